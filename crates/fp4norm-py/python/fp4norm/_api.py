"""The torch / NumPy plumbing of fp4norm: argument checks with the caller's argument
names, output allocation, dtype mapping, 3-D flattening and the CUDA stream. Everything
numeric (and every check again, before anything is written) happens in Rust (`_core`).
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from typing import Any, List, NamedTuple, Optional, Tuple

from . import _core
from ._errors import ArgumentError, ArgumentTypeError

# --------------------------------------------------------------------------------------
# Array views
# --------------------------------------------------------------------------------------

_TORCH_DTYPES: Optional[dict] = None


def _torch_dtype_codes(torch: Any) -> dict:
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        table = {
            torch.bfloat16: "bf16",
            torch.float16: "f16",
            torch.float32: "f32",
            torch.uint8: "u8",
        }
        for attr, code in (
            ("float8_e4m3fn", "e4m3"),
            ("float8_e5m2", "e5m2"),
            ("float8_e8m0fnu", "ue8m0"),
            ("float4_e2m1fn_x2", "fp4x2"),
        ):
            dt = getattr(torch, attr, None)
            if dt is not None:
                table[dt] = code
        _TORCH_DTYPES = table
    return _TORCH_DTYPES


_NUMPY_NAMES = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "uint8": "u8",
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
    "float8_e8m0fnu": "ue8m0",
}

_DTYPE_WORDS = {
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "u8": "uint8",
    "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "ue8m0": "float8_e8m0fnu",
    "fp4x2": "float4_e2m1fn_x2",
}


def _np_fp8(code: str) -> Any:
    """The NumPy dtype of FP8 codes (``e4m3``, ``e5m2``): ml_dtypes' float8 type, or None
    without ml_dtypes. Imported on first use: ``import fp4norm`` imports no NumPy."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}.get(code)


def inference_message(name: str) -> str:
    """Why an inference tensor is not written outside inference mode (PyTorch's rule)."""
    return (
        f"{name} is an inference tensor (made under torch.inference_mode()) and fp4norm writes "
        "it in place, which outside inference mode PyTorch refuses (\"Inplace update to "
        "inference tensor outside InferenceMode is not allowed\"): make the call under "
        "torch.inference_mode(), or pass a clone"
    )


