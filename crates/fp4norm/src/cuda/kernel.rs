//! Kernel specialisations: configuration → NVRTC defines, launch shape, and the
//! compile cache (in process, thread-safe, compile once; and on disk).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;

use super::nvrtc;
use crate::{DType, Error, Problem, ScaleFormat};

/// The kernel source, embedded in the crate.
pub const SOURCE: &str = include_str!("kernels/fp4norm.cu");

/// The kernel source this process compiles: [`SOURCE`], unless the measurement knob
/// `FP4NORM_KERNEL_SOURCE=FILE` names another (an A/B variant of the kernel, timed by the
/// same binary in the same run: `scripts/gpu-check.sh ab`). The knob says so on stderr
/// once; a file that cannot be read is an error of every compile, never a silent
/// fallback to the default. A variant must keep the host's parameter struct.
pub fn source_text() -> Result<&'static str, Error> {
    static TEXT: std::sync::OnceLock<Result<&'static str, String>> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| match std::env::var_os("FP4NORM_KERNEL_SOURCE") {
        None => Ok(SOURCE),
        Some(path) => match std::fs::read_to_string(&path) {
            Ok(text) => {
                eprintln!("fp4norm: kernel source from FP4NORM_KERNEL_SOURCE={path:?} (a measurement knob)");
                Ok(Box::leak(text.into_boxed_str()))
            }
            Err(e) => Err(format!("FP4NORM_KERNEL_SOURCE={path:?}: {e}")),
        },
    })
    .clone()
    .map_err(|log| Error::Compile {
        config: "kernel source".into(),
        log,
    })
}

/// Which kernel of the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// `fp4norm_fused`: the op.
    Fused = 0,
    /// `fp4norm_dequant`: SPEC.md §4.
    Dequant = 1,
    /// `fp4norm_copy`: a 16-byte SM copy, the benchmarks' bandwidth yardstick.
    Copy = 2,
    /// `fp4norm_codec_check`: the fused kernel's fast encoders against the literal ones
    /// on every input (see [`crate::cuda::Gpu::codec_self_check`]).
    CodecCheck = 3,
    /// `fp4norm_swizzle`: the second kernel of a split swizzled write
    /// ([`KernelConfig::swizzle_split`]); `row_major` says where it reads the codes.
    Swizzle = 4,
}

/// How the global scale reaches the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GsMode {
    /// No global scale: 1.0 (and UE8M0, which does not use it).
    None,
    /// One value in device memory.
    Uniform,
    /// One value per row in device memory.
    PerRow,
}

/// One specialisation: everything that is a compile-time constant of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelConfig {
    /// Which kernel.
    pub kind: KernelKind,
    /// Element dtype.
    pub dtype: DType,
    /// Hidden size.
    pub h: usize,
    /// Block size (16 or 32).
    pub block: usize,
    /// UE8M0 (true) or E4M3 scales.
    pub ue8m0: bool,
    /// Write row-major scales.
    pub row_major: bool,
    /// Write swizzled scales.
    pub swizzled: bool,
    /// Residual add (false: `rmsnorm_fp4quant`).
    pub residual: bool,
    /// Write `y_out`.
    pub y_out: bool,
    /// Global-scale source.
    pub gs: GsMode,
    /// Hardware E2M1 conversion (sm_100a-class targets).
    pub hw_e2m1: bool,
    /// Trust the packed add/cvt to return the canonical NaN 0x7FFF (no fix-up code).
    pub hw_canonical_nan: bool,
    /// Every row takes the exact sum of squares, the path the kernel otherwise takes only
    /// for the rare rows whose f64 sum cannot decide rstd (a test knob:
    /// `FP4NORM_FORCE_EXACT_SUMSQ=1`; the bytes are the same either way).
    pub force_exact_sumsq: bool,
    /// Threads per row.
    pub threads_per_row: u32,
    /// Rows per CTA.
    pub rows_per_cta: u32,
    /// CTAs per row (a thread-block cluster); 1 = one CTA holds whole rows.
    pub cluster: u32,
    /// 16-byte vector accesses (false: the element-wise fallback).
    pub aligned: bool,
    /// Swizzled scales written by a second kernel, [`KernelKind::Swizzle`] (see
    /// `swizzle_split_wanted`): the fused kernel stages the codes with coalesced stores.
    pub swizzle_split: bool,
    /// The direct swizzled write's 4-byte words stored with an L2 evict-last policy (see
    /// `swizzle_keep_wanted`); only where `swizzled && aligned && !swizzle_split`.
    pub swizzle_keep: bool,
}

impl KernelConfig {
    /// The fused kernel's configuration for `p`, with the launch shape chosen for the
    /// device (see [`launch_shape`]).
    pub fn fused(
        p: &Problem,
        gs: GsMode,
        aligned: bool,
        hw_e2m1: bool,
        sm_count: u32,
        clusters: bool,
    ) -> Self {
        let (g, r, c) = launch_shape(p.h, p.block(), p.m, p.dtype, sm_count, clusters);
        // The swizzle pass moves 4-byte words: only for the vector kernel, whose
        // `aligned` implies 4-byte aligned scale pointers (any alignment is allowed).
        let swizzle_split = p.layout.has_swizzled()
            && aligned
            && swizzle_split_wanted(p.m, p.h, p.block(), clusters);
        KernelConfig {
            kind: KernelKind::Fused,
            dtype: p.dtype,
            h: p.h,
            block: p.block(),
            ue8m0: p.format.scale == ScaleFormat::UE8M0,
            row_major: p.layout.has_row_major(),
            swizzled: p.layout.has_swizzled(),
            residual: p.has_residual,
            y_out: p.has_y_out,
            gs: if p.format.scale == ScaleFormat::UE8M0 {
                GsMode::None
            } else {
                gs
            },
            hw_e2m1,
            hw_canonical_nan: false,
            force_exact_sumsq: false,
            threads_per_row: g,
            rows_per_cta: r,
            cluster: c,
            aligned,
            swizzle_split,
            swizzle_keep: p.layout.has_swizzled()
                && aligned
                && !swizzle_split
                && swizzle_keep_wanted(p.m, p.h),
        }
    }

