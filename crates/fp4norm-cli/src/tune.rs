//! `fp4norm tune`: measure generic launch shapes on this GPU and write the fastest per
//! bucket of row counts to the table the library reads (`fp4norm::cuda::TunedTable`).
// Without the CUDA backend only the argument parsing and its error remain.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use fp4norm::{DType, Fp4Format, ScaleLayout};

use crate::case::{CaseProblem, Op};
use crate::format::{parse_format, Format};
use crate::CliError;

/// Row lengths of the full run: the hidden sizes of the bench table.
const FULL_H: &[usize] = &[2048, 4096, 5120, 7168, 8192, 16384, 32768];
/// The quick run: bf16 at three common hidden sizes.
const QUICK_H: &[usize] = &[4096, 8192, 16384];
/// Elements of the largest call measured (bounds memory and time; a bucket's
/// representative row count is capped to it).
const MAX_ELEMS: usize = 1 << 28;

#[derive(clap::Args, Debug)]
#[command(
    long_about = "Measure launch shapes (threads per row, rows per CTA, CTAs per row) on this GPU \
and write the fastest of each bucket to the table fp4norm then uses on this device.\n\n\
For each format, row length H and dtype, and each bucket of row counts (1 row; up to 1/8, 1/2 \
and all of the SMs; 16, 32, 64 rows per SM and beyond), every generic candidate shape (1 to 8 \
CTAs per row, 1 to 16 vectors of 8 elements per thread; no built-in table goes into them) is \
timed by CUDA-graph replay on calls of fresh random data (after a second of copies that wake the \
GPU; the built-in shape is timed before and after the candidates and keeps its faster time), and \
its bytes are compared with the built-in shape's: a shape never changes what a call writes. A format's shapes serve every call \
of its class: the FP4 op (nvfp4, measured row-major, also serves mxfp4), FP8 per tensor, FP8 \
per token, FP8 per group of each size (fp8-group128 also serves fp8-g128-ue8m0-column-major). \
The table is written to the cache directory (FP4NORM_CACHE_DIR, else ~/.cache/fp4norm; with it \
off only --dry-run runs) under tuned/, keeping the rows it does not measure again (a saved table that does not parse stops the \
run before it measures: move it away to start afresh); a bucket's row is the built-in shape where \
no candidate beats it. A `Gpu` opened afterwards on the same device, fp4norm version and kernel \
source uses it (FP4NORM_TUNED=off ignores it). Printed: per bucket, the built-in shape's time and \
the tuned one's.\n\n\
--quick measures bf16 at H = 4096, 8192, 16384 (about a minute a format on an H200); the full \
run bf16 and f16 at H = 2048 ... 32768 (a few minutes a format). Progress goes to stderr."
)]
pub struct TuneArgs {
    /// The quick run: bf16, H = 4096, 8192, 16384
    #[arg(long)]
    quick: bool,
    /// Hidden sizes to tune, comma-separated (each a multiple of 16) [default: the full or quick list]
    #[arg(long, value_name = "H,..", value_delimiter = ',', num_args = 1..,
          value_parser = crate::args::hidden, allow_negative_numbers = true)]
    h: Vec<usize>,
    /// Element types to tune: bf16, f16 [default: both; bf16 with --quick]
    #[arg(long = "dtype", value_name = "DTYPE", value_delimiter = ',')]
    dtypes: Vec<DType>,
    /// Formats whose kernels to tune, comma-separated, as `bench --format` names them
    /// (e.g. nvfp4, fp8-tensor, fp8-token, fp8-group128, mxfp8) [default: nvfp4]
    #[arg(long = "format", value_name = "FORMAT", value_delimiter = ',', value_parser = parse_format)]
    formats: Vec<Format>,
    /// CUDA device ordinal [default: FP4NORM_DEVICE, else 0]
    #[arg(long, value_name = "N", value_parser = crate::args::count0,
          allow_negative_numbers = true)]
    device: Option<usize>,
    /// Measure and print, but do not write the table
    #[arg(long)]
    dry_run: bool,
}

