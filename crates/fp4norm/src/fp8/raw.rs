//! The FP8 ops by address: [`RawFp8Call`] describes one call wherever its memory lives,
//! [`RawFp8Call::validate`] is its validator (the FP8 rules of [`super::Fp8Problem`] plus
//! lengths, extents, alignment and overlaps, as [`crate::RawCall::validate`] does for the
//! FP4 op), and [`run_host_fp8`] runs a validated call over host memory. The CUDA backend
//! (`cuda::Gpu::launch_fp8_raw`, feature `cuda`) and the Python module run the same validator.

use super::{Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat, Fp8Scales, Fp8Scaling};
use crate::raw::{
    byte_len, check_mat, check_overlaps, check_ptr, host_mat, host_mat_mut, host_slice,
    host_slice_mut, HostEngine, Range, RawBuf, RawMat,
};
use crate::{bf16, f16, DType, Element, Error};

/// One FP8 call (SPEC.md §8) by address. `residual: None` is `rmsnorm_fp8quant`.
#[derive(Clone, Copy, Debug)]
pub struct RawFp8Call {
    /// Element dtype of x, residual, weight and y_out.
    pub dtype: DType,
    /// Input `[M, H]`, read only.
    pub x: RawMat,
    /// Residual `[M, H]`, updated in place.
    pub residual: Option<RawMat>,
    /// Weight, `H` elements.
    pub weight: RawBuf,
    /// FP8 codes, `M · H` bytes, row by row.
    pub q: RawBuf,
    /// Dynamic scales: [`Fp8Problem::scales_len`] f32 values or UE8M0 bytes in the options'
    /// layout; `None` for a per-tensor scale.
    pub scales: Option<RawBuf>,
    /// A per-tensor scale by address (one f32, read when the call runs, so that a captured
    /// CUDA graph sees new values on replay); `None` takes the value in the options.
    pub static_scale: Option<RawBuf>,
    /// Optional `[M, H]` normalised values in the dtype.
    pub y_out: Option<RawMat>,
    /// Element format, scaling, eps, weight bias.
    pub options: Fp8Options,
}

/// What [`RawFp8Call::validate`] found.
#[derive(Clone, Debug)]
pub struct Fp8Checked {
    /// Shape, options and byte counts of the call.
    pub problem: Fp8Problem,
    /// Every byte range the call reads or writes (empty ones left out).
    pub ranges: Vec<Range>,
    /// Whether rows, weight and outputs allow vector access (rows and weight 16-byte
    /// aligned, `q` 8-byte aligned, scales aligned to 4 bytes): the CUDA fast path.
    pub vector_aligned: bool,
}

impl RawFp8Call {
    /// Checks the call: the options and shape ([`Fp8Problem::new`]), the scale buffer
    /// against the scaling (none for a per-tensor scale, the exact length otherwise),
    /// allocation lengths, 64-bit extents, null and misaligned pointers, overlaps of written
    /// buffers with anything else. Nothing is read or written. With `M = 0` only shapes,
    /// options and lengths are checked.
    pub fn validate(&self) -> Result<Fp8Checked, Error> {
        let (m, h) = (self.x.rows, self.x.cols);
        let p = Fp8Problem {
            has_residual: self.residual.is_some(),
            has_y_out: self.y_out.is_some(),
            ..Fp8Problem::new(m, h, self.dtype, &self.options)?
        };
        let e = self.dtype.size();
        let mut ranges = Vec::with_capacity(8);
        ranges.push(Range::new(
            "input",
            self.x.ptr,
            check_mat("input", &self.x, m, h, e)?,
            false,
        )?);
        if let Some(r) = &self.residual {
            ranges.push(Range::new(
                "residual",
                r.ptr,
                check_mat("residual", r, m, h, e)?,
                true,
            )?);
        }
        if let Some(y) = &self.y_out {
            ranges.push(Range::new(
                "y_out",
                y.ptr,
                check_mat("y_out", y, m, h, e)?,
                true,
            )?);
        }
        if let Some(len) = self.weight.len {
            if len != h {
                return Err(Error::WeightLength {
                    expected: h,
                    got: len,
                });
            }
        }
        ranges.push(Range::new(
            "weight",
            self.weight.ptr,
            byte_len(h, e)?,
            false,
        )?);
        p.check_q(self.q.len.unwrap_or(p.q_len()))?;
        ranges.push(Range::new("q", self.q.ptr, p.q_len(), true)?);
        let scale_size = p.scale_element_bytes();
        match (&self.scales, p.scale_format()) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(Error::Fp8ScaleKind {
                    expected: super::KIND_NONE,
                    got: super::KIND_F32,
                })
            }
            (None, Some(f)) => {
                return Err(Error::Fp8ScaleKind {
                    expected: kind_of(f),
                    got: super::KIND_NONE,
                })
            }
            (Some(b), Some(f)) => {
                p.check_scales(kind_of(f), b.len.unwrap_or(p.scales_len()))?;
                ranges.push(Range::new(
                    "scales",
                    b.ptr,
                    byte_len(p.scales_len(), scale_size)?,
                    true,
                )?);
            }
        }
        let static_scale = match (self.static_scale, self.options.scaling) {
            (None, _) => None,
            (Some(b), Fp8Scaling::PerTensor(_)) => {
                if let Some(n) = b.len {
                    if n != 1 {
                        return Err(Error::GlobalScaleLength {
                            expected: 1,
                            got: n,
                        });
                    }
                }
                ranges.push(Range::new("scale", b.ptr, 4, false)?);
                Some(b)
            }
            (Some(_), Fp8Scaling::Dynamic { .. }) => {
                return Err(Error::Unsupported(
                    "a static scale was given for dynamic scales (per token or per group): \
                     pass it only with a per-tensor scale"
                        .into(),
                ))
            }
        };
        if m == 0 {
            return Ok(Fp8Checked {
                problem: p,
                ranges: Vec::new(),
                vector_aligned: true,
            });
        }
        check_ptr("input", self.x.ptr, e)?;
        if let Some(r) = &self.residual {
            check_ptr("residual", r.ptr, e)?;
        }
        if let Some(y) = &self.y_out {
            check_ptr("y_out", y.ptr, e)?;
        }
        check_ptr("weight", self.weight.ptr, e)?;
        check_ptr("q", self.q.ptr, 1)?;
        if let Some(b) = &self.scales {
            check_ptr("scales", b.ptr, scale_size.max(1))?;
        }
        if let Some(b) = static_scale {
            check_ptr("scale", b.ptr, 4)?;
        }
        ranges.retain(|r| !r.is_empty());
        check_overlaps(&ranges)?;
        // Wrapping, as in `RawCall::validate`: a stride no row uses may be any value.
        let rows_aligned =
            |mat: &RawMat| mat.ptr % 16 == 0 && mat.row_stride.wrapping_mul(e) % 16 == 0;
        let vector_aligned = rows_aligned(&self.x)
            && self.residual.as_ref().is_none_or(rows_aligned)
            && self.y_out.as_ref().is_none_or(rows_aligned)
            && self.weight.ptr % 16 == 0
            && self.q.ptr % 8 == 0
            && self.scales.is_none_or(|b| b.ptr % 4 == 0);
        Ok(Fp8Checked {
            problem: p,
            ranges,
            vector_aligned,
        })
    }
}