    /// Replaces the launch shape (threads per row, rows per CTA, CTAs per row) with `shape`
    /// if the kernel supports it for this configuration's rows ([`shape_fits`]; `clusters`:
    /// whether the device has thread-block clusters), and says whether it did.
    pub fn try_launch_shape(&mut self, shape: (u32, u32, u32), clusters: bool) -> bool {
        let fits = shape_fits(self.h, self.block, shape, clusters);
        if fits {
            (self.threads_per_row, self.rows_per_cta, self.cluster) = shape;
        }
        fits
    }

    /// The swizzle pass that completes a fused call of this configuration, if it is split.
    pub fn swizzle_pass(&self) -> Option<KernelConfig> {
        (self.kind == KernelKind::Fused && self.swizzle_split).then(|| KernelConfig {
            h: self.h,
            block: self.block,
            row_major: self.row_major,
            swizzled: true,
            ..KernelConfig::shapeless(KernelKind::Swizzle)
        })
    }

    /// The configuration of a kernel that has no launch shape of its own (the copy
    /// yardstick, the codec self-check; the dequantisation and swizzle kernels set their
    /// format fields over it).
    pub fn shapeless(kind: KernelKind) -> Self {
        KernelConfig {
            kind,
            dtype: DType::BF16,
            h: 16,
            block: 16,
            ue8m0: false,
            row_major: false,
            swizzled: false,
            residual: false,
            y_out: false,
            gs: GsMode::None,
            hw_e2m1: false,
            hw_canonical_nan: false,
            force_exact_sumsq: false,
            threads_per_row: 32,
            rows_per_cta: 1,
            cluster: 1,
            aligned: true,
            swizzle_split: false,
            swizzle_keep: false,
        }
    }

    /// The kernel's entry point.
    pub fn function_name(&self) -> &'static str {
        match self.kind {
            KernelKind::Fused => "fp4norm_fused",
            KernelKind::Dequant => "fp4norm_dequant",
            KernelKind::Copy => "fp4norm_copy",
            KernelKind::CodecCheck => "fp4norm_codec_check",
            KernelKind::Swizzle => "fp4norm_swizzle",
        }
    }

    /// Threads per CTA.
    pub fn block_threads(&self) -> u32 {
        match self.kind {
            KernelKind::Fused => self.threads_per_row * self.rows_per_cta,
            KernelKind::Dequant => 256,
            KernelKind::Copy => 512,
            KernelKind::CodecCheck => 256,
            KernelKind::Swizzle => 256,
        }
    }

    /// The `#define`s that specialise the source.
    pub fn defines(&self) -> String {
        let b = |v: bool| v as u32;
        format!(
            "#define FP4_KIND {}\n#define FP4_F16 {}\n#define FP4_H {}\n#define FP4_BLOCK {}\n#define FP4_UE8M0 {}\n\
             #define FP4_ROW_MAJOR {}\n#define FP4_SWIZZLED {}\n#define FP4_RESIDUAL {}\n\
             #define FP4_Y_OUT {}\n#define FP4_GS {}\n#define FP4_HW_E2M1 {}\n#define FP4_HW_CANONICAL_NAN {}\n#define FP4_FORCE_EXACT_SUMSQ {}\n#define FP4_G {}\n\
             #define FP4_R {}\n#define FP4_C {}\n#define FP4_VEC_ALIGNED {}\n#define FP4_SWZ_SPLIT {}\n#define FP4_SWZ_KEEP {}\n\
             #define FP4_HOLD_IN_REGS {}\n#define FP4_MIN_CTAS {}\n",
            self.kind as u32,
            b(self.dtype == DType::F16),
            self.h,
            self.block,
            b(self.ue8m0),
            b(self.row_major),
            b(self.swizzled),
            b(self.residual),
            b(self.y_out),
            match self.gs {
                GsMode::None => 0,
                GsMode::Uniform => 1,
                GsMode::PerRow => 2,
            },
            b(self.hw_e2m1),
            b(self.hw_canonical_nan),
            b(self.force_exact_sumsq),
            self.threads_per_row,
            self.rows_per_cta,
            self.cluster,
            b(self.aligned),
            b(self.swizzle_split),
            b(self.swizzle_keep),
            b(self.holds_rows_in_registers()),
            self.min_ctas_per_sm(),
        )
    }

    /// Vectors (8 elements, 16 bytes) per thread of the fused kernel: a row's vectors over
    /// its CTAs, then over each CTA's threads per row (the kernel's `VPT`).
    pub fn vectors_per_thread(&self) -> usize {
        let vectors_per_cta = (self.h / 8) / self.cluster.max(1) as usize;
        vectors_per_cta.div_ceil(self.threads_per_row.max(1) as usize)
    }

    /// Whether the fused kernel keeps each row in registers between its two passes rather
    /// than re-reading it from L2 in the second (`FP4_HOLD_IN_REGS`): up to four vectors
    /// per thread, or eight in CTAs of at most 256 threads. Only rows held in registers
    /// get the L2 prefetch by default ([`l2_prefetch_rows`]).
    pub fn holds_rows_in_registers(&self) -> bool {
        let vpt = self.vectors_per_thread();
        vpt <= 4 || (vpt <= 8 && self.block_threads() <= 256)
    }

    /// The minimum of resident CTAs per SM that the fused kernel's launch bound asks for
    /// (`FP4_MIN_CTAS`; 1 = none beyond the CTA size): two CTAs of 512 threads, five of
    /// 256, ten of 128, which caps them at 64 or 48 registers.
    ///
    /// Without an explicit minimum, ptxas trades registers for occupancy and sinks some of
    /// pass 1's loads below the first arithmetic, so fewer loads are in flight; the bound
    /// is chosen where no kernel spills (the CI compile check). The element-wise fallback
    /// (unaligned rows) is not bounded: at 64 registers some of its kernels spill.
    pub fn min_ctas_per_sm(&self) -> u32 {
        if !self.aligned {
            return 1;
        }
        match self.block_threads() {
            512 => 2,
            256 => 5,
            128 => 10,
            _ => 1,
        }
    }

    /// The full source of this specialisation.
    pub fn source(&self) -> Result<String, Error> {
        Ok(format!("{}\n{}", self.defines(), source_text()?))
    }

    /// A one-line description for logs and errors.
    pub fn describe(&self) -> String {
        format!(
            "{:?} {} H={} B={} {} rm={} sw={} res={} y_out={} gs={:?} hw_e2m1={} hw_nan={} exact_ss={} G={} R={} C={} aligned={} swz_split={} swz_keep={}",
            self.kind,
            self.dtype,
            self.h,
            self.block,
            if self.ue8m0 { "ue8m0" } else { "e4m3" },
            self.row_major,
            self.swizzled,
            self.residual,
            self.y_out,
            self.gs,
            self.hw_e2m1,
            self.hw_canonical_nan,
            self.force_exact_sumsq,
            self.threads_per_row,
            self.rows_per_cta,
            self.cluster,
            self.aligned,
            self.swizzle_split,
            self.swizzle_keep
        )
    }
}

