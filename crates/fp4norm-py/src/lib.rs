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

use fp4norm::cuda::{Gpu, LaunchOptions};
use fp4norm::raw::{dequantize_host, run_host, HostEngine};
use fp4norm::{
    BlockSize, DType, Error, Fp4Format, Options, Problem, RawBuf, RawCall, RawDequant,
    RawGlobalScale, RawMat, ScaleFormat, ScaleLayout, ScaleOut,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

mod torch_ops;

/// A matrix argument: (address, rows, cols, row stride in elements).
type Mat = (u64, usize, usize, usize);
/// A flat buffer argument: (address, length in elements).
type Buf = (u64, usize);

/// fp4norm's errors as Python exceptions: bad arguments as `fp4norm.ArgumentTypeError` (a
/// TypeError) or `fp4norm.ArgumentError` (a ValueError), both also AssertionErrors as in
/// FlashInfer; driver and compiler failures as RuntimeError.
fn to_py(e: Error) -> PyErr {
    let class = match e {
        Error::CudaUnavailable(_)
        | Error::NvrtcUnavailable(_)
        | Error::Compile { .. }
        | Error::Cuda { .. } => return PyRuntimeError::new_err(e.to_string()),
        Error::DTypeMismatch { .. } | Error::UnsupportedDType(_) => "ArgumentTypeError",
        _ => "ArgumentError",
    };
    Python::attach(|py| {
        match py
            .import("fp4norm._errors")
            .and_then(|m| m.getattr(class))
            .and_then(|c| c.call1((e.to_string(),)))
        {
            Ok(exc) => PyErr::from_value(exc),
            Err(_) => PyValueError::new_err(e.to_string()),
        }
    })
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

fn options(
    block_size: usize,
    scale_format: &str,
    eps: f64,
    weight_bias: f64,
) -> Result<Options, Error> {
    let eps32 = eps as f32;
    // An eps that is finite in f64 but overflows f32 is reported with its f32 value (inf).
    if !eps.is_finite() || eps < 0.0 || !eps32.is_finite() {
        return Err(Error::InvalidEps(eps32));
    }
    // The weight bias is an f32 (SPEC.md §8): one that overflows it is refused likewise.
    let bias32 = weight_bias as f32;
    if !weight_bias.is_finite() || !bias32.is_finite() {
        return Err(Error::InvalidWeightBias(bias32));
    }
    Ok(Options {
        format: format_of(block_size, scale_format)?,
        eps: eps32,
        weight_bias: bias32,
    })
}

fn raw_mat(m: Mat, name: &'static str) -> Result<RawMat, Error> {
    let mat = RawMat {
        ptr: m.0,
        rows: m.1,
        cols: m.2,
        row_stride: m.3,
        len: None,
    };
    // The Python layer derives the view from a live tensor: its extent is its length.
    Ok(RawMat {
        len: Some(mat.extent(name)?),
        ..mat
    })
}

/// One [`Gpu`] per device ordinal, opened on first use and kept (its compiled kernels too).
pub(crate) fn gpu(ordinal: usize) -> Result<Arc<Gpu>, Error> {
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
    global_scale, eps, block_size, scale_format, enable_pdl=None, weight_bias=0.0
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
    weight_bias: f64,
) -> PyResult<()> {
    let be = self::backend(&backend, device, stream).map_err(to_py)?;
    let scales = match (row_major, swizzled) {
        (Some(r), None) => ScaleOut::RowMajor(RawBuf::new(r.0, r.1)),
        (None, Some(s)) => ScaleOut::Swizzled(RawBuf::new(s.0, s.1)),
        (Some(r), Some(s)) => ScaleOut::Both {
            row_major: RawBuf::new(r.0, r.1),
            swizzled: RawBuf::new(s.0, s.1),
        },
        (None, None) => {
            return Err(to_py(Error::Unsupported(
                "no block_scale buffer: pass a row-major or a swizzled buffer".into(),
            )))
        }
    };
    let call = (|| -> Result<RawCall, Error> {
        Ok(RawCall {
            dtype: dtype.parse::<DType>()?,
            x: raw_mat(x, "input")?,
            residual: residual.map(|r| raw_mat(r, "residual")).transpose()?,
            weight: RawBuf::new(weight.0, weight.1),
            y_fp4: RawBuf::new(y_fp4.0, y_fp4.1),
            scales,
            y_out: y_out.map(|y| raw_mat(y, "y_out")).transpose()?,
            global_scale: match global_scale {
                None => RawGlobalScale::None,
                Some((ptr, n)) => RawGlobalScale::from_count(ptr, n),
            },
            options: options(block_size, &scale_format, eps, weight_bias)?,
        })
    })()
    .map_err(to_py)?;
    py.detach(move || match be {
        // SAFETY: the Python layer passes the extents of live host arrays; run_host
        // validates the call before touching them.
        Backend::Cpu => unsafe { run_host(&call, HostEngine::Cpu) },
        // SAFETY: as above.
        Backend::Reference => unsafe { run_host(&call, HostEngine::Reference) },
        // SAFETY: the Python layer passes live device tensors of `ordinal` and torch's
        // current stream of that device; launch_raw_with validates the call and checks
        // every pointer's device.
        Backend::Cuda { ordinal, stream } => unsafe {
            gpu(ordinal)?.launch_raw_with(
                stream as *mut _,
                &call,
                &LaunchOptions {
                    pdl: enable_pdl,
                    devices_checked: false,
                },
            )
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
    let sf = RawBuf::new(block_scale.0, block_scale.1);
    let call = RawDequant {
        m,
        h,
        format,
        y_fp4: RawBuf::new(y_fp4.0, y_fp4.1),
        scales: if swizzled {
            ScaleOut::Swizzled(sf)
        } else {
            ScaleOut::RowMajor(sf)
        },
        global_scale: match global_scale {
            None => RawGlobalScale::None,
            Some((ptr, n)) => RawGlobalScale::from_count(ptr, n),
        },
        out: RawBuf::new(out.0, out.1),
    };
    py.detach(move || match be {
        // SAFETY: the Python layer passes the extents of live host arrays; validated first.
        Backend::Cpu | Backend::Reference => unsafe { dequantize_host(&call) },
        // SAFETY: live device tensors of `ordinal`, torch's current stream.
        Backend::Cuda { ordinal, stream } => unsafe {
            gpu(ordinal)?.dequantize_raw(stream as *mut _, &call)
        },
    })
    .map_err(to_py)
}

/// SPEC.md §9's reduction over host memory: `inputs` (the ranks' `[M, H]` views, in rank
/// order) summed into `out` (`M · H` elements, contiguous) by the scalar reference.
#[pyfunction]
fn allreduce_sum(py: Python<'_>, dtype: String, inputs: Vec<Mat>, out: Buf) -> PyResult<()> {
    let dtype = dtype.parse::<DType>().map_err(to_py)?;
    let mats = inputs
        .iter()
        .enumerate()
        .map(|(k, &m)| raw_mat(m, if k == 0 { "inputs[0]" } else { "inputs[k]" }))
        .collect::<Result<Vec<_>, _>>()
        .map_err(to_py)?;
    py.detach(move || {
        // SAFETY: the Python layer passes the extents of live host arrays of `dtype`; `out`
        // is a fresh array of M·H elements that overlaps none of them.
        unsafe {
            match dtype {
                DType::BF16 => host_allreduce_sum::<fp4norm::bf16>(&mats, out),
                DType::F16 => host_allreduce_sum::<fp4norm::f16>(&mats, out),
            }
        }
    })
    .map_err(to_py)
}

/// # Safety
/// As for [`allreduce_sum`].
unsafe fn host_allreduce_sum<T: fp4norm::Element>(mats: &[RawMat], out: Buf) -> Result<(), Error> {
    let views = mats
        .iter()
        .map(|m| {
            let len = m.len.unwrap_or(0);
            // SAFETY: the caller's guarantee: `len` elements of T at `ptr` (len 0: no access).
            let data: &[T] = if len == 0 {
                &[]
            } else {
                unsafe { std::slice::from_raw_parts(m.ptr as usize as *const T, len) }
            };
            fp4norm::MatRef::with_stride(data, m.rows, m.cols, m.row_stride)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sum = fp4norm::reference::allreduce_sum(&views)?;
    if sum.len() != out.1 {
        return Err(Error::OutputSize {
            name: "out",
            expected: sum.len(),
            got: out.1,
            what: "M·H elements".into(),
        });
    }
    if !sum.is_empty() {
        // SAFETY: the caller's guarantee: `out` holds out.1 writable elements of T.
        unsafe { std::slice::from_raw_parts_mut(out.0 as usize as *mut T, out.1) }
            .copy_from_slice(&sum);
    }
    Ok(())
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
    let opts = options(block_size, &scale_format, 1e-6, 0.0).map_err(to_py)?;
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

/// `(fast, reason)`: whether CUDA device `ordinal`'s kernels use the fast conversions (the
/// self-test passed, or `FP4NORM_SELFTEST=hardware`) or the literal SPEC.md encoders, and
/// why. Runs the self-test if this process has no verdict and the disk cache none.
#[pyfunction]
fn cuda_conversion_path(py: Python<'_>, ordinal: usize) -> PyResult<(bool, String)> {
    py.detach(|| gpu(ordinal).and_then(|g| g.conversion_path().map(|p| (p.fast, p.reason.clone()))))
        .map_err(to_py)
}

/// Registers the CPU and CUDA kernels of the `fp4norm::*` PyTorch operators (whose schemas
/// the Python layer defined) from PyTorch's stable C ABI in `libtorch_cpu` (and
/// `libtorch_cuda`, where PyTorch has CUDA). Returns PyTorch's stable-ABI version; raises
/// RuntimeError where this PyTorch cannot host them (older than 2.10).
#[pyfunction]
#[pyo3(signature = (libtorch_cpu, libtorch_cuda=None))]
fn register_torch_ops(libtorch_cpu: &str, libtorch_cuda: Option<&str>) -> PyResult<u64> {
    torch_ops::register(libtorch_cpu, libtorch_cuda).map_err(PyRuntimeError::new_err)
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
    m.add_function(wrap_pyfunction!(cuda_conversion_path, m)?)?;
    m.add_function(wrap_pyfunction!(register_torch_ops, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_sum, m)?)?;
    Ok(())
}
