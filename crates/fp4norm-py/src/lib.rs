//! `fp4norm._core`: the native half of the `fp4norm` Python module.
//!
//! The Python layer (`python/fp4norm/`) turns torch tensors and NumPy arrays into raw
//! pointers, shapes and strides (in elements) and calls the functions here. This side
//! checks every argument again (shapes, buffer lengths, dtypes, alignment, overlap,
//! block size, scale format, eps, global scale) **before anything is written**, then runs
//!
//! * the fast CPU backend (`fp4norm::cpu`) or the scalar reference (`fp4norm::reference`)
//!   over host memory, building slices of exactly the lengths the shapes and strides imply;
//! * or the CUDA backend (`fp4norm::cuda::Gpu::launch_raw`) on the caller's stream, with
//!   one `Gpu` per device ordinal kept for the life of the process. A GPU call never
//!   synchronises, so it can be captured in a CUDA graph.
//!
//! Errors of fp4norm become `ValueError` (bad arguments) or `RuntimeError` (the CUDA
//! driver, NVRTC or a kernel compile failed), with fp4norm's message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use fp4norm::cuda::{Gpu, RawCall, RawDequant, RawGlobalScale, RawMat};
use fp4norm::{
    bf16, f16, BlockSize, DType, Element, Error, Fp4Format, Fp4Out, GlobalScale, MatMut, MatRef,
    Options, Problem, ScaleFormat, ScaleIn, ScaleLayout, ScaleOut,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A matrix argument: (address, rows, cols, row stride in elements).
type Mat = (u64, usize, usize, usize);
/// A flat buffer argument: (address, length in elements).
type Buf = (u64, usize);

fn to_py(e: Error) -> PyErr {
    match e {
        Error::CudaUnavailable(_)
        | Error::NvrtcUnavailable(_)
        | Error::Compile { .. }
        | Error::Cuda { .. } => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// Where a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// The fast CPU backend, host memory.
    Cpu,
    /// The scalar reference, host memory.
    Reference,
    /// The CUDA backend: device `ordinal`, raw stream handle.
    Cuda { ordinal: usize, stream: usize },
}

fn backend(name: &str, device: usize, stream: usize) -> Result<Backend, Error> {
    match name {
        "cpu" => Ok(Backend::Cpu),
        "reference" => Ok(Backend::Reference),
        "cuda" => Ok(Backend::Cuda {
            ordinal: device,
            stream,
        }),
        other => Err(Error::Unsupported(format!(
            "backend {other:?}: use \"cpu\", \"reference\" or \"cuda\""
        ))),
    }
}

fn format_of(block_size: usize, scale_format: &str) -> Result<Fp4Format, Error> {
    Ok(Fp4Format::new(
        BlockSize::try_from(block_size)?,
        scale_format.parse::<ScaleFormat>()?,
    ))
}

fn options(block_size: usize, scale_format: &str, eps: f64) -> Result<Options, Error> {
    let eps32 = eps as f32;
    // An eps that is finite in f64 but overflows f32 is reported with its f32 value (inf).
    if !eps.is_finite() || eps < 0.0 || !eps32.is_finite() {
        return Err(Error::InvalidEps(eps32));
    }
    Ok(Options {
        format: format_of(block_size, scale_format)?,
        eps: eps32,
    })
}

fn dtype_of(name: &str) -> Result<DType, Error> {
    name.parse::<DType>()
}

// ---------------------------------------------------------------------------------------
// Checks shared by both backends, with the Python argument names.
// ---------------------------------------------------------------------------------------

/// Elements a `rows × cols` view with `stride` spans from its first element.
fn extent(name: &'static str, m: &Mat) -> Result<usize, Error> {
    let (_, rows, cols, stride) = *m;
    if rows > 1 && stride < cols {
        return Err(Error::StrideTooSmall { name, stride, cols });
    }
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    (rows - 1)
        .checked_mul(stride)
        .and_then(|n| n.checked_add(cols))
        .ok_or(Error::SizeOverflow)
}

fn check_shape(name: &'static str, m: &Mat, rows: usize, cols: usize) -> Result<(), Error> {
    if m.1 != rows || m.2 != cols {
        return Err(Error::ShapeMismatch {
            name,
            rows,
            cols,
            got_rows: m.1,
            got_cols: m.2,
        });
    }
    Ok(())
}

fn check_len(name: &'static str, got: usize, expected: usize, what: String) -> Result<(), Error> {
    if got != expected {
        return Err(Error::OutputSize {
            name,
            expected,
            got,
            what,
        });
    }
    Ok(())
}

/// `elems · size` in bytes, refused (`SizeOverflow`) past `isize::MAX`: no allocation is
/// that large, `slice::from_raw_parts` requires it, and a wrapped product would make the
/// overlap check compare the wrong ranges.
fn byte_len(elems: usize, size: usize) -> Result<usize, Error> {
    elems
        .checked_mul(size)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or(Error::SizeOverflow)
}

/// A byte range one call touches, for the overlap check.
struct Range {
    name: &'static str,
    start: u64,
    end: u64,
    written: bool,
}

impl Range {
    fn new(name: &'static str, ptr: u64, bytes: usize, written: bool) -> Result<Self, Error> {
        Ok(Range {
            name,
            start: ptr,
            end: ptr.checked_add(bytes as u64).ok_or(Error::SizeOverflow)?,
            written,
        })
    }
}

/// Outputs may not overlap inputs or each other (bounding byte ranges, so interleaved
/// strided views of one buffer are refused too). Read-only inputs may overlap.
fn check_overlaps(ranges: &[Range]) -> Result<(), Error> {
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            if (a.written || b.written)
                && a.start < a.end
                && b.start < b.end
                && a.start < b.end
                && b.start < a.end
            {
                return Err(Error::Overlap {
                    a: a.name,
                    b: b.name,
                });
            }
        }
    }
    Ok(())
}

