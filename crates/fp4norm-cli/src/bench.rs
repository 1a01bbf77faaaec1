//! `fp4norm bench`: time the ops (FP4, and the FP8 family) over realistic shapes, report
//! effective bandwidth against a memcpy measured in the same run, and check every result
//! against the reference.

use std::io::Write;
use std::time::Instant;

use fp4norm::fp8::{Fp8Problem, Fp8Scaling};
use fp4norm::{DType, Fp4Format, Options, Problem, ScaleLayout};
use rayon::prelude::*;
use serde::Serialize;

use crate::args;
use crate::backend::{self, median, Backend, CopyBaseline, Device, HostBackend, Prepared};
use crate::case::{compare, Case, Gs, Op, Outputs};
use crate::format::{parse_format, Format, Fp8Format, Fp8Kind};
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
    long_about = "Time the fused residual add + RMSNorm + FP4 or FP8 quantisation over a table of \
decode and prefill shapes (M tokens x hidden size H) and formats, and report the effective \
bandwidth: bytes moved per call (SPEC.md §6: x, residual read + written, weight, codes (packed \
FP4, or one byte per FP8 element), scales as written (padding included), y_out) divided by the \
median time of the timed calls. A plain copy of a large buffer, measured on the same device in \
the same run (bytes read + written), is the yardstick ('vs copy'); FP4 and FP8 rows of one run \
share it and one table.\n\n\
Formats (--format, comma-separated or repeated; FP4 and FP8 may be mixed):\n  \
FP4 (SPEC.md §1; scales in the --layout layouts):\n    \
nvfp4, mxfp4, or a block/scale pairing b16-e4m3, b16-ue8m0, b32-e4m3, b32-ue8m0\n  \
FP8 (SPEC.md §8; E4M3 elements, or E5M2 with the suffix -e5m2, e.g. fp8-token-e5m2):\n    \
fp8-tensor     per-tensor static scale (--fp8-scale; a GPU reads it from memory); no scale output\n    \
fp8-token      per-token f32 scales, row-major [M] (floor: --fp8-scale-floor)\n    \
fp8-group128   f32 scales per 128 elements, column-major [H/128, 4*ceil(M/4)] (DeepSeek-style);\n                   \
also fp8-group64, fp8-group32\n    \
mxfp8          UE8M0 scales per 32 elements, swizzled 128x4 (MXFP8)\n    \
fp8-<token|g32|g64|g128>-<f32|ue8m0>-<row-major|column-major|swizzled|column-major-packed>\n                   \
any other combination (swizzled: UE8M0 in groups of 32 only; column-major-packed, four\n                   \
UE8M0 codes to a word as DeepGEMM reads them: groups of 32, 64, 128 only)\n\
An FP8 format names its own scale layout: --layout applies to the FP4 formats only. Group \
formats need H a multiple of the group.\n\n\
Each shape gets fresh random inputs (never zero), the same for every format. Before timing, \
every output of one call (codes, scales including layout padding, updated residual, y_out) is \
compared byte for byte with fp4norm::reference on the same inputs, every row of every shape \
(large shapes in parts of whole 128-row tiles, the reference running on all cores). Any \
MISMATCH makes the exit status 1.\n\n\
The default table (6 M x 6 H x nvfp4, mxfp4; 7 H on a GPU) takes about a minute on 2 cores; --quick runs \
a few small shapes for CI. The table goes to stdout, progress (one line per shape) to stderr."
)]
pub struct BenchArgs {
    /// Token counts M (rows), comma-separated [default: 1,16,128,1024,4096,16384]
    #[arg(long, value_name = "M,..", value_delimiter = ',', num_args = 1..,
          value_parser = args::rows, allow_negative_numbers = true)]
    m: Vec<usize>,
    /// Hidden sizes H, comma-separated; each a multiple of every format's block or group size [default: 2048,4096,5120,7168,8192,16384, and 32768 on a GPU]
    #[arg(long, value_name = "H,..", value_delimiter = ',', num_args = 1..,
          value_parser = args::hidden, allow_negative_numbers = true)]
    h: Vec<usize>,
    /// Formats, comma-separated or repeated; FP4 and FP8 may be mixed: nvfp4, mxfp4,
    /// b16-ue8m0, b32-e4m3; fp8-tensor, fp8-token, fp8-group128 (and 32, 64), mxfp8, or
    /// fp8-{token|g32|g64|g128}-{f32|ue8m0}-{layout}; suffix -e5m2 for E5M2 FP8 elements
    /// (see --help) [default: nvfp4,mxfp4]
    #[arg(long = "format", value_name = "FORMAT", value_delimiter = ',', value_parser = parse_format)]
    formats: Vec<Format>,
    /// Element type of input, residual, weight and y_out: bf16 or f16; repeatable
    #[arg(
        long = "dtype",
        value_name = "DTYPE",
        value_delimiter = ',',
        default_value = "bf16"
    )]
    dtypes: Vec<DType>,
    /// FP4 scale layout: row-major, swizzled (128x4, what Blackwell GEMMs read) or both;
    /// repeatable (FP8 formats name their own layout)
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
    #[arg(long, value_name = "N", value_parser = args::count, allow_negative_numbers = true)]
    reps: Option<usize>,
    /// Untimed calls before timing, besides the check's call and one sizing call [default: enough for about 20 ms]
    #[arg(long, value_name = "N", value_parser = args::count0, allow_negative_numbers = true)]
    warmup: Option<usize>,
    /// Milliseconds of copies that keep the GPU busy before the copy baseline and the rows
    /// are timed (a GPU fresh from idle launches kernels slower for a while); 0: none
    /// [default: 1000; 0 with --quick]
    #[arg(long, value_name = "MS", value_parser = args::count0, allow_negative_numbers = true)]
    gpu_warmup_ms: Option<usize>,
    /// Also write the results as JSON to PATH ('-' for stdout; the table then goes to stderr)
    #[arg(long, value_name = "PATH")]
    json: Option<String>,
    /// Where to run: cpu, cuda, or auto (cuda if it can be opened, else cpu, saying why on
    /// stderr; FP4NORM_REQUIRE_GPU=1 makes that an error)
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
    #[arg(long, default_value_t = 1, value_parser = args::seed, allow_negative_numbers = true)]
    seed: u64,
    /// Size of the copy baseline's buffer in MiB [default: 2048 on a GPU, 512 on the CPU, 64 with --quick]
    #[arg(long, value_name = "MIB", value_parser = args::count, allow_negative_numbers = true)]
    copy_mib: Option<usize>,
    /// RMSNorm epsilon (finite, >= 0)
    #[arg(long, default_value_t = 1e-6, allow_hyphen_values = true)]
    eps: f32,
    /// Added to every weight (SPEC.md §8; 1 for Gemma's (1 + w)); finite
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    weight_bias: f32,
    /// Also time the chain "previous kernel -> fp4norm" with and without programmatic
    /// dependent launch (CUDA, sm_90+; not with --device cpu), for the small shapes of the table
    #[arg(long)]
    pdl: bool,
    /// FP4 global scale (used by E4M3 block scales); finite
    #[arg(
        long,
        value_name = "GS",
        default_value_t = 1.0,
        allow_hyphen_values = true
    )]
    global_scale: f32,
    /// The per-tensor scale s of fp8-tensor formats (q = FP8(y · RN32(1/s))); finite. On a
    /// GPU it is read from device memory, as a captured graph needs
    #[arg(
        long,
        value_name = "S",
        default_value_t = 1.0,
        allow_hyphen_values = true
    )]
    fp8_scale: f32,
    /// Floor of f32 dynamic FP8 scales (s = max(amax/FMAX, floor)); finite, >= 0; 0: none.
    /// vLLM's per-token quant uses 1/(448·512) = 4.3597e-6
    #[arg(
        long,
        value_name = "S_MIN",
        default_value_t = 0.0,
        allow_hyphen_values = true
    )]
    fp8_scale_floor: f32,
}