/// `FP4NORM_FORCE_EXACT_SUMSQ=1` (a test knob): every fused kernel computes every row's
/// exact sum of squares, the slow path it otherwise takes only for the rare rows whose f64
/// sum cannot decide rstd (see `rstd_checked` in the kernel source): the GPU tests run
/// their sweep under it to check that path in every launch shape. The bytes are the same.
pub fn force_exact_sumsq_knob() -> bool {
    static KNOB: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOB.get_or_init(|| {
        switch_knob("FP4NORM_FORCE_EXACT_SUMSQ", |on| {
            format!(
                "every row's sum of squares {}",
                if on {
                    "exact"
                } else {
                    "decided where it can be"
                }
            )
        })
        .unwrap_or(false)
    })
}

/// `FP4NORM_SMEM_CARVEOUT=P` (a measurement knob): the preferred share of the unified L1 /
/// shared memory given to shared memory, in percent (0-100), set on every kernel but the
/// benchmarks' copy yardstick as it is loaded
/// (`CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`); unset, the driver chooses. Any
/// other value is ignored, and says so.
fn smem_carveout_knob() -> Option<i32> {
    static KNOB: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    *KNOB.get_or_init(|| {
        measurement_knob(
            "FP4NORM_SMEM_CARVEOUT",
            |raw| raw.trim().parse().ok().filter(|v| (0..=100).contains(v)),
            |v| format!("{v} % of L1 / shared memory preferred as shared"),
            "a percentage 0-100",
        )
    })
}

/// Reads the measurement knob `name` (read once by its caller's `OnceLock`): `parse` turns
/// its value into a setting, which is announced on stderr as `describe` says; a value
/// `parse` refuses is reported as not `expected` and ignored.
fn measurement_knob<T>(
    name: &str,
    parse: impl Fn(&str) -> Option<T>,
    describe: impl Fn(&T) -> String,
    expected: &str,
) -> Option<T> {
    let raw = std::env::var(name).ok()?;
    let setting = parse(&raw);
    match &setting {
        Some(v) => eprintln!(
            "fp4norm: {name}={raw} (a measurement knob): {}",
            describe(v)
        ),
        None => eprintln!("fp4norm: {name}={raw:?} is not {expected}; ignored"),
    }
    setting
}

/// A [`measurement_knob`] that is `0` (off) or `1` (on).
fn switch_knob(name: &str, describe: impl Fn(bool) -> String) -> Option<bool> {
    measurement_knob(
        name,
        |raw| match raw {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        },
        |&on| describe(on),
        "0 or 1",
    )
}

/// A [`switch_knob`] read once per process into `cell` (its note printed once), described
/// by the text for on or off.
fn switch_knob_once(
    cell: &'static std::sync::OnceLock<Option<bool>>,
    name: &str,
    on_text: &str,
    off_text: &str,
) -> Option<bool> {
    *cell.get_or_init(|| switch_knob(name, |on| (if on { on_text } else { off_text }).into()))
}