class _View:
    """One array argument: where it lives, its address, shape, strides (in elements)."""

    __slots__ = (
        "obj",
        "name",
        "kind",
        "device",
        "ptr",
        "shape",
        "strides",
        "dt",
        "contiguous",
        "writeable",
        "inference",
    )

    def __init__(self, obj: Any, name: str) -> None:
        self.obj = obj
        self.name = name
        torch = sys.modules.get("torch")
        np = sys.modules.get("numpy")
        if torch is not None and isinstance(obj, torch.Tensor):
            self._from_torch(torch, obj)
        elif np is not None and isinstance(obj, np.ndarray):
            self._from_numpy(obj)
        else:
            raise ArgumentTypeError(
                f"{name} must be a torch.Tensor or a numpy.ndarray, got {type(obj).__name__}"
            )

    def _from_torch(self, torch: Any, t: Any) -> None:
        if t.layout != torch.strided:
            raise ArgumentTypeError(f"{self.name} must be a dense (strided) tensor, got layout {t.layout}")
        dev = t.device
        if dev.type == "cpu":
            self.device = "cpu"
        elif dev.type == "cuda":
            self.device = f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
        else:
            raise ArgumentError(
                f"{self.name} is on device {dev}: fp4norm runs on CPU and CUDA tensors only"
            )
        self.kind = "torch"
        self.ptr = int(t.data_ptr())
        self.shape = tuple(int(s) for s in t.shape)
        self.strides = tuple(int(s) for s in t.stride())
        self.dt = _torch_dtype_codes(torch).get(t.dtype, str(t.dtype).replace("torch.", ""))
        self.contiguous = bool(t.is_contiguous())
        self.writeable = True
        # PyTorch's rule for in-place writes: an inference tensor only in inference mode.
        self.inference = bool(t.is_inference()) and not torch.is_inference_mode_enabled()
        numel = int(t.numel())
        if numel > 0 and hasattr(t, "untyped_storage"):  # torch >= 2.0
            # A tensor whose storage was freed or shrunk (`untyped_storage().resize_(..)`,
            # as FSDP-style code does) still reports its old shape; its elements must lie
            # inside the storage it has now, or the kernel would touch memory it does not own.
            # (About 0.4 us per tensor: the span of a contiguous tensor is its numel.)
            span = numel
            if not self.contiguous:
                span = 1
                for n, st in zip(self.shape, self.strides):
                    span += (n - 1) * st
            need = (int(t.storage_offset()) + span) * int(t.element_size())
            have = int(t.untyped_storage().nbytes())
            if need > have:
                raise ArgumentError(
                    f"{self.name}: its storage holds {have} bytes but the tensor of shape "
                    f"{list(self.shape)} spans {need} (was its storage freed or resized?)"
                )
            if self.ptr == 0:
                raise ArgumentError(
                    f"{self.name} has no storage (a tensor subclass or a meta/fake tensor?): "
                    "fp4norm reads and writes a tensor's memory; pass a plain tensor"
                )

    def _from_numpy(self, a: Any) -> None:
        self.kind = "numpy"
        self.device = "cpu"
        dtype = a.dtype
        code = _NUMPY_NAMES.get(dtype.name) if dtype.isnative else None
        self.dt = code if code is not None else f"{dtype} (numpy)"
        self.ptr = int(a.ctypes.data)
        self.shape = tuple(int(s) for s in a.shape)
        item = dtype.itemsize
        strides = []
        for s in a.strides:
            if s < 0:
                raise ArgumentError(
                    f"{self.name} has a negative stride ({a.strides} bytes): pass a view with "
                    "non-negative strides"
                )
            if item and s % item:
                raise ArgumentError(
                    f"{self.name} has strides {a.strides} bytes, not a multiple of its element size"
                )
            strides.append(s // item if item else s)
        self.strides = tuple(strides)
        self.contiguous = bool(a.flags.c_contiguous)
        self.writeable = bool(a.flags.writeable)
        self.inference = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def where(self) -> str:
        return "a NumPy array" if self.kind == "numpy" else f"a torch tensor on {self.device}"

    def same_place(self, ref: "_View") -> None:
        if self.kind != ref.kind:
            raise ArgumentTypeError(
                f"{self.name} is {self.where()} but {ref.name} is {ref.where()}: pass one kind "
                "of array (torch or NumPy) for every argument"
            )
        if self.device != ref.device:
            raise ArgumentError(
                f"{self.name} is on {self.device} but {ref.name} is on {ref.device}: put all "
                "tensors of one call on one device"
            )

    def need_dtype(self, allowed: Tuple[str, ...]) -> None:
        if self.dt not in allowed:
            words = " or ".join(_DTYPE_WORDS.get(a, a) for a in allowed)
            raise ArgumentTypeError(
                f"{self.name} has dtype {_DTYPE_WORDS.get(self.dt, self.dt)}; expected {words}"
            )

    def need_writeable(self) -> None:
        if self.kind == "torch" and self.obj.requires_grad:
            # As the operators' Autograd kernel (and PyTorch's in-place ops), with grad on.
            import torch

            if torch.is_grad_enabled():
                from ._ops import refuse_if_requires_grad

                refuse_if_requires_grad(self.obj, "fp4norm", self.name)
        if self.inference:
            raise ArgumentError(inference_message(self.name))
        if not self.writeable:
            raise ArgumentError(f"{self.name} is read-only: fp4norm writes it in place")

    def rows(self) -> Tuple[int, int, int, int]:
        """`(address, rows, cols, row_stride)`: leading dimensions flattened into rows.
        The last dimension must be contiguous and the rows evenly spaced (never copied)."""
        if self.ndim not in (2, 3):
            raise ArgumentError(
                f"{self.name} must be 2-D [M, H] or 3-D [B, S, H]; got shape {list(self.shape)}"
            )
        cols = self.shape[-1]
        rows = math.prod(self.shape[:-1])
        if rows == 0 or cols == 0:  # an empty tensor's strides mean nothing
            return (self.ptr, rows, cols, cols)
        if cols > 1 and self.strides[-1] != 1:
            raise ArgumentError(
                f"{self.name}: the last (hidden) dimension must be contiguous (stride 1); got "
                f"strides {list(self.strides)} (in elements). Rows may be strided, elements may "
                "not; fp4norm never copies a tensor behind your back"
            )
        row_stride: Optional[int] = None
        expected = 0
        for size, stride in reversed(list(zip(self.shape[:-1], self.strides[:-1]))):
            if size == 1:
                continue
            if row_stride is None:
                row_stride = stride
            elif stride != expected:
                raise ArgumentError(
                    f"{self.name}: the leading dimensions of shape {list(self.shape)} with strides "
                    f"{list(self.strides)} cannot be flattened into evenly spaced rows; pass a "
                    "tensor whose rows are one stride apart"
                )
            expected = stride * size
        if row_stride is None:  # a single row
            row_stride = cols
        return (self.ptr, rows, cols, row_stride)

    def flat(self) -> Tuple[int, int]:
        """`(address, elements)` of a buffer written or read as one flat block."""
        if not self.contiguous:
            raise ArgumentError(
                f"{self.name} must be contiguous (shape {list(self.shape)}, strides "
                f"{list(self.strides)}): it is used as one flat buffer"
            )
        return (self.ptr, self.numel)


def _view(obj: Any, name: str) -> _View:
    return _View(obj, name)


# --------------------------------------------------------------------------------------
# Allocation
# --------------------------------------------------------------------------------------


def _empty(ref: _View, shape: Tuple[int, ...], code: str, typed: bool = False) -> Any:
    """An uninitialised array of the input's kind and device; `code` is the logical dtype
    (`u8`, `fp4x2`, `e4m3`, `e5m2`, `ue8m0`, `f32`). NumPy outputs are uint8 for every
    byte output (view them with ml_dtypes if you want typed values), except with `typed`
    (FP8 codes, whose dtype says their format): ml_dtypes' float8 types where installed."""
    if ref.kind == "numpy":
        import numpy as np

        fp8 = _np_fp8(code) if typed else None
        if fp8 is not None:
            return np.empty(shape, dtype=fp8)
        return np.empty(shape, dtype=np.float32 if code == "f32" else np.uint8)
    import torch

    if code == "f32":
        return torch.empty(shape, dtype=torch.float32, device=ref.obj.device)
    t = torch.empty(shape, dtype=torch.uint8, device=ref.obj.device)
    want = {
        "fp4x2": getattr(torch, "float4_e2m1fn_x2", None),
        "e4m3": getattr(torch, "float8_e4m3fn", None),
        "e5m2": getattr(torch, "float8_e5m2", None),
    }.get(code)
    if want is not None:
        try:
            t = t.view(want)
        except (RuntimeError, TypeError):  # an old torch without this dtype's views
            pass
    return t


def _scale_dtypes(scale_format: str) -> Tuple[str, ...]:
    return ("u8", "e4m3") if scale_format == "e4m3" else ("u8", "ue8m0")


# --------------------------------------------------------------------------------------
# Scalars and options
# --------------------------------------------------------------------------------------


def type_name(value: Any) -> str:
    """A value's type as a message names it: ``int``, ``numpy.int64``, ``numpy.bool``."""
    t = type(value)
    if t.__module__ == "builtins":
        return t.__name__
    return f"{t.__module__.split('.')[0]}.{t.__name__}"


def flag(value: Any, name: str, optional: bool = False) -> Optional[bool]:
    """A bool option: a bool or a NumPy bool (None too where ``optional``), nothing else
    (not an int: a typo'd positional argument must not pass as a flag)."""
    if value is True or value is False:
        return value
    if optional and value is None:
        return None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.bool_):
        return bool(value)
    raise ArgumentTypeError(
        f"{name} must be a bool{' or None' if optional else ''}, got {type_name(value)}"
    )


def block_size_arg(block_size: Any) -> int:
    """``block_size`` as an int (NumPy's too; not a bool): its value is checked later."""
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral):
        raise ArgumentTypeError(
            f"block_size must be an int (16 or 32), got {type_name(block_size)}"
        )
    return int(block_size)