/// One fused call, as the Python layer describes it.
struct Call {
    dtype: DType,
    x: Mat,
    residual: Option<Mat>,
    weight: Buf,
    y_fp4: Buf,
    /// Row-major scales: `block_scale`, or `block_scale_unswizzled` when both layouts are asked for.
    row_major: Option<Buf>,
    /// Swizzled scales: always `block_scale`.
    swizzled: Option<Buf>,
    y_out: Option<Mat>,
    /// (address, count): count 1 is one scale for every row, count M one per row.
    global_scale: Option<Buf>,
    opts: Options,
}

impl Call {
    fn row_major_name(&self) -> &'static str {
        if self.swizzled.is_some() {
            "block_scale_unswizzled"
        } else {
            "block_scale"
        }
    }

    fn layout(&self) -> Result<ScaleLayout, Error> {
        match (self.row_major.is_some(), self.swizzled.is_some()) {
            (true, false) => Ok(ScaleLayout::RowMajor),
            (false, true) => Ok(ScaleLayout::Swizzled),
            (true, true) => Ok(ScaleLayout::Both),
            (false, false) => Err(Error::Unsupported(
                "no block_scale buffer: pass a row-major or a swizzled buffer".into(),
            )),
        }
    }

    /// Every check that can be made on the description alone (SPEC.md §5), naming the
    /// Python arguments; the backends check again before writing.
    fn validate(&self) -> Result<Problem, Error> {
        let (m, h) = (self.x.1, self.x.2);
        let p = Problem::new(m, h, self.dtype, self.layout()?, &self.opts)?
            .with_y_out(self.y_out.is_some());
        let p = if self.residual.is_some() {
            p
        } else {
            p.without_residual()
        };
        let e = self.dtype.size();
        let mut ranges = vec![Range::new(
            "input",
            self.x.0,
            byte_len(extent("input", &self.x)?, e)?,
            false,
        )?];
        if let Some(r) = &self.residual {
            check_shape("residual", r, m, h)?;
            ranges.push(Range::new(
                "residual",
                r.0,
                byte_len(extent("residual", r)?, e)?,
                true,
            )?);
        }
        if let Some(y) = &self.y_out {
            check_shape("y_out", y, m, h)?;
            ranges.push(Range::new(
                "y_out",
                y.0,
                byte_len(extent("y_out", y)?, e)?,
                true,
            )?);
        }
        if self.weight.1 != h {
            return Err(Error::WeightLength {
                expected: h,
                got: self.weight.1,
            });
        }
        ranges.push(Range::new("weight", self.weight.0, byte_len(h, e)?, false)?);
        check_len(
            "y_fp4",
            self.y_fp4.1,
            p.fp4_len(),
            format!("M·H/2 for M = {m}, H = {h}"),
        )?;
        ranges.push(Range::new("y_fp4", self.y_fp4.0, self.y_fp4.1, true)?);
        if let Some(r) = &self.row_major {
            check_len(
                self.row_major_name(),
                r.1,
                p.row_major_scales_len(),
                format!("M·H/B for M = {m}, H/B = {}", p.n_blocks()),
            )?;
            ranges.push(Range::new(self.row_major_name(), r.0, r.1, true)?);
        }
        if let Some(s) = &self.swizzled {
            check_len(
                "block_scale",
                s.1,
                p.swizzled_scales_len(),
                format!(
                    "the swizzled 128x4 layout: 128·ceil(M/128)·4·ceil((H/B)/4) for M = {m}, H/B = {}",
                    p.n_blocks()
                ),
            )?;
            ranges.push(Range::new("block_scale", s.0, s.1, true)?);
        }
        if let Some((ptr, n)) = self.global_scale {
            check_global_scale_count(n, m)?;
            ranges.push(Range::new("global_scale", ptr, byte_len(n, 4)?, false)?);
        }
        check_overlaps(&ranges)?;
        Ok(p)
    }
}

