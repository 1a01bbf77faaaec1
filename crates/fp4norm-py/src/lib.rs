//! `fp4norm._core`: the native half of the `fp4norm` Python module.
//!
//! The Python layer (`python/fp4norm/`) turns torch tensors and NumPy arrays into raw
//! pointers, shapes and strides (in elements) and calls the functions here. This side
//! checks every argument again (shapes, buffer lengths, dtypes, alignment, overlap,
//! block size, scale format, eps, global scale; for the FP8 ops element format, group,
//! scale layout and static scale) **before anything is written**, then runs
//!
//! * the fast CPU backend (`fp4norm::cpu`, `fp4norm::fp8::cpu`) or the scalar reference
//!   (`fp4norm::reference`, `fp4norm::fp8::reference`) over host memory, building slices of
//!   exactly the lengths the shapes and strides imply;
//! * or the CUDA backend (`fp4norm::cuda::Gpu::launch_raw`, `launch_fp8_raw`, and for the
//!   fused all-reduce of SPEC.md §9 `launch_allreduce_raw` over inputs gathered on the GPU or
//!   `launch_allreduce_peer_raw` / `launch_fp8_allreduce_peer_raw` over peer access) on the
//!   caller's stream, with one `Gpu` per device ordinal kept for the life of the process. A
//!   GPU call never synchronises, so it can be captured in a CUDA graph.
//!
//! Errors of fp4norm become `ValueError` (bad arguments) or `RuntimeError` (the CUDA
//! driver, NVRTC or a kernel compile failed), with fp4norm's message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use fp4norm::cuda::{Gpu, LaunchOptions, PeerStrategy, RawPeers};
use fp4norm::fp8::{
    self, run_host_fp8, Fp8Problem, Fp8ScaleFormat, Fp8ScalesIn, Fp8Scaling, RawFp8Call,
};
use fp4norm::raw::{dequantize_host, run_host, HostEngine};
use fp4norm::{
    BlockSize, DType, Error, Fp4Format, Options, Problem, RawBuf, RawCall, RawDequant,
    RawGlobalScale, RawMat, ScaleFormat, ScaleLayout, ScaleOut,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

mod args;
mod torch_ops;

/// A matrix argument: (address, rows, cols, row stride in elements).
type Mat = (u64, usize, usize, usize);
/// A flat buffer argument: (address, length in elements).
type Buf = (u64, usize);

/// A failed call, by the Python exception class it becomes: bad arguments as
/// `fp4norm.ArgumentTypeError` (a TypeError) or `fp4norm.ArgumentError` (a ValueError), both
/// also AssertionErrors as in FlashInfer; driver and compiler failures as RuntimeError. The
/// Python functions raise it directly; the PyTorch operators throw it with the class named
/// at the start of the message ([`Fail::message`]).
pub(crate) enum Fail {
    Type(String),
    Value(String),
    Runtime(String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        match e {
            Error::DTypeMismatch { .. } | Error::UnsupportedDType(_) => Fail::Type(e.to_string()),
            Error::CudaUnavailable(_)
            | Error::NvrtcUnavailable(_)
            | Error::NcclUnavailable(_)
            | Error::Compile { .. }
            | Error::TunedTable { .. }
            | Error::TunedTableWrite { .. }
            | Error::TuneBusy { .. }
            | Error::Cuda { .. } => Fail::Runtime(e.to_string()),
            _ => Fail::Value(e.to_string()),
        }
    }
}

impl Fail {
    /// The message a PyTorch operator throws: the class, then what went wrong.
    pub(crate) fn message(&self) -> String {
        match self {
            Fail::Type(m) => format!("fp4norm.ArgumentTypeError: {m}"),
            Fail::Value(m) => format!("fp4norm.ArgumentError: {m}"),
            Fail::Runtime(m) => format!("fp4norm.RuntimeError: {m}"),
        }
    }

    /// The Python exception.
    fn into_py(self) -> PyErr {
        let (class, msg) = match self {
            Fail::Runtime(m) => return PyRuntimeError::new_err(m),
            Fail::Type(m) => ("ArgumentTypeError", m),
            Fail::Value(m) => ("ArgumentError", m),
        };
        Python::attach(|py| {
            match py
                .import("fp4norm._errors")
                .and_then(|m| m.getattr(class))
                .and_then(|c| c.call1((msg.as_str(),)))
            {
                Ok(exc) => PyErr::from_value(exc),
                Err(_) => PyValueError::new_err(msg),
            }
        })
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> Self {
        f.into_py()
    }
}

/// fp4norm's errors as Python exceptions (see [`Fail`]).
fn to_py(e: Error) -> PyErr {
    Fail::from(e).into_py()
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
    let eps = args::eps32(eps)?;
    let weight_bias = args::bias32(weight_bias)?;
    Ok(Options {
        format: format_of(block_size, scale_format)?,
        eps,
        weight_bias,
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

/// The ranks of a fused all-reduce over peer access (SPEC.md §9), as the Python layer
/// passes them: every rank's buffer and signal pad as mapped on this GPU (rank order, e.g.
/// a `torch.distributed._symmetric_memory` allocation), the buffers' row stride, the words
/// of each pad and this rank.
struct Peers {
    buffers: Vec<u64>,
    row_stride: usize,
    signal_pads: Vec<u64>,
    signal_pad_words: usize,
    rank: usize,
    strategy: PeerStrategy,
}

impl Peers {
    /// The peer arguments of a call: both lists or neither, on the CUDA backend, and
    /// fp4norm's checks that need no device (`RawPeers::check_ranks`: the rank count, a pad
    /// per rank, this rank among them); the launch checks the addresses and the pads' size
    /// before anything is written. None without peers.
    fn from_args(
        be: Backend,
        buffers: Option<Vec<u64>>,
        row_stride: usize,
        signal_pads: Option<Vec<u64>>,
        signal_pad_words: usize,
        rank: usize,
        two_shot: bool,
    ) -> Result<Option<Peers>, Error> {
        let (buffers, signal_pads) = match (buffers, signal_pads) {
            (None, None) => return Ok(None),
            (Some(b), Some(s)) => (b, s),
            _ => {
                return Err(Error::Unsupported(
                    "peer_buffers and signal_pads come together: pass both (the peer-access \
                     all-reduce) or neither"
                        .into(),
                ))
            }
        };
        if !matches!(be, Backend::Cuda { .. }) {
            return Err(Error::Unsupported(
                "the all-reduce over peer access runs on the CUDA backend only".into(),
            ));
        }
        let peers = Peers {
            buffers,
            row_stride,
            signal_pads,
            signal_pad_words,
            rank,
            strategy: if two_shot {
                PeerStrategy::TwoShot
            } else {
                PeerStrategy::OneShot
            },
        };
        peers.raw().check_ranks()?;
        Ok(Some(peers))
    }

    fn raw(&self) -> RawPeers<'_> {
        RawPeers {
            buffers: &self.buffers,
            row_stride: self.row_stride,
            signal_pads: &self.signal_pads,
            signal_pad_words: self.signal_pad_words,
            rank: self.rank,
            strategy: self.strategy,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Python functions.
// ---------------------------------------------------------------------------------------

/// Residual add (if `residual` is given) + RMSNorm + FP4 quantisation over raw pointers.
///
/// With `ranks` (the other ranks' inputs gathered on this GPU) or `peer_buffers` and
/// `signal_pads` (every rank's buffer and signal pad over peer access, `peer_row_stride`
/// elements between the buffers' rows, `signal_pad_words` words per pad, this rank `rank`,
/// the two-shot schedule with `peer_two_shot`) the fused all-reduce of SPEC.md §9 runs in
/// front, on the CUDA backend.
///
/// Called by the `fp4norm` Python layer, which derives every address and length from live
/// tensors; calling it with made-up addresses corrupts memory.
#[pyfunction]
#[pyo3(signature = (
    backend, device, stream, dtype, x, residual, weight, y_fp4, row_major, swizzled, y_out,
    global_scale, eps, block_size, scale_format, enable_pdl=None, weight_bias=0.0, ranks=None,
    peer_buffers=None, peer_row_stride=0, signal_pads=None, signal_pad_words=0, rank=0,
    peer_two_shot=false
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
    ranks: Option<Vec<Mat>>,
    peer_buffers: Option<Vec<u64>>,
    peer_row_stride: usize,
    signal_pads: Option<Vec<u64>>,
    signal_pad_words: usize,
    rank: usize,
    peer_two_shot: bool,
) -> PyResult<()> {
    let be = self::backend(&backend, device, stream).map_err(to_py)?;
    let peers = Peers::from_args(
        be,
        peer_buffers,
        peer_row_stride,
        signal_pads,
        signal_pad_words,
        rank,
        peer_two_shot,
    )
    .map_err(to_py)?;
    if peers.is_some() && ranks.is_some() {
        return Err(to_py(Error::Unsupported(
            "the other ranks come gathered (ranks) or over peer access (peer_buffers), not both"
                .into(),
        )));
    }
    // The other ranks' inputs of a fused all-reduce (SPEC.md §9), ranks 1, 2, ... (`x` is
    // rank 0's), each of `x`'s shape and row stride: the GPU kernel sums them; the host
    // backends are handed the sum by the Python layer instead.
    let ranks = ranks.unwrap_or_default();
    if ranks.len() > fp4norm::raw::RANK_INPUT_NAMES.len() {
        return Err(to_py(Error::Unsupported(format!(
            "{} ranks: the fused all-reduce sums 2 to 8",
            ranks.len() + 1
        ))));
    }
    let ranks = ranks
        .into_iter()
        .zip(fp4norm::raw::RANK_INPUT_NAMES)
        .map(|(m, name)| raw_mat(m, name))
        .collect::<Result<Vec<_>, _>>()
        .map_err(to_py)?;
    if !ranks.is_empty() && !matches!(be, Backend::Cuda { .. }) {
        return Err(to_py(Error::Unsupported(
            "the other ranks' inputs are summed by the CUDA backend only".into(),
        )));
    }
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
        // With other ranks' inputs, launch_allreduce_raw checks each of them as well; over
        // peer access the Python layer passes a symmetric allocation's addresses, mapped on
        // this device, and every rank of the group makes the same call.
        Backend::Cuda { ordinal, stream } => unsafe {
            let opts = LaunchOptions {
                pdl: enable_pdl,
                devices_checked: false,
            };
            let g = gpu(ordinal)?;
            match &peers {
                Some(p) => g.launch_allreduce_peer_raw(stream as *mut _, &call, &p.raw(), &opts),
                None if ranks.is_empty() => g.launch_raw_with(stream as *mut _, &call, &opts),
                None => g.launch_allreduce_raw(stream as *mut _, &call, &ranks, &opts),
            }
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

/// Residual add (if `residual` is given) + RMSNorm + FP8 quantisation (SPEC.md §8) over raw
/// pointers. A per-tensor static scale comes by address (`static_scale`, one f32 read when
/// the call runs) or by value (`scale_value`); without either, the scales are dynamic
/// (`group_size` -1 for per token, `scale_format`, `scale_layout`, `s_min`) and written to
/// `scales` (f32 values or UE8M0 bytes).
///
/// With `peer_buffers` and `signal_pads` (every rank's buffer and signal pad over peer
/// access, as for [`fused`]) the fused all-reduce of SPEC.md §9 runs in front, on the CUDA
/// backend.
///
/// Called by the `fp4norm` Python layer, which derives every address and length from live
/// arrays; calling it with made-up addresses corrupts memory.
#[pyfunction]
#[pyo3(signature = (
    backend, device, stream, dtype, x, residual, weight, q, scales, static_scale, scale_value,
    y_out, element, group_size, scale_format, scale_layout, s_min, eps, weight_bias,
    enable_pdl=None, peer_buffers=None, peer_row_stride=0, signal_pads=None,
    signal_pad_words=0, rank=0, peer_two_shot=false
))]
#[allow(clippy::too_many_arguments)] // the op's tensors and options, as the schemas list them
fn fused_fp8(
    py: Python<'_>,
    backend: String,
    device: usize,
    stream: usize,
    dtype: String,
    x: Mat,
    residual: Option<Mat>,
    weight: Buf,
    q: Buf,
    scales: Option<Buf>,
    static_scale: Option<Buf>,
    scale_value: Option<f64>,
    y_out: Option<Mat>,
    element: String,
    group_size: i64,
    scale_format: String,
    scale_layout: String,
    s_min: f64,
    eps: f64,
    weight_bias: f64,
    enable_pdl: Option<bool>,
    peer_buffers: Option<Vec<u64>>,
    peer_row_stride: usize,
    signal_pads: Option<Vec<u64>>,
    signal_pad_words: usize,
    rank: usize,
    peer_two_shot: bool,
) -> PyResult<()> {
    let be = self::backend(&backend, device, stream).map_err(to_py)?;
    let peers = Peers::from_args(
        be,
        peer_buffers,
        peer_row_stride,
        signal_pads,
        signal_pad_words,
        rank,
        peer_two_shot,
    )
    .map_err(to_py)?;
    let call = (|| -> Result<RawFp8Call, Fail> {
        let options = match (static_scale, scale_value) {
            (Some(_), Some(_)) => {
                return Err(Fail::Value(
                    "a per-tensor scale is given both by address and by value: pass one".into(),
                ))
            }
            // By address the value is read when the call runs; 1.0 is never used.
            (Some(_), None) => {
                args::per_tensor_options(args::element(&element)?, 1.0, eps, weight_bias)?
            }
            (None, Some(v)) => {
                args::per_tensor_options(args::element(&element)?, v as f32, eps, weight_bias)?
            }
            (None, None) => args::dynamic_options(
                &element,
                group_size,
                &scale_format,
                &scale_layout,
                s_min,
                eps,
                weight_bias,
            )?,
        };
        Ok(RawFp8Call {
            dtype: dtype.parse::<DType>()?,
            x: raw_mat(x, "input")?,
            residual: residual.map(|r| raw_mat(r, "residual")).transpose()?,
            weight: RawBuf::new(weight.0, weight.1),
            q: RawBuf::new(q.0, q.1),
            scales: scales.map(|b| RawBuf::new(b.0, b.1)),
            static_scale: static_scale.map(|b| RawBuf::new(b.0, b.1)),
            y_out: y_out.map(|y| raw_mat(y, "y_out")).transpose()?,
            options,
        })
    })()
    .map_err(Fail::into_py)?;
    py.detach(move || match be {
        // SAFETY: the Python layer passes the extents of live host arrays; run_host_fp8
        // validates the call before touching them.
        Backend::Cpu => unsafe { run_host_fp8(&call, HostEngine::Cpu) },
        // SAFETY: as above.
        Backend::Reference => unsafe { run_host_fp8(&call, HostEngine::Reference) },
        // SAFETY: the Python layer passes live device tensors of `ordinal` and torch's
        // current stream of that device; launch_fp8_raw validates the call and checks every
        // pointer's device. Over peer access, as in `fused`.
        Backend::Cuda { ordinal, stream } => unsafe {
            let opts = LaunchOptions {
                pdl: enable_pdl,
                devices_checked: false,
            };
            let g = gpu(ordinal)?;
            match &peers {
                Some(p) => {
                    g.launch_fp8_allreduce_peer_raw(stream as *mut _, &call, &p.raw(), &opts)
                }
                None => g.launch_fp8_raw(stream as *mut _, &call, &opts),
            }
        },
    })
    .map_err(|e| to_py(args::with_py_names(e)))
}

/// FP8 dequantisation (SPEC.md §8) of host memory: `m · h` codes and their scales (f32
/// values or UE8M0 bytes, in `scale_layout`; none with a per-tensor `scale_value`) → `m · h`
/// float32 at `out`. Host memory only: fp4norm has no FP8 dequantisation kernel.
#[pyfunction]
#[pyo3(signature = (
    m, h, element, scale_value, group_size, scale_format, scale_layout, q, scales, out
))]
#[allow(clippy::too_many_arguments)]
fn dequantize_fp8(
    py: Python<'_>,
    m: usize,
    h: usize,
    element: String,
    scale_value: Option<f64>,
    group_size: i64,
    scale_format: String,
    scale_layout: String,
    q: Buf,
    scales: Option<Buf>,
    out: Buf,
) -> PyResult<()> {
    let opts = match scale_value {
        Some(v) => args::per_tensor_options(args::element(&element)?, v as f32, 0.0, 0.0),
        None => args::dynamic_options(
            &element,
            group_size,
            &scale_format,
            &scale_layout,
            0.0,
            0.0,
            0.0,
        ),
    }
    .map_err(Fail::into_py)?;
    py.detach(move || -> Result<(), Error> {
        // SAFETY (the slices below): the Python layer passes the extents of live host arrays
        // (`q` and `scales` initialised, `out` a fresh array overlapping neither); alignment
        // and null pointers are checked by host_buf.
        let q = unsafe { host_buf::<u8>("q", q)? };
        let out = unsafe { host_buf_mut::<f32>("out", out)? };
        let scales = match (scales, opts.scaling) {
            (None, _) => Fp8ScalesIn::None,
            (
                Some(b),
                Fp8Scaling::Dynamic {
                    format: Fp8ScaleFormat::UE8M0,
                    ..
                },
            ) => Fp8ScalesIn::UE8M0(unsafe { host_buf::<u8>("scales", b)? }),
            (Some(b), _) => Fp8ScalesIn::F32(unsafe { host_buf::<f32>("scales", b)? }),
        };
        fp8::dequantize(m, h, &opts, q, scales, out)
    })
    .map_err(to_py)
}

/// A host buffer as a slice, its pointer checked (null, alignment) first.
///
/// # Safety
/// `buf` must address `buf.1` initialised `T` of a live allocation, written by no one else
/// while the slice lives.
unsafe fn host_buf<'a, T>(name: &'static str, buf: Buf) -> Result<&'a [T], Error> {
    let (ptr, len) = buf;
    if len == 0 {
        return Ok(&[]);
    }
    check_host_ptr::<T>(name, ptr)?;
    // SAFETY: the caller's guarantee; pointer non-null and aligned (checked).
    Ok(unsafe { std::slice::from_raw_parts(ptr as usize as *const T, len) })
}

