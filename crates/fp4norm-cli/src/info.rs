//! `fp4norm info`: what this build can do.

use crate::backend::{self, Backend, HostBackend};
use crate::CliError;

pub fn run() -> Result<bool, CliError> {
    println!(
        "fp4norm {} (fused residual add + RMSNorm + FP4 or FP8 quantisation, SPEC.md)",
        env!("CARGO_PKG_VERSION")
    );
    println!();
    println!("FP4 formats (--format, SPEC.md §1):");
    println!("  nvfp4      16-element blocks, E4M3 scale, times a global scale");
    println!(
        "  mxfp4      32-element blocks, UE8M0 power-of-two scale (rounded up), no global scale"
    );
    println!("  b16-ue8m0  16-element blocks, UE8M0 scale (any block/scale pairing is allowed)");
    println!("  b32-e4m3   32-element blocks, E4M3 scale times a global scale");
    println!("FP8 formats (--format, SPEC.md §8; E4M3 elements, or E5M2 with the suffix -e5m2):");
    println!("  fp8-tensor    per-tensor static scale (--fp8-scale), no scale output");
    println!("  fp8-token     per-token f32 scales, row-major [M]");
    println!("  fp8-group128  f32 scales per 128 elements, column-major [H/128, 4*ceil(M/4)] (also fp8-group32, fp8-group64)");
    println!("  mxfp8         UE8M0 scales per 32 elements, swizzled 128x4 (MXFP8)");
    println!("  fp8-<token|g32|g64|g128>-<f32|ue8m0>-<row-major|column-major|swizzled>  any other combination");
    println!("dtypes (--dtype): bf16, f16");
    println!("FP4 scale layouts (--layout; an FP8 format names its own):");
    println!("  row-major  sf[M, H/B]");
    println!("  swizzled   128x4 tiles for Blackwell block-scaled GEMMs, padding zeroed");
    println!("  both       both buffers from one pass");
    println!();
    println!("backends (--device):");
    let cpu = HostBackend::fast();
    println!("  {:<5} available: {}", cpu.name(), cpu.describe());
    match backend::open_cuda() {
        Ok(b) => println!("  {:<5} available: {}", b.name(), b.describe()),
        Err(e) => println!("  cuda  not available: {e}"),
    }
    println!("  (the scalar fp4norm::reference is the oracle every backend is checked against)");
    println!();
    // The tensor-parallel transports over NCCL (fp4norm::cuda::nccl) load it at run time.
    #[cfg(feature = "cuda")]
    match fp4norm::cuda::nccl::nccl_version() {
        Ok(v) => println!(
            "tensor parallel over NCCL: available (NCCL {}.{}.{})",
            v / 10000,
            v / 100 % 100,
            v % 100
        ),
        Err(e) => println!("tensor parallel over NCCL: not available: {e}"),
    }
    Ok(true)
}