impl TuneArgs {
    /// Contradictions and bad values of the command line (exit status 2).
    pub fn check_usage(&self) -> Result<(), String> {
        if let Some(&h) = self.h.iter().find(|&&h| h == 0 || h % 16 != 0) {
            return Err(format!(
                "--h {h}: a hidden size must be a positive multiple of 16"
            ));
        }
        // The calls measured have up to 1024 rows: each format must take them.
        for f in self.formats() {
            for &h in &self.h {
                if let Err(e) = problem_of(&op_of(f), 1024, h, DType::BF16) {
                    return Err(format!("--h {h} does not fit format {f}: {e}"));
                }
            }
        }
        Ok(())
    }

    /// The formats to tune, in order, each once.
    fn formats(&self) -> Vec<Format> {
        let mut out: Vec<Format> = Vec::new();
        for &f in &self.formats {
            if !out.contains(&f) {
                out.push(f);
            }
        }
        if out.is_empty() {
            out.push(Format::Fp4(TUNE_FORMAT));
        }
        out
    }

    fn plan(&self) -> (Vec<usize>, Vec<DType>) {
        let h = if !self.h.is_empty() {
            self.h.clone()
        } else if self.quick {
            QUICK_H.to_vec()
        } else {
            FULL_H.to_vec()
        };
        let dtypes = if !self.dtypes.is_empty() {
            self.dtypes.clone()
        } else if self.quick {
            vec![DType::BF16]
        } else {
            vec![DType::BF16, DType::F16]
        };
        (h, dtypes)
    }
}

/// The op a tuning call of format `f` runs: the FP4 formats row-major, FP8 formats with
/// their own layout, a per-tensor scale of 1 read from memory and no f32 floor.
pub fn op_of(f: Format) -> Op {
    match f {
        Format::Fp4(format) => Op::Fp4 {
            opts: fp4norm::Options::default().with_format(format),
            layout: TUNE_LAYOUT,
        },
        Format::Fp8(f) => Op::fp8(f.options(1.0, 0.0)),
    }
}

/// The validated problem of `op` on `m` rows of `h` elements of `dtype` (the validators'
/// message if it takes no such call).
fn problem_of(op: &Op, m: usize, h: usize, dtype: DType) -> fp4norm::Result<CaseProblem> {
    Ok(match op {
        Op::Fp4 { opts, layout } => {
            CaseProblem::Fp4(fp4norm::Problem::new(m, h, dtype, *layout, opts)?)
        }
        Op::Fp8 { opts, .. } => CaseProblem::Fp8(fp4norm::fp8::Fp8Problem::new(m, h, dtype, opts)?),
    })
}

/// The buckets `(m_from, m_to, m)` measured at row length `h`, and the most rows a call
/// measured has: each at its row count capped at [`MAX_ELEMS`] elements but never below its
/// first row; a bucket that starts past the cap is left out (the built-in shape serves it),
/// not measured at a row count of another bucket.
fn measured_buckets(
    buckets: &[(usize, usize, usize)],
    h: usize,
) -> (Vec<(usize, usize, usize)>, usize) {
    let cap = (MAX_ELEMS / h.max(1)).max(1);
    let measured = buckets
        .iter()
        .filter(|b| b.0 <= cap)
        .map(|&(from, to, at)| (from, to, at.min(cap)))
        .collect();
    (measured, cap)
}

/// One measured bucket: a row of the summary and of the table.
#[cfg(feature = "cuda")]
pub struct BucketResult {
    /// The kernels the shape serves.
    pub class: fp4norm::cuda::ShapeClass,
    pub dtype: DType,
    pub h: usize,
    pub m_from: usize,
    pub m_to: usize,
    pub m: usize,
    pub builtin: ((u32, u32, u32), f64),
    pub best: ((u32, u32, u32), f64),
    pub candidates: usize,
}