fn check_global_scale_count(n: usize, m: usize) -> Result<(), Error> {
    if n != 1 && n != m {
        return Err(Error::GlobalScaleLength {
            expected: m,
            got: n,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Host memory.
// ---------------------------------------------------------------------------------------

/// A shared slice over host memory the Python layer vouches for.
///
/// # Safety
/// `ptr` must address `len` readable elements of `T` that stay valid, and are not written
/// through another path, for `'a`.
unsafe fn host_slice<'a, T>(name: &'static str, ptr: u64, len: usize) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    check_host_ptr::<T>(name, ptr)?;
    byte_len(len, std::mem::size_of::<T>())?;
    // SAFETY: non-null, aligned, at most isize::MAX bytes, and the caller guarantees the extent.
    Ok(unsafe { std::slice::from_raw_parts(ptr as usize as *const T, len) })
}

/// A mutable slice over host memory the Python layer vouches for.
///
/// # Safety
/// As for [`host_slice`], and the memory must be writable and overlap no other slice of
/// the call (checked by [`Call::validate`]).
unsafe fn host_slice_mut<'a, T>(
    name: &'static str,
    ptr: u64,
    len: usize,
) -> Result<&'a mut [T], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_host_ptr::<T>(name, ptr)?;
    byte_len(len, std::mem::size_of::<T>())?;
    // SAFETY: non-null, aligned, at most isize::MAX bytes, exclusive (overlap checked),
    // extent guaranteed by the caller.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as usize as *mut T, len) })
}

fn check_host_ptr<T>(name: &'static str, ptr: u64) -> Result<(), Error> {
    if ptr == 0 {
        return Err(Error::NullPointer { name });
    }
    let align = std::mem::align_of::<T>();
    if ptr % align as u64 != 0 {
        return Err(Error::Misaligned {
            name,
            address: ptr,
            required: align,
        });
    }
    Ok(())
}

/// # Safety
/// As for [`host_slice`].
unsafe fn host_mat<'a, T>(name: &'static str, m: &Mat) -> Result<MatRef<'a, T>, Error> {
    // SAFETY: forwarded.
    let data = unsafe { host_slice::<T>(name, m.0, extent(name, m)?)? };
    MatRef::with_stride(data, m.1, m.2, m.3)
}

/// # Safety
/// As for [`host_slice_mut`].
unsafe fn host_mat_mut<'a, T>(name: &'static str, m: &Mat) -> Result<MatMut<'a, T>, Error> {
    // SAFETY: forwarded.
    let data = unsafe { host_slice_mut::<T>(name, m.0, extent(name, m)?)? };
    MatMut::with_stride(data, m.1, m.2, m.3)
}

/// # Safety
/// As for [`host_slice`].
unsafe fn host_global_scale<'a>(gs: Option<Buf>) -> Result<GlobalScale<'a>, Error> {
    Ok(match gs {
        None => GlobalScale::Uniform(1.0),
        // SAFETY: forwarded.
        Some((ptr, 1)) => {
            GlobalScale::Uniform(unsafe { host_slice::<f32>("global_scale", ptr, 1)? }[0])
        }
        // SAFETY: forwarded.
        Some((ptr, n)) => {
            GlobalScale::PerRow(unsafe { host_slice::<f32>("global_scale", ptr, n)? })
        }
    })
}

