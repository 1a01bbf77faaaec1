//! `fp4norm bench`: time the op over realistic shapes, report effective bandwidth
//! against a memcpy measured in the same run, and check every result against the reference.

use std::io::Write;
use std::time::Instant;

use fp4norm::{DType, Fp4Format, Options, ScaleLayout};
use rayon::prelude::*;
use serde::Serialize;

use crate::backend::{self, median, Backend, CopyBaseline, Device, HostBackend, Prepared};
use crate::case::{compare, Case, Gs, Outputs};
use crate::CliError;

const DEFAULT_M: &[usize] = &[1, 16, 128, 1024, 4096, 16384];
const DEFAULT_H: &[usize] = &[2048, 4096, 5120, 7168, 8192, 16384];
/// GPU default: the decode/prefill table of the speed targets, H up to 32768.
const DEFAULT_M_GPU: &[usize] = &[1, 16, 128, 1024, 4096, 16384];
const DEFAULT_H_GPU: &[usize] = &[2048, 4096, 5120, 7168, 8192, 16384, 32768];
const QUICK_M: &[usize] = &[1, 256];
const QUICK_H: &[usize] = &[2048, 7168];
/// Shapes up to this many elements are checked by one reference call; larger ones in
/// parts of about this many elements (whole 128-row tiles), the parts in parallel.
const CHECK_PART_ELEMS: usize = 1 << 22;
/// Shapes moving at least this many bytes also get a copy of their own size timed (GPU).
const SAME_SIZE_COPY_MIN: u64 = 32 << 20;

#[derive(clap::Args, Debug)]
#[command(
    long_about = "Time the fused residual add + RMSNorm + FP4 quantisation over a table of decode \
and prefill shapes (M tokens x hidden size H) and formats, and report the effective bandwidth: \
bytes moved per call (SPEC.md §6: x, residual read + written, weight, packed FP4, scales, y_out) \
divided by the median time of the timed calls. A plain copy of a large buffer, measured on the \
same device in the same run (bytes read + written), is the yardstick ('vs copy').\n\n\
Each shape gets fresh random inputs (never zero). Before timing, every output of one call \
(packed FP4, scales including swizzle padding, updated residual, y_out) is compared byte for \
byte with fp4norm::reference on the same inputs, every row of every shape (large shapes in parts of \
whole 128-row tiles, the reference running on all cores). Any MISMATCH makes the exit status 1.\n\n\
The default table (6 M x 6 H x nvfp4, mxfp4) takes about a minute on 2 cores; --quick runs \
a few small shapes for CI. The table goes to stdout, progress (one line per shape) to stderr."
)]
pub struct BenchArgs {
    /// Token counts M (rows), comma-separated [default: 1,16,128,1024,4096,16384]
    #[arg(long, value_name = "M,..", value_delimiter = ',', num_args = 1..)]
    m: Vec<usize>,
    /// Hidden sizes H, comma-separated; each a multiple of the block size [default: 2048,4096,5120,7168,8192,16384]
    #[arg(long, value_name = "H,..", value_delimiter = ',', num_args = 1..)]
    h: Vec<usize>,
    /// FP4 format: nvfp4, mxfp4 or a pairing b16-ue8m0 / b32-e4m3; repeatable [default: nvfp4,mxfp4]
    #[arg(long = "format", value_name = "FORMAT", value_delimiter = ',', value_parser = parse_format)]
    formats: Vec<Fp4Format>,
    /// Element type of input, residual, weight and y_out: bf16 or f16; repeatable
    #[arg(
        long = "dtype",
        value_name = "DTYPE",
        value_delimiter = ',',
        default_value = "bf16"
    )]
    dtypes: Vec<DType>,
    /// Scale layout: row-major, swizzled (128x4, what Blackwell GEMMs read) or both; repeatable
    #[arg(
        long = "layout",
        value_name = "LAYOUT",
        value_delimiter = ',',
        default_value = "swizzled"
    )]
    layouts: Vec<ScaleLayout>,
    /// Also write y_out (the normalised values in the input dtype); adds M·H·2 bytes per call
    #[arg(long)]
    y_out: bool,
    /// Benchmark rmsnorm_fp4quant (no residual add, no residual write-back)
    #[arg(long)]
    no_residual: bool,
    /// Timed calls per row [default: as many as fit in about 0.15 s, at least 5 (3 for calls over 0.1 s)]
    #[arg(long, value_name = "N")]
    reps: Option<usize>,
    /// Untimed calls before timing, besides the check's call and one sizing call [default: enough for about 20 ms]
    #[arg(long, value_name = "N")]
    warmup: Option<usize>,
    /// Also write the results as JSON to PATH ('-' for stdout; the table then goes to stderr)
    #[arg(long, value_name = "PATH")]
    json: Option<String>,
    /// Where to run: cpu, cuda, or auto (cuda if available, else cpu)
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Check every result against fp4norm::reference (the default)
    #[arg(long, overrides_with = "no_check")]
    check: bool,
    /// Skip the check against the reference
    #[arg(long, overrides_with = "check")]
    no_check: bool,
    /// A few small shapes and short timings, for CI (M 1,256 x H 2048,7168; 64 MiB copy)
    #[arg(long)]
    quick: bool,
    /// Seed of the random inputs
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Size of the memcpy baseline's buffer in MiB [default: 512, 64 with --quick]
    #[arg(long, value_name = "MIB")]
    copy_mib: Option<usize>,
    /// RMSNorm epsilon (finite, >= 0)
    #[arg(long, default_value_t = 1e-6, allow_negative_numbers = true)]
    eps: f32,
    /// Added to every weight (SPEC.md §8; 1 for Gemma's (1 + w)); finite
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    weight_bias: f32,
    /// Also time the chain "previous kernel -> fp4norm" with and without programmatic
    /// dependent launch (CUDA, sm_90+), for the small shapes of the table
    #[arg(long)]
    pdl: bool,
    /// Global scale (used by E4M3 scales)
    #[arg(
        long,
        value_name = "GS",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    global_scale: f32,
}