def count_arg(value: Any, name: str) -> int:
    """A count or index the native layer takes as an unsigned 64-bit int (``m``, ``h``, a
    device ordinal): an int (NumPy's too), 0 to 2**64 - 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be a non-negative int, got {type(value).__name__}")
    v = int(value)
    if v < 0 or v >= 2**64:
        raise ArgumentError(f"{name} = {v} is out of range: pass a non-negative int below 2**64")
    return v


def fp4_scale_format(scale_format: Any) -> Optional[str]:
    """An FP4 ``scale_format`` as every path takes it: ``"e4m3"`` or ``"ue8m0"`` in any
    case (returned in lower case), or None (the block size's default). Any other spelling
    is refused here, so that NumPy, torch, the operators and their fake kernels agree."""
    if scale_format is None:
        return None
    if not isinstance(scale_format, str):
        raise ArgumentTypeError(
            f"scale_format must be a str (\"e4m3\" or \"ue8m0\") or None, got "
            f"{type(scale_format).__name__}"
        )
    fmt = scale_format.lower()
    if fmt != "e4m3" and fmt != "ue8m0":
        raise ArgumentError(f"scale_format = {scale_format!r} is not supported: use \"e4m3\" or \"ue8m0\"")
    return fmt


def _block_and_format(block_size: Any, scale_format: Any) -> Tuple[int, str]:
    block_size = block_size_arg(block_size)
    if block_size not in (16, 32):
        raise ArgumentError(f"block_size = {block_size} is not supported: use 16 (NVFP4) or 32 (MXFP4)")
    fmt = fp4_scale_format(scale_format)
    if fmt is None:
        return block_size, ("ue8m0" if block_size == 32 else "e4m3")
    return block_size, fmt


def require_residual(residual: Any, instead: Optional[str] = None) -> None:
    """Refuses ``residual=None`` in a function whose op adds a residual (FlashInfer's
    require it): the op must not quietly run without its residual add. ``instead`` names
    the form without a residual, where there is one."""
    if residual is None:
        hint = f" (use {instead} for no residual)" if instead else ""
        raise ArgumentTypeError(
            f"residual is required{hint}: the op adds it to the input and writes the sum "
            "back into it"
        )


def _eps(eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise ArgumentTypeError(f"eps must be a float, got {type(eps).__name__}")
    value = float(eps)
    if not math.isfinite(value) or value < 0:
        raise ArgumentError(f"eps = {value} is invalid: eps must be finite and >= 0 (usually 1e-6)")
    return value


def _weight_bias(bias: Any) -> float:
    if bias is None:
        return 0.0
    if isinstance(bias, bool) or not isinstance(bias, numbers.Real):
        raise ArgumentTypeError(f"weight_bias must be a float, got {type(bias).__name__}")
    value = float(bias)
    if not math.isfinite(value) or not math.isfinite(float(_f32(value))):
        raise ArgumentError(
            f"weight_bias = {value} is invalid: it must be finite (0 for plain RMSNorm, 1 for "
            "Gemma-style norms)"
        )
    return value


def _f32(value: float) -> float:
    """``value`` rounded to float32 (inf where it overflows)."""
    import struct

    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.inf


def _flag(value: Any, name: str) -> bool:
    return bool(flag(value, name))


def _global_scale(gs: Any, ref: _View, m: int) -> Tuple[Optional[Tuple[int, int]], Any]:
    """`((address, count), keep-alive object)`; count is 1 (one scale) or M (per row)."""
    if gs is None:
        return None, None
    if isinstance(gs, numbers.Real) and not isinstance(gs, bool):
        value = float(gs)
        if ref.kind == "numpy":
            import numpy as np

            gs = np.array([value], dtype=np.float32)
        else:
            import torch

            gs = torch.full((1,), value, dtype=torch.float32, device=ref.obj.device)
    v = _view(gs, "global_scale")
    v.same_place(ref)
    v.need_dtype(("f32",))
    if v.ndim > 1 or v.numel not in (1, m):
        raise ArgumentError(
            f"global_scale has shape {list(v.shape)}: pass shape (1,) (one scale) or "
            f"({m},) (one per row; M = {m})"
        )
    return v.flat(), gs


_NVRTC_CHECKED = False


def _find_nvrtc() -> None:
    """Points fp4norm at NVRTC from the `nvidia-cuda-nvrtc` wheel (the one PyTorch
    installs) when FP4NORM_NVRTC_DIR is unset."""
    global _NVRTC_CHECKED
    if _NVRTC_CHECKED:
        return
    _NVRTC_CHECKED = True
    if os.environ.get("FP4NORM_NVRTC_DIR"):
        return
    for base in sys.path:
        for sub in (("nvidia", "cu13", "lib"), ("nvidia", "cuda_nvrtc", "lib")):
            d = os.path.join(base or ".", *sub)
            try:
                names = os.listdir(d)
            except OSError:
                continue
            if any(n.startswith("libnvrtc.so") for n in names) and any(
                n.startswith("libnvrtc-builtins.so") for n in names
            ):
                os.environ["FP4NORM_NVRTC_DIR"] = d
                return


def _backend(ref: _View, backend: Optional[str]) -> Tuple[str, int, int]:
    """`(backend, device ordinal, stream)` for a call whose input is `ref`."""
    if ref.device == "cpu":
        return (backend or "cpu", 0, 0)
    if backend not in (None, "cuda"):
        raise ArgumentError(f"the {backend} backend runs on host (CPU / NumPy) arrays only")
    import torch

    _find_nvrtc()
    ordinal = int(ref.device.split(":")[1])
    stream = torch.cuda.current_stream(ref.obj.device).cuda_stream
    return ("cuda", ordinal, int(stream))


class Peers(NamedTuple):
    """The ranks of a fused all-reduce over peer access (SPEC.md §9): every rank's buffer
    and signal pad as mapped on this device (rank order), ``row_stride`` elements between
    the buffers' rows, ``signal_pad_words`` u32 words per pad, this ``rank``, and the
    schedule (``two_shot``: reduce-scatter then all-gather, see docs/tensor-parallel.md)."""

    buffers: List[int]
    row_stride: int
    signal_pads: List[int]
    signal_pad_words: int
    rank: int
    two_shot: bool = False


def _peer_args(peers: Optional[Peers]) -> dict:
    """The native functions' keyword arguments of ``peers`` (none without)."""
    if peers is None:
        return {}
    return {
        "peer_buffers": list(peers.buffers),
        "peer_row_stride": peers.row_stride,
        "signal_pads": list(peers.signal_pads),
        "signal_pad_words": peers.signal_pad_words,
        "rank": peers.rank,
        "peer_two_shot": bool(peers.two_shot),
    }


# --------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------


def _row_inputs(
    input: Any, residual: Any, weight: Any
) -> Tuple[_View, Tuple[int, int, int, int], Any, Tuple[int, int]]:
    """`(input view, input rows, residual rows or None, weight buffer)`, checked: the row
    inputs every op of the family takes alike."""
    x = _view(input, "input")
    x.need_dtype(("bf16", "f16"))
    x_rows = x.rows()
    h = x_rows[2]

    r_rows = None
    if residual is not None:
        r = _view(residual, "residual")
        r.same_place(x)
        if r.dt != x.dt:
            raise ArgumentTypeError(
                f"residual has dtype {_DTYPE_WORDS.get(r.dt, r.dt)} but input is "
                f"{_DTYPE_WORDS[x.dt]}: input, residual and weight must share one dtype"
            )
        r.need_writeable()
        if r.shape != x.shape:
            raise ArgumentError(
                f"residual has shape {list(r.shape)} but input has shape {list(x.shape)}"
            )
        r_rows = r.rows()

    w = _view(weight, "weight")
    w.same_place(x)
    if w.dt != x.dt:
        raise ArgumentTypeError(
            f"weight has dtype {_DTYPE_WORDS.get(w.dt, w.dt)} but input is {_DTYPE_WORDS[x.dt]}: "
            "input, residual and weight must share one dtype"
        )
    if w.ndim != 1 or w.shape[0] != h:
        raise ArgumentError(f"weight has shape {list(w.shape)}; expected ({h},), one value per hidden element")
    if h > 1 and w.strides[0] != 1:
        raise ArgumentError(f"weight must be contiguous (stride 1), got stride {w.strides[0]}")
    return x, x_rows, r_rows, (w.ptr, w.numel)


def _y_out_rows(y_out: Any, x: _View) -> Optional[Tuple[int, int, int, int]]:
    """The rows of the optional ``y_out`` (input's shape, dtype and place), checked."""
    if y_out is None:
        return None
    y = _view(y_out, "y_out")
    y.same_place(x)
    if y.dt != x.dt:
        raise ArgumentTypeError(
            f"y_out has dtype {_DTYPE_WORDS.get(y.dt, y.dt)} but input is {_DTYPE_WORDS[x.dt]}"
        )
    y.need_writeable()
    if y.shape != x.shape:
        raise ArgumentError(f"y_out has shape {list(y.shape)} but input has shape {list(x.shape)}")
    return y.rows()


def _output(
    x: _View,
    obj: Any,
    name: str,
    shape: Tuple[int, ...],
    code: str,
    allowed: Tuple[str, ...],
    typed: bool = False,
    shaped: Optional[str] = "rows",
) -> Tuple[Any, Tuple[int, int]]:
    """An output: allocated like ``x`` where ``obj`` is None (``typed`` as for
    :func:`_empty`), else the caller's, checked (place, dtype, writeable, one flat block) to
    be written in place, and of the documented shape: ``shaped`` "rows" takes ``shape``
    (``x``'s leading dimensions, then one), its rows flattened (``[M, last]``) or one flat
    buffer; "exact" (or "packed") ``shape`` or one flat buffer; None any shape (the swizzled scales,
    FlashInfer's static ``out``). A buffer of the right size but another shape (``[32, 3]``
    for ``[3, 32]``) would be read in another layout than the one written."""
    if obj is None:
        obj = _empty(x, shape, code, typed)
        shaped = None
    v = _view(obj, name)
    v.same_place(x)
    v.need_dtype(allowed)
    if shaped is not None:
        what = {
            "exact": "the column-major layout [H/G, 4*ceil(M/4)]",
            "packed": "the packed column-major layout [ceil(H/G/4), 4*4*ceil(M/4)] bytes",
        }.get(shaped, "")
        need_shape(v.shape, name, tuple(shape), shaped == "rows", what)
    v.need_writeable()
    return obj, v.flat()


def need_shape(
    got: Tuple[int, ...], name: str, shape: Tuple[int, ...], rows: bool, what: str = ""
) -> None:
    """Refuses an output whose shape is not ``shape``, nor (``rows``) its rows flattened
    ``[M, last]``, nor one flat buffer of its size; ``what`` names the layout."""
    n = math.prod(shape)
    ok = [shape, (n,)]
    if rows and len(shape) > 2:
        ok.insert(1, (math.prod(shape[:-1]), shape[-1]))
    if tuple(got) not in ok:
        raise ArgumentError(
            f"{name} has shape {list(got)}; expected {' or '.join(str(list(s)) for s in ok)}"
            + (f" ({what})" if what else "")
        )


def fused(
    input: Any,
    residual: Any,
    weight: Any,
    y_fp4: Any,
    block_scale: Any,
    global_scale: Any,
    eps: Any,
    block_size: Any,
    scale_format: Any,
    is_sf_swizzled_layout: Any,
    output_both_sf_layouts: Any,
    block_scale_unswizzled: Any,
    enable_pdl: Any,
    y_out: Any,
    weight_bias: Any = None,
    backend: Optional[str] = None,
    ranks: Any = None,
    peers: Optional["Peers"] = None,
) -> Tuple[Any, ...]:
    """The FP4 op; with ``ranks`` (the other ranks' inputs, on the GPU) the fused
    all-reduce of SPEC.md §9, ``input`` being rank 0's; with ``peers`` the same over peer
    access, ``input`` being this rank's."""
    x, x_rows, r_rows, w_buf = _row_inputs(input, residual, weight)
    _, m, h, _ = x_rows
    rank_rows = [_rank_rows(x, a, k + 1) for k, a in enumerate(ranks or ())]

    block_size, fmt = _block_and_format(block_size, scale_format)
    eps = _eps(eps)
    weight_bias = _weight_bias(weight_bias)
    both = _flag(output_both_sf_layouts, "output_both_sf_layouts")
    swizzled = both or _flag(is_sf_swizzled_layout, "is_sf_swizzled_layout")
    pdl = flag(enable_pdl, "enable_pdl", optional=True)
    pdl = True if pdl is None else pdl
    fp4_len, rm_len, sw_len = _core.sizes(m, h, block_size, fmt)
    lead = x.shape[:-1]
    scale_code = "e4m3" if fmt == "e4m3" else "u8"

    # Outputs: allocated here, or the caller's (checked, then written in place).
    def output(obj: Any, name: str, shape: Tuple[int, ...], code: str, allowed: Tuple[str, ...]):
        return _output(x, obj, name, shape, code, allowed)

    y_fp4, q_buf = output(y_fp4, "y_fp4", lead + (h // 2,), "fp4x2", ("u8", "fp4x2"))
    row_major_buf = swizzled_buf = None
    if swizzled:
        block_scale, swizzled_buf = _output(
            x, block_scale, "block_scale", (sw_len,), scale_code, _scale_dtypes(fmt), shaped=None
        )
        if both:
            block_scale_unswizzled, row_major_buf = output(
                block_scale_unswizzled,
                "block_scale_unswizzled",
                lead + (h // block_size,),
                scale_code,
                _scale_dtypes(fmt),
            )
    else:
        block_scale, row_major_buf = output(
            block_scale, "block_scale", lead + (h // block_size,), scale_code, _scale_dtypes(fmt)
        )

    y_rows = _y_out_rows(y_out, x)
    gs_buf, gs_keep = _global_scale(global_scale, x, m)
    be, ordinal, stream = _backend(x, backend)
    _core.fused(
        be,
        ordinal,
        stream,
        x.dt,
        x_rows,
        r_rows,
        w_buf,
        q_buf,
        row_major_buf,
        swizzled_buf,
        y_rows,
        gs_buf,
        eps,
        block_size,
        fmt,
        pdl,
        weight_bias,
        rank_rows or None,
        **_peer_args(peers),
    )
    del gs_keep  # a temporary device scale is freed in stream order: safe
    if both:
        return (y_fp4, block_scale, block_scale_unswizzled)
    return (y_fp4, block_scale)


def dequantize(
    y_fp4: Any,
    block_scale: Any,
    global_scale: Any,
    block_size: Any,
    scale_format: Any,
    is_sf_swizzled_layout: Any,
    m: Optional[int],
    h: Optional[int],
) -> Any:
    q = _view(y_fp4, "y_fp4")
    q.need_dtype(("u8", "fp4x2"))
    q_buf = q.flat()
    if (m is None) != (h is None):
        raise ArgumentError("pass both m and h, or neither (they are then read from y_fp4's shape)")
    if m is None:
        if q.ndim < 2:
            raise ArgumentError(
                f"y_fp4 has shape {list(q.shape)}: pass m and h for a flat buffer, or y_fp4 "
                "shaped [..., H/2]"
            )
        h = 2 * q.shape[-1]
        m = math.prod(q.shape[:-1])
        out_shape = q.shape[:-1] + (h,)
    else:
        for value, name in ((m, "m"), (h, "h")):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ArgumentTypeError(f"{name} must be a non-negative int, got {value!r}")
        m, h = int(m), int(h)
        if q.ndim >= 2 and math.prod(q.shape[:-1]) == m and 2 * q.shape[-1] == h:
            out_shape = q.shape[:-1] + (h,)
        else:
            out_shape = (m, h)
        # Before the output is allocated: its M·H floats are then bounded by y_fp4's bytes.
        if h % 2 or q.numel != m * (h // 2):
            raise ArgumentError(
                f"y_fp4 has {q.numel} bytes but M·H/2 = {m * h / 2 if h % 2 else m * h // 2} "
                f"for M = {m}, H = {h}"
            )
    block_size, fmt = _block_and_format(block_size, scale_format)
    swizzled = _flag(is_sf_swizzled_layout, "is_sf_swizzled_layout")
    sf = _view(block_scale, "block_scale")
    sf.same_place(q)
    sf.need_dtype(_scale_dtypes(fmt))
    sf_buf = sf.flat()
    gs_buf, gs_keep = _global_scale(global_scale, q, m)
    out = _empty(q, out_shape, "f32")
    o_buf = _view(out, "out").flat()
    be, ordinal, stream = _backend(q, None)
    _core.dequantize(
        be, ordinal, stream, m, h, block_size, fmt, q_buf, sf_buf, swizzled, gs_buf, o_buf
    )
    del gs_keep
    return out


# --------------------------------------------------------------------------------------
# The FP8 family (SPEC.md §8)
# --------------------------------------------------------------------------------------

_FP8_ELEMENT_NAMES = {
    "e4m3": "e4m3",
    "e4m3fn": "e4m3",
    "float8_e4m3fn": "e4m3",
    "e5m2": "e5m2",
    "float8_e5m2": "e5m2",
}


def fp8_element(element: Any, out_code: Optional[str]) -> str:
    """The element format, ``"e4m3"`` or ``"e5m2"``: ``element`` where given (it must agree
    with a float8 ``out``), else ``out``'s float8 dtype, else E4M3. ``out_code`` is the
    dtype code of the ``out`` given, or None."""
    typed = out_code if out_code in ("e4m3", "e5m2") else None
    if element is None:
        return typed or "e4m3"
    if not isinstance(element, str):
        raise ArgumentTypeError(
            f"element must be a str (\"e4m3\" or \"e5m2\") or None, got {type(element).__name__}"
        )
    name = _FP8_ELEMENT_NAMES.get(element.strip().lower())
    if name is None:
        raise ArgumentError(
            f"element = {element!r} is not supported: use \"e4m3\" (float8_e4m3fn) or "
            "\"e5m2\" (float8_e5m2)"
        )
    if typed is not None and typed != name:
        raise ArgumentTypeError(
            f"out has dtype {_DTYPE_WORDS[typed]} but element = {element!r}: pass out of dtype "
            f"{_DTYPE_WORDS[name]} (or uint8), or leave element None to take out's format"
        )
    return name


def fp8_block_quant(
    quant: Any, out: Any, block_scale: Any, normed_out: Any, input: Any, residual: Any,
    weight: Any, eps: Any, weight_bias: Any, **more: Any,
) -> None:
    """``fused_add_rmsnorm_fp8_block_quant`` (as proposed for FlashInfer) through ``quant``, an
    ``add_rmsnorm_fp8quant`` (the module's or the reference's): E4M3 in groups of 128,
    f32 scales column-major, ``y_out=normed_out`` and a scale floor of RN32(1e-4 / 448),
    FlashInfer's amax floor of 1e-4 divided by 448 (the same f32 scale: rounding is
    monotonic). First FlashInfer's own rules: both outputs given (it writes them in
    place), ``block_scale`` of its shape (a buffer of the right size but another shape,
    such as the logical ``[M, H/128]``, would be read in another layout than the one
    written) and E4M3 codes; errors then name its arguments."""
    require_residual(residual)
    for name, a in (("out", out), ("block_scale", block_scale)):
        if a is None:
            raise ArgumentTypeError(
                f"{name} must be a preallocated array: fused_add_rmsnorm_fp8_block_quant "
                "writes its outputs in place (use add_rmsnorm_fp8quant to allocate them)"
            )
    shape = tuple(getattr(input, "shape", ()))
    if shape and shape[-1] % 128 == 0:  # (else the H rule's own error follows)
        m = 1
        for d in shape[:-1]:
            m *= d
        want = (shape[-1] // 128, (m + 3) // 4 * 4)
        got = tuple(getattr(block_scale, "shape", ()))
        if got != want:
            raise ArgumentError(
                f"block_scale must have shape [H/128, 4*ceil(M/4)] = {list(want)} (the "
                f"column-major layout DeepGEMM reads), got {list(got)}"
            )
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor):
        e5m2 = out.dtype == torch.float8_e5m2
    else:
        e5m2 = _np_fp8("e5m2") is not None and getattr(out, "dtype", None) == _np_fp8("e5m2")
    if e5m2:
        raise ArgumentTypeError(
            "out must be float8_e4m3fn (or uint8): the 1 x 128 block quantisation writes "
            "E4M3 codes, got float8_e5m2"
        )
    def call() -> None:
        quant(
            input, residual, weight, out, block_scale, eps, element="e4m3", group=128,
            scale_format="f32", scale_layout="column-major", s_min=2.2321428616578487e-07,
            y_out=normed_out, weight_bias=weight_bias, **more,
        )

    if torch is not None and torch.compiler.is_compiling():
        # Traced: no handler around the operator, whose fake kernel's refusal then reaches
        # the caller as Dynamo's error naming the fp4norm class (with the operator's names).
        call()
        return
    try:
        call()
    except (ArgumentError, ArgumentTypeError) as e:
        import re

        message = re.sub(r"\bscales_out\b", "block_scale", str(e))
        raise type(e)(re.sub(r"\by_out\b", "normed_out", message)) from None


def fp8_group(group: Any) -> int:
    """The group size as the native layer takes it: -1 for per token (``None``,
    ``"token"``), else 32, 64 or 128."""
    if group is None:
        return -1
    if isinstance(group, str):
        if group.strip().lower().replace("_", "-") in ("token", "per-token"):
            return -1
        raise ArgumentError(
            f"group = {group!r} is not supported: use \"token\" (one scale per row), 32, 64 or 128"
        )
    if isinstance(group, bool) or not isinstance(group, numbers.Integral):
        raise ArgumentTypeError(
            f"group must be \"token\" or an int (32, 64 or 128), got {type(group).__name__}"
        )
    g = int(group)
    if g not in (32, 64, 128):
        raise ArgumentError(
            f"group = {g} is not supported: use \"token\" (one scale per row), 32, 64 or 128"
        )
    return g


def fp8_name(value: Any, name: str, default: str) -> str:
    """A name option (``scale_format``, ``scale_layout``): a str, or None for ``default``.
    Its value is checked by the native layer, with the same message on every path."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str or None, got {type(value).__name__}")
    return value


def fp8_s_min(s_min: Any) -> float:
    """The f32 scale floor: None is 0 (no floor); finiteness and sign are checked natively."""
    if s_min is None:
        return 0.0
    if isinstance(s_min, bool) or not isinstance(s_min, numbers.Real):
        raise ArgumentTypeError(f"s_min must be a float, got {type(s_min).__name__}")
    return float(s_min)


def fp8_per_tensor(
    scale: Any, scales_out: Any, group: Any, scale_format: Any, scale_layout: Any, s_min: Any
) -> bool:
    """Whether a call of the general FP8 API has a per-tensor static scale (``scale``
    given); refuses it together with the arguments of dynamic scales."""
    if scale is None:
        return False
    if scales_out is not None:
        raise ArgumentError(
            "scales_out is given with a per-tensor scale, which writes no scales: pass scale "
            "for a static per-tensor scale, or scales_out (and group, scale_format, "
            "scale_layout) for dynamic scales"
        )
    given = [
        n for n, v in (
            ("group", group), ("scale_format", scale_format), ("scale_layout", scale_layout),
            ("s_min", s_min),
        ) if v is not None
    ]
    if given:
        raise ArgumentError(
            f"{', '.join(given)} {'describes' if len(given) == 1 else 'describe'} dynamic "
            "scales: leave it out with a per-tensor scale (scale=...), or pass scale=None"
        )
    return True


def _is_f32_format(fmt: str) -> bool:
    return fmt.strip().lower() in ("f32", "float32")


def _fp8_static_scale(
    scale: Any, x: _View
) -> Tuple[Optional[Tuple[int, int]], Optional[float], Any]:
    """A per-tensor scale: ``(buffer, None, the array)`` for an array (read when the call
    runs), ``(None, value, a new (1,) float32 array)`` for a Python number."""
    if isinstance(scale, numbers.Real) and not isinstance(scale, bool):
        value = float(scale)
        if x.kind == "numpy":
            import numpy as np

            return None, value, np.array([value], dtype=np.float32)
        import torch

        return None, value, torch.full((1,), value, dtype=torch.float32, device=x.obj.device)
    v = _view(scale, "scale")
    v.same_place(x)
    v.need_dtype(("f32",))
    if v.ndim > 1 or v.numel != 1:
        raise ArgumentError(
            f"scale has shape {list(v.shape)}: pass a float32 array of shape (1,) (or 0-d), or a "
            "float"
        )
    return v.flat(), None, scale


def fused_fp8(
    input: Any,
    residual: Any,
    weight: Any,
    out: Any,
    scales_out: Any,
    scale: Any,
    element: Any,
    group: Any,
    scale_format: Any,
    scale_layout: Any,
    s_min: Any,
    eps: Any,
    y_out: Any,
    enable_pdl: Any,
    weight_bias: Any,
    backend: Optional[str] = None,
    static: bool = False,
    peers: Optional["Peers"] = None,
) -> Tuple[Any, Any]:
    """Residual add + RMSNorm + FP8 quantisation of host arrays (and, through `_core`, of
    CUDA tensors): checks every argument with the caller's names, allocates the outputs not
    given, and runs the call; returns ``(out, scales)``, ``scales`` being the per-tensor
    scale's array for a static scale. ``static`` is FlashInfer's ``rmsnorm_quant``: ``out``
    and ``scale`` required, ``out``'s float8 dtype picks the element format. With
    ``peers`` the fused all-reduce of SPEC.md §9 over peer access runs in front (CUDA)."""
    x, x_rows, r_rows, w_buf = _row_inputs(input, residual, weight)
    _, m, h, _ = x_rows
    eps = _eps(eps)
    weight_bias = _weight_bias(weight_bias)
    pdl = flag(enable_pdl, "enable_pdl", optional=True)
    pdl = True if pdl is None else pdl
    out_view = None
    if out is not None:
        out_view = _view(out, "out")
        out_view.same_place(x)
    if static:
        if scale is None:
            raise ArgumentTypeError(
                "scale is required: a float32 array of shape (1,), or a float"
            )
        if out_view is None or out_view.dt not in ("e4m3", "e5m2"):
            got = "None" if out_view is None else _DTYPE_WORDS.get(out_view.dt, out_view.dt)
            raise ArgumentTypeError(
                f"out has dtype {got}; expected float8_e4m3fn or float8_e5m2 (its dtype picks "
                "the FP8 format; NumPy: ml_dtypes.float8_e4m3fn or float8_e5m2)"
            )
        per_tensor = True
        elem = out_view.dt
    else:
        per_tensor = fp8_per_tensor(scale, scales_out, group, scale_format, scale_layout, s_min)
        elem = fp8_element(element, out_view.dt if out_view is not None else None)
    group_size = -1 if per_tensor else fp8_group(group)
    fmt = fp8_name(scale_format, "scale_format", "f32")
    layout = fp8_name(scale_layout, "scale_layout", "row-major")
    smin = fp8_s_min(s_min)
    # Sizes from the native layer: it refuses a group, format or layout H does not allow.
    _, scales_len, scale_rows, n_groups = _core.fp8_sizes(
        m, h, None if per_tensor else group_size, fmt, layout
    )
    out, q_buf = _output(
        x, out, "out", x.shape, elem, (elem, "u8"), typed=True,
        shaped=None if per_tensor else "rows",
    )
    scales_buf = static_buf = value = None
    if per_tensor:
        static_buf, value, scales_out = _fp8_static_scale(scale, x)
    else:
        f32 = _is_f32_format(fmt)
        lay = layout.strip().lower().replace("_", "-")
        if lay == "swizzled":
            shape: Tuple[int, ...] = (scales_len,)
            rule: Optional[str] = None
        elif lay in ("row-major", "row"):
            shape, rule = x.shape[:-1] + (n_groups,), "rows"
        elif lay in ("column-major-packed", "packed"):
            # Words of four codes, as bytes: .view(int32) is DeepGEMM's [ceil(H/G/4), Mp4].
            shape, rule = ((n_groups + 3) // 4, 4 * scale_rows), "packed"
        else:
            shape, rule = (n_groups, scale_rows), "exact"
        scales_out, scales_buf = _output(
            x, scales_out, "scales_out", shape, "f32" if f32 else "u8",
            ("f32",) if f32 else ("u8", "ue8m0"), shaped=rule,
        )
    y_rows = _y_out_rows(y_out, x)
    be, ordinal, stream = _backend(x, backend)
    _core.fused_fp8(
        be, ordinal, stream, x.dt, x_rows, r_rows, w_buf, q_buf, scales_buf, static_buf, value,
        y_rows, elem, group_size, fmt, layout, smin, eps, weight_bias, pdl, **_peer_args(peers),
    )
    return out, scales_out


def dequantize_fp8(
    q: Any,
    scales: Any,
    element: Any,
    group: Any,
    scale_format: Any,
    scale_layout: Any,
    m: Optional[int],
    h: Optional[int],
) -> Any:
    """FP8 codes and their scales back to float32 (SPEC.md §8), for host arrays."""
    v = _view(q, "q")
    if v.device != "cpu":
        raise ArgumentError(
            f"dequantize_fp8 runs on host arrays only (q is on {v.device}): fp4norm has no FP8 "
            "dequantisation kernel; pass q.cpu() and scales.cpu()"
        )
    if v.dt not in ("e4m3", "e5m2", "u8"):
        raise ArgumentTypeError(
            f"q has dtype {_DTYPE_WORDS.get(v.dt, v.dt)}; expected float8_e4m3fn, float8_e5m2 "
            "or uint8"
        )
    if element is None and v.dt == "u8":
        raise ArgumentError("q is uint8: pass element (\"e4m3\" or \"e5m2\") to say its format")
    elem = fp8_element(element, v.dt)
    q_buf = v.flat()
    if (m is None) != (h is None):
        raise ArgumentError("pass both m and h, or neither (they are then read from q's shape)")
    if m is None:
        if v.ndim < 1:
            raise ArgumentError(f"q has shape {list(v.shape)}: pass m and h, or q shaped [..., H]")
        h = v.shape[-1]
        m = math.prod(v.shape[:-1])
        out_shape = v.shape
    else:
        for value, name in ((m, "m"), (h, "h")):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ArgumentTypeError(f"{name} must be a non-negative int, got {value!r}")
        m, h = int(m), int(h)
        out_shape = (m, h)
        # Before the output is allocated: its M·H floats are then bounded by q's codes.
        if v.numel != m * h:
            raise ArgumentError(f"q has {v.numel} codes but M·H = {m * h} for M = {m}, H = {h}")
    per_tensor = isinstance(group, str) and group.strip().lower() == "tensor"
    value = None
    s_buf = None
    if per_tensor:
        if isinstance(scales, numbers.Real) and not isinstance(scales, bool):
            value = float(scales)
        else:
            s = _view(scales, "scales")
            s.same_place(v)
            s.need_dtype(("f32",))
            if s.ndim > 1 or s.numel != 1:
                raise ArgumentError(
                    f"scales has shape {list(s.shape)}: a per-tensor scale is one float32 value"
                )
            value = float(s.obj.reshape(-1)[0])
        group_size = -1
    else:
        group_size = fp8_group(group)
        s = _view(scales, "scales")
        s.same_place(v)
        f32 = _is_f32_format(fp8_name(scale_format, "scale_format", "f32"))
        s.need_dtype(("f32",) if f32 else ("u8", "ue8m0"))
        s_buf = s.flat()
    out = _empty(v, out_shape, "f32")
    o_buf = _view(out, "out").flat()
    _core.dequantize_fp8(
        m, h, elem, value, group_size, fp8_name(scale_format, "scale_format", "f32"),
        fp8_name(scale_layout, "scale_layout", "row-major"), q_buf, s_buf, o_buf,
    )
    return out


def _rank_rows(x: _View, a: Any, k: int) -> Tuple[int, int, int, int]:
    """The rows of rank ``k``'s input ``a`` of a fused all-reduce whose rank 0 is ``x``:
    same place, dtype and shape, checked."""
    v = _view(a, f"inputs[{k}]")
    v.same_place(x)
    if v.dt != x.dt:
        raise ArgumentTypeError(
            f"inputs[{k}] has dtype {_DTYPE_WORDS.get(v.dt, v.dt)} but inputs[0] is "
            f"{_DTYPE_WORDS[x.dt]}: every rank's input must share one dtype"
        )
    if v.shape != x.shape:
        raise ArgumentError(f"inputs[{k}] has shape {list(v.shape)} but inputs[0] has shape {list(x.shape)}")
    return v.rows()


def fp4_written(
    residual: Any, y_fp4: Any, block_scale: Any, both: Any, unswizzled: Any, y_out: Any
) -> Tuple[Tuple[Any, str], ...]:
    """The buffers an FP4 call writes, with their names (:func:`allreduce_sum`)."""
    return (
        (residual, "residual"), (y_out, "y_out"), (y_fp4, "y_fp4"),
        (block_scale, "block_scale"),
        (unswizzled if both is True else None, "block_scale_unswizzled"),
    )


def rank_inputs(inputs: Any, most: Optional[int] = None) -> Tuple[Any, ...]:
    """``inputs`` (the ranks' arrays of an all-reduce, rank order), checked to be a
    non-empty list or tuple (of at most ``most``)."""
    if not isinstance(inputs, (list, tuple)):
        raise ArgumentTypeError(
            f"inputs must be a list (or tuple) of the ranks' arrays, got {type(inputs).__name__}"
        )
    if len(inputs) == 0:
        raise ArgumentError("inputs is empty: the all-reduce needs the input of at least one rank")
    if most is not None and len(inputs) > most:
        raise ArgumentError(f"{len(inputs)} ranks: the fused all-reduce on a GPU sums 1 to {most}")
    return tuple(inputs)


def _byte_range(v: _View) -> Optional[Tuple[int, int]]:
    """The bytes an array spans, first to one past the last (None without elements)."""
    if v.numel == 0:
        return None
    item = v.obj.dtype.itemsize if v.kind == "numpy" else v.obj.element_size()
    span = 1 + sum((n - 1) * s for n, s in zip(v.shape, v.strides))
    return v.ptr, v.ptr + span * item


def _refuse_rank_overlaps(views: List[_View], written: Tuple[Tuple[Any, str], ...]) -> None:
    """A fused all-reduce's rule on every backend (the GPU's): no rank's input may overlap
    a buffer the call writes. Arguments that are not host arrays are left to the op's own
    checks."""
    ranges = []
    for obj, name in written:
        if obj is None:
            continue
        try:
            w = _view(obj, name)
        except (ArgumentError, ArgumentTypeError):
            continue
        r = _byte_range(w) if w.device == "cpu" else None
        if r is not None:
            ranges.append((name, r))
    for v in views:
        r = _byte_range(v)
        if r is None:
            continue
        for name, (start, end) in ranges:
            if r[0] < end and start < r[1]:
                raise ArgumentError(
                    f"{name} and {v.name} overlap in memory: outputs must not alias inputs or "
                    "each other"
                )


def allreduce_sum(inputs: Any, written: Tuple[Tuple[Any, str], ...] = ()) -> Any:
    """SPEC.md §9's reduction of host arrays: the ranks' inputs summed in rank order (one
    float32 rounding per addition, one rounding to the dtype at the end), as a new array of
    the first input's kind, dtype and shape. ``written`` pairs the buffers the op on the
    sum writes with their names: no rank's input may overlap one (refused before summing,
    as the GPU's one kernel refuses it)."""
    inputs = rank_inputs(inputs)
    views = [_view(a, "inputs[0]" if k == 0 else f"inputs[{k}]") for k, a in enumerate(inputs)]
    first = views[0]
    if first.device != "cpu":
        raise ArgumentError("the reference runs on host (CPU / NumPy) arrays only")
    first.need_dtype(("bf16", "f16"))
    for v in views[1:]:
        v.same_place(first)
        if v.kind != first.kind:
            raise ArgumentTypeError(f"{v.name} is a {v.kind} array but inputs[0] is a {first.kind} one")
        if v.dt != first.dt:
            raise ArgumentTypeError(
                f"{v.name} has dtype {_DTYPE_WORDS.get(v.dt, v.dt)} but inputs[0] is "
                f"{_DTYPE_WORDS[first.dt]}: every rank's input must share one dtype"
            )
        if v.shape != first.shape:
            raise ArgumentError(
                f"{v.name} has shape {list(v.shape)} but inputs[0] has shape {list(first.shape)}"
            )
    _refuse_rank_overlaps(views, written)
    if first.kind == "numpy":
        import numpy as np

        out = np.empty(first.shape, dtype=first.obj.dtype)
    else:
        import torch

        out = torch.empty(first.shape, dtype=first.obj.dtype)
    o = _view(out, "out")
    _core.allreduce_sum(first.dt, [v.rows() for v in views], o.flat())
    return out
