"""vLLM's fused RMSNorm + FP8 quantisation operators, computed by fp4norm (SPEC.md §8).

vLLM declares four such operators in ``csrc/torch_bindings.cpp`` (``torch.ops._C.*``) and
its ``RMSNormQuantFusionPass`` emits them. This module gives each one with vLLM's name,
argument names, order and mutation annotations, writing fp4norm's contract bytes:

* :func:`rms_norm_static_fp8_quant` and :func:`fused_add_rms_norm_static_fp8_quant`: a
  per-tensor static scale, through :func:`fp4norm.rmsnorm_quant` /
  :func:`fp4norm.fused_add_rmsnorm_quant`;
* :func:`rms_norm_dynamic_per_token_quant`: one f32 scale per row, through
  :func:`fp4norm.add_rmsnorm_fp8quant` / :func:`fp4norm.rmsnorm_fp8quant` with
  ``group="token"``;
* :func:`rms_norm_per_block_quant`: one f32 scale per group of 64 or 128 (32 too), row-major
  or transposed (column-major, vLLM's ``is_scale_transposed``), through the same functions.

Dynamic scales are floored at vLLM's minimum scaling factor ``RN32(1 / (FMAX * 512))``
(:func:`scale_floor`), as vLLM's per-token and per-block kernels floor them.

Importing this module also defines the operators ``torch.ops.fp4norm_vllm.<name>`` with
vLLM's exact schemas (CPU and CUDA kernels that call these functions, and fake kernels for
``torch.compile``), so that a fusion pass can emit them where vLLM emits ``torch.ops._C``'s;
:func:`register_vllm_kernels` instead installs these functions as the kernels of vLLM's own
operators (for a vLLM general plugin).

What fp4norm cannot compute is refused with :class:`fp4norm.ArgumentError` /
:class:`fp4norm.ArgumentTypeError` naming the argument, before anything is written: a
``scale_ub`` (fp4norm's contract has no upper bound on the amax), an int8 or ROCm (``fnuz``)
``result``, a float32 ``input``, a group size other than 32, 64 or 128. A ``float8_e5m2``
``result`` is computed (vLLM's kernels take E4M3 only); a ``uint8`` ``result`` is taken as
E4M3 codes. With ``is_scale_transposed`` the scales are written straight into ``scale``
only where its storage is fp4norm's column-major buffer (see
:func:`rms_norm_per_block_quant`); otherwise into a temporary buffer, then copied.
"""

from __future__ import annotations

import inspect
import re
import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

import fp4norm

from ._errors import ArgumentError, ArgumentTypeError

__all__ = [
    "NAMESPACE",
    "VLLM_SCHEMAS",
    "scale_floor",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "rms_norm_dynamic_per_token_quant",
    "rms_norm_per_block_quant",
    "register_vllm_kernels",
]

NAMESPACE = "fp4norm_vllm"

# vLLM's schemas, as csrc/torch_bindings.cpp defines them.
VLLM_SCHEMAS: Dict[str, str] = {
    "rms_norm_static_fp8_quant": "rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
    "Tensor weight, Tensor scale, float epsilon) -> ()",
    "fused_add_rms_norm_static_fp8_quant": "fused_add_rms_norm_static_fp8_quant("
    "Tensor! result, Tensor input, Tensor! residual, Tensor weight, Tensor scale, "
    "float epsilon) -> ()",
    "rms_norm_dynamic_per_token_quant": "rms_norm_dynamic_per_token_quant(Tensor! result, "
    "Tensor input, Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, "
    "Tensor!? residual) -> ()",
    "rms_norm_per_block_quant": "rms_norm_per_block_quant(Tensor! result, Tensor input, "
    "Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, Tensor!? residual, "
    "int group_size, bool is_scale_transposed) -> ()",
}

_FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
_GROUPS = (32, 64, 128)


def _rn32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def scale_floor(dtype: torch.dtype = torch.float8_e4m3fn) -> float:
    """vLLM's minimum scaling factor for ``dtype``, ``1.0f / (FMAX * 512.0f)`` in f32
    (its ``min_scaling_factor``): ``RN32(1 / 229376)`` for E4M3, ``RN32(1 / 29360128)`` for
    E5M2 (the same rule; vLLM's fused kernels themselves take E4M3 only). The ``s_min`` the
    dynamic ops pass to fp4norm."""
    return _rn32(1.0 / (_FMAX[_element("scale_floor", "dtype", dtype)] * 512.0))