/// Threads per row, rows per CTA and CTAs per row for `m` rows of `h` elements in blocks
/// of `block`, on a device of `sm_count` SMs (with thread-block `clusters` or not). Each
/// thread handles 8-element (16-byte) vectors. Every rule was measured on the H200; the
/// figures behind each are in BENCHMARKS.md.
///
/// * Many rows (more than SMs) are throughput-bound: two vectors per thread up to H = 4096,
///   four up to H = 16384, one row per CTA (short rows share a CTA, so that CTAs stay at
///   least 128 threads wide) and every row held in registers; longer rows take one CTA of
///   512 threads that re-reads its row from L2 in its second pass. With clusters, rows are
///   split over CTAs where that measured faster (the splits below): a split shortens the
///   last wave of a call and keeps long rows in registers, which the L2 prefetch needs.
/// * Few rows (at most the SMs) are latency-bound: each row is spread over up to `SMs / M`
///   CTAs (at most 8, a cluster, each on its own SM) with one vector per thread, so that
///   the rows together cover the SMs; fewer CTAs where that gives CTAs of whole warps
///   (down to half as many). Beyond 512 threads per CTA a thread takes more vectors,
///   except that a whole row of 2048 vectors or more in one CTA takes 1024 threads.
pub fn launch_shape(
    h: usize,
    block: usize,
    m: usize,
    dtype: DType,
    sm_count: u32,
    clusters: bool,
) -> (u32, u32, u32) {
    let nv = (h / 8).max(1);
    let vpb = (block / 8).max(1);
    let sms = sm_count.max(1) as usize;
    let latency = m <= sms;
    // Each CTA must own whole groups of four scale blocks (one 32-bit swizzled store).
    let fits = |c: usize| nv % c == 0 && (nv / c) % (4 * vpb) == 0;
    let (mut c, mut vectors_per_thread) = if latency {
        ((sms / m.max(1)).clamp(1, 8), 1)
    } else if nv <= 512 {
        (1, 2)
    } else if nv <= 2048 {
        (1, 4)
    } else {
        (1, nv.div_ceil(512))
    };
    if clusters && !latency {
        // Many rows: the measured cluster splits (CTAs per row, vectors per thread).
        let (split, split_vectors) = match nv {
            // H = 8192: two CTAs of 256 beat one CTA at every row count.
            1024 => (2, 2),
            // H = 5120: two CTAs of 160 beat one of 160 holding four vectors, up to 64
            // rows per SM; beyond, one CTA of 320 holding two (fewer registers).
            640 if m <= 64 * sms => (2, 2),
            640 => (1, 2),
            // H = 7168: two CTAs of 224 win only from 16 to 64 rows per SM.
            896 if m > 16 * sms && m <= 64 * sms => (2, 2),
            // f16, H = 32768: two CTAs of 512 beat eight of 256 from 16 rows per SM.
            4096 if dtype == DType::F16 && m > 16 * sms => (2, 4),
            // f16, H = 16384: one CTA of 512 beats four of 256 from 32 rows per SM.
            2048 if dtype == DType::F16 && m > 32 * sms => (1, 4),
            // H = 16384 / 32768: four / eight CTAs of 256 up to 64 rows per SM, held in
            // registers (where one CTA of 512 re-reads a row of 32768) ...
            2048 | 4096 if m <= 64 * sms => (nv / 512, 2),
            // ... then a row of 32768 in two CTAs of 512 holding four: still held.
            4096 => (2, 4),
            _ => (c, vectors_per_thread),
        };
        if split == 1 || fits(split) {
            (c, vectors_per_thread) = (split, split_vectors);
        }
    }
    if !clusters {
        c = 1;
    }
    while c > 1 && !fits(c) {
        c -= 1;
    }
    if latency {
        // Fewer CTAs of whole warps beat more CTAs with a ragged last warp, down to half
        // the CTAs (not measured further).
        if let Some(whole) = (1..=c)
            .rev()
            .find(|&k| 2 * k >= c && fits(k) && (nv / k) % 32 == 0)
        {
            c = whole;
        }
    }
    let nvc = nv / c;
    if latency {
        let max_threads = if c == 1 && nvc >= 2048 { 1024 } else { 512 };
        vectors_per_thread = nvc.div_ceil(max_threads);
    }
    let g = (nvc.div_ceil(vectors_per_thread).div_ceil(32).clamp(1, 32) * 32) as u32;
    let r = if c > 1 { 1 } else { (128 / g).max(1) };
    (g, r, c as u32)
}

/// Whether a call of `m` rows of `h` elements in blocks of `block` writes its swizzled
/// scales in two kernels (the fused kernel staging codes with coalesced stores kept in L2,
/// then the swizzle pass; `FP4_SWZ_SPLIT` in the kernel source), on GPUs with programmatic
/// dependent launch (sm_90+) to overlap the second launch: from 8192 rows and 8 MiB of
/// scales. Below, the direct write (its words kept in L2, [`swizzle_keep_wanted`]) is as
/// fast or faster, and at fewer rows the second launch's latency dominates.
/// `FP4NORM_SWIZZLE_SPLIT=0|1` (a measurement knob) forces it off or on.
pub fn swizzle_split_wanted(m: usize, h: usize, block: usize, pdl_capable: bool) -> bool {
    static KNOB: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let knob = switch_knob_once(
        &KNOB,
        "FP4NORM_SWIZZLE_SPLIT",
        "every swizzled write split",
        "every swizzled write direct",
    );
    let scale_bytes = m.saturating_mul(h / block.max(1));
    knob.unwrap_or(pdl_capable && m >= 8192 && scale_bytes >= 8 << 20)
}

/// Whether the direct swizzled write of a call of `m` rows of `h` stores its 4-byte words
/// with an L2 evict-last policy (`FP4_SWZ_KEEP` in the kernel source): from 2^24 elements.
/// The 128 x 4 layout fills each 32-byte sector from eight rows (four row quarters of a
/// 128-row tile, two rows each), so plain stores leave it part-filled in L2 while a large
/// call streams through; a smaller call's bytes mostly stay in L2 anyway, and there the
/// policy costs more than it saves. `FP4NORM_SWIZZLE_KEEP=0|1` (a measurement knob) forces
/// it off or on.
pub fn swizzle_keep_wanted(m: usize, h: usize) -> bool {
    static KNOB: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let knob = switch_knob_once(
        &KNOB,
        "FP4NORM_SWIZZLE_KEEP",
        "direct swizzled words stored evict-last in L2",
        "direct swizzled words stored plainly",
    );
    knob.unwrap_or(m.saturating_mul(h) >= 1 << 24)
}

/// Resident CTAs per SM of an aligned fused kernel: the minimum its launch bound asks for
/// ([`KernelConfig::min_ctas_per_sm`]), or, for CTA sizes it does not bound, what 64
/// registers per thread allow.
fn resident_ctas_per_sm(cfg: &KernelConfig) -> u32 {
    match cfg.min_ctas_per_sm() {
        1 => (65536 / (64 * cfg.block_threads().max(1))).max(1),
        bound => bound,
    }
}

