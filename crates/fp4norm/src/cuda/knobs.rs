//! Every `FP4NORM_*` environment variable the CUDA backend reads (nothing else reads one):
//! two settings (where NVRTC and the cubin cache are) and knobs for testing and measuring,
//! none of which changes the bytes a call writes.
//!
//! The measurement knobs (from `FP4NORM_TUNE_SHAPE` on) say on stderr what they do when
//! set, and a value one cannot parse is reported and ignored, never silently measured as
//! the default; the settings and the two device overrides are silent. Each variable is
//! read once per process, except `FP4NORM_CACHE_DIR` (at every use) and the five that
//! `Gpu::new` reads (at every `Gpu::new`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

/// `FP4NORM_NVRTC_DIR=DIR`: the folder that holds `libnvrtc.so.*` (else the usual places).
pub(crate) fn nvrtc_dir() -> Option<OsString> {
    std::env::var_os("FP4NORM_NVRTC_DIR")
}

/// `FP4NORM_CACHE_DIR=DIR|off`: the cubin cache's folder, or none (default: ~/.cache/fp4norm).
pub(crate) fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("FP4NORM_CACHE_DIR") {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("fp4norm")),
    }
}

/// `FP4NORM_SOFTWARE_E2M1=1`: the software E2M1 encoder (plain `sm_XY`) where hardware has one.
pub(crate) fn software_e2m1() -> bool {
    std::env::var_os("FP4NORM_SOFTWARE_E2M1").is_some_and(|v| v != "0")
}

/// `FP4NORM_ASSUME_HW_CANONICAL_NAN=1|0`: the NaN fix-up compiled out (1) or in (0) on any GPU.
pub(crate) fn assume_hw_canonical_nan() -> Option<bool> {
    std::env::var("FP4NORM_ASSUME_HW_CANONICAL_NAN")
        .ok()
        .map(|v| v != "0")
}

/// `FP4NORM_SELFTEST=auto|rerun|hardware|literal`: the conversion self-test before a
/// device's first kernel (see `selftest`): its cached verdict or a run (`auto`, the
/// default), a run whatever is cached (`rerun`), or no test and the hardware conversions
/// (`hardware`) or the literal encoders (`literal`) taken as the verdict. Read at every
/// `Gpu::new`; an unknown value is reported and taken as `auto`.
pub(crate) fn selftest_mode() -> super::selftest::Mode {
    use super::selftest::Mode;
    match std::env::var("FP4NORM_SELFTEST").as_deref() {
        Err(_) | Ok("auto") | Ok("") => Mode::Auto,
        Ok("rerun") => Mode::Rerun,
        Ok("hardware") => Mode::Hardware,
        Ok("literal") => Mode::Literal,
        Ok(other) => {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| {
                eprintln!(
                    "fp4norm: FP4NORM_SELFTEST={other:?} is not auto, rerun, hardware or literal; auto"
                )
            });
            Mode::Auto
        }
    }
}

/// `FP4NORM_TUNED=off`: the built-in launch table, not the one `fp4norm tune` wrote. Read
/// at every `Gpu::new`.
pub(crate) fn use_tuned_table() -> bool {
    std::env::var("FP4NORM_TUNED").map_or(true, |v| v != "off" && v != "0")
}

/// `FP4NORM_TUNE_SHAPE=G,R,C`: the fused kernel's launch shape wherever it fits the call.
pub(crate) fn tune_shape() -> Option<(u32, u32, u32)> {
    let v = std::env::var("FP4NORM_TUNE_SHAPE").ok()?;
    let f: Option<Vec<u32>> = v.split(',').map(|t| t.trim().parse().ok()).collect();
    match f.as_deref() {
        Some(&[g, r, c]) => {
            eprintln!("fp4norm: FP4NORM_TUNE_SHAPE={g},{r},{c} (a measurement knob): launch shape forced where it fits");
            Some((g, r, c))
        }
        _ => {
            eprintln!("fp4norm: FP4NORM_TUNE_SHAPE={v:?} is not G,R,C (three integers); ignored");
            None
        }
    }
}

/// `FP4NORM_SWIZZLE_SPLIT=0|1`: every swizzled write direct (0) or split over two kernels (1).
pub(crate) fn swizzle_split() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_SWIZZLE_SPLIT",
        "every swizzled write split",
        "every swizzled write direct",
    )
}

/// `FP4NORM_SWIZZLE_KEEP=0|1`: direct swizzled words stored plainly (0) or evict-last in L2 (1).
pub(crate) fn swizzle_keep() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_SWIZZLE_KEEP",
        "direct swizzled words stored evict-last in L2",
        "direct swizzled words stored plainly",
    )
}

/// `FP4NORM_SWIZZLE_DEMOTE=0|1`: kept swizzled words left evict-last to the end (0) or
/// handed back to L2's normal eviction once their tile is complete (1, the default).
pub(crate) fn swizzle_demote() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_SWIZZLE_DEMOTE",
        "kept swizzled words demoted once their tile is complete",
        "kept swizzled words left evict-last to the end of the call",
    )
}

/// `FP4NORM_PAD_SPREAD=0|1`: the zero scales of the swizzled layout's padding rows written
/// by one CTA (or cluster) per padding row (0), or by every thread of the call's rows (1,
/// the default).
pub(crate) fn pad_spread() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_PAD_SPREAD",
        "swizzled padding rows zeroed by the threads of the call's rows",
        "swizzled padding rows zeroed by CTAs of their own",
    )
}