# ---------------------------------------------------------------------------------------
# Validation (vLLM's argument names; nothing is written before it passes)
# ---------------------------------------------------------------------------------------


def _tensor(op: str, name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _element(op: str, name: str, dtype: torch.dtype) -> str:
    """The FP8 element format of a ``result`` dtype; uint8 codes are E4M3, vLLM's FP8."""
    if dtype in (torch.float8_e4m3fn, torch.uint8):
        return "e4m3"
    if dtype == torch.float8_e5m2:
        return "e5m2"
    if dtype == torch.int8:
        why = "fp4norm has no int8 quantisation (vLLM's int8 path is its own kernel's)"
    elif "fnuz" in str(dtype):
        why = "fp4norm writes the OCP formats, not ROCm's fnuz FP8"
    else:
        why = "expected float8_e4m3fn, float8_e5m2 or uint8 (E4M3 codes)"
    raise ArgumentTypeError(f"{op}: {name} has dtype {str(dtype).replace('torch.', '')}: {why}")


def _rows(op: str, name: str, t: torch.Tensor, h: int) -> torch.Tensor:
    """``t`` as ``[M, H]`` without copying (a copy of a written tensor would lose the write)."""
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, h)
    except RuntimeError:
        raise ArgumentError(
            f"{op}: {name} (shape {list(t.shape)}, strides {list(t.stride())}) cannot be "
            "viewed as [M, H] without a copy"
        ) from None


def _refuse_grad(op: str, written: Sequence[Tuple[Optional[torch.Tensor], str]]) -> None:
    # As PyTorch's in-place ops: the operators are not differentiable.
    if torch.is_grad_enabled():
        for t, name in written:
            if t is not None and t.requires_grad:
                raise RuntimeError(
                    f"{op} is not differentiable and writes {name} in place, which requires "
                    "grad: call it under torch.no_grad() or on a detached tensor"
                )