/// Runs a validated call on the host.
///
/// # Safety
/// Every address in `c` must be host memory of at least the extent its shape implies,
/// live and not used by anyone else for the duration of the call.
unsafe fn run_host<T: Element>(c: &Call, reference: bool) -> Result<(), Error> {
    // SAFETY (all blocks below): the caller's guarantee; `validate` checked that written
    // buffers overlap nothing else of the call.
    let x = unsafe { host_mat::<T>("input", &c.x)? };
    let weight = unsafe { host_slice::<T>("weight", c.weight.0, c.weight.1)? };
    let residual = match &c.residual {
        Some(r) => Some(unsafe { host_mat_mut::<T>("residual", r)? }),
        None => None,
    };
    let y_out = match &c.y_out {
        Some(y) => Some(unsafe { host_mat_mut::<T>("y_out", y)? }),
        None => None,
    };
    let y_fp4 = unsafe { host_slice_mut::<u8>("y_fp4", c.y_fp4.0, c.y_fp4.1)? };
    let row_major = match c.row_major {
        Some((p, n)) => Some(unsafe { host_slice_mut::<u8>(c.row_major_name(), p, n)? }),
        None => None,
    };
    let swizzled = match c.swizzled {
        Some((p, n)) => Some(unsafe { host_slice_mut::<u8>("block_scale", p, n)? }),
        None => None,
    };
    let scales = match (row_major, swizzled) {
        (Some(r), None) => ScaleOut::RowMajor(r),
        (None, Some(s)) => ScaleOut::Swizzled(s),
        (Some(row_major), Some(swizzled)) => ScaleOut::Both {
            row_major,
            swizzled,
        },
        (None, None) => unreachable!("validate() requires a scale buffer"),
    };
    let gs = unsafe { host_global_scale(c.global_scale)? };
    let out = Fp4Out {
        y_fp4,
        scales,
        y_out,
    };
    let opts = &c.opts;
    match (reference, residual) {
        (false, Some(r)) => fp4norm::cpu::add_rmsnorm_fp4quant(x, r, weight, out, gs, opts),
        (false, None) => fp4norm::cpu::rmsnorm_fp4quant(x, weight, out, gs, opts),
        (true, Some(r)) => fp4norm::reference::add_rmsnorm_fp4quant(x, r, weight, out, gs, opts),
        (true, None) => fp4norm::reference::rmsnorm_fp4quant(x, weight, out, gs, opts),
    }
}

// ---------------------------------------------------------------------------------------
// CUDA.
// ---------------------------------------------------------------------------------------

/// One [`Gpu`] per device ordinal, opened on first use and kept (its compiled kernels too).
fn gpu(ordinal: usize) -> Result<Arc<Gpu>, Error> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    let mut map = GPUS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(g) = map.get(&ordinal) {
        return Ok(g.clone());
    }
    let g = Arc::new(Gpu::new(ordinal)?);
    map.insert(ordinal, g.clone());
    Ok(g)
}

fn raw_mat(m: &Mat, name: &'static str) -> Result<RawMat, Error> {
    Ok(RawMat {
        ptr: m.0,
        rows: m.1,
        cols: m.2,
        row_stride: m.3,
        len: Some(extent(name, m)?),
    })
}

fn raw_global_scale(gs: Option<Buf>, m: usize) -> RawGlobalScale {
    match gs {
        None => RawGlobalScale::None,
        Some((p, n)) if n == 1 || m == 1 => RawGlobalScale::Uniform(p),
        Some((p, _)) => RawGlobalScale::PerRow(p),
    }
}