#[derive(Serialize)]
struct Row {
    m: usize,
    h: usize,
    dtype: String,
    format: String,
    layout: String,
    residual: bool,
    y_out: bool,
    bytes_moved: u64,
    warmup: usize,
    reps: usize,
    median_us: f64,
    /// Median µs per call when calls are replayed from a CUDA graph (GPU only).
    graph_us: Option<f64>,
    /// GB/s of the graph-replay median.
    graph_gb_per_s: Option<f64>,
    min_us: f64,
    max_us: f64,
    gb_per_s: f64,
    vs_copy: f64,
    /// GB/s of a copy of this call's own byte count (half read, half written), for shapes
    /// of at least `SAME_SIZE_COPY_MIN` bytes on a GPU: what launch and ramp-up leave of
    /// the large-buffer yardstick at this size.
    copy_same_bytes_gb_per_s: Option<f64>,
    /// "ok", "MISMATCH" or "skipped".
    check: String,
    /// Rows compared with the reference (all M unless skipped or a mismatch stopped the check).
    rows_checked: usize,
    mismatch: Option<String>,
}

#[derive(Serialize)]
struct Report {
    tool: String,
    device: String,
    device_description: String,
    clock: String,
    copy: CopyBaseline,
    /// µs per launch of a near-empty kernel replayed from a CUDA graph (GPU only).
    launch_floor_us: Option<f64>,
    eps: f32,
    weight_bias: f32,
    global_scale: f32,
    seed: u64,
    rows: Vec<Row>,
    all_ok: bool,
}

impl BenchArgs {
    /// The checks of the command line that clap's parsers cannot make alone (they relate
    /// several options): a failure is a bad command line, exit status 2, before any work.
    pub fn check_usage(&self) -> Result<(), String> {
        if let Some(&m) = self.m.iter().find(|&&m| m == 0) {
            return Err(format!(
                "--m {m}: M must be at least 1 (M = 0 moves no bytes)"
            ));
        }
        let formats = if self.formats.is_empty() {
            &[Fp4Format::NVFP4, Fp4Format::MXFP4][..]
        } else {
            &self.formats[..]
        };
        for &h in &self.h {
            for f in formats {
                if h == 0 || h % f.block_size() != 0 {
                    return Err(format!(
                        "--h {h} does not fit format {f}: H must be a positive multiple of its block size {}",
                        f.block_size()
                    ));
                }
            }
        }
        if self.reps == Some(0) {
            return Err("--reps must be at least 1".into());
        }
        if self.copy_mib == Some(0) {
            return Err("--copy-mib must be at least 1".into());
        }
        if !self.weight_bias.is_finite() {
            return Err(format!(
                "--weight-bias {}: the weight bias must be finite",
                self.weight_bias
            ));
        }
        if !self.eps.is_finite() || self.eps < 0.0 {
            return Err(format!(
                "--eps {}: eps must be finite and >= 0 (the usual value is 1e-6)",
                self.eps
            ));
        }
        Ok(())
    }
}

