//! **Not part of the API**: what the crate's own integration tests, examples and tools
//! need of the GPU backend's internals (kernel configurations, the launch table, NVRTC),
//! in one place. It may change or disappear in any release, without notice; nothing
//! outside this repository should use it.

use super::{Gpu, GsMode};
use crate::Problem;

pub use super::kernel::{
    compile, compile_and_report, launch_shape, Fp8KernelScaling, Fp8Spec, KernelConfig, KernelKind,
};
pub use super::nvrtc::{ensure_loaded, resource_usage, version, Compiled, ResourceUsage};

/// The launch shape `FP4NORM_TUNE_SHAPE=G,R,C` forces, if set (announced on stderr).
pub fn tune_shape() -> Option<(u32, u32, u32)> {
    super::knobs::tune_shape()
}

/// The kernel specialisation a call with these parameters uses on `gpu`.
pub fn config(gpu: &Gpu, problem: &Problem, gs: GsMode, aligned: bool) -> KernelConfig {
    gpu.config(problem, gs, aligned)
}

/// The kernel specialisation an FP8 call with these parameters uses on `gpu`.
pub fn fp8_config(
    gpu: &Gpu,
    problem: &crate::fp8::Fp8Problem,
    scale_in_memory: bool,
    aligned: bool,
) -> KernelConfig {
    gpu.fp8_config(problem, scale_in_memory, aligned)
}

/// `gpu` with every fused call's launch shape forced where it fits (`None`: the launch
/// table's), as `FP4NORM_TUNE_SHAPE` does: for testing at small sizes the shapes the
/// table picks only for large calls.
pub fn with_launch_shape(gpu: Gpu, shape: Option<(u32, u32, u32)>) -> Gpu {
    gpu.with_launch_shape(shape)
}

/// `gpu` planning its launches as if its DRAM streamed `bytes_per_s` (0: unknown), the one
/// device figure a launch rule reads that two Hopper parts differ in: for testing on one
/// GPU the write another would take (the split column-major scales).
pub fn with_dram_bandwidth(mut gpu: Gpu, bytes_per_s: u64) -> Gpu {
    gpu.limits.dram_bytes_per_s = bytes_per_s;
    gpu
}

/// `gpu` with its conversion path forced (`fast`: the hardware conversions, untested;
/// otherwise the literal encoders), as `FP4NORM_SELFTEST=hardware|literal` does for a
/// whole process: for testing the fallback path on a GPU whose self-test passes.
pub fn with_conversion_path(gpu: Gpu, fast: bool) -> Gpu {
    let _ = gpu.conversions.set(super::ConversionPath {
        fast,
        reason: "forced by the caller".into(),
    });
    gpu
}

/// Runs the conversion self-test on `gpu`'s device now, whatever is cached or forced, and
/// returns the first mismatch it found (`None`: passed). Neither caches nor settles.
pub fn run_selftest(gpu: &Gpu) -> Result<Option<String>, crate::Error> {
    let probe = with_conversion_path(Gpu::new(gpu.ordinal())?, true);
    super::selftest::run(&probe)
}

/// The file the self-test's verdict for `gpu`'s device, driver, compiler and kernel source
/// is cached in (`None` with the disk cache off).
pub fn selftest_verdict_file(gpu: &Gpu) -> Option<std::path::PathBuf> {
    super::selftest::verdict_file(gpu)
}

/// Forces the launch shape of every later fused call on `gpu` where it fits (`None`: the
/// tables'), as [`with_launch_shape`] does, on a shared `Gpu`.
pub fn set_launch_shape(gpu: &Gpu, shape: Option<(u32, u32, u32)>) {
    gpu.set_launch_shape(shape)
}

pub use super::kernel::shape_fits;
pub use super::tuned::{
    buckets as tune_buckets, candidates as tune_candidates, lock as lock_tuned_table,
    save as save_tuned_table, saved as saved_tuned_table, table_path as tuned_table_path,
};

/// `gpu` without the tuned launch table (the built-in table's shapes), as
/// `FP4NORM_TUNED=off` does for a whole process: what `fp4norm tune` measures against.
pub fn without_tuned_table(mut gpu: Gpu) -> Gpu {
    gpu.tuned = None;
    gpu
}