/// How many rows ahead each row's CTA prefetches x and r into L2 (the kernel's `pf_rows`;
/// 0: none): at most one resident wave of rows, and at most the budget
/// ([`l2_prefetch_budget_mib`]) of x and r in flight ahead. Only the 16-byte vector kernels
/// of two or more vectors per thread prefetch (the one-vector kernels are the latency
/// shapes, M up to the SM count).
///
/// `FP4NORM_L2_PREFETCH_ROWS=N` (a test knob: the GPU tests force 1, so that every row's
/// prefetch addresses are exercised) and `FP4NORM_L2_PREFETCH_MIB=N` (a measurement knob:
/// the budget, 0 = off) override the rule.
pub fn l2_prefetch_rows(cfg: &KernelConfig, m: usize, h: usize, sm_count: u32) -> u32 {
    static ROWS: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    static MIB: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    if !cfg.aligned || cfg.kind != KernelKind::Fused {
        return 0;
    }
    let forced_rows = *ROWS.get_or_init(|| {
        measurement_knob(
            "FP4NORM_L2_PREFETCH_ROWS",
            |raw| raw.parse().ok(),
            |n| format!("every kernel with the L2 prefetch prefetches the row {n} rows ahead"),
            "a row count",
        )
    });
    if let Some(rows) = forced_rows {
        return rows;
    }
    let budget_mib = MIB
        .get_or_init(|| {
            measurement_knob(
                "FP4NORM_L2_PREFETCH_MIB",
                |raw| raw.parse().ok(),
                |n| format!("L2 prefetch of at most {n} MiB of x and r ahead (0: none)"),
                "a size in MiB",
            )
        })
        .unwrap_or_else(|| l2_prefetch_budget_mib(m, h, cfg.holds_rows_in_registers()));
    let wave = sm_count as u64 * resident_ctas_per_sm(cfg) as u64 * cfg.rows_per_cta as u64
        / cfg.cluster.max(1) as u64;
    let row_bytes = (h as u64 * 2) * if cfg.residual { 2 } else { 1 };
    let rows = wave.min((budget_mib << 20) / row_bytes.max(1));
    u32::try_from(rows).unwrap_or(u32::MAX)
}

/// The default L2 prefetch budget of a call of `m` rows of `h` elements whose kernel holds
/// its rows in registers (`held`), in MiB (0: none; `u64::MAX >> 20`: one resident wave):
/// one wave ahead from 2^25 elements where rows are held, none otherwise. Where the second
/// pass re-reads its row from L2, the prefetched rows evict it; below 2^25 elements a call
/// mostly stays in L2 anyway, and the prefetch gains in some shapes what it loses in others.
fn l2_prefetch_budget_mib(m: usize, h: usize, held: bool) -> u64 {
    if held && m.saturating_mul(h) >= 1 << 25 {
        u64::MAX >> 20
    } else {
        0
    }
}

/// A launch shape forced by `FP4NORM_TUNE_SHAPE=G,R,C` (threads per row, rows per CTA,
/// CTAs per row), for measuring launch-shape tables on a device. It applies only to
/// problems it is valid for ([`shape_fits`]); others keep [`launch_shape`].
pub fn tune_shape_from_env() -> Option<(u32, u32, u32)> {
    let v = std::env::var("FP4NORM_TUNE_SHAPE").ok()?;
    let f: Option<Vec<u32>> = v.split(',').map(|t| t.trim().parse().ok()).collect();
    match f.as_deref() {
        Some(&[g, r, c]) => {
            eprintln!("fp4norm: FP4NORM_TUNE_SHAPE={g},{r},{c} (a measurement knob): launch shape forced where it fits");
            Some((g, r, c))
        }
        _ => {
            // A measurement knob: say it is ignored rather than measure the default unawares.
            eprintln!("fp4norm: FP4NORM_TUNE_SHAPE={v:?} is not G,R,C (three integers); ignored");
            None
        }
    }
}

/// Whether the kernel supports launch shape `(g, r, c)` for rows of `h` elements in
/// blocks of `block`: whole warps, at most 1024 threads, a cluster of at most 8 CTAs
/// that each own whole groups of four scale blocks, and one row per clustered CTA.
pub fn shape_fits(h: usize, block: usize, shape: (u32, u32, u32), clusters: bool) -> bool {
    let (g, r, c) = (shape.0 as usize, shape.1 as usize, shape.2 as usize);
    let nv = h / 8;
    let vpb = (block / 8).max(1);
    g >= 32
        && g % 32 == 0
        && r >= 1
        && g * r <= 1024
        && (1..=8).contains(&c)
        && (c == 1 || (clusters && r == 1 && nv % c == 0 && (nv / c) % (4 * vpb) == 0))
}

/// Where compiled cubins are kept between processes: `FP4NORM_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/fp4norm`, else `~/.cache/fp4norm`. `FP4NORM_CACHE_DIR=off` disables it.
pub fn disk_cache_dir() -> Option<PathBuf> {
    match std::env::var_os("FP4NORM_CACHE_DIR") {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("fp4norm")),
    }
}

/// FNV-1a, 64 bits: a stable hash for cache file names (the full key is also stored in
/// the file and compared on load, so a collision cannot load a wrong kernel).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The disk-cache key of a specialisation: everything that determines the cubin (the
/// kernel source enters as two independent 64-bit hashes, to keep cache files small).
fn cache_key(cfg: &KernelConfig, arch: &str) -> Result<String, Error> {
    let nvrtc_version = nvrtc::version()?;
    let source = source_text()?;
    let mut reversed = source.as_bytes().to_vec();
    reversed.reverse();
    Ok(format!(
        "fp4norm {} nvrtc {:?} {arch} source {:016x}{:016x}\n{}",
        env!("CARGO_PKG_VERSION"),
        nvrtc_version,
        fnv1a(source.as_bytes()),
        fnv1a(&reversed),
        cfg.defines()
    ))
}

/// `<cache dir>/<arch>/<hash>.cubin`: one folder per target, so one can be shipped alone.
fn cache_file(arch: &str, key: &str) -> Option<PathBuf> {
    disk_cache_dir().map(|d| {
        d.join(arch)
            .join(format!("{:016x}.cubin", fnv1a(key.as_bytes())))
    })
}