def _prepare(
    op: str,
    result: Any,
    input: Any,
    weight: Any,
    residual: Any,
    scale_ub: Any = None,
) -> Tuple[str, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Checks what every op shares; returns the element format and ``input``, ``residual``
    and ``result`` as ``[M, H]`` (``result`` as float8)."""
    result = _tensor(op, "result", result)
    input = _tensor(op, "input", input)
    _tensor(op, "weight", weight)
    if scale_ub is not None:
        raise ArgumentError(
            f"{op}: scale_ub is not supported: fp4norm's contract (SPEC.md §8) has no upper "
            "bound on the amax, so it cannot write the bytes vLLM's clamped scales give; "
            "pass scale_ub=None"
        )
    if input.dtype not in (torch.bfloat16, torch.float16):
        raise ArgumentTypeError(
            f"{op}: input has dtype {str(input.dtype).replace('torch.', '')}: fp4norm "
            "computes bfloat16 and float16 inputs only"
        )
    elem = _element(op, "result", result.dtype)
    if input.dim() < 1 or input.shape[-1] < 1:
        raise ArgumentError(f"{op}: input must be [..., H] with H >= 1, got {list(input.shape)}")
    if tuple(result.shape) != tuple(input.shape):
        raise ArgumentError(
            f"{op}: result has shape {list(result.shape)}, input {list(input.shape)}: "
            "they must be equal"
        )
    if result.device != input.device:
        raise ArgumentError(f"{op}: result is on {result.device}, input on {input.device}")
    if not result.is_contiguous():
        raise ArgumentError(f"{op}: result must be contiguous, got strides {list(result.stride())}")
    h = input.shape[-1]
    if residual is not None:
        residual = _tensor(op, "residual", residual)
        if tuple(residual.shape) != tuple(input.shape):
            raise ArgumentError(
                f"{op}: residual has shape {list(residual.shape)}, input "
                f"{list(input.shape)}: they must be equal"
            )
        residual = _rows(op, "residual", residual, h)
    q = result.view(-1, h)
    if q.dtype == torch.uint8:
        q = q.view(torch.float8_e4m3fn)
    return elem, _rows(op, "input", input, h), residual, q


def _f32_scale(op: str, scale: Any, input: torch.Tensor) -> torch.Tensor:
    scale = _tensor(op, "scale", scale)
    if scale.dtype != torch.float32:
        raise ArgumentTypeError(
            f"{op}: scale has dtype {str(scale.dtype).replace('torch.', '')}; expected float32"
        )
    if scale.device != input.device:
        raise ArgumentError(f"{op}: scale is on {scale.device}, input on {input.device}")
    return scale


def _group(op: str, group_size: Any) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ArgumentTypeError(f"{op}: group_size must be an int, got {type(group_size).__name__}")
    if group_size not in _GROUPS:
        raise ArgumentError(
            f"{op}: group_size = {group_size} is not supported: fp4norm has groups of 32, "
            "64 and 128 (vLLM uses 64 and 128)"
        )
    return group_size


def _call(op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """One fp4norm call; its argument errors named by this op's argument names."""
    try:
        fn(*args, **kwargs)
    except (ArgumentError, ArgumentTypeError) as e:
        message = re.sub(r"\bscales_out\b", "scale", str(e))
        raise type(e)(f"{op}: " + re.sub(r"\bout\b", "result", message)) from None


# ---------------------------------------------------------------------------------------
# The four operators' functions
# ---------------------------------------------------------------------------------------


def rms_norm_static_fp8_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    epsilon: float,
) -> None:
    """vLLM's ``rms_norm_static_fp8_quant``: RMSNorm + FP8 with a per-tensor static
    scale, ``result <- FP8(RN32(y * RN32(1 / scale)))`` (SPEC.md §8), through
    :func:`fp4norm.rmsnorm_quant`.

    ``result``: float8_e4m3fn / float8_e5m2 (or uint8, E4M3 codes), ``input``'s shape,
    contiguous, written. ``input``: ``[..., H]`` bfloat16 / float16, the last dimension
    contiguous. ``weight``: ``[H]``. ``scale``: float32 of shape ``()``, ``(1,)`` or
    ``(1, 1)`` on the input's device, read when the kernel runs."""
    op = "rms_norm_static_fp8_quant"
    _, x, _, q = _prepare(op, result, input, weight, None)
    s = _static_scale(op, scale, input)
    _refuse_grad(op, ((result, "result"),))
    _call(op, fp4norm.rmsnorm_quant, q, x, weight, s, epsilon)


def fused_add_rms_norm_static_fp8_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    epsilon: float,
) -> None:
    """vLLM's ``fused_add_rms_norm_static_fp8_quant``: ``residual <- RNdt(input +
    residual)`` in place, then :func:`rms_norm_static_fp8_quant` of it, through
    :func:`fp4norm.fused_add_rmsnorm_quant`. ``residual``: ``input``'s shape and dtype."""
    op = "fused_add_rms_norm_static_fp8_quant"
    if residual is None:
        raise ArgumentTypeError(f"{op}: residual must be a torch.Tensor, got None")
    _, x, r, q = _prepare(op, result, input, weight, residual)
    s = _static_scale(op, scale, input)
    _refuse_grad(op, ((result, "result"), (residual, "residual")))
    _call(op, fp4norm.fused_add_rmsnorm_quant, q, x, r, weight, s, epsilon)


def _static_scale(op: str, scale: Any, input: torch.Tensor) -> torch.Tensor:
    scale = _f32_scale(op, scale, input)
    if scale.numel() != 1 or scale.dim() > 2:
        raise ArgumentError(
            f"{op}: scale has shape {list(scale.shape)}: a per-tensor scale has shape (), "
            "(1,) or (1, 1)"
        )
    return scale.reshape(1)  # a view: one element is always viewable