pub fn run(a: BenchArgs) -> Result<bool, CliError> {
    a.check_usage().map_err(CliError)?;
    let backend = backend::open(a.device)?;
    let gpu = backend.name() == "cuda";
    let ms = pick(
        &a.m,
        match (a.quick, gpu) {
            (true, _) => QUICK_M,
            (false, true) => DEFAULT_M_GPU,
            (false, false) => DEFAULT_M,
        },
    );
    let hs = pick(
        &a.h,
        match (a.quick, gpu) {
            (true, _) => QUICK_H,
            (false, true) => DEFAULT_H_GPU,
            (false, false) => DEFAULT_H,
        },
    );
    let formats = if a.formats.is_empty() {
        vec![Fp4Format::NVFP4, Fp4Format::MXFP4]
    } else {
        a.formats.clone()
    };
    let do_check = a.check || !a.no_check; // the last of --check / --no-check wins
    let target_s = if a.quick { 0.02 } else { 0.15 };
    let opts = Options::default()
        .with_eps(a.eps)
        .with_weight_bias(a.weight_bias);

    let json_stdout = a.json.as_deref() == Some("-");
    // Open the JSON file now, so that a bad path fails before a long run.
    let mut json_file = match a.json.as_deref() {
        Some(path) if path != "-" => Some(
            std::fs::File::create(path)
                .map_err(|e| CliError(format!("cannot write --json {path}: {e}")))?,
        ),
        _ => None,
    };
    let mut out: Box<dyn Write> = if json_stdout {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };

    let copy_bytes = a.copy_mib.unwrap_or(if a.quick {
        64
    } else if gpu {
        2048
    } else {
        512
    }) << 20;
    eprintln!("measuring the copy baseline ({} MiB)...", copy_bytes >> 20);
    let copy = backend.copy_baseline(copy_bytes, if a.quick { 5 } else { 10 })?;

    writeln!(
        out,
        "fp4norm {} bench | device {}: {} | {}, median of timed calls after warm-up",
        env!("CARGO_PKG_VERSION"),
        backend.name(),
        backend.describe(),
        backend.clock()
    )?;
    writeln!(
        out,
        "copy baseline: {} MiB buffer, {} MiB read + written per copy, median of {}: {:.2} GB/s",
        copy.buffer_bytes >> 20,
        copy.bytes_per_copy >> 20,
        copy.reps,
        copy.gb_per_s
    )?;
    let launch_floor_us = match backend.launch_floor() {
        Some(t) => Some(t? * 1e6),
        None => None,
    };
    if let Some(us) = launch_floor_us {
        writeln!(
            out,
            "launch floor: {us:.2} µs per launch of a one-CTA kernel that moves 16 bytes, replayed from a CUDA graph (500 per graph)"
        )?;
    }
    writeln!(
        out,
        "op: {} + RMSNorm + FP4 quantisation, eps {:e}, global scale {}, y_out {}; bytes per call as in SPEC.md §6",
        if a.no_residual { "no residual" } else { "residual add (in place)" },
        a.eps,
        a.global_scale,
        if a.y_out { "written" } else { "not written" }
    )?;
    writeln!(out)?;

    let total_shapes = ms.len() * hs.len();
    let mut rows = Vec::new();
    let start = Instant::now();
    let mut shape_idx = 0;
    for &m in &ms {
        for &h in &hs {
            shape_idx += 1;
            let t_shape = Instant::now();
            let mut progress = format!("[{shape_idx:>2}/{total_shapes}] M={m:<5} H={h:<5}");
            for &dtype in &a.dtypes {
                let seed = a
                    .seed
                    .wrapping_mul(0x9E37_79B9)
                    .wrapping_add((m as u64) << 32 | h as u64)
                    ^ dtype as u64;
                let mut case = Case::random(m, h, dtype, a.layouts[0], opts, seed);
                case.gs = Gs::Uniform(a.global_scale);
                case.y_out = a.y_out;
                if a.no_residual {
                    case.residual = None;
                }
                for &layout in &a.layouts {
                    for &format in &formats {
                        case.layout = layout;
                        case.opts = opts.with_format(format);
                        let row = bench_one(&*backend, &case, &a, do_check, target_s, &copy)?;
                        let mut label = format.to_string();
                        if a.layouts.len() > 1 {
                            label = format!("{label}/{layout}");
                        }
                        if a.dtypes.len() > 1 {
                            label = format!("{label}/{dtype}");
                        }
                        progress.push_str(&format!(
                            "  {label} {:.1} GB/s{}",
                            row.gb_per_s,
                            if do_check {
                                format!(" {}", row.check)
                            } else {
                                String::new()
                            }
                        ));
                        rows.push(row);
                    }
                }
            }
            eprintln!("{progress}  ({:.1} s)", t_shape.elapsed().as_secs_f64());
        }
    }
    let all_ok = rows.iter().all(|r| r.check != "MISMATCH");

    print_table(&mut out, &rows, do_check)?;
    if a.pdl {
        writeln!(out)?;
        writeln!(
            out,
            "programmatic dependent launch: graph of N x (previous kernel: 1 MiB copy -> fp4norm), µs per pair"
        )?;
        writeln!(
            out,
            "{:>6} {:>6}  {:<9} {:>10} {:>10} {:>7}",
            "M", "H", "format", "no PDL", "PDL", "gain"
        )?;
        for &m in ms.iter().filter(|&&m| m <= 1024) {
            for &h in hs.iter().filter(|&&h| h <= 8192) {
                for &format in &formats {
                    let mut case = Case::random(m, h, a.dtypes[0], a.layouts[0], opts, a.seed);
                    case.opts = opts.with_format(format);
                    match backend.pdl_chain(&case) {
                        None => {
                            writeln!(out, "(this backend has no programmatic dependent launch)")?;
                            break;
                        }
                        Some(r) => {
                            let (plain, pdl) = r?;
                            writeln!(
                                out,
                                "{:>6} {:>6}  {:<9} {:>10} {:>10} {:>6.1}%",
                                m,
                                h,
                                format.to_string(),
                                fmt_us(plain * 1e6),
                                fmt_us(pdl * 1e6),
                                100.0 * (plain - pdl) / plain
                            )?;
                        }
                    }
                }
            }
        }
    }
    writeln!(out)?;
    if do_check {
        writeln!(
            out,
            "check: each row's outputs (packed FP4, scales incl. swizzle padding, residual, y_out) from one call \
             compared byte for byte with fp4norm::reference on the same inputs, every row (shapes above {}M elements \
             in parts of whole 128-row tiles, the reference on all cores).",
            CHECK_PART_ELEMS >> 20
        )?;
    }
    writeln!(
        out,
        "GB/s = SPEC.md §6 bytes / median time; 'vs copy' = GB/s / copy baseline. Shapes that fit in the CPU \
         caches stay there between calls, so they can beat a DRAM-sized copy."
    )?;
    if rows.iter().any(|r| r.copy_same_bytes_gb_per_s.is_some()) {
        writeln!(
            out,
            "'vs same' = graph GB/s / a copy of the call's own byte count (half read, half written), \
             back-to-back copies timed between events: the copy figure left at this size once launch and ramp-up are paid."
        )?;
    }
    for r in rows.iter().filter(|r| r.mismatch.is_some()) {
        writeln!(
            out,
            "MISMATCH M={} H={} {} {} {}: {}",
            r.m,
            r.h,
            r.format,
            r.dtype,
            r.layout,
            r.mismatch.as_deref().unwrap_or_default()
        )?;
    }
    writeln!(
        out,
        "{} rows in {:.1} s: {}",
        rows.len(),
        start.elapsed().as_secs_f64(),
        if !do_check {
            "not checked (--no-check)".to_string()
        } else if all_ok {
            "all match the reference".to_string()
        } else {
            format!(
                "{} MISMATCH",
                rows.iter().filter(|r| r.check == "MISMATCH").count()
            )
        }
    )?;
    out.flush()?;

    if let Some(path) = &a.json {
        let report = Report {
            tool: format!("fp4norm {}", env!("CARGO_PKG_VERSION")),
            device: backend.name().into(),
            device_description: backend.describe(),
            clock: backend.clock().into(),
            copy,
            launch_floor_us,
            eps: a.eps,
            weight_bias: a.weight_bias,
            global_scale: a.global_scale,
            seed: a.seed,
            rows,
            all_ok,
        };
        let text =
            serde_json::to_string_pretty(&report).map_err(|e| CliError(format!("JSON: {e}")))?;
        if let Some(f) = json_file.as_mut() {
            writeln!(f, "{text}")
                .map_err(|e| CliError(format!("cannot write --json {path}: {e}")))?;
            eprintln!("wrote {path}");
        } else if json_stdout {
            println!("{text}");
        }
    }
    Ok(all_ok)
}