/// A cubin from the disk cache, if present and made for exactly this key.
fn cache_load(arch: &str, key: &str) -> Option<Vec<u8>> {
    let bytes = std::fs::read(cache_file(arch, key)?).ok()?;
    // Layout: key length (u64 LE), key, cubin.
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    (bytes.len() > 8 + n && bytes.get(8..8 + n)? == key.as_bytes()).then(|| bytes[8 + n..].to_vec())
}

/// Stores a cubin in the disk cache. Best effort: a cache that cannot be written only
/// costs a recompile.
fn cache_store(arch: &str, key: &str, cubin: &[u8]) {
    let Some(f) = cache_file(arch, key) else {
        return;
    };
    let _ = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(f.parent().expect("has parent"))?;
        // A name of its own per process and per store, so two threads writing the same
        // specialisation never share a temporary file; the rename is atomic.
        static STORES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STORES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = f.with_extension(format!("tmp{}-{n}", std::process::id()));
        let mut data = (key.len() as u64).to_le_bytes().to_vec();
        data.extend_from_slice(key.as_bytes());
        data.extend_from_slice(cubin);
        std::fs::write(&tmp, data)?;
        std::fs::rename(&tmp, f)
    })();
}

/// Compiles a specialisation for `arch` afresh, past both caches.
pub fn compile(cfg: &KernelConfig, arch: &str) -> Result<nvrtc::Compiled, Error> {
    nvrtc::compile(&cfg.source()?, arch, &cfg.describe())
}

/// Compiles a specialisation for `arch`, through the disk cache.
pub fn compile_cached(cfg: &KernelConfig, arch: &str) -> Result<Vec<u8>, Error> {
    let key = cache_key(cfg, arch)?;
    if let Some(cubin) = cache_load(arch, &key) {
        return Ok(cubin);
    }
    let compiled = nvrtc::compile(&cfg.source()?, arch, &cfg.describe())?;
    cache_store(arch, &key, &compiled.cubin);
    Ok(compiled.cubin)
}

/// Compiles a specialisation afresh (bypassing the cache, so that the ptxas report is
/// current), stores it in the disk cache, and returns its resource usage. Needs NVRTC
/// but no GPU: CI uses it to check every specialisation for spills and local memory.
pub fn compile_and_report(cfg: &KernelConfig, arch: &str) -> Result<nvrtc::ResourceUsage, Error> {
    let key = cache_key(cfg, arch)?;
    let compiled = nvrtc::compile(&cfg.source()?, arch, &cfg.describe())?;
    cache_store(arch, &key, &compiled.cubin);
    nvrtc::resource_usage(&compiled.log, cfg.function_name()).ok_or_else(|| Error::Compile {
        config: cfg.describe(),
        log: format!(
            "no resource report for {} in the ptxas log:\n{}",
            cfg.function_name(),
            compiled.log
        ),
    })
}

type Slot = Arc<OnceLock<Result<CudaFunction, String>>>;

/// Loaded kernels of one device, one entry per specialisation. Concurrent callers asking
/// for the same specialisation wait for a single compile.
#[derive(Default)]
pub struct KernelCache {
    slots: Mutex<HashMap<KernelConfig, Slot>>,
    /// Specialisations built (compiled, or read from the disk cache) and loaded.
    builds: std::sync::atomic::AtomicUsize,
}