def rms_norm_dynamic_per_token_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    epsilon: float,
    scale_ub: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
) -> None:
    """vLLM's ``rms_norm_dynamic_per_token_quant``: one f32 scale per row,
    ``s = max(RN32(amax(y) / FMAX), scale_floor)`` and ``result <- FP8(RN32(y *
    RN32(1 / s)))`` (SPEC.md §8); with ``residual``, ``residual <- RNdt(input + residual)``
    in place and that sum normalised. Through :func:`fp4norm.add_rmsnorm_fp8quant` /
    :func:`fp4norm.rmsnorm_fp8quant` with ``group="token"``, ``s_min=scale_floor(...)``.

    ``scale``: float32, ``M`` values, contiguous (vLLM's ``[M, 1]``), written.
    ``scale_ub`` must be None (not supported: fp4norm's contract has no upper bound on the
    amax). The other arguments are as in :func:`rms_norm_static_fp8_quant`."""
    op = "rms_norm_dynamic_per_token_quant"
    elem, x, r, q = _prepare(op, result, input, weight, residual, scale_ub)
    scale = _f32_scale(op, scale, input)
    m = x.shape[0]
    if scale.numel() != m or not scale.is_contiguous():
        raise ArgumentError(
            f"{op}: scale must be a contiguous float32 [M, 1] tensor (M = {m}), got shape "
            f"{list(scale.shape)}, strides {list(scale.stride())}"
        )
    _refuse_grad(op, ((result, "result"), (scale, "scale"), (residual, "residual")))
    _dynamic(op, x, r, weight, q, scale, epsilon, elem, "token", "row-major")


