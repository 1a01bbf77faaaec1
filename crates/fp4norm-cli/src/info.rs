//! `fp4norm info`: what this build can do.

use crate::backend::{self, Backend, HostBackend};
use crate::CliError;

pub fn run() -> Result<bool, CliError> {
    println!(
        "fp4norm {} (fused residual add + RMSNorm + FP4 quantisation, SPEC.md)",
        env!("CARGO_PKG_VERSION")
    );
    println!();
    println!("formats (--format):");
    println!("  nvfp4      16-element blocks, E4M3 scale, times a global scale");
    println!(
        "  mxfp4      32-element blocks, UE8M0 power-of-two scale (rounded up), no global scale"
    );
    println!("  b16-ue8m0  16-element blocks, UE8M0 scale (any block/scale pairing is allowed)");
    println!("  b32-e4m3   32-element blocks, E4M3 scale times a global scale");
    println!("dtypes (--dtype): bf16, f16");
    println!("scale layouts (--layout):");
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
    Ok(true)
}