#[cfg(not(feature = "cuda"))]
pub fn run(_args: TuneArgs) -> Result<bool, CliError> {
    Err(CliError(
        "fp4norm tune needs the CUDA backend (built without the cuda feature)".into(),
    ))
}

#[cfg(feature = "cuda")]
pub fn run(args: TuneArgs) -> Result<bool, CliError> {
    use crate::backend::Backend as _;
    use crate::cuda_backend::CudaBackend;
    use fp4norm::cuda::{internal, TunedRow, TunedTable};

    let ordinal = match args.device {
        Some(n) => n,
        None => crate::backend::default_cuda_ordinal()?,
    };
    let be = CudaBackend::open_untuned(ordinal)?;
    let gpu = be.gpu();
    let limits = *gpu.limits();
    let (hs, dtypes) = args.plan();
    let formats = args.formats();
    let buckets = internal::tune_buckets(limits.sm_count);
    eprintln!(
        "tuning on {} ({}, {} SMs): {} at H {:?}, {:?}, {} buckets of row counts",
        gpu.name(),
        gpu.arch(),
        limits.sm_count,
        formats
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        hs,
        dtypes,
        buckets.len()
    );
    // With no disk cache there is nowhere to write: stop before measuring.
    if !args.dry_run && internal::tuned_table_path(gpu).is_none() {
        return Err(CliError(
            "the disk cache is off or has no folder (FP4NORM_CACHE_DIR=off, or neither it, \
             XDG_CACHE_HOME nor HOME set): `fp4norm tune` has nowhere to write its table; set \
             FP4NORM_CACHE_DIR to a folder, or measure only with --dry-run"
                .into(),
        ));
    }
    // Held until the table is written (or the run stops). A dry run writes nothing, so a
    // lock it cannot create is only a warning; another run's lock stops it all the same.
    let _lock = match internal::lock_tuned_table(gpu) {
        Err(e @ fp4norm::Error::TunedTableWrite { .. }) if args.dry_run => {
            eprintln!("warning: {e}; measuring without the lock (--dry-run)");
            None
        }
        other => other?,
    };
    // A saved table this run would merge into must parse: the run stops before measuring
    // rather than overwrite rows it cannot read (and reads it again to merge at the end).
    if !args.dry_run {
        internal::saved_tuned_table(gpu)?;
    }
    // A GPU fresh from idle launches slower for a while: busy it before the first bucket.
    be.keep_busy(1.0)?;
    let started = std::time::Instant::now();
    let mut results: Vec<BucketResult> = Vec::new();
    let mut unmeasured: Vec<(DType, usize, usize)> = Vec::new();
    let total = formats.len() * hs.len() * dtypes.len();
    let mut done = 0;
    for &format in &formats {
        let op = op_of(format);
        for &dtype in &dtypes {
            for &h in &hs {
                done += 1;
                // One call's configuration gives the class and the block the shapes must fit.
                let cfg = be.tune_config(&op, &problem_of(&op, 1, h, dtype)?);
                let class = cfg.shape_class();
                if results
                    .iter()
                    .any(|r| (r.class, r.dtype, r.h) == (class, dtype, h))
                {
                    eprintln!("[{done}/{total}] {format} {dtype} H={h}: its class {class} is tuned already");
                    continue;
                }
                let candidates = internal::tune_candidates(class, h, cfg.shape_block(), &limits);
                let (measured, cap) = measured_buckets(&buckets, h);
                if measured.len() < buckets.len() {
                    unmeasured.push((dtype, h, cap));
                }
                // Compile every candidate in parallel first, through the disk cache (a row
                // count can change an FP8 kernel's scale write; equal kernels compile once).
                for &(_, _, m) in &measured {
                    be.precompile_shapes(&op, &problem_of(&op, m, h, dtype)?, &candidates)?;
                }
                for &(m_from, m_to, m) in &measured {
                    let r = be.tune_bucket(m, h, dtype, &op, &candidates)?;
                    results.push(BucketResult {
                        class,
                        dtype,
                        h,
                        m_from,
                        m_to,
                        m,
                        builtin: r.0,
                        best: r.1,
                        candidates: candidates.len(),
                    });
                }
                eprintln!(
                    "[{done}/{total}] {format} ({class}) {dtype} H={h}: {} candidates x {} buckets ({:.0} s)",
                    candidates.len(),
                    measured.len(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
    }
    print_summary(&results);
    for (dtype, h, cap) in unmeasured {
        println!(
            "{dtype} H={h}: buckets from {} rows not measured (calls up to {MAX_ELEMS} elements: {cap} rows); the built-in shape serves them",
            cap + 1
        );
    }
    let table = TunedTable {
        rows: results
            .iter()
            .map(|r| TunedRow {
                class: r.class,
                dtype: r.dtype,
                h: r.h,
                m_from: r.m_from,
                m_to: r.m_to,
                shape: r.best.0,
            })
            .collect(),
    };
    if args.dry_run {
        println!("(--dry-run: the table was not written)");
    } else {
        // The rows of classes, dtypes and row lengths not tuned now stay, as the file holds
        // them now.
        let table = internal::saved_tuned_table(gpu)?
            .unwrap_or_default()
            .merged_with(&table);
        let path = internal::save_tuned_table(gpu, &table)?;
        println!("wrote {} ({} rows)", path.display(), table.rows.len());
    }
    Ok(true)
}

#[cfg(feature = "cuda")]
fn print_summary(results: &[BucketResult]) {
    println!(
        "{:>10} {:>5} {:>6} {:>17} {:>7} {:>16} {:>10} {:>16} {:>10} {:>7}",
        "class", "dtype", "H", "rows", "M", "built-in shape", "µs", "tuned shape", "µs", "tuned/bi"
    );
    for r in results {
        let rows = if r.m_to == usize::MAX {
            format!("{}..", r.m_from)
        } else {
            format!("{}..{}", r.m_from, r.m_to)
        };
        let shape = |s: (u32, u32, u32)| format!("({},{},{})", s.0, s.1, s.2);
        println!(
            "{:>10} {:>5} {:>6} {:>17} {:>7} {:>16} {:>10.2} {:>16} {:>10.2} {:>7.3}",
            r.class.to_string(),
            r.dtype.to_string(),
            r.h,
            rows,
            r.m,
            shape(r.builtin.0),
            r.builtin.1 * 1e6,
            shape(r.best.0),
            r.best.1 * 1e6,
            r.best.1 / r.builtin.1
        );
    }
    let n = results.len();
    let kept = results.iter().filter(|r| r.best.0 == r.builtin.0).count();
    let faster = results
        .iter()
        .filter(|r| r.best.1 * 1.02 < r.builtin.1)
        .count();
    println!(
        "{n} buckets ({} candidates each on average); the built-in shape kept in {kept}; tuned faster than built-in by more than 2 %: {faster}",
        results.iter().map(|r| r.candidates).sum::<usize>() / n.max(1)
    );
}

/// The FP4 format and layout the FP4 op's shapes are measured on by default (the shape
/// does not depend on them beyond the block size; NVFP4's 16-element blocks allow every
/// shape MXFP4's do).
pub const TUNE_FORMAT: Fp4Format = Fp4Format::NVFP4;
pub const TUNE_LAYOUT: ScaleLayout = ScaleLayout::RowMajor;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        a: TuneArgs,
    }

    #[test]
    fn plans_and_bad_values() {
        let w = Wrap::try_parse_from(["t", "--quick"]).unwrap();
        assert_eq!(w.a.plan(), (QUICK_H.to_vec(), vec![DType::BF16]));
        let w = Wrap::try_parse_from(["t"]).unwrap();
        assert_eq!(w.a.plan(), (FULL_H.to_vec(), vec![DType::BF16, DType::F16]));
        let w = Wrap::try_parse_from(["t", "--h", "4096,100"]).unwrap();
        assert!(w.a.check_usage().is_err());
        let w = Wrap::try_parse_from(["t", "--h", "1152921504606846976"]).unwrap();
        assert!(w.a.check_usage().unwrap_err().contains("overflow"));
        let w = Wrap::try_parse_from(["t", "--h", "4096", "--dtype", "f16"]).unwrap();
        assert_eq!(w.a.plan(), (vec![4096], vec![DType::F16]));
    }

    #[test]
    fn every_bucket_is_measured_inside_itself_or_not_at_all() {
        // 132 SMs (an H100 or H200): at H = 32768 the cap is 8192 rows, inside the bucket
        // 4225..=8448; the last bucket (from 8449) is left out, not measured at 8192.
        let b = vec![
            (1, 1, 1),
            (2, 16, 8),
            (17, 66, 33),
            (67, 132, 132),
            (133, 2112, 1056),
            (2113, 4224, 3168),
            (4225, 8448, 6336),
            (8449, usize::MAX, 12672),
        ];
        let (m, cap) = measured_buckets(&b, 32768);
        assert_eq!(cap, 8192);
        assert_eq!(m.len(), 7);
        assert_eq!(m[6], (4225, 8448, 6336));
        let (m, cap) = measured_buckets(&b, 65536);
        assert_eq!((cap, m.len(), m[5]), (4096, 6, (2113, 4224, 3168)));
        let (m, _) = measured_buckets(&b, 4096);
        assert_eq!(m, b);
        for h in [16usize, 4096, 32768, 65536, 1 << 20, 1 << 28, 1 << 30] {
            let (m, cap) = measured_buckets(&b, h);
            assert!(!m.is_empty(), "H={h}");
            for &(from, to, at) in &m {
                assert!((from..=to).contains(&at) && at <= cap, "H={h}: {m:?}");
            }
        }
    }

    #[test]
    fn formats_default_to_the_fp4_op_and_must_fit_every_h() {
        let w = Wrap::try_parse_from(["t", "--quick"]).unwrap();
        assert_eq!(w.a.formats(), vec![Format::Fp4(TUNE_FORMAT)]);
        let w = Wrap::try_parse_from(["t", "--format", "fp8-token,nvfp4,fp8-token"]).unwrap();
        let names: Vec<String> = w.a.formats().iter().map(|f| f.to_string()).collect();
        assert_eq!(names, ["fp8-token", "nvfp4"]);
        assert!(w.a.check_usage().is_ok());
        // Groups of 128 need H a multiple of 128; the FP4 op's 16 takes 4112.
        let w = Wrap::try_parse_from(["t", "--format", "fp8-group128", "--h", "4112"]).unwrap();
        let e = w.a.check_usage().unwrap_err();
        assert!(
            e.contains("--h 4112 does not fit format fp8-group128"),
            "{e}"
        );
        let w = Wrap::try_parse_from(["t", "--format", "nvfp4", "--h", "4112"]).unwrap();
        assert!(w.a.check_usage().is_ok());
        assert!(Wrap::try_parse_from(["t", "--format", "fp9"]).is_err());
        // FP4 formats are measured row-major; FP8 ones in their own layout, the per-tensor
        // scale read from memory.
        assert!(matches!(
            op_of(Format::Fp4(Fp4Format::MXFP4)),
            Op::Fp4 {
                layout: TUNE_LAYOUT,
                ..
            }
        ));
        let Ok(Format::Fp8(t)) = parse_format("fp8-tensor") else {
            panic!("fp8-tensor parses");
        };
        assert!(matches!(
            op_of(Format::Fp8(t)),
            Op::Fp8 {
                scale_in_memory: true,
                ..
            }
        ));
    }
}
