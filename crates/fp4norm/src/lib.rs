//! # fp4norm
//!
//! The fused **residual add + RMSNorm + FP4 block quantisation** of LLM inference,
//! bit-exact to one contract (`SPEC.md`) on CPUs and NVIDIA GPUs:
//!
//! ```text
//! residual ← RNdt(input + residual)                       (in place)
//! y        ← RN32(RN32(residual · rstd) · weight)          rstd = 1/sqrt(mean(residual²) + eps) in f64
//! y_fp4    ← E2M1(y · inv_scale_b), one scale per block    (NVFP4: 16 × E4M3, MXFP4: 32 × UE8M0)
//! ```
//!
//! * [`cpu`] — the fast CPU backend (rayon + vectorised loops); also re-exported at the root.
//! * [`reference`](mod@reference) — the scalar reference: the spec, step by step.
//! * `cuda` — the GPU backend (feature `cuda`, on by default; no CUDA needed to build).
//! * [`codec`], [`layout`] — the number formats and scale layouts every backend shares.
//! * [`fp8`] — the FP8 members of the family (SPEC.md §8): E4M3/E5M2 elements, per-tensor
//!   or per-group scales (f32 or UE8M0, MXFP8 included), the weight bias of Gemma norms.
//! * [`sumsq`] — the row's sum of squares and rstd: the exact sum rounded once, which every
//!   backend reaches from its own fast sum (SPEC.md §1.2).
//!
//! ```
//! use fp4norm::{add_rmsnorm_fp4quant, Fp4Out, GlobalScale, MatMut, MatRef, Options, Problem, ScaleOut};
//! use fp4norm::layout::ScaleLayout;
//! use fp4norm::bf16;
//!
//! let (m, h) = (4, 64);
//! let x = vec![bf16::from_f32(0.25); m * h];
//! let mut residual = vec![bf16::from_f32(1.0); m * h];
//! let weight = vec![bf16::ONE; h];
//! let opts = Options::nvfp4();
//! // Problem gives every buffer size, so callers never compute one by hand.
//! let p = Problem::new(m, h, fp4norm::DType::BF16, ScaleLayout::Swizzled, &opts)?;
//! let mut y_fp4 = vec![0u8; p.fp4_len()];
//! let mut scales = vec![0u8; p.swizzled_scales_len()];
//! add_rmsnorm_fp4quant(
//!     MatRef::new(&x, m, h)?,
//!     MatMut::new(&mut residual, m, h)?,
//!     &weight,
//!     Fp4Out { y_fp4: &mut y_fp4, scales: ScaleOut::Swizzled(&mut scales), y_out: None },
//!     GlobalScale::Uniform(1.0),
//!     &opts,
//! )?;
//! assert_eq!(residual[0], bf16::from_f32(1.25));
//! // Every y is 1.0: scale 1/6 → E4M3 0.171875 (code 0x23); 1.0 / 0.171875 = 5.8 → E2M1 6.0 (0x7).
//! assert_eq!(scales[0], 0x23);
//! assert_eq!(y_fp4[0], 0x77);
//! # Ok::<(), fp4norm::Error>(())
//! ```

#![deny(missing_docs)]

pub mod codec;
pub mod cpu;
mod dequant;
mod error;
mod format;
pub mod fp8;
pub mod layout;
mod op;
mod problem;
pub mod raw;
pub mod reference;
pub mod sumsq;
mod tensor;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use cpu::{add_rmsnorm_fp4quant, rmsnorm_fp4quant};
pub use dequant::{dequantize, ScaleIn};
pub use error::{Error, Result};
pub use format::{BlockSize, DType, Element, Fp4Format, Options, ScaleFormat};
pub use fp8::{
    add_rmsnorm_fp8quant, dequantize as dequantize_fp8, rmsnorm_fp8quant, Fp8Element, Fp8Group,
    Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout, Fp8Scales, Fp8ScalesIn,
    Fp8Scaling,
};
pub use half::{bf16, f16};

// The README's Rust example is compiled and run as a doctest, with fp4norm as its only
// dependency.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExample;
pub use layout::ScaleLayout;
pub use problem::Problem;
pub use raw::{RawBuf, RawCall, RawDequant, RawGlobalScale, RawMat};
pub use tensor::{Fp4Out, GlobalScale, MatMut, MatRef, ScaleOut};