def rms_norm_per_block_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    epsilon: float,
    scale_ub: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    group_size: int,
    is_scale_transposed: bool,
) -> None:
    """vLLM's ``rms_norm_per_block_quant``: one f32 scale per group of ``group_size``
    elements of a row (64 or 128 in vLLM; 32 too), floored and applied as in
    :func:`rms_norm_dynamic_per_token_quant`. Through :func:`fp4norm.add_rmsnorm_fp8quant`
    / :func:`fp4norm.rmsnorm_fp8quant` with ``group=group_size``.

    ``scale``: float32 of logical shape ``[M, H/G]``, written. Not transposed: contiguous
    (row-major). Transposed (``is_scale_transposed``): any layout whose elements do not
    overlap, as vLLM makes it a column-major view with strides ``(1, Mpad)``, ``Mpad = M``
    or ``4 * ceil(M / 4)`` (TMA-aligned), by ``torch.empty_strided``. When that view is
    exactly fp4norm's column-major layout, strides ``(1, Mp4)`` with ``Mp4 = 4 * ceil(M /
    4)``, and either ``Mp4 == M`` or its storage is exactly that ``[H/G, Mp4]`` buffer
    (offset 0, ``H/G * Mp4`` floats), fp4norm writes it directly, the padding rows
    ``M..Mp4-1`` of that buffer as zeros. Otherwise (``M % 4 != 0`` with ``empty_strided``'s
    storage, which ends at the last valid element; ``Mpad = M``; a view into a larger
    buffer; another layout) fp4norm writes a temporary ``[H/G, Mp4]`` buffer and
    ``scale.copy_`` copies the valid ``[M, H/G]`` values into ``scale``: one more small
    kernel, and nothing outside ``scale``'s elements is written."""
    op = "rms_norm_per_block_quant"
    elem, x, r, q = _prepare(op, result, input, weight, residual, scale_ub)
    g = _group(op, group_size)
    m, h = x.shape
    if h % g:
        raise ArgumentError(f"{op}: H = {h} is not a multiple of group_size = {g}")
    n = h // g
    scale = _f32_scale(op, scale, input)
    if tuple(scale.shape) != (m, n):
        raise ArgumentError(
            f"{op}: scale has shape {list(scale.shape)}; expected [M, H/G] = {[m, n]}"
        )
    copy_back = False
    if not is_scale_transposed:
        if not scale.is_contiguous():
            raise ArgumentError(
                f"{op}: scale must be contiguous (row-major) when is_scale_transposed is "
                f"False, got strides {list(scale.stride())}"
            )
        target, layout = scale, "row-major"
    else:
        layout = "column-major"
        target = _column_major_view(scale, m, n)
        if target is None:
            if not _non_overlapping(scale):
                raise ArgumentError(
                    f"{op}: scale's elements overlap (strides {list(scale.stride())}): "
                    "they cannot all be written"
                )
            target = torch.empty((n, (m + 3) // 4 * 4), dtype=torch.float32, device=scale.device)
            copy_back = True
    _refuse_grad(op, ((result, "result"), (scale, "scale"), (residual, "residual")))
    _dynamic(op, x, r, weight, q, target, epsilon, elem, g, layout)
    if copy_back:
        scale.copy_(target[:, :m].t())


def _dynamic(
    op: str, x: torch.Tensor, r: Optional[torch.Tensor], weight: torch.Tensor,
    q: torch.Tensor, scales: torch.Tensor, epsilon: float, elem: str, group: Any,
    layout: str,
) -> None:
    if x.shape[0] == 0:
        return  # nothing to write (SPEC.md §1)
    options = dict(
        element=elem, group=group, scale_format="f32", scale_layout=layout,
        s_min=scale_floor(torch.float8_e5m2 if elem == "e5m2" else torch.float8_e4m3fn),
    )
    if r is None:
        _call(op, fp4norm.rmsnorm_fp8quant, x, weight, q, scales, epsilon, **options)
    else:
        _call(op, fp4norm.add_rmsnorm_fp8quant, x, r, weight, q, scales, epsilon, **options)


def _column_major_view(scale: torch.Tensor, m: int, n: int) -> Optional[torch.Tensor]:
    """``scale`` as fp4norm's ``[H/G, Mp4]`` buffer where writing that buffer writes only
    ``scale``'s own memory: its strides are ``(1, Mp4)`` and either there is no padding or
    the storage is exactly that buffer. None otherwise."""
    mp4 = (m + 3) // 4 * 4
    if m == 0 or n == 0:
        return None
    if (m > 1 and scale.stride(0) != 1) or (n > 1 and scale.stride(1) != mp4):
        return None
    if mp4 != m and (
        scale.storage_offset() != 0 or scale.untyped_storage().nbytes() != n * mp4 * 4
    ):
        return None
    return scale.as_strided((n, mp4), (mp4, 1))


def _non_overlapping(t: torch.Tensor) -> bool:
    # Sufficient rule: each stride, in increasing order, exceeds the span of the smaller ones.
    span = 0
    for stride, size in sorted((t.stride(i), t.size(i)) for i in range(t.dim()) if t.size(i) > 1):
        if stride <= span:
            return False
        span += stride * (size - 1)
    return True


_FUNCTIONS: Dict[str, Callable[..., None]] = {
    "rms_norm_static_fp8_quant": rms_norm_static_fp8_quant,
    "fused_add_rms_norm_static_fp8_quant": fused_add_rms_norm_static_fp8_quant,
    "rms_norm_dynamic_per_token_quant": rms_norm_dynamic_per_token_quant,
    "rms_norm_per_block_quant": rms_norm_per_block_quant,
}


# ---------------------------------------------------------------------------------------
# torch.ops.fp4norm_vllm.*: vLLM's schemas, these functions as CPU and CUDA kernels
# ---------------------------------------------------------------------------------------

_LIB = torch.library.Library(NAMESPACE, "DEF")
for _name, _schema in VLLM_SCHEMAS.items():
    _LIB.define(_schema)
    for _key in ("CPU", "CUDA"):
        _LIB.impl(_name, _FUNCTIONS[_name], _key)
    # The ops return nothing: tracing needs only to know that they exist.
    torch.library.register_fake(f"{NAMESPACE}::{_name}", lib=_LIB)(
        lambda *args, **kwargs: None
    )


# ---------------------------------------------------------------------------------------
# register_vllm_kernels: these functions as the kernels of vLLM's own operators
# ---------------------------------------------------------------------------------------

# Registrations live as long as their Library object: kept here, one per (namespace, name, key).
_INSTALLED: Dict[Tuple[str, str, str], Any] = {}


def _same_schema(a: Any, b: Any) -> bool:
    """Argument names, types, written-ness, defaults and returns equal (alias set names
    aside, which differ between ``Tensor!`` and ``Tensor(a!)``)."""

    def key(s: Any) -> Any:
        return (
            s.overload_name,
            [
                (x.name, str(x.type), x.alias_info is not None and x.alias_info.is_write,
                 repr(x.default_value), x.kwarg_only)
                for x in s.arguments
            ],
            [str(x.type) for x in s.returns],
        )

    return key(a) == key(b)


def _previous_kernel(op: Any, key: str) -> Any:
    get_kernel = getattr(torch.library, "get_kernel", None)  # torch >= 2.9
    if get_kernel is None or not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
        return None
    return get_kernel(op, key)


def _kernel(fn: Callable[..., None], previous: Any) -> Callable[..., None]:
    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except (ArgumentError, ArgumentTypeError):
            # Nothing was written: the kernel that was there before computes this call.
            if previous is None:
                raise
            previous.call_boxed(keyset, *args, **kwargs)

    return kernel


# Replacing a kernel registered from Python (not vLLM's C++ ones) needs allow_override
# on the torch releases that refuse it by default (2.10 among them); older ones lack it.
_OVERRIDE: Dict[str, Any] = {"with_keyset": True}
if "allow_override" in inspect.signature(torch.library.Library.impl).parameters:
    _OVERRIDE["allow_override"] = True


def register_vllm_kernels(
    namespace: str = "_C", dispatch_keys: Sequence[str] = ("CUDA",)
) -> List[str]:
    """Makes fp4norm compute vLLM's operators ``torch.ops.<namespace>.<name>`` for the
    four names of :data:`VLLM_SCHEMAS`: registers this module's functions as their kernels
    at ``dispatch_keys`` ("CPU" and/or "CUDA") through ``torch.library.Library(namespace,
    "IMPL")``, for a vLLM general plugin (``vllm.general_plugins`` entry point) to call
    after vLLM has loaded ``vllm._C``.

    Only operators that exist in ``namespace`` are registered; each one's schema must be
    vLLM's (argument names, types and mutations), else ArgumentError is raised and nothing
    is registered. A call that fp4norm cannot compute (an int8 result, ``scale_ub``, a
    float32 input, ...: the ArgumentError / ArgumentTypeError cases of the functions, which
    write nothing) goes to the kernel registered before at that key, vLLM's own, where there
    was one (``torch.library.get_kernel``, torch >= 2.9); else the error is raised. PyTorch
    warns once that a kernel is overridden. Registrations last for the process; a second
    call for the same namespace and key registers nothing again.

    Returns the qualified names (``"namespace::name"``) of the operators this call
    registered a kernel for.
    """
    if isinstance(dispatch_keys, str):
        dispatch_keys = (dispatch_keys,)
    keys = tuple(dispatch_keys)
    for key in keys:
        if key not in ("CPU", "CUDA"):
            raise ArgumentError(
                f"dispatch_keys: {key!r} is not supported: fp4norm computes CPU and CUDA tensors"
            )
    if not isinstance(namespace, str) or not namespace:
        raise ArgumentTypeError("namespace must be a non-empty str")
    if namespace == NAMESPACE:
        raise ArgumentError(f"namespace {NAMESPACE!r} is this module's own: its kernels are fp4norm's")
    ops = getattr(torch.ops, namespace)
    found = []
    for name, text in VLLM_SCHEMAS.items():
        if not hasattr(ops, name):
            continue
        overload = getattr(getattr(ops, name), "default", None)
        expected = torch._C.parse_schema(f"{namespace}::{text}")
        if overload is None or not _same_schema(overload._schema, expected):
            got = "no default overload" if overload is None else str(overload._schema)
            raise ArgumentError(
                f"{namespace}::{name} is not vLLM's operator: its schema is {got}, fp4norm "
                f"computes {namespace}::{text}; nothing was registered"
            )
        found.append((name, overload))
    registered = []
    lib = None
    for name, overload in found:
        new = False
        for key in keys:
            if (namespace, name, key) in _INSTALLED:
                continue
            previous = _previous_kernel(overload, key)
            if lib is None:
                lib = torch.library.Library(namespace, "IMPL")
            lib.impl(name, _kernel(_FUNCTIONS[name], previous), key, **_OVERRIDE)
            _INSTALLED[(namespace, name, key)] = lib
            new = True
        if new:
            registered.append(f"{namespace}::{name}")
    return registered