impl KernelCache {
    /// The loaded function for `cfg`, compiling and loading it on first use.
    pub fn get(
        &self,
        ctx: &Arc<CudaContext>,
        arch: &str,
        cfg: &KernelConfig,
    ) -> Result<CudaFunction, Error> {
        nvrtc::ensure_loaded()?;
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(*cfg).or_default().clone()
        };
        slot.get_or_init(|| {
            self.builds
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let cubin = compile_cached(cfg, arch).map_err(|e| e.to_string())?;
            let module = ctx
                .load_module(Ptx::from_binary(cubin))
                .map_err(|e| format!("loading {}: {e}", cfg.describe()))?;
            let f = module
                .load_function(cfg.function_name())
                .map_err(|e| format!("{}: {e}", cfg.function_name()))?;
            // The copy kernel is the bandwidth yardstick: the knob leaves it alone.
            if let Some(percent) = smem_carveout_knob().filter(|_| cfg.kind != KernelKind::Copy) {
                use cudarc::driver::sys::CUfunction_attribute_enum as A;
                f.set_attribute(
                    A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    percent,
                )
                .map_err(|e| format!("{}: shared memory carveout: {e}", cfg.function_name()))?;
            }
            Ok(f)
        })
        .clone()
        .map_err(|log| Error::Compile {
            config: cfg.describe(),
            log,
        })
    }

    /// Number of specialisations compiled (or being compiled) so far.
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Specialisations built and loaded so far: one per specialisation, however many
    /// callers asked for it at once.
    pub fn builds(&self) -> usize {
        self.builds.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    const SMS: u32 = 132;

    #[test]
    fn swizzled_writes_split_only_for_many_rows_and_8_mib_of_scales() {
        if std::env::var_os("FP4NORM_SWIZZLE_SPLIT").is_some() {
            return; // the knob overrides the table
        }
        assert!(!swizzle_split_wanted(16384, 4096, 16, true)); // 4 MiB of scales
        assert!(!swizzle_split_wanted(8192, 4096, 16, true));
        assert!(!swizzle_split_wanted(16384, 8192, 32, true)); // 4 MiB
        assert!(swizzle_split_wanted(16384, 8192, 16, true)); // 8 MiB
        assert!(swizzle_split_wanted(16384, 16384, 32, true));
        assert!(!swizzle_split_wanted(4096, 32768, 16, true)); // 8 MiB but few rows
        assert!(!swizzle_split_wanted(16384, 8192, 16, false));
    }

    #[test]
    fn swizzled_words_kept_in_l2_from_2_to_the_24_elements() {
        if std::env::var_os("FP4NORM_SWIZZLE_KEEP").is_some() {
            return; // the knob overrides the rule
        }
        assert!(swizzle_keep_wanted(4096, 4096));
        assert!(swizzle_keep_wanted(2048, 8192));
        assert!(swizzle_keep_wanted(8192, 2048));
        assert!(!swizzle_keep_wanted(4096, 2048));
        assert!(!swizzle_keep_wanted(1024, 8192));
        assert!(!swizzle_keep_wanted(usize::MAX, 0));
    }

    /// A bf16 NVFP4 row-major problem of `m` rows of `h` elements (the shape tests' usual).
    fn bf16_nvfp4_problem(m: usize, h: usize) -> crate::Problem {
        crate::Problem::new(
            m,
            h,
            DType::BF16,
            crate::ScaleLayout::RowMajor,
            &crate::Options::nvfp4(),
        )
        .expect("valid problem")
    }

    #[test]
    fn l2_prefetch_one_wave_ahead_from_2_to_the_25_elements_with_rows_held() {
        if std::env::var_os("FP4NORM_L2_PREFETCH_ROWS").is_some()
            || std::env::var_os("FP4NORM_L2_PREFETCH_MIB").is_some()
        {
            return; // the knobs override the rule
        }
        let rows = |m: usize, h: usize, aligned: bool| {
            let p = bf16_nvfp4_problem(m, h);
            let cfg = KernelConfig::fused(&p, GsMode::Uniform, aligned, false, SMS, true);
            l2_prefetch_rows(&cfg, m, h, SMS)
        };
        // One resident wave: 132 SMs x 5 CTAs of 256 threads (one row each) ...
        assert_eq!(rows(16384, 4096, true), 660);
        assert_eq!(rows(8192, 4096, true), 660);
        // ... of two-CTA clusters (H = 8192), of 512-thread CTAs (two per SM), of 224-thread
        // CTAs (four per SM at 64 registers), of 8-CTA clusters (2048 x 32768).
        assert_eq!(rows(16384, 8192, true), 330);
        assert_eq!(rows(16384, 16384, true), 264);
        assert_eq!(rows(16384, 7168, true), 528);
        assert_eq!(rows(2048, 32768, true), 82);
        // ... of two-CTA clusters of 512 threads (16384 x 32768: four vectors per thread).
        assert_eq!(rows(16384, 32768, true), 132);
        // None below 2^25 elements, where the second pass re-reads its row (one CTA of 512
        // at H = 32768, without clusters), or without 16-byte vectors.
        assert_eq!(rows(4096, 4096, true), 0);
        assert_eq!(rows(1024, 8192, true), 0);
        assert_eq!(rows(16384, 4096, false), 0);
        let p = bf16_nvfp4_problem(16384, 32768);
        let unclustered = KernelConfig::fused(&p, GsMode::Uniform, true, false, SMS, false);
        assert_eq!(l2_prefetch_rows(&unclustered, 16384, 32768, SMS), 0);
    }

    #[test]
    fn the_kernel_takes_its_register_hold_and_launch_bound_from_the_host() {
        let p = bf16_nvfp4_problem(16384, 32768);
        let shaped = |shape: (u32, u32, u32), aligned: bool| {
            let mut cfg = KernelConfig::fused(&p, GsMode::Uniform, aligned, false, SMS, true);
            assert!(cfg.try_launch_shape(shape, true), "{shape:?}");
            cfg
        };
        // (vectors per thread, held, launch bound) per shape of a row of 4096 vectors.
        for (shape, vpt, held, min_ctas) in [
            ((256, 1, 8), 2, true, 5),  // eight CTAs of 256
            ((512, 1, 2), 4, true, 2),  // two CTAs of 512
            ((256, 1, 2), 8, true, 5),  // eight vectors in a CTA of 256 still held
            ((512, 1, 1), 8, false, 2), // ... not in one of 512: the re-reading CTA
            ((1024, 1, 1), 4, true, 1), // no launch bound beyond the size
            ((224, 1, 1), 19, false, 1),
        ] {
            let cfg = shaped(shape, true);
            assert_eq!(cfg.vectors_per_thread(), vpt, "{shape:?}");
            assert_eq!(cfg.holds_rows_in_registers(), held, "{shape:?}");
            assert_eq!(cfg.min_ctas_per_sm(), min_ctas, "{shape:?}");
            let defines = cfg.defines();
            assert!(defines.contains(&format!("#define FP4_HOLD_IN_REGS {}\n", held as u32)));
            assert!(defines.contains(&format!("#define FP4_MIN_CTAS {min_ctas}\n")));
        }
        // The element-wise fallback (unaligned rows) is never bounded.
        assert_eq!(shaped((512, 1, 1), false).min_ctas_per_sm(), 1);
    }

    #[test]
    fn launch_table_is_the_measured_one() {
        // BENCHMARKS.md (H200): (H, M) -> (G, R, C).
        for (h, m, want) in [
            (1024, 65536, (64, 2, 1)),
            (2048, 32768, (128, 1, 1)),
            (4096, 16384, (256, 1, 1)),
            (5120, 8192, (160, 1, 2)),
            (5120, 16384, (320, 1, 1)),
            (7168, 16384, (224, 1, 1)),
            (8192, 8192, (256, 1, 2)),
            (8192, 1024, (256, 1, 2)),
            (16384, 1024, (256, 1, 4)),
            (16384, 4096, (256, 1, 4)),
            (16384, 16384, (512, 1, 1)),
            (7168, 8192, (224, 1, 2)),
            (7168, 2048, (224, 1, 1)),
            (32768, 2048, (256, 1, 8)),
            (32768, 8192, (256, 1, 8)),
            (32768, 16384, (512, 1, 2)), // four vectors per thread, held
            (32768, 4096 * 64, (512, 1, 2)),
            (4096, 1, (64, 1, 8)),
            (8192, 16, (128, 1, 8)),
            (5120, 1, (128, 1, 5)),
            (7168, 16, (128, 1, 7)),
            (2816, 1, (96, 1, 4)), // whole warps only at 1 CTA: the ragged 4 stay
            (8192, 128, (512, 1, 1)),
            (16384, 128, (1024, 1, 1)), // one CTA, 2048 vectors: 1024 threads
            (32768, 100, (1024, 1, 1)),
            (32768, 64, (512, 1, 2)), // split rows keep 512-thread CTAs
        ] {
            assert_eq!(
                launch_shape(h, 16, m, DType::BF16, SMS, true),
                want,
                "H={h} M={m}"
            );
        }
        // The limits of the many-row splits (132 SMs): 64 rows per SM at H = 5120, 16384
        // and 32768, 16 to 64 at H = 7168; just above the SM count the splits already apply.
        assert_eq!(
            launch_shape(5120, 16, 8448, DType::BF16, SMS, true),
            (160, 1, 2)
        );
        assert_eq!(
            launch_shape(5120, 16, 8449, DType::BF16, SMS, true),
            (320, 1, 1)
        );
        assert_eq!(
            launch_shape(5120, 32, 16384, DType::F16, SMS, true),
            (320, 1, 1)
        );
        // Without clusters, four vectors in 160 threads at every M beyond the SMs.
        assert_eq!(
            launch_shape(5120, 16, 16384, DType::BF16, SMS, false),
            (160, 1, 1)
        );
        assert_eq!(
            launch_shape(7168, 16, 2112, DType::BF16, SMS, true),
            (224, 1, 1)
        );
        assert_eq!(
            launch_shape(7168, 16, 2113, DType::BF16, SMS, true),
            (224, 1, 2)
        );
        assert_eq!(
            launch_shape(7168, 16, 8448, DType::BF16, SMS, true),
            (224, 1, 2)
        );
        assert_eq!(
            launch_shape(7168, 16, 8449, DType::BF16, SMS, true),
            (224, 1, 1)
        );
        assert_eq!(
            launch_shape(16384, 16, 8448, DType::BF16, SMS, true),
            (256, 1, 4)
        );
        assert_eq!(
            launch_shape(16384, 16, 8449, DType::BF16, SMS, true),
            (512, 1, 1)
        );
        assert_eq!(
            launch_shape(32768, 16, 8448, DType::BF16, SMS, true),
            (256, 1, 8)
        );
        assert_eq!(
            launch_shape(32768, 16, 8449, DType::BF16, SMS, true),
            (512, 1, 2)
        );
        assert_eq!(
            launch_shape(32768, 32, 8449, DType::BF16, SMS, true),
            (512, 1, 2)
        );
        assert_eq!(
            launch_shape(32768, 16, 133, DType::BF16, SMS, true),
            (256, 1, 8)
        );
        // Without clusters (pre-Hopper) a row is never split, and many rows keep the
        // single-CTA shape.
        assert_eq!(launch_shape(4096, 16, 1, DType::BF16, SMS, false).2, 1);
        assert_eq!(
            launch_shape(8192, 16, 8192, DType::BF16, SMS, false),
            (256, 1, 1)
        );
        assert_eq!(
            launch_shape(32768, 32, 2048, DType::BF16, SMS, false),
            (512, 1, 1)
        );
        // f16 rows of 32768 take the two CTAs of 512 from 16 rows per SM; bf16 from 64.
        assert_eq!(
            launch_shape(32768, 16, 2112, DType::F16, SMS, true),
            (256, 1, 8)
        );
        assert_eq!(
            launch_shape(32768, 16, 2113, DType::F16, SMS, true),
            (512, 1, 2)
        );
        assert_eq!(
            launch_shape(32768, 32, 8192, DType::F16, SMS, true),
            (512, 1, 2)
        );
        assert_eq!(
            launch_shape(32768, 16, 8192, DType::BF16, SMS, true),
            (256, 1, 8)
        );
        // f16 rows of 16384 take one CTA of 512 from 32 rows per SM; bf16 from 64.
        assert_eq!(
            launch_shape(16384, 16, 4224, DType::F16, SMS, true),
            (256, 1, 4)
        );
        assert_eq!(
            launch_shape(16384, 16, 4225, DType::F16, SMS, true),
            (512, 1, 1)
        );
        assert_eq!(
            launch_shape(16384, 32, 8192, DType::F16, SMS, true),
            (512, 1, 1)
        );
        assert_eq!(
            launch_shape(16384, 16, 8192, DType::BF16, SMS, true),
            (256, 1, 4)
        );
        // MXFP4's blocks split the same way.
        assert_eq!(
            launch_shape(5120, 32, 4096, DType::BF16, SMS, true),
            (160, 1, 2)
        );
    }

    #[test]
    fn every_chosen_shape_is_one_the_kernel_supports() {
        for h in (16..=65536usize)
            .step_by(16)
            .filter(|h| h % 160 == 0 || h.is_power_of_two())
        {
            for block in [16, 32] {
                if h % block != 0 {
                    continue;
                }
                for m in [1, 2, 7, 16, 66, 128, 132, 133, 1000, 16384] {
                    for clusters in [true, false] {
                        for dtype in [DType::BF16, DType::F16] {
                            let s = launch_shape(h, block, m, dtype, SMS, clusters);
                            assert!(
                                shape_fits(h, block, s, clusters),
                                "H={h} B={block} M={m} {dtype:?}: {s:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn shape_fits_refuses_what_the_kernel_cannot_run() {
        assert!(!shape_fits(4096, 16, (48, 1, 1), true)); // not whole warps
        assert!(!shape_fits(4096, 16, (512, 4, 1), true)); // 2048 threads
        assert!(!shape_fits(4096, 16, (64, 2, 8), true)); // clustered CTAs own one row
        assert!(!shape_fits(4096, 16, (64, 1, 8), false)); // no clusters on this device
        assert!(!shape_fits(5120, 16, (64, 1, 3), true)); // 640 vectors do not split in 3
        assert!(!shape_fits(4096, 16, (32, 1, 16), true)); // at most 8 CTAs per cluster
        assert!(shape_fits(4096, 16, (64, 1, 8), true));
    }
}
