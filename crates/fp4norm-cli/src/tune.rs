//! `fp4norm tune`: measure generic launch shapes on this GPU and write the fastest per
//! bucket of row counts to the table the library reads (`fp4norm::cuda::TunedTable`).
// Without the CUDA backend only the argument parsing and its error remain.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use fp4norm::{DType, Fp4Format, ScaleLayout};

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
For each row length H and dtype, and each bucket of row counts (1 row; up to 1/8, 1/2 and all \
of the SMs; 16, 32, 64 rows per SM and beyond), every generic candidate shape (1 to 8 CTAs per \
row, 1 to 16 vectors of 8 elements per thread; no built-in table goes into them) is timed by \
CUDA-graph replay on NVFP4 row-major calls of fresh random data, and its bytes are compared \
with the built-in shape's: a shape never changes what a call writes. The table is written to \
the cache directory (FP4NORM_CACHE_DIR, else ~/.cache/fp4norm) under tuned/; a `Gpu` opened \
afterwards on the same device, fp4norm version and kernel source uses it (FP4NORM_TUNED=off \
ignores it). Printed: per bucket, the built-in shape's time and the tuned one's.\n\n\
--quick measures bf16 at H = 4096, 8192, 16384 (about a minute on an H200); the full run \
bf16 and f16 at H = 2048 ... 32768 (a few minutes). Progress goes to stderr."
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
        // The calls measured have up to 1024 rows: their byte counts must fit.
        let opts = fp4norm::Options::nvfp4().with_format(TUNE_FORMAT);
        for &h in &self.h {
            if let Err(e) = fp4norm::Problem::new(1024, h, DType::BF16, TUNE_LAYOUT, &opts) {
                return Err(format!("--h {h}: {e}"));
            }
        }
        Ok(())
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

/// One measured bucket, for the summary.
pub struct BucketResult {
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
    let buckets = internal::tune_buckets(limits.sm_count);
    eprintln!(
        "tuning on {} ({}, {} SMs): H {:?}, {:?}, {} buckets of row counts",
        gpu.name(),
        gpu.arch(),
        limits.sm_count,
        hs,
        dtypes,
        buckets.len()
    );
    let started = std::time::Instant::now();
    let mut results = Vec::new();
    let total = hs.len() * dtypes.len();
    for (i, (&dtype, &h)) in dtypes
        .iter()
        .flat_map(|d| hs.iter().map(move |h| (d, h)))
        .enumerate()
    {
        let candidates = internal::tune_candidates(h, 16, &limits);
        // Compile every candidate in parallel first (each once for all buckets: the row
        // count does not change a row-major kernel), through the disk cache.
        be.precompile_shapes(h, dtype, &candidates)?;
        for &(m_from, m_to, m) in &buckets {
            let m = m.min((MAX_ELEMS / h).max(1));
            let r = be.tune_bucket(m, h, dtype, &candidates)?;
            results.push(BucketResult {
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
            "[{}/{total}] {dtype} H={h}: {} candidates x {} buckets ({:.0} s)",
            i + 1,
            candidates.len(),
            buckets.len(),
            started.elapsed().as_secs_f64()
        );
    }
    print_summary(&results);
    let table = TunedTable {
        rows: results
            .iter()
            .map(|r| TunedRow {
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
        let path = internal::save_tuned_table(gpu, &table)?;
        println!("wrote {} ({} rows)", path.display(), table.rows.len());
    }
    Ok(true)
}

fn print_summary(results: &[BucketResult]) {
    println!(
        "{:>5} {:>6} {:>17} {:>7} {:>16} {:>10} {:>16} {:>10} {:>7}",
        "dtype", "H", "rows", "M", "built-in shape", "µs", "tuned shape", "µs", "tuned/bi"
    );
    for r in results {
        let rows = if r.m_to == usize::MAX {
            format!("{}..", r.m_from)
        } else {
            format!("{}..{}", r.m_from, r.m_to)
        };
        let shape = |s: (u32, u32, u32)| format!("({},{},{})", s.0, s.1, s.2);
        println!(
            "{:>5} {:>6} {:>17} {:>7} {:>16} {:>10.2} {:>16} {:>10.2} {:>7.3}",
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
    let worse = results
        .iter()
        .filter(|r| r.best.1 > r.builtin.1 * 1.02)
        .count();
    println!(
        "{n} buckets ({} candidates each on average); tuned slower than built-in by more than 2 %: {worse}",
        results.iter().map(|r| r.candidates).sum::<usize>() / n.max(1)
    );
}

/// The layout and format the shapes are measured on (the shape does not depend on them
/// beyond the block size; NVFP4's 16-element blocks allow every shape MXFP4's do).
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
}