/// A kind of row the bench measures at every shape and dtype: an FP4 format in one scale
/// layout, or an FP8 format (whose name fixes its layout).
#[derive(Clone, Copy, Debug)]
enum Variant {
    Fp4(Fp4Format, ScaleLayout),
    Fp8(Fp8Format),
}

impl Variant {
    /// The op of this variant with the run's options.
    fn op(&self, a: &BenchArgs) -> Op {
        match *self {
            Variant::Fp4(format, layout) => Op::Fp4 {
                opts: Options::default()
                    .with_format(format)
                    .with_eps(a.eps)
                    .with_weight_bias(a.weight_bias),
                layout,
            },
            Variant::Fp8(f) => Op::fp8(
                f.options(a.fp8_scale, a.fp8_scale_floor)
                    .with_eps(a.eps)
                    .with_weight_bias(a.weight_bias),
            ),
        }
    }

    /// Progress-line label: the format, and the FP4 layout when several are measured.
    fn label(&self, several_layouts: bool) -> String {
        match self {
            Variant::Fp4(f, l) if several_layouts => format!("{f}/{l}"),
            Variant::Fp4(f, _) => f.to_string(),
            Variant::Fp8(f) => f.to_string(),
        }
    }
}

#[derive(Serialize)]
struct Row {
    m: usize,
    h: usize,
    dtype: String,
    /// The format as `--format` names it.
    format: String,
    /// The scale layout: FP4 `row-major` / `swizzled` / `both`, FP8 `row-major` /
    /// `column-major` / `swizzled`, or `none` (a per-tensor FP8 scale writes no scales).
    layout: String,
    /// `fp4` (SPEC.md §1) or `fp8` (SPEC.md §8).
    op: String,
    /// The code element: `e2m1`, `e4m3` or `e5m2`.
    element: String,
    /// Elements per scale (FP4 block, FP8 group; H for per-token); `None` per tensor.
    group: Option<usize>,
    /// How scales are stored: `e4m3` or `ue8m0` (FP4), `f32`, `ue8m0` or `static` (FP8).
    scale_format: String,
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
    /// Milliseconds of copies run before anything was timed (GPU only).
    gpu_warmup_ms: usize,
    /// µs per launch of a near-empty kernel replayed from a CUDA graph (GPU only).
    launch_floor_us: Option<f64>,
    /// The same, measured again after the rows: a change means the device's state moved
    /// during the run.
    launch_floor_end_us: Option<f64>,
    eps: f32,
    weight_bias: f32,
    global_scale: f32,
    /// The per-tensor scale of fp8-tensor rows.
    fp8_scale: f32,
    /// The floor of f32 dynamic FP8 scales.
    fp8_scale_floor: f32,
    seed: u64,
    rows: Vec<Row>,
    all_ok: bool,
}