/// Enqueues a validated call on `stream` of device `ordinal`.
///
/// # Safety
/// Every address must be device memory of that GPU holding the extent its shape implies,
/// live until the kernel has run; `stream` a live stream of the device's primary context.
unsafe fn run_cuda(
    c: &Call,
    ordinal: usize,
    stream: usize,
    pdl: Option<bool>,
) -> Result<(), Error> {
    let g = gpu(ordinal)?;
    if let Some(on) = pdl {
        g.set_programmatic_dependent_launch(on);
    }
    let m = c.x.1;
    let scales = match (c.row_major, c.swizzled) {
        (Some(r), None) => ScaleOut::RowMajor(r.0),
        (None, Some(s)) => ScaleOut::Swizzled(s.0),
        (Some(r), Some(s)) => ScaleOut::Both {
            row_major: r.0,
            swizzled: s.0,
        },
        (None, None) => unreachable!("validate() requires a scale buffer"),
    };
    let call = RawCall {
        dtype: c.dtype,
        x: raw_mat(&c.x, "input")?,
        residual: c
            .residual
            .as_ref()
            .map(|r| raw_mat(r, "residual"))
            .transpose()?,
        weight: c.weight.0,
        weight_len: Some(c.weight.1),
        y_fp4: c.y_fp4.0,
        y_fp4_len: Some(c.y_fp4.1),
        scales,
        scale_lens: (c.row_major.map(|r| r.1), c.swizzled.map(|s| s.1)),
        y_out: c.y_out.as_ref().map(|y| raw_mat(y, "y_out")).transpose()?,
        global_scale: raw_global_scale(c.global_scale, m),
        global_scale_len: c
            .global_scale
            .map(|(_, n)| if n == 1 || m == 1 { 1 } else { n }),
        options: c.opts,
    };
    // SAFETY: the caller's guarantee; launch_raw checks shapes, alignment, overlap and device.
    unsafe { g.launch_raw(stream as *mut _, &call) }
}

// ---------------------------------------------------------------------------------------
// Python functions.
// ---------------------------------------------------------------------------------------

/// Residual add (if `residual` is given) + RMSNorm + FP4 quantisation over raw pointers.
///
/// Called by the `fp4norm` Python layer, which derives every address and length from live
/// tensors; calling it with made-up addresses corrupts memory.
#[pyfunction]
#[pyo3(signature = (
    backend, device, stream, dtype, x, residual, weight, y_fp4, row_major, swizzled, y_out,
    global_scale, eps, block_size, scale_format, enable_pdl=None
))]
#[allow(clippy::too_many_arguments)] // the op's tensors, as in FlashInfer's signature
fn fused(
    py: Python<'_>,
    backend: String,
    device: usize,
    stream: usize,
    dtype: String,
    x: Mat,
    residual: Option<Mat>,
    weight: Buf,
    y_fp4: Buf,
    row_major: Option<Buf>,
    swizzled: Option<Buf>,
    y_out: Option<Mat>,
    global_scale: Option<Buf>,
    eps: f64,
    block_size: usize,
    scale_format: String,
    enable_pdl: Option<bool>,
) -> PyResult<()> {
    let be = self::backend(&backend, device, stream).map_err(to_py)?;
    let call = Call {
        dtype: dtype_of(&dtype).map_err(to_py)?,
        x,
        residual,
        weight,
        y_fp4,
        row_major,
        swizzled,
        y_out,
        global_scale,
        opts: options(block_size, &scale_format, eps).map_err(to_py)?,
    };
    call.validate().map_err(to_py)?;
    py.detach(move || match be {
        // SAFETY: the Python layer passes the extents of live host tensors.
        Backend::Cpu | Backend::Reference => unsafe {
            let reference = be == Backend::Reference;
            match call.dtype {
                DType::BF16 => run_host::<bf16>(&call, reference),
                DType::F16 => run_host::<f16>(&call, reference),
            }
        },
        // SAFETY: the Python layer passes live device tensors of `ordinal` and torch's
        // current stream of that device.
        Backend::Cuda { ordinal, stream } => unsafe {
            run_cuda(&call, ordinal, stream, enable_pdl)
        },
    })
    .map_err(to_py)
}

