//! Kernel specialisations, the GPU backend's internal policy: what one is ([`config`]),
//! what a call of a given size launches ([`launch_table`]), the CUDA source NVRTC compiles
//! for it ([`source`]), and the caches that build each one once ([`cache`]). Not API: the
//! crate's tests and examples reach the parts they need through `cuda::internal`.

mod cache;
mod config;
mod launch_table;
mod source;

pub(crate) use cache::fnv1a;
pub use cache::{compile, compile_and_report, KernelCache};
pub use config::{Fp8KernelScaling, Fp8Spec, GsMode, KernelConfig, KernelKind};
pub use launch_table::{l2_prefetch_rows, launch_shape, pad_cta_count, shape_fits};
pub(crate) use source::fingerprint as source_fingerprint;

/// A bf16 NVFP4 row-major problem of `m` rows of `h` elements (the unit tests' usual).
#[cfg(test)]
fn bf16_nvfp4_problem(m: usize, h: usize) -> crate::Problem {
    crate::Problem::new(
        m,
        h,
        crate::DType::BF16,
        crate::ScaleLayout::RowMajor,
        &crate::Options::nvfp4(),
    )
    .expect("valid problem")
}