/// As [`host_buf`], writable.
///
/// # Safety
/// As [`host_buf`], and the memory overlaps no other slice of the call.
unsafe fn host_buf_mut<'a, T>(name: &'static str, buf: Buf) -> Result<&'a mut [T], Error> {
    let (ptr, len) = buf;
    if len == 0 {
        return Ok(&mut []);
    }
    check_host_ptr::<T>(name, ptr)?;
    // SAFETY: the caller's guarantee; pointer non-null and aligned (checked).
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

/// Whether the peer-access all-reduce of `m` rows of `h` elements of `dtype` over `ranks`
/// ranks takes the two-shot schedule (`PeerStrategy::for_call`: the rule lives in Rust, so
/// every front decides alike).
#[pyfunction]
fn peer_two_shot(m: usize, h: usize, dtype: String, ranks: usize) -> PyResult<bool> {
    let dtype = dtype.parse::<DType>().map_err(to_py)?;
    Ok(PeerStrategy::for_call(m, h, dtype, ranks) == PeerStrategy::TwoShot)
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

/// SPEC.md §9's sum, in rank order, of the host matrices `mats` (the ranks' inputs), by the
/// scalar reference: for the NumPy entry and the PyTorch operators' CPU kernel.
///
/// # Safety
/// Each matrix addresses live host memory of `T` of its `len` (or, without one, its
/// extent).
pub(crate) unsafe fn host_rank_sum<T: fp4norm::Element>(mats: &[RawMat]) -> Result<Vec<T>, Error> {
    let views = mats
        .iter()
        .map(|m| {
            let len = match m.len {
                Some(len) => len,
                None => m.extent("inputs")?,
            };
            // SAFETY: the caller's guarantee: `len` elements of T at `ptr` (len 0: no access).
            let data: &[T] = if len == 0 {
                &[]
            } else {
                unsafe { std::slice::from_raw_parts(m.ptr as usize as *const T, len) }
            };
            fp4norm::MatRef::with_stride(data, m.rows, m.cols, m.row_stride)
        })
        .collect::<Result<Vec<_>, _>>()?;
    fp4norm::reference::allreduce_sum(&views)
}

/// # Safety
/// As for [`allreduce_sum`].
unsafe fn host_allreduce_sum<T: fp4norm::Element>(mats: &[RawMat], out: Buf) -> Result<(), Error> {
    // SAFETY: forwarded.
    let sum = unsafe { host_rank_sum::<T>(mats)? };
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

/// Buffer sizes of one FP8 call: `(code bytes, scale elements, scale rows with padding,
/// groups per row)`; `group_size` None is a per-tensor scale (no scales). Raises ValueError
/// for a bad group, scale format or layout or a hidden size they do not allow.
#[pyfunction]
#[pyo3(signature = (m, h, group_size, scale_format, scale_layout))]
fn fp8_sizes(
    m: usize,
    h: usize,
    group_size: Option<i64>,
    scale_format: String,
    scale_layout: String,
) -> PyResult<(usize, usize, usize, usize)> {
    let opts = match group_size {
        None => args::per_tensor_options(fp8::Fp8Element::E4M3, 1.0, 0.0, 0.0),
        Some(g) => args::dynamic_options("e4m3", g, &scale_format, &scale_layout, 0.0, 0.0, 0.0),
    }
    .map_err(Fail::into_py)?;
    let p = Fp8Problem::new(m, h, DType::BF16, &opts).map_err(to_py)?;
    Ok((p.q_len(), p.scales_len(), p.scale_rows(), p.n_groups()))
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
    m.add_function(wrap_pyfunction!(fused_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(fp8_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(sizes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_info, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_conversion_path, m)?)?;
    m.add_function(wrap_pyfunction!(register_torch_ops, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_sum, m)?)?;
    m.add_function(wrap_pyfunction!(peer_two_shot, m)?)?;
    Ok(())
}