fn kind_of(f: Fp8ScaleFormat) -> &'static str {
    match f {
        Fp8ScaleFormat::F32 { .. } => super::KIND_F32,
        Fp8ScaleFormat::UE8M0 => super::KIND_UE8M0,
    }
}

/// Validates `call` and runs it on the host with `engine` (a per-tensor scale given by
/// address is read from there).
///
/// # Safety
/// Every address of `call` must be host memory holding at least the extent its shape
/// implies, live and used by nobody else for the duration of the call; read-only inputs
/// must be initialised.
pub unsafe fn run_host_fp8(call: &RawFp8Call, engine: HostEngine) -> Result<(), Error> {
    let checked = call.validate()?;
    let p = &checked.problem;
    if p.m == 0 {
        return Ok(());
    }
    match call.dtype {
        // SAFETY: forwarded.
        DType::BF16 => unsafe { run_host_typed::<bf16>(call, p, engine) },
        // SAFETY: forwarded.
        DType::F16 => unsafe { run_host_typed::<f16>(call, p, engine) },
    }
}

/// # Safety
/// As [`run_host_fp8`]; `call` validated into `p`.
unsafe fn run_host_typed<T: Element>(
    call: &RawFp8Call,
    p: &Fp8Problem,
    engine: HostEngine,
) -> Result<(), Error> {
    // SAFETY (every block below): the caller's guarantee; validate() checked pointers,
    // extents and that written buffers overlap nothing else of the call.
    let x = unsafe { host_mat::<T>(&call.x)? };
    let weight = unsafe { host_slice::<T>(call.weight.ptr, p.h) };
    let residual = match &call.residual {
        Some(r) => Some(unsafe { host_mat_mut::<T>(r)? }),
        None => None,
    };
    let y_out = match &call.y_out {
        Some(y) => Some(unsafe { host_mat_mut::<T>(y)? }),
        None => None,
    };
    let q = unsafe { host_slice_mut::<u8>(call.q.ptr, p.q_len()) };
    let scales = match (call.scales, p.scale_format()) {
        (Some(b), Some(Fp8ScaleFormat::F32 { .. })) => {
            Fp8Scales::F32(unsafe { host_slice_mut::<f32>(b.ptr, p.scales_len()) })
        }
        (Some(b), Some(Fp8ScaleFormat::UE8M0)) => {
            Fp8Scales::UE8M0(unsafe { host_slice_mut::<u8>(b.ptr, p.scales_len()) })
        }
        _ => Fp8Scales::None,
    };
    let mut opts = call.options;
    if let (Some(b), Fp8Scaling::PerTensor(_)) = (call.static_scale, opts.scaling) {
        opts.scaling = Fp8Scaling::PerTensor(unsafe { host_slice::<f32>(b.ptr, 1) }[0]);
    }
    let out = Fp8Out { q, scales, y_out };
    match (engine, residual) {
        (HostEngine::Cpu, Some(r)) => super::cpu::add_rmsnorm_fp8quant(x, r, weight, out, &opts),
        (HostEngine::Cpu, None) => super::cpu::rmsnorm_fp8quant(x, weight, out, &opts),
        (HostEngine::Reference, Some(r)) => {
            super::reference::add_rmsnorm_fp8quant(x, r, weight, out, &opts)
        }
        (HostEngine::Reference, None) => super::reference::rmsnorm_fp8quant(x, weight, out, &opts),
    }
}