/// `--format`: the library's names, with a message that lists every choice.
pub fn parse_format(s: &str) -> Result<Fp4Format, String> {
    s.parse::<Fp4Format>().map_err(|_| {
        format!("unknown format {s:?}: use nvfp4, mxfp4, or a block/scale pairing b16-e4m3, b16-ue8m0, b32-e4m3, b32-ue8m0")
    })
}

fn pick(given: &[usize], default: &[usize]) -> Vec<usize> {
    if given.is_empty() {
        default.to_vec()
    } else {
        given.to_vec()
    }
}

fn bench_one(
    backend: &dyn Backend,
    case: &Case,
    a: &BenchArgs,
    do_check: bool,
    target_s: f64,
    copy: &CopyBaseline,
) -> Result<Row, CliError> {
    let p = case.problem()?;
    let mut prep = backend.prepare(case)?;
    let (check, rows_checked, mismatch) = if do_check {
        prep.run_once()?;
        match check_against_reference(case, &*prep)? {
            (rows, None) => ("ok".to_string(), rows, None),
            (rows, Some(m)) => ("MISMATCH".to_string(), rows, Some(m)),
        }
    } else {
        ("skipped".to_string(), 0, None)
    };
    // One call (the check's, or one more) warms up, one more sizes the run; both count
    // as warm-up. Automatic: warm up for about 20 ms, time for about `target_s`, at least
    // 5 calls (3 for calls over 0.1 s).
    if !do_check {
        prep.run_once()?;
    }
    let est = prep.time(0, 1)?[0].max(1e-7);
    let mut warmup = 2;
    let extra_warmup = match a.warmup {
        Some(w) => w,
        None => ((0.02 / est).ceil() as usize)
            .clamp(1, 200)
            .saturating_sub(warmup),
    };
    warmup += extra_warmup;
    let min_reps = if est > 0.1 { 3 } else { 5 };
    let reps = a
        .reps
        .unwrap_or(((target_s / est).ceil() as usize).clamp(min_reps, 2000));
    let mut times = prep.time(extra_warmup, reps)?;
    let med = median(&mut times);
    let bytes = p.bytes_moved();
    let gbps = bytes as f64 / med / 1e9;
    // Graph replay: enough calls per graph for ~2 ms of work (launch gaps amortised, as
    // with triton.testing.do_bench_cudagraph), about target_s in all.
    let per_graph = ((2e-3 / est).ceil() as usize).clamp(1, 500);
    let replays = ((target_s / (est * per_graph as f64)).ceil() as usize).clamp(5, 300);
    let graph_us = match prep.time_graph(per_graph, replays) {
        Some(t) => Some(median(&mut t?) * 1e6),
        None => None,
    };
    drop(prep);
    let copy_same_bytes_gb_per_s = if graph_us.is_some() && bytes >= SAME_SIZE_COPY_MIN {
        Some(backend.copy_baseline(bytes as usize / 2, 10)?.gb_per_s)
    } else {
        None
    };
    Ok(Row {
        m: case.m,
        h: case.h,
        dtype: case.dtype.to_string(),
        format: case.opts.format.to_string(),
        layout: case.layout.to_string(),
        residual: case.residual.is_some(),
        y_out: case.y_out,
        bytes_moved: bytes,
        warmup,
        reps,
        median_us: med * 1e6,
        graph_us,
        graph_gb_per_s: graph_us.map(|us| bytes as f64 / us / 1e3),
        min_us: times[0] * 1e6,
        max_us: times[times.len() - 1] * 1e6,
        gb_per_s: gbps,
        vs_copy: gbps / copy.gb_per_s,
        copy_same_bytes_gb_per_s,
        check,
        rows_checked,
        mismatch,
    })
}

