//! The CUDA C++ that NVRTC compiles, embedded in the crate (`kernels/fp4norm.cu`): a
//! specialisation's program is the source with the configuration's `#define`s prepended.
//!
//! The measurement knob `FP4NORM_KERNEL_SOURCE=FILE` names another source (an A/B variant
//! of the kernel, timed by the same binary in the same run: `scripts/gpu-check.sh ab`).
//! The knob says so on stderr once; a file that cannot be read is an error of every
//! compile, never a silent fallback to the default. A variant must keep the host's
//! parameter structs.

use std::sync::OnceLock;

use super::config::KernelConfig;
use crate::cuda::knobs;
use crate::Error;

/// The kernel source, embedded in the crate.
const SOURCE: &str = include_str!("../kernels/fp4norm.cu");

/// The kernel source this process compiles: [`SOURCE`], or the file
/// `FP4NORM_KERNEL_SOURCE` names (read once).
pub fn source_text() -> Result<&'static str, Error> {
    static TEXT: OnceLock<Result<&'static str, String>> = OnceLock::new();
    TEXT.get_or_init(|| match knobs::kernel_source() {
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

/// The full source of the specialisation `cfg`.
pub fn source(cfg: &KernelConfig) -> Result<String, Error> {
    Ok(format!("{}\n{}", cfg.defines(), source_text()?))
}