/// Dequantisation (SPEC.md §4) over raw pointers: packed FP4 + scale codes → f32.
#[pyfunction]
#[pyo3(signature = (
    backend, device, stream, m, h, block_size, scale_format, y_fp4, block_scale, swizzled,
    global_scale, out
))]
#[allow(clippy::too_many_arguments)]
fn dequantize(
    py: Python<'_>,
    backend: String,
    device: usize,
    stream: usize,
    m: usize,
    h: usize,
    block_size: usize,
    scale_format: String,
    y_fp4: Buf,
    block_scale: Buf,
    swizzled: bool,
    global_scale: Option<Buf>,
    out: Buf,
) -> PyResult<()> {
    let be = self::backend(&backend, device, stream).map_err(to_py)?;
    let format = format_of(block_size, &scale_format).map_err(to_py)?;
    let layout = if swizzled {
        ScaleLayout::Swizzled
    } else {
        ScaleLayout::RowMajor
    };
    let check = || -> Result<(), Error> {
        let p = Problem::new(m, h, DType::BF16, layout, &Options { format, eps: 0.0 })?;
        check_len(
            "y_fp4",
            y_fp4.1,
            p.fp4_len(),
            format!("M·H/2 for M = {m}, H = {h}"),
        )?;
        let sf_len = if swizzled {
            p.swizzled_scales_len()
        } else {
            p.row_major_scales_len()
        };
        check_len(
            "block_scale",
            block_scale.1,
            sf_len,
            format!("{layout} scales for M = {m}, H/B = {}", p.n_blocks()),
        )?;
        let out_len = m.checked_mul(h).ok_or(Error::SizeOverflow)?;
        check_len("out", out.1, out_len, format!("M·H for M = {m}, H = {h}"))?;
        let mut ranges = vec![
            Range::new("y_fp4", y_fp4.0, y_fp4.1, false)?,
            Range::new("block_scale", block_scale.0, block_scale.1, false)?,
            Range::new("out", out.0, byte_len(out.1, 4)?, true)?,
        ];
        if let Some((ptr, n)) = global_scale {
            check_global_scale_count(n, m)?;
            ranges.push(Range::new("global_scale", ptr, byte_len(n, 4)?, false)?);
        }
        check_overlaps(&ranges)
    };
    check().map_err(to_py)?;
    py.detach(move || -> Result<(), Error> {
        match be {
            Backend::Cpu | Backend::Reference => {
                // SAFETY: the Python layer passes the extents of live host arrays; `out`
                // overlaps nothing (checked).
                let (q, sf, gs, o) = unsafe {
                    (
                        host_slice::<u8>("y_fp4", y_fp4.0, y_fp4.1)?,
                        host_slice::<u8>("block_scale", block_scale.0, block_scale.1)?,
                        host_global_scale(global_scale)?,
                        host_slice_mut::<f32>("out", out.0, out.1)?,
                    )
                };
                let sf = if swizzled {
                    ScaleIn::Swizzled(sf)
                } else {
                    ScaleIn::RowMajor(sf)
                };
                fp4norm::dequantize(m, h, format, q, sf, gs, o)
            }
            Backend::Cuda { ordinal, stream } => {
                let g = gpu(ordinal)?;
                let call = RawDequant {
                    m,
                    h,
                    format,
                    y_fp4: y_fp4.0,
                    scales: if swizzled {
                        ScaleOut::Swizzled(block_scale.0)
                    } else {
                        ScaleOut::RowMajor(block_scale.0)
                    },
                    global_scale: raw_global_scale(global_scale, m),
                    out: out.0,
                };
                // SAFETY: live device tensors of `ordinal`, torch's current stream.
                unsafe { g.dequantize_raw(stream as *mut _, &call) }
            }
        }
    })
    .map_err(to_py)
}

/// Buffer sizes of one call: `(y_fp4 bytes, row-major scale bytes, swizzled scale bytes)`.
/// Raises ValueError for an invalid block size, scale format or hidden size.
#[pyfunction]
fn sizes(
    m: usize,
    h: usize,
    block_size: usize,
    scale_format: String,
) -> PyResult<(usize, usize, usize)> {
    let opts = options(block_size, &scale_format, 1e-6).map_err(to_py)?;
    let p = Problem::new(m, h, DType::BF16, ScaleLayout::Both, &opts).map_err(to_py)?;
    Ok((
        p.fp4_len(),
        p.row_major_scales_len(),
        p.swizzled_scales_len(),
    ))
}

/// Number of CUDA devices the driver reports (0 without a driver).
#[pyfunction]
fn cuda_device_count() -> usize {
    fp4norm::cuda::device_count()
}

/// `(name, NVRTC target, hardware E2M1)` of CUDA device `ordinal` (opens it).
#[pyfunction]
fn cuda_device_info(py: Python<'_>, ordinal: usize) -> PyResult<(String, String, bool)> {
    py.detach(|| gpu(ordinal).map(|g| (g.name(), g.arch().to_string(), g.hardware_e2m1())))
        .map_err(to_py)
}

/// The native module of `fp4norm`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(fused, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(sizes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_info, m)?)?;
    Ok(())
}