impl BenchArgs {
    /// The checks of the command line that clap's parsers cannot make alone (they relate
    /// several options): a failure is a bad command line, exit status 2, before any work.
    pub fn check_usage(&self) -> Result<(), String> {
        if self.pdl && self.device == Device::Cpu {
            return Err(
                "--pdl: programmatic dependent launch is a CUDA launch feature; \
                 it needs --device cuda (or auto on a GPU)"
                    .into(),
            );
        }
        if let Some(&m) = self.m.iter().find(|&&m| m == 0) {
            return Err(format!(
                "--m {m}: M must be at least 1 (M = 0 moves no bytes)"
            ));
        }
        if !self.fp8_scale_floor.is_finite() || self.fp8_scale_floor < 0.0 {
            return Err(format!(
                "--fp8-scale-floor {}: the floor must be finite and >= 0 (0: no floor)",
                self.fp8_scale_floor
            ));
        }
        if !self.global_scale.is_finite() {
            return Err(format!(
                "--global-scale {}: the global scale must be finite",
                self.global_scale
            ));
        }
        if !self.fp8_scale.is_finite() {
            return Err(format!(
                "--fp8-scale {}: the per-tensor scale must be finite",
                self.fp8_scale
            ));
        }
        // The single values first: the shape checks below go through the library, which
        // would report a bad eps or weight bias as a shape's fault.
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
        for &h in &self.h {
            for f in self.formats() {
                match f {
                    Format::Fp4(f) => {
                        if h == 0 || h % f.block_size() != 0 {
                            return Err(format!(
                                "--h {h} does not fit format {f}: H must be a positive multiple of its block size {}",
                                f.block_size()
                            ));
                        }
                    }
                    Format::Fp8(f) => {
                        let opts = f.options(self.fp8_scale, self.fp8_scale_floor);
                        if let Err(e) = Fp8Problem::new(1, h, DType::BF16, &opts) {
                            return Err(format!("--h {h} does not fit format {f}: {e}"));
                        }
                    }
                }
            }
        }
        if self.reps == Some(0) {
            return Err("--reps must be at least 1".into());
        }
        if self.copy_mib == Some(0) {
            return Err("--copy-mib must be at least 1".into());
        }
        if let Some(mib) = self.copy_mib {
            if mib
                .checked_mul(1 << 20)
                .is_none_or(|bytes| bytes > isize::MAX as usize)
            {
                return Err(format!(
                    "--copy-mib {mib}: more bytes than this machine can address"
                ));
            }
        }
        // Every shape's buffers and byte counts must fit (the library says where they
        // overflow), for the shapes given and the largest of the default tables.
        let or_defaults = |given: &[usize], defaults: &[&[usize]]| {
            if given.is_empty() {
                defaults.iter().flat_map(|d| d.iter().copied()).collect()
            } else {
                given.to_vec()
            }
        };
        let ms = or_defaults(&self.m, &[DEFAULT_M, DEFAULT_M_GPU, QUICK_M]);
        let hs = or_defaults(&self.h, &[DEFAULT_H, DEFAULT_H_GPU, QUICK_H]);
        for &m in &ms {
            for &h in &hs {
                for v in self.variants() {
                    let r = match v.op(self) {
                        Op::Fp4 { opts, layout } => {
                            Problem::new(m, h, DType::BF16, layout, &opts).map(|_| ())
                        }
                        Op::Fp8 { opts, .. } => {
                            Fp8Problem::new(m, h, DType::BF16, &opts).map(|_| ())
                        }
                    };
                    if let Err(e) = r {
                        return Err(format!(
                            "--m {m} x --h {h} (format {}): {e}",
                            v.label(false)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The formats to measure: as given, or NVFP4 and MXFP4.
    fn formats(&self) -> Vec<Format> {
        if self.formats.is_empty() {
            vec![Format::Fp4(Fp4Format::NVFP4), Format::Fp4(Fp4Format::MXFP4)]
        } else {
            self.formats.clone()
        }
    }

    /// The rows measured at each shape and dtype, in the order of `--format`: each FP4
    /// format once per `--layout` (layouts outer, as the FP4 table always ran), each FP8
    /// format once, in the first layout's pass.
    fn variants(&self) -> Vec<Variant> {
        let mut v = Vec::new();
        for (i, &layout) in self.layouts.iter().enumerate() {
            for f in self.formats() {
                match f {
                    Format::Fp4(f) => v.push(Variant::Fp4(f, layout)),
                    Format::Fp8(f) if i == 0 => v.push(Variant::Fp8(f)),
                    Format::Fp8(_) => {}
                }
            }
        }
        v
    }
}

/// Calls of at most this many elements ready their variants' kernels together first.
const WARM_MAX_ELEMENTS: usize = 1 << 20;

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
    let formats = a.formats();
    let variants = a.variants();
    let fp8: Vec<Fp8Format> = formats
        .iter()
        .filter_map(|f| match f {
            Format::Fp8(f) => Some(*f),
            Format::Fp4(_) => None,
        })
        .collect();
    let has_fp4 = formats.iter().any(|f| matches!(f, Format::Fp4(_)));
    let do_check = a.check || !a.no_check; // the last of --check / --no-check wins
    let target_s = if a.quick { 0.02 } else { 0.15 };

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
    let gpu_warmup_ms = a.gpu_warmup_ms.unwrap_or(if a.quick { 0 } else { 1000 });
    if gpu && gpu_warmup_ms > 0 {
        eprintln!("keeping the GPU busy for {gpu_warmup_ms} ms before timing...");
        backend.keep_busy(gpu_warmup_ms as f64 * 1e-3)?;
    }
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
    let mut settings = vec![format!("eps {:e}", a.eps)];
    if a.weight_bias != 0.0 {
        settings.push(format!("weight bias {}", a.weight_bias));
    }
    if has_fp4 {
        settings.push(format!("FP4 global scale {}", a.global_scale));
    }
    if fp8.iter().any(|f| f.kind == Fp8Kind::PerTensor) {
        settings.push(format!(
            "FP8 per-tensor scale {}{}",
            a.fp8_scale,
            if gpu {
                " (read from device memory)"
            } else {
                ""
            }
        ));
    }
    if a.fp8_scale_floor != 0.0 && fp8.iter().any(|f| f.scale_format_name() == "f32") {
        settings.push(format!("FP8 f32 scale floor {:e}", a.fp8_scale_floor));
    }
    settings.push(format!(
        "y_out {}",
        if a.y_out { "written" } else { "not written" }
    ));
    writeln!(
        out,
        "op: {} + RMSNorm + {} quantisation, {}; bytes per call as in SPEC.md §6",
        if a.no_residual {
            "no residual"
        } else {
            "residual add (in place)"
        },
        match (has_fp4, !fp8.is_empty()) {
            (true, true) => "FP4 / FP8",
            (false, true) => "FP8",
            _ => "FP4",
        },
        settings.join(", ")
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
                // One set of inputs per shape and dtype, shared by every format.
                let mut case = Case::try_random_op(m, h, dtype, variants[0].op(&a), seed)
                    .map_err(|e| CliError(format!("M={m} H={h}: {e}")))?;
                case.gs = Gs::Uniform(a.global_scale);
                case.y_out = a.y_out;
                if a.no_residual {
                    case.residual = None;
                }
                // Up to decode sizes, where compiling would take longer than timing, every
                // variant's kernels are readied at once, in parallel (copies of such
                // inputs are cheap).
                if backend.warms() && variants.len() > 1 && m.saturating_mul(h) <= WARM_MAX_ELEMENTS
                {
                    let all: Vec<Case> = variants
                        .iter()
                        .map(|v| Case {
                            op: v.op(&a),
                            ..case.clone()
                        })
                        .collect();
                    backend.warm(&all);
                }
                for v in &variants {
                    case.op = v.op(&a);
                    let row = bench_one(&*backend, &case, &a, do_check, target_s, &copy)?;
                    let mut label = v.label(a.layouts.len() > 1);
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
            eprintln!("{progress}  ({:.1} s)", t_shape.elapsed().as_secs_f64());
        }
    }
    let all_ok = rows.iter().all(|r| r.check != "MISMATCH");

    print_table(&mut out, &rows, do_check)?;
    // The floor again after the rows: small calls' times sit on it, so a floor that moved
    // (clocks, other work on the device) makes them incomparable across the run.
    // A diagnostic: where it cannot be measured the run still reports its rows.
    let launch_floor_end_us = match (launch_floor_us, backend.launch_floor()) {
        (Some(_), Some(Ok(t))) => Some(t * 1e6),
        (Some(_), Some(Err(e))) => {
            eprintln!("warning: the launch floor after the rows was not measured: {e}");
            None
        }
        _ => None,
    };
    if let (Some(first), Some(last)) = (launch_floor_us, launch_floor_end_us) {
        writeln!(out, "launch floor after the rows: {last:.2} µs")?;
        if (last - first).abs() > 0.05 * first {
            writeln!(
                out,
                "WARNING: the launch floor moved from {first:.2} to {last:.2} µs during the run (the GPU's clocks or other work on it); small calls' times are not comparable across it"
            )?;
        }
    }
    if a.pdl && !gpu {
        // `auto` without CUDA (a CPU device is a usage error).
        writeln!(out)?;
        writeln!(
            out,
            "programmatic dependent launch: not measured (a CUDA launch feature; this run is on the {})",
            backend.name()
        )?;
    } else if a.pdl {
        writeln!(out)?;
        writeln!(
            out,
            "programmatic dependent launch: graph of N x (previous kernel: 1 MiB copy -> fp4norm), µs per pair"
        )?;
        let pdl_variants: Vec<&Variant> = variants
            .iter()
            .filter(|v| match v {
                Variant::Fp4(_, l) => *l == a.layouts[0],
                Variant::Fp8(_) => true,
            })
            .collect();
        let fw = pdl_variants
            .iter()
            .map(|v| v.label(false).len())
            .max()
            .unwrap_or(0)
            .max(9);
        writeln!(
            out,
            "{:>6} {:>6}  {:<fw$} {:>10} {:>10} {:>7}",
            "M", "H", "format", "no PDL", "PDL", "gain"
        )?;
        for &m in ms.iter().filter(|&&m| m <= 1024) {
            for &h in hs.iter().filter(|&&h| h <= 8192) {
                for v in &pdl_variants {
                    let case = Case::try_random_op(m, h, a.dtypes[0], v.op(&a), a.seed)?;
                    match backend.pdl_chain(&case) {
                        None => {
                            writeln!(out, "(this backend has no programmatic dependent launch)")?;
                            break;
                        }
                        Some(r) => {
                            let (plain, pdl) = r?;
                            writeln!(
                                out,
                                "{:>6} {:>6}  {:<fw$} {:>10} {:>10} {:>6.1}%",
                                m,
                                h,
                                v.label(false),
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
            "check: each row's outputs (codes, scales incl. layout padding, residual, y_out) from one call \
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
            gpu_warmup_ms: if gpu { gpu_warmup_ms } else { 0 },
            launch_floor_us,
            launch_floor_end_us,
            eps: a.eps,
            weight_bias: a.weight_bias,
            global_scale: a.global_scale,
            fp8_scale: a.fp8_scale,
            fp8_scale_floor: a.fp8_scale_floor,
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
    warmup = warmup.saturating_add(extra_warmup);
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
    let (op, element, group, scale_format) = match &case.op {
        Op::Fp4 { opts, .. } => (
            "fp4",
            "e2m1".to_string(),
            Some(opts.format.block_size()),
            opts.format.scale.name().to_string(),
        ),
        Op::Fp8 { opts, .. } => (
            "fp8",
            opts.element.to_string(),
            match opts.scaling {
                Fp8Scaling::PerTensor(_) => None,
                Fp8Scaling::Dynamic { group, .. } => Some(group.size(case.h)),
            },
            Fp8Format::of(opts).scale_format_name().to_string(),
        ),
    };
    Ok(Row {
        m: case.m,
        h: case.h,
        dtype: case.dtype.to_string(),
        format: case.op.format_name(),
        layout: case.op.layout_name().to_string(),
        op: op.into(),
        element,
        group,
        scale_format,
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
/// many parts as there are threads at a time, the reference on the parts in parallel. The
/// backend's outputs are read back once, on this thread (a GPU context is bound to it),
/// and each part's rows sliced from them: reading them per part made the check quadratic
/// in M. Returns the rows checked and the first mismatch.
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
    let all = prep.outputs()?;
    let mut rows = 0;
    for wave in starts.chunks(rayon::current_num_threads().max(1)) {
        let verdicts = wave
            .par_iter()
            .map(|&s| {
                let len = part.min(m - s);
                check_part(case, s, len, all.rows(case, s, len)?)
            })
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
    let part;
    let sub = if (start, len) == (0, case.m) {
        case
    } else {
        part = case.rows(start, len)?;
        &part
    };
    let reference = HostBackend::reference();
    let mut p = reference.prepare(sub)?;
    if let Err(e) = p.run_once() {
        return Ok(Some(format!(
            "the reference rejects this case ({e}) but the backend ran it"
        )));
    }
    let expected = p.outputs()?;
    Ok(compare(sub, &expected, &got).map(|mm| {
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
    // Columns as wide as the longest format and layout name (FP8 names run longer).
    let fw = rows
        .iter()
        .map(|r| r.format.len())
        .max()
        .unwrap_or(0)
        .max(9);
    let lw = rows
        .iter()
        .map(|r| r.layout.len())
        .max()
        .unwrap_or(0)
        .max(9);
    writeln!(
        out,
        "{:>6} {:>6}  {:<fw$} {:<5} {:<lw$} {:>9} {:>5} {:>10} {:>7} {:>7}{}  check",
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
            "{:>6} {:>6}  {:<fw$} {:<5} {:<lw$} {:>9} {:>5} {:>10} {:>7.1} {:>6.1}%{}  {}",
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

#[cfg(test)]
mod tests {
    use super::*;
    use fp4norm::fp8::{Fp8Element, Fp8Group, Fp8Options, Fp8ScaleFormat, Fp8ScaleLayout};

    /// A backend's call whose outputs have one FP8 scale byte flipped.
    struct OneWrongByte<'a> {
        inner: Box<dyn Prepared + 'a>,
        at: usize,
    }

    impl Prepared for OneWrongByte<'_> {
        fn run_once(&mut self) -> Result<(), fp4norm::Error> {
            self.inner.run_once()
        }
        fn reset(&mut self) -> Result<(), CliError> {
            self.inner.reset()
        }
        fn outputs(&self) -> Result<Outputs, CliError> {
            let mut o = self.inner.outputs()?;
            o.fp8_scales.as_mut().expect("FP8 scales")[self.at] ^= 0x01;
            Ok(o)
        }
    }

    #[test]
    fn the_check_finds_a_wrong_fp8_scale_and_passes_right_ones() {
        let opts = Fp8Options::dynamic(
            Fp8Element::E5M2,
            Fp8Group::G128,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        let case = Case::random_op(7, 256, DType::F16, Op::fp8(opts), 11);
        let cpu = HostBackend::fast();
        let mut right = cpu.prepare(&case).unwrap();
        right.run_once().unwrap();
        assert!(matches!(
            check_against_reference(&case, &*right),
            Ok((7, None))
        ));
        // Scale (row 5, group 1): element 1·8 + 5, its lowest byte.
        let mut wrong = OneWrongByte {
            inner: cpu.prepare(&case).unwrap(),
            at: 4 * 13,
        };
        wrong.run_once().unwrap();
        let (rows, mismatch) = check_against_reference(&case, &wrong).unwrap();
        let m = mismatch.expect("a mismatch");
        assert_eq!(rows, 7);
        assert!(
            m.starts_with("FP8 f32 scales scale 13 (column-major: row 5, group 1)"),
            "{m}"
        );
    }

    /// A shape past one check part: each part's rows are sliced from the one read-back, the
    /// column-major scales included, and a wrong byte in the last part is found there.
    #[test]
    fn the_check_in_parts_finds_a_wrong_byte_in_a_later_part() {
        let opts = Fp8Options::dynamic(
            Fp8Element::E4M3,
            Fp8Group::G128,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        let (m, h) = (600, 8192);
        assert!(m * h > CHECK_PART_ELEMS);
        let case = Case::random_op(m, h, DType::BF16, Op::fp8(opts), 12);
        let cpu = HostBackend::fast();
        let mut right = cpu.prepare(&case).unwrap();
        right.run_once().unwrap();
        assert!(matches!(
            check_against_reference(&case, &*right),
            Ok((600, None))
        ));
        // Scale (row 550, group 3) of [H/128, Mp4 = 600]: in the part of rows 512..600.
        let mut wrong = OneWrongByte {
            inner: cpu.prepare(&case).unwrap(),
            at: 4 * (3 * 600 + 550),
        };
        wrong.run_once().unwrap();
        let (rows, mismatch) = check_against_reference(&case, &wrong).unwrap();
        let mm = mismatch.expect("a mismatch");
        assert_eq!(rows, 600);
        assert!(
            mm.contains("row 38, group 3") && mm.ends_with("(rows counted from 512)"),
            "{mm}"
        );
    }
}