/// `FP4NORM_PAD_CTAS=0|1`: with the padding spread and few rows, the swizzled padding
/// zeroed by CTAs added after the rows' (1, the default) or by the rows' own threads after
/// their row (0).
pub(crate) fn pad_ctas() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_PAD_CTAS",
        "swizzled padding zeroed by CTAs added after the rows'",
        "swizzled padding zeroed by the rows' threads after their row",
    )
}

/// `FP4NORM_FP8_SCALES_KEEP=0|1`: FP8 column-major group scales stored plainly (0) or with
/// an L2 evict-last hint (1).
pub(crate) fn fp8_scales_keep() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_FP8_SCALES_KEEP",
        "column-major FP8 scales stored evict-last in L2",
        "column-major FP8 scales stored plainly",
    )
}

/// `FP4NORM_FP8_SCALES_REDUCE=0|1`: FP8 column-major group scales stored (0) or written as
/// one reduction each from the old bytes loaded at the kernel's start (1), where the fused
/// kernel writes them itself.
pub(crate) fn fp8_scales_reduce() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_FP8_SCALES_REDUCE",
        "column-major FP8 scales written as reductions",
        "column-major FP8 scales stored",
    )
}

/// `FP4NORM_FP8_SCALES_DEMOTE=0|1`: FP8 column-major scales kept by the direct write left
/// evict-last to the end of the call (0) or handed back to normal eviction a resident wave
/// and two lines of rows behind (1).
pub(crate) fn fp8_scales_demote() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_FP8_SCALES_DEMOTE",
        "kept column-major FP8 scales handed back to normal eviction a resident wave behind",
        "kept column-major FP8 scales left evict-last",
    )
}

/// `FP4NORM_FP8_SCALES_SPLIT=0|1`: FP8 column-major f32 group scales written directly (0)
/// or staged and reordered by a second kernel (1).
pub(crate) fn fp8_scales_split() -> Option<bool> {
    static KNOB: OnceLock<Option<bool>> = OnceLock::new();
    switch_knob_once(
        &KNOB,
        "FP4NORM_FP8_SCALES_SPLIT",
        "column-major FP8 scales split into staged stores and a second kernel",
        "column-major FP8 scales written directly",
    )
}

/// `FP4NORM_L2_PREFETCH_ROWS=N`: the L2 prefetch fetches the row N ahead (the GPU tests: 1).
pub(crate) fn l2_prefetch_rows() -> Option<u32> {
    static KNOB: OnceLock<Option<u32>> = OnceLock::new();
    *KNOB.get_or_init(|| {
        measurement_knob(
            "FP4NORM_L2_PREFETCH_ROWS",
            |raw| raw.parse().ok(),
            |n| format!("every kernel with the L2 prefetch prefetches the row {n} rows ahead"),
            "a row count",
        )
    })
}

/// `FP4NORM_L2_PREFETCH_MIB=N`: the L2 prefetch's budget of x and r ahead, in MiB (0: none).
pub(crate) fn l2_prefetch_mib() -> Option<u64> {
    static KNOB: OnceLock<Option<u64>> = OnceLock::new();
    *KNOB.get_or_init(|| {
        measurement_knob(
            "FP4NORM_L2_PREFETCH_MIB",
            |raw| raw.parse().ok(),
            |n| format!("L2 prefetch of at most {n} MiB of x and r ahead (0: none)"),
            "a size in MiB",
        )
    })
}

/// `FP4NORM_SMEM_CARVEOUT=P`: L1's preferred shared-memory share, % (every kernel but the copy).
pub(crate) fn smem_carveout() -> Option<i32> {
    static KNOB: OnceLock<Option<i32>> = OnceLock::new();
    *KNOB.get_or_init(|| {
        measurement_knob(
            "FP4NORM_SMEM_CARVEOUT",
            |raw| raw.trim().parse().ok().filter(|v| (0..=100).contains(v)),
            |v| format!("{v} % of L1 / shared memory preferred as shared"),
            "a percentage 0-100",
        )
    })
}

/// `FP4NORM_FORCE_EXACT_SUMSQ=1`: every row takes the rare exact-sum-of-squares path (for tests).
pub(crate) fn force_exact_sumsq() -> bool {
    static KNOB: OnceLock<bool> = OnceLock::new();
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

/// `FP4NORM_KERNEL_SOURCE=PATH`: other kernel sources, for A/B variants (see `kernel::source`).
pub(crate) fn kernel_source() -> Option<OsString> {
    std::env::var_os("FP4NORM_KERNEL_SOURCE")
}

/// Reads the knob `name` (its caller keeps the result in a `OnceLock`): `parse` turns its
/// value into a setting, announced on stderr as `describe` says; a value `parse` refuses
/// is reported as not `expected` and ignored.
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

/// A [`switch_knob`] read once per process into `cell`, described by the text for on or off.
fn switch_knob_once(
    cell: &'static OnceLock<Option<bool>>,
    name: &str,
    on_text: &str,
    off_text: &str,
) -> Option<bool> {
    *cell.get_or_init(|| switch_knob(name, |on| (if on { on_text } else { off_text }).into()))
}