/// Runs the reference on the same inputs and compares every row. A large shape goes in
/// parts of whole 128-row tiles (a swizzled layout splits at tile bounds), a wave of as
/// many parts as there are threads at a time: the backend's outputs of the wave are read
/// on this thread (a GPU context is bound to it), then the reference runs on the parts in
/// parallel. Returns the rows checked and the first mismatch.
fn check_against_reference(
    case: &Case,
    prep: &dyn Prepared,
) -> Result<(usize, Option<String>), CliError> {
    let m = case.m;
    if m * case.h <= CHECK_PART_ELEMS {
        return Ok((m, check_part(case, 0, m, prep.outputs()?)?));
    }
    let part = (CHECK_PART_ELEMS / case.h).div_ceil(128).max(1) * 128;
    let starts: Vec<usize> = (0..m).step_by(part).collect();
    let mut rows = 0;
    for wave in starts.chunks(rayon::current_num_threads().max(1)) {
        let got = wave
            .iter()
            .map(|&s| {
                let len = part.min(m - s);
                Ok((s, len, prep.outputs_rows(s, len)?))
            })
            .collect::<Result<Vec<_>, CliError>>()?;
        let verdicts = got
            .into_par_iter()
            .map(|(s, len, g)| check_part(case, s, len, g))
            .collect::<Vec<_>>();
        for (v, &s) in verdicts.into_iter().zip(wave) {
            rows += part.min(m - s);
            if let Some(mm) = v? {
                return Ok((rows, Some(mm)));
            }
        }
    }
    Ok((rows, None))
}

/// The reference on rows `start .. start + len` of `case`, compared with `got` (the
/// backend's outputs of those rows): the first mismatch, if any.
fn check_part(
    case: &Case,
    start: usize,
    len: usize,
    got: Outputs,
) -> Result<Option<String>, CliError> {
    let sub = if (start, len) == (0, case.m) {
        case.clone()
    } else {
        case.rows(start, len)
    };
    let reference = HostBackend::reference();
    let mut p = reference.prepare(&sub)?;
    if let Err(e) = p.run_once() {
        return Ok(Some(format!(
            "the reference rejects this case ({e}) but the backend ran it"
        )));
    }
    let expected = p.outputs()?;
    Ok(compare(&sub, &expected, &got).map(|mm| {
        if start == 0 {
            mm.to_string()
        } else {
            format!("{mm} (rows counted from {start})")
        }
    }))
}

fn fmt_us(us: f64) -> String {
    if us < 10.0 {
        format!("{us:.2}")
    } else if us < 1000.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

fn fmt_mb(bytes: u64) -> String {
    let mb = bytes as f64 / 1e6;
    if mb < 10.0 {
        format!("{mb:.3}")
    } else {
        format!("{mb:.1}")
    }
}

fn print_table(out: &mut dyn Write, rows: &[Row], do_check: bool) -> Result<(), CliError> {
    let graphs = rows.iter().any(|r| r.graph_us.is_some());
    writeln!(
        out,
        "{:>6} {:>6}  {:<9} {:<5} {:<9} {:>9} {:>5} {:>10} {:>7} {:>7}{}  check",
        "M",
        "H",
        "format",
        "dtype",
        "layout",
        "MB/call",
        "reps",
        "median µs",
        "GB/s",
        "vs copy",
        if graphs {
            format!(
                " {:>9} {:>7} {:>7} {:>9}",
                "graph µs", "GB/s", "vs copy", "vs same"
            )
        } else {
            String::new()
        }
    )?;
    for r in rows {
        let check = if !do_check {
            "-".to_string()
        } else if r.rows_checked == r.m {
            r.check.clone()
        } else {
            format!("{} ({} of {} rows)", r.check, r.rows_checked, r.m)
        };
        let graph = match (r.graph_us, r.graph_gb_per_s) {
            (Some(us), Some(gb)) => format!(
                " {:>9} {:>7.1} {:>6.1}% {:>9}",
                fmt_us(us),
                gb,
                100.0 * r.vs_copy * gb / r.gb_per_s,
                match r.copy_same_bytes_gb_per_s {
                    Some(c) => format!("{:.1}%", 100.0 * gb / c),
                    None => "-".into(),
                }
            ),
            _ if graphs => format!(" {:>9} {:>7} {:>7} {:>9}", "-", "-", "-", "-"),
            _ => String::new(),
        };
        writeln!(
            out,
            "{:>6} {:>6}  {:<9} {:<5} {:<9} {:>9} {:>5} {:>10} {:>7.1} {:>6.1}%{}  {}",
            r.m,
            r.h,
            r.format,
            r.dtype,
            r.layout,
            fmt_mb(r.bytes_moved),
            r.reps,
            fmt_us(r.median_us),
            r.gb_per_s,
            r.vs_copy * 100.0,
            graph,
            check
        )?;
    }
    Ok(())
}
