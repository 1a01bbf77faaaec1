"""The ``fp4norm::*`` PyTorch operators.

Schemas and fake (meta) kernels are defined here with ``torch.library``; the CPU and CUDA
kernels are native (Rust, registered through PyTorch's stable C ABI by
``_core.register_torch_ops``). The operators are what ``torch.compile`` traces and what
CUDA graphs capture; the FlashInfer-signature functions of :mod:`fp4norm` call them for
torch tensors.

Operators (``torch.ops.fp4norm``):

* ``add_rmsnorm_fp4quant(input, residual, weight, global_scale=None, eps=1e-6,
  block_size=16, scale_format=None, is_sf_swizzled_layout=False, y_out=None,
  enable_pdl=None, weight_bias=0.0) -> (y_fp4, block_scale)``: mutates ``residual`` (and
  ``y_out``), returns new outputs. ``weight_bias`` is added to every weight (SPEC.md §8; 1.0
  for Gemma's ``(1 + w)``).
* ``add_rmsnorm_fp4quant.both(...)``, the same arguments ``-> (y_fp4, block_scale,
  block_scale_unswizzled)``: both scale layouts, ``block_scale`` swizzled
  (``is_sf_swizzled_layout`` is ignored).
* ``add_rmsnorm_fp4quant.out(input, residual, weight, y_fp4, block_scale,
  block_scale_unswizzled=None, global_scale=None, eps=1e-6, block_size=16,
  scale_format=None, is_sf_swizzled_layout=False, y_out=None, enable_pdl=None,
  weight_bias=0.0) -> ()``:
  writes preallocated outputs; a ``block_scale_unswizzled`` asks for both layouts.
* ``rmsnorm_fp4quant``, ``.both`` and ``.out``: the same without ``residual``.
* ``dequantize(y_fp4, block_scale, global_scale=None, block_size=16, scale_format=None,
  is_sf_swizzled_layout=False) -> Tensor``: float32 ``[..., H]`` from ``y_fp4 [..., H/2]``.
* ``allreduce_add_rmsnorm_fp4quant(inputs, residual, weight, ...)``, ``.both`` and
  ``.out``: ``add_rmsnorm_fp4quant``'s overloads with ``Tensor[] inputs`` (every rank's
  input, rank order, 1 to 8) for ``input``: the tensor-parallel all-reduce fused in front
  (SPEC.md §9), the inputs summed in rank order, then the op on the sum.

The FP8 family (SPEC.md §8):

* ``rmsnorm_quant(out, input, weight, scale, eps=1e-6, enable_pdl=None, y_out=None,
  weight_bias=0.0, element=None) -> ()`` and ``fused_add_rmsnorm_quant(out, input,
  residual, weight, scale, eps=1e-6, enable_pdl=None, y_out=None, weight_bias=0.0,
  element=None) -> ()``: FlashInfer's operators (a per-tensor static scale, a float32
  tensor of one value read when the kernel runs; ``out``'s dtype, ``float8_e4m3fn`` or
  ``float8_e5m2``, picks the element format), with ``y_out``, ``weight_bias`` and
  ``element`` (for a uint8 ``out``) appended. They mutate ``out`` (and ``residual``, and
  ``y_out``) and return nothing.
* ``add_rmsnorm_fp8quant(input, residual, weight, element="e4m3", group_size=-1,
  scale_format="f32", scale_layout="row-major", s_min=0.0, eps=1e-6, y_out=None,
  enable_pdl=None, weight_bias=0.0) -> (out, scales)``: dynamic scales, one per group of
  ``group_size`` elements of a row (-1: per token), f32 (floored at ``s_min``) or UE8M0, in
  the row-major ``[..., H/G]``, column-major ``[H/G, 4*ceil(M/4)]``, (UE8M0, G = 32)
  swizzled 128x4 or (UE8M0, G = 32, 64, 128) packed column-major ``[ceil(H/G/4),
  4*4*ceil(M/4)]`` bytes layout; ``.out(input, residual, weight, out, scales_out, ...) -> ()``
  writes preallocated outputs.
* ``rmsnorm_fp8quant`` and ``.out``: the same without ``residual``.
* ``allreduce_add_rmsnorm_fp8quant(inputs, residual, weight, ...)`` and ``.out``, and
  ``allreduce_fused_add_rmsnorm_quant(out, inputs, residual, weight, scale, ...)``: the FP8
  operators with a residual, ``Tensor[] inputs`` (every rank's input, rank order, 1 to 8)
  in ``input``'s place, as for the FP4 op: the ranks' sum (SPEC.md §9), then the op.

A failure inside a native kernel reaches Python as RuntimeError whose message starts with
``fp4norm.ArgumentError:`` / ``fp4norm.ArgumentTypeError:`` / ``fp4norm.RuntimeError:``;
:func:`translate` turns it into that class.
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Optional, Tuple

import torch

from . import _api, _core
from ._errors import ArgumentError, ArgumentTypeError

Tensor = torch.Tensor

_fp4_format = _api.fp4_scale_format

_OPTIONS = (
    "Tensor? global_scale=None, float eps=1e-06, int block_size=16, str? scale_format=None, "
    "bool is_sf_swizzled_layout=False"
)
# The functional forms: `.default` returns (y_fp4, block_scale), `.both` also the
# row-major scales (block_scale then holds the swizzled layout; is_sf_swizzled_layout is
# ignored). Two overloads, not a flag, so that a call allocates only the outputs it returns.
_FUNCTIONAL_TAIL = "Tensor(b!)? y_out=None, bool? enable_pdl=None, float weight_bias=0.0)"
SCHEMAS = {
    "add_rmsnorm_fp4quant": "add_rmsnorm_fp4quant(Tensor input, Tensor(a!) residual, Tensor weight, "
    f"{_OPTIONS}, {_FUNCTIONAL_TAIL} -> (Tensor, Tensor)",
    "add_rmsnorm_fp4quant.both": "add_rmsnorm_fp4quant.both(Tensor input, Tensor(a!) residual, "
    f"Tensor weight, {_OPTIONS}, {_FUNCTIONAL_TAIL} -> (Tensor, Tensor, Tensor)",
    "add_rmsnorm_fp4quant.out": "add_rmsnorm_fp4quant.out(Tensor input, Tensor(a!) residual, "
    "Tensor weight, Tensor(b!) y_fp4, Tensor(c!) block_scale, "
    f"Tensor(d!)? block_scale_unswizzled=None, {_OPTIONS}, Tensor(e!)? y_out=None, "
    "bool? enable_pdl=None, float weight_bias=0.0) -> ()",
    "rmsnorm_fp4quant": "rmsnorm_fp4quant(Tensor input, Tensor weight, "
    f"{_OPTIONS}, {_FUNCTIONAL_TAIL} -> (Tensor, Tensor)",
    "rmsnorm_fp4quant.both": "rmsnorm_fp4quant.both(Tensor input, Tensor weight, "
    f"{_OPTIONS}, {_FUNCTIONAL_TAIL} -> (Tensor, Tensor, Tensor)",
    "rmsnorm_fp4quant.out": "rmsnorm_fp4quant.out(Tensor input, Tensor weight, "
    "Tensor(b!) y_fp4, Tensor(c!) block_scale, Tensor(d!)? block_scale_unswizzled=None, "
    f"{_OPTIONS}, Tensor(e!)? y_out=None, bool? enable_pdl=None, float weight_bias=0.0) -> ()",
    "dequantize": "dequantize(Tensor y_fp4, Tensor block_scale, Tensor? global_scale=None, "
    "int block_size=16, str? scale_format=None, bool is_sf_swizzled_layout=False) -> Tensor",
}
# The FP8 family (SPEC.md §8). FlashInfer's two operators with their argument order, then
# y_out, weight_bias and element (for a uint8 out); the dynamic-scale operators in the FP4
# ones' pattern (a functional overload that allocates, `.out` for preallocated outputs).
_FP8_STATIC_TAIL = (
    "float eps=1e-06, bool? enable_pdl=None, Tensor({y}!)? y_out=None, float weight_bias=0.0, "
    "str? element=None) -> ()"
)
_FP8_OPTIONS = (
    'str element="e4m3", int group_size=-1, str scale_format="f32", '
    'str scale_layout="row-major", float s_min=0.0, float eps=1e-06'
)
_FP8_TAIL = "Tensor({y}!)? y_out=None, bool? enable_pdl=None, float weight_bias=0.0)"
SCHEMAS.update({
    "rmsnorm_quant": "rmsnorm_quant(Tensor(a!) out, Tensor input, Tensor weight, Tensor scale, "
    + _FP8_STATIC_TAIL.format(y="b"),
    "fused_add_rmsnorm_quant": "fused_add_rmsnorm_quant(Tensor(a!) out, Tensor input, "
    "Tensor(b!) residual, Tensor weight, Tensor scale, " + _FP8_STATIC_TAIL.format(y="c"),
    "add_rmsnorm_fp8quant": "add_rmsnorm_fp8quant(Tensor input, Tensor(a!) residual, "
    f"Tensor weight, {_FP8_OPTIONS}, {_FP8_TAIL.format(y='b')} -> (Tensor, Tensor)",
    "add_rmsnorm_fp8quant.out": "add_rmsnorm_fp8quant.out(Tensor input, Tensor(a!) residual, "
    f"Tensor weight, Tensor(b!) out, Tensor(c!) scales_out, {_FP8_OPTIONS}, "
    f"{_FP8_TAIL.format(y='d')} -> ()",
    "rmsnorm_fp8quant": "rmsnorm_fp8quant(Tensor input, Tensor weight, "
    f"{_FP8_OPTIONS}, {_FP8_TAIL.format(y='b')} -> (Tensor, Tensor)",
    "rmsnorm_fp8quant.out": "rmsnorm_fp8quant.out(Tensor input, Tensor weight, "
    f"Tensor(b!) out, Tensor(c!) scales_out, {_FP8_OPTIONS}, {_FP8_TAIL.format(y='d')} -> ()",
})
# The fused all-reduce (SPEC.md §9) in front of every op with a residual: its overloads with
# every rank's input in input's place, so that the two can never disagree on the rest.
for _name in (
    "add_rmsnorm_fp4quant", "add_rmsnorm_fp4quant.both", "add_rmsnorm_fp4quant.out",
    "add_rmsnorm_fp8quant", "add_rmsnorm_fp8quant.out", "fused_add_rmsnorm_quant",
):
    SCHEMAS["allreduce_" + _name] = "allreduce_" + SCHEMAS[_name].replace(
        "Tensor input,", "Tensor[] inputs,", 1
    )

_LIB = torch.library.Library("fp4norm", "DEF")
for _schema in SCHEMAS.values():
    _LIB.define(_schema)


def _register_native() -> int:
    # The CUDA kernels are compiled by NVRTC on first use: point fp4norm at the
    # nvidia-cuda-nvrtc wheel PyTorch installs, unless FP4NORM_NVRTC_DIR says otherwise.
    _api._find_nvrtc()
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cuda = os.path.join(lib, "libtorch_cuda.so")
    return _core.register_torch_ops(
        os.path.join(lib, "libtorch_cpu.so"), cuda if os.path.exists(cuda) else None
    )


try:
    ABI_VERSION = _register_native()
except Exception:
    # Undefine the schemas, so that importing fp4norm again raises this error again rather
    # than torch's complaint about a second definition of the namespace.
    _LIB._destroy()
    raise

_ops = torch.ops.fp4norm
ADD = _ops.add_rmsnorm_fp4quant.default
ADD_BOTH = _ops.add_rmsnorm_fp4quant.both
ADD_OUT = _ops.add_rmsnorm_fp4quant.out
RMS = _ops.rmsnorm_fp4quant.default
RMS_BOTH = _ops.rmsnorm_fp4quant.both
RMS_OUT = _ops.rmsnorm_fp4quant.out
DEQUANTIZE = _ops.dequantize.default
RMS_QUANT = _ops.rmsnorm_quant.default
ADD_QUANT = _ops.fused_add_rmsnorm_quant.default
ADD_FP8 = _ops.add_rmsnorm_fp8quant.default
ADD_FP8_OUT = _ops.add_rmsnorm_fp8quant.out
RMS_FP8 = _ops.rmsnorm_fp8quant.default
RMS_FP8_OUT = _ops.rmsnorm_fp8quant.out
ALLREDUCE = _ops.allreduce_add_rmsnorm_fp4quant.default
ALLREDUCE_BOTH = _ops.allreduce_add_rmsnorm_fp4quant.both
ALLREDUCE_OUT = _ops.allreduce_add_rmsnorm_fp4quant.out
ALLREDUCE_FP8 = _ops.allreduce_add_rmsnorm_fp8quant.default
ALLREDUCE_FP8_OUT = _ops.allreduce_add_rmsnorm_fp8quant.out
ALLREDUCE_QUANT = _ops.allreduce_fused_add_rmsnorm_quant.default


# --------------------------------------------------------------------------------------
# Autograd: the operators are not differentiable; their in-place writes are PyTorch's.
# --------------------------------------------------------------------------------------


def refuse_if_requires_grad(t: Tensor, op_name: str, arg: str) -> None:
    """What PyTorch's own in-place ops do, with grad mode on, to a tensor that requires
    grad: a leaf is refused with PyTorch's message; a non-leaf is refused too, since
    fp4norm's operators are not differentiable."""
    if t.requires_grad:
        if t.is_leaf:
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an in-place operation "
                f"({op_name} writes {arg} in place)."
            )
        raise RuntimeError(
            f"{op_name} is not differentiable and writes {arg} in place, which requires "
            "grad: call it under torch.no_grad() or on a detached tensor"
        )


def refuse_inference(written: Any) -> None:
    """Outside inference mode, refuses to write an inference tensor, as PyTorch's own
    in-place ops do (``written`` pairs tensors with their argument names)."""
    for t, name in written:
        if isinstance(t, Tensor) and t.is_inference():
            raise ArgumentError(_api.inference_message(name))


def _autograd_kernel(op: Any) -> Any:
    """The Autograd kernel of a mutating operator: refuses to write a tensor that requires
    grad (a leaf as torch's own in-place ops refuse it), runs the operator below autograd
    (its outputs never require grad) and advances the version counter of every tensor it
    wrote, as an in-place op of PyTorch does."""
    written = [
        (i, a.name) for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]
    below = torch._C._after_autograd_keyset
    name = op._schema.name

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        # The dispatcher passes arguments left at their defaults by name, or not at all.
        tensors = [
            (args[i] if i < len(args) else kwargs.get(arg), arg) for i, arg in written
        ]
        tensors = [(t, arg) for t, arg in tensors if t is not None]
        if torch.is_grad_enabled():
            for t, arg in tensors:
                refuse_if_requires_grad(t, name, arg)
        if not torch.is_inference_mode_enabled():
            try:
                refuse_inference(tensors)
            except ArgumentError as e:  # torch.ops' convention: the class in the message
                raise RuntimeError(f"fp4norm.ArgumentError: {e}") from None
        out = op.redispatch(keyset & below, *args, **kwargs)
        torch.autograd.graph.increment_version([t for t, _ in tensors])
        return out

    return kernel


for _op in (
    ADD, ADD_BOTH, ADD_OUT, RMS, RMS_BOTH, RMS_OUT,
    RMS_QUANT, ADD_QUANT, ADD_FP8, ADD_FP8_OUT, RMS_FP8, RMS_FP8_OUT,
    ALLREDUCE, ALLREDUCE_BOTH, ALLREDUCE_OUT, ALLREDUCE_FP8, ALLREDUCE_FP8_OUT, ALLREDUCE_QUANT,
):
    _LIB.impl(_op._schema.name.split("::")[1] + (
        "." + _op._schema.overload_name if _op._schema.overload_name else ""
    ), _autograd_kernel(_op), "Autograd", with_keyset=True)
# Dequantisation writes nothing it is given, and is not differentiable either.
_LIB.impl("dequantize", torch.library.fallthrough_kernel, "Autograd")


# --------------------------------------------------------------------------------------
# Fake kernels: output shapes from input shapes, with no guard on the token count, after
# the checks that need no data (dtypes, ranks, H against the block or group, options), so
# that a bad call fails when torch.compile or torch.export traces it, with the kernels'
# classes and messages, rather than when the compiled code runs.
# --------------------------------------------------------------------------------------


def _scale_dtype(block_size: int, scale_format: Optional[str]) -> torch.dtype:
    # The spellings every path accepts (an ArgumentError for any other, as the kernels).
    fmt = _fp4_format(scale_format) or ("ue8m0" if block_size == 32 else "e4m3")
    return torch.float8_e4m3fn if fmt == "e4m3" else torch.uint8


def _word(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_ROW_DTYPES = (torch.bfloat16, torch.float16)


def _need_dtype(t: Tensor, name: str, allowed: Tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise ArgumentTypeError(
            f"{name} has dtype {_word(t.dtype)}; expected {' or '.join(_word(d) for d in allowed)}"
        )


def _same_device(t: Tensor, name: str, input: Tensor, input_name: str) -> None:
    if t.device != input.device:
        raise ArgumentError(
            f"{name} is on {t.device} but {input_name} is on {input.device}: put all tensors "
            "of one call on one device"
        )


def _check_rows(
    input: Tensor, residual: Optional[Tensor], weight: Tensor, y_out: Optional[Tensor],
    ranks: Tuple[Tensor, ...] = (), name: str = "input",
) -> Any:
    """The row tensors' rules (the kernels' ``read_rows``): ``input`` bf16 or f16, 2-D or
    3-D; ``residual``, ``y_out`` and the other ranks' inputs of its dtype, device and shape;
    ``weight`` ``[H]`` of its dtype and device. Returns H. Shapes are compared only with
    shapes (no guard on the token count beyond equality)."""
    required(input, name)
    required(weight, "weight")
    _need_dtype(input, name, _ROW_DTYPES)
    if input.dim() not in (2, 3):
        raise ArgumentError(
            f"{name} must be 2-D [M, H] or 3-D [B, S, H]; got shape {list(input.shape)}"
        )
    rule = "input, residual, weight and y_out must share one dtype"
    rows = [(residual, "residual", rule)]
    rows += [(r, f"inputs[{k + 1}]", "every rank's input must share one dtype") for k, r in enumerate(ranks)]
    for t, n, why in rows[:1] + [(weight, "weight", rule), (y_out, "y_out", rule)] + rows[1:]:
        if t is None:
            continue
        _same_device(t, n, input, name)
        if t.dtype != input.dtype:
            raise ArgumentTypeError(
                f"{n} has dtype {_word(t.dtype)} but {name} is {_word(input.dtype)}: {why}"
            )
        if n == "weight":
            h = input.shape[-1]
            if t.dim() != 1 or t.shape[0] != h:
                raise ArgumentError(
                    f"weight has shape {list(t.shape)}; expected ({h},), one value per hidden "
                    "element"
                )
        elif tuple(t.shape) != tuple(input.shape):
            raise ArgumentError(
                f"{n} has shape {list(t.shape)} but {name} has shape {list(input.shape)}"
            )
    return input.shape[-1]


def _rank_list(inputs: Any) -> Tuple[Tensor, Tuple[Tensor, ...]]:
    """A fused all-reduce's ``Tensor[] inputs``: rank 0's and the others', 1 to 8 in all."""
    if len(inputs) == 0:
        raise ArgumentError("inputs is empty: the all-reduce needs the input of at least one rank")
    if len(inputs) > 8:
        raise ArgumentError(f"{len(inputs)} ranks: the fused all-reduce sums 1 to 8")
    return inputs[0], tuple(inputs[1:])


def _check_fp4(
    input, residual, weight, y_out, global_scale, block_size, scale_format, ranks=(),
    name="input",
) -> None:
    """An FP4 call's rules that need no data, in the kernels' order: block size and scale
    format, the row tensors, the global scale's dtype and rank, H a positive multiple of
    the block."""
    if block_size not in (16, 32):
        raise ArgumentError(
            f"block_size = {block_size} is not supported: use 16 (NVFP4) or 32 (MXFP4)"
        )
    _fp4_format(scale_format)
    h = _check_rows(input, residual, weight, y_out, ranks, name)
    if global_scale is not None:
        _same_device(global_scale, "global_scale", input, name)
        _need_dtype(global_scale, "global_scale", (torch.float32,))
        if global_scale.dim() > 1:
            raise ArgumentError(
                f"global_scale has shape {list(global_scale.shape)}: pass shape (1,) (one "
                "scale) or (M,) (one per row)"
            )
    _check_hidden(h, block_size)


def _check_hidden(h: Any, block_size: int) -> None:
    if h == 0:
        raise ArgumentError(
            f"hidden size H is 0: H must be a positive multiple of the block size ({block_size})"
        )
    if h % block_size != 0:
        raise ArgumentError(
            f"hidden size H = {h} is not a multiple of the block size {block_size}: use H "
            f"divisible by {block_size}, or another block size"
        )


def _fp4_scale_dtypes(block_size: int, scale_format: Optional[str]) -> Tuple[torch.dtype, ...]:
    """The dtypes a caller's FP4 scale output may have (the first is fp4norm's own)."""
    if _scale_dtype(block_size, scale_format) == torch.float8_e4m3fn:
        return (torch.float8_e4m3fn, torch.uint8)
    return (torch.uint8, torch.float8_e8m0fnu)


def _check_row_shape(t: Tensor, name: str, input: Tensor, last: Any) -> None:
    """A preallocated output laid out in rows: ``[..., last]`` with ``input``'s leading
    dimensions, its rows flattened (``[M, last]``) or one flat buffer, as the kernels take
    it. Traced, the rows of a flattened or flat buffer are not counted (that would compare
    the token count; the kernel counts them when it runs)."""
    shape = tuple(t.shape)
    if len(shape) == 1 or (len(shape) == 2 and input.dim() == 3 and shape[1] == last):
        return
    if len(shape) == input.dim() and shape[-1] == last and shape[:-1] == tuple(input.shape[:-1]):
        return
    want = list(input.shape[:-1]) + [last]
    raise ArgumentError(
        f"{name} has shape {list(shape)}; expected {want}"
        + (" or its rows flattened" if input.dim() == 3 else "") + " or one flat buffer"
    )


def _check_fp4_outputs(
    input, y_fp4, block_scale, unswizzled, block_size, scale_format, swizzled, name="input"
):
    """Preallocated FP4 outputs: their devices, dtypes and shapes (the swizzled scales may
    have any)."""
    required(y_fp4, "y_fp4")
    required(block_scale, "block_scale")
    scale_dtypes = _fp4_scale_dtypes(block_size, scale_format)
    h = input.shape[-1]
    for t, n, allowed, last in (
        (y_fp4, "y_fp4", (torch.uint8, torch.float4_e2m1fn_x2), h // 2),
        (block_scale, "block_scale", scale_dtypes, None if swizzled else h // block_size),
        (unswizzled, "block_scale_unswizzled", scale_dtypes, h // block_size),
    ):
        if t is not None:
            _same_device(t, n, input, name)
            _need_dtype(t, n, allowed)
            if last is not None:
                _check_row_shape(t, n, input, last)


def output_shapes(
    input: Tensor, block_size: int, swizzled: bool, both: bool
) -> Tuple[Tuple[Any, ...], Tuple[Any, ...], Tuple[Any, ...]]:
    """Shapes of ``(y_fp4, block_scale, block_scale_unswizzled)`` for ``input [..., H]``
    (symbolic sizes stay symbolic: only arithmetic, no comparison)."""
    lead = tuple(input.shape[:-1])
    h = input.shape[-1]
    n_blocks = h // block_size
    if swizzled or both:
        m = 1
        for s in lead:
            m = m * s
        scales: Tuple[Any, ...] = (((m + 127) // 128) * 128 * ((n_blocks + 3) // 4) * 4,)
    else:
        scales = lead + (n_blocks,)
    return lead + (h // 2,), scales, (lead + (n_blocks,) if both else (0,))


def _fake_outputs(input, block_size, scale_format, swizzled, both):
    q_shape, s_shape, u_shape = output_shapes(input, block_size, swizzled, both)
    sdt = _scale_dtype(block_size, scale_format)
    q = input.new_empty(q_shape, dtype=torch.float4_e2m1fn_x2)
    if both:
        return (q, input.new_empty(s_shape, dtype=sdt), input.new_empty(u_shape, dtype=sdt))
    return (q, input.new_empty(s_shape, dtype=sdt))


@torch.library.register_fake("fp4norm::add_rmsnorm_fp4quant")
def _fake_add(
    input, residual, weight, global_scale=None, eps=1e-6, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    required(residual, "residual")
    _check_fp4(input, residual, weight, y_out, global_scale, block_size, scale_format)
    return _fake_outputs(input, block_size, scale_format, is_sf_swizzled_layout, False)


@torch.library.register_fake("fp4norm::add_rmsnorm_fp4quant.both")
def _fake_add_both(
    input, residual, weight, global_scale=None, eps=1e-6, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    required(residual, "residual")
    _check_fp4(input, residual, weight, y_out, global_scale, block_size, scale_format)
    return _fake_outputs(input, block_size, scale_format, True, True)


@torch.library.register_fake("fp4norm::rmsnorm_fp4quant")
def _fake_rms(
    input, weight, global_scale=None, eps=1e-6, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    _check_fp4(input, None, weight, y_out, global_scale, block_size, scale_format)
    return _fake_outputs(input, block_size, scale_format, is_sf_swizzled_layout, False)


@torch.library.register_fake("fp4norm::rmsnorm_fp4quant.both")
def _fake_rms_both(
    input, weight, global_scale=None, eps=1e-6, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    _check_fp4(input, None, weight, y_out, global_scale, block_size, scale_format)
    return _fake_outputs(input, block_size, scale_format, True, True)


@torch.library.register_fake("fp4norm::add_rmsnorm_fp4quant.out")
def _fake_add_out(
    input, residual, weight, y_fp4, block_scale, block_scale_unswizzled=None,
    global_scale=None, eps=1e-6, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    required(residual, "residual")
    _check_fp4(input, residual, weight, y_out, global_scale, block_size, scale_format)
    _check_fp4_outputs(
        input, y_fp4, block_scale, block_scale_unswizzled, block_size, scale_format,
        is_sf_swizzled_layout or block_scale_unswizzled is not None,
    )
    return None


@torch.library.register_fake("fp4norm::rmsnorm_fp4quant.out")
def _fake_rms_out(
    input, weight, y_fp4, block_scale, block_scale_unswizzled=None, global_scale=None,
    eps=1e-6, block_size=16, scale_format=None, is_sf_swizzled_layout=False, y_out=None,
    enable_pdl=None, weight_bias=0.0,
):
    _check_fp4(input, None, weight, y_out, global_scale, block_size, scale_format)
    _check_fp4_outputs(
        input, y_fp4, block_scale, block_scale_unswizzled, block_size, scale_format,
        is_sf_swizzled_layout or block_scale_unswizzled is not None,
    )
    return None


@torch.library.register_fake("fp4norm::allreduce_add_rmsnorm_fp4quant")
def _fake_allreduce(
    inputs, residual, weight, global_scale=None, eps=1e-6, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    first, ranks = _rank_list(inputs)
    required(residual, "residual")
    _check_fp4(first, residual, weight, y_out, global_scale, block_size, scale_format, ranks, "inputs[0]")
    return _fake_outputs(first, block_size, scale_format, is_sf_swizzled_layout, False)


@torch.library.register_fake("fp4norm::allreduce_add_rmsnorm_fp4quant.both")
def _fake_allreduce_both(
    inputs, residual, weight, global_scale=None, eps=1e-6, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    first, ranks = _rank_list(inputs)
    required(residual, "residual")
    _check_fp4(first, residual, weight, y_out, global_scale, block_size, scale_format, ranks, "inputs[0]")
    return _fake_outputs(first, block_size, scale_format, True, True)


@torch.library.register_fake("fp4norm::allreduce_add_rmsnorm_fp4quant.out")
def _fake_allreduce_out(
    inputs, residual, weight, y_fp4, block_scale, block_scale_unswizzled=None,
    global_scale=None, eps=1e-6, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    first, ranks = _rank_list(inputs)
    required(residual, "residual")
    _check_fp4(first, residual, weight, y_out, global_scale, block_size, scale_format, ranks, "inputs[0]")
    _check_fp4_outputs(
        first, y_fp4, block_scale, block_scale_unswizzled, block_size, scale_format,
        is_sf_swizzled_layout or block_scale_unswizzled is not None, "inputs[0]",
    )
    return None


@torch.library.register_fake("fp4norm::dequantize")
def _fake_dequantize(
    y_fp4, block_scale, global_scale=None, block_size=16, scale_format=None,
    is_sf_swizzled_layout=False,
):
    if block_size not in (16, 32):
        raise ArgumentError(
            f"block_size = {block_size} is not supported: use 16 (NVFP4) or 32 (MXFP4)"
        )
    _fp4_format(scale_format)
    required(y_fp4, "y_fp4")
    required(block_scale, "block_scale")
    _need_dtype(y_fp4, "y_fp4", (torch.uint8, torch.float4_e2m1fn_x2))
    if y_fp4.dim() < 1:
        raise ArgumentError("y_fp4 must have a last dimension of H/2 bytes")
    _same_device(block_scale, "block_scale", y_fp4, "y_fp4")
    _need_dtype(block_scale, "block_scale", _fp4_scale_dtypes(block_size, scale_format))
    if global_scale is not None:
        _same_device(global_scale, "global_scale", y_fp4, "y_fp4")
        _need_dtype(global_scale, "global_scale", (torch.float32,))
    _check_hidden(2 * y_fp4.shape[-1], block_size)
    return y_fp4.new_empty(tuple(y_fp4.shape[:-1]) + (2 * y_fp4.shape[-1],), dtype=torch.float32)


def _name(value: Any) -> str:
    """A name argument as the native kernels read it: lower case, ``_`` as ``-``."""
    return value.strip().lower().replace("_", "-") if isinstance(value, str) else ""


def fp8_dtype(element: Any) -> torch.dtype:
    """The torch dtype of FP8 codes: ``float8_e5m2`` for ``"e5m2"``, else ``float8_e4m3fn``."""
    return torch.float8_e5m2 if _name(element) in ("e5m2", "float8-e5m2") else torch.float8_e4m3fn


def fp8_scale_dtype(scale_format: Any) -> torch.dtype:
    """The torch dtype fp4norm allocates dynamic scales in: float32, or uint8 for UE8M0."""
    return torch.uint8 if _name(scale_format) == "ue8m0" else torch.float32


def fp8_output_shapes(
    input: Tensor, group_size: int, scale_layout: Any
) -> Tuple[Tuple[Any, ...], Tuple[Any, ...]]:
    """Shapes of ``(out, scales)`` for ``input [..., H]`` and dynamic scales in groups of
    ``group_size`` (-1: per token): ``out`` is ``input``'s shape; scales are ``[..., H/G]``
    row-major, ``[H/G, Mp4]`` column-major (``Mp4 = 4*ceil(M/4)``) or flat
    ``Mp*4*ceil((H/32)/4)`` swizzled (``Mp = 128*ceil(M/128)``), or ``[ceil(H/G/4), 4*Mp4]``
    bytes packed column-major. Symbolic sizes stay symbolic: only arithmetic, no
    comparison."""
    lead = tuple(input.shape[:-1])
    h = input.shape[-1]
    n = 1 if group_size == -1 else h // group_size
    layout = _name(scale_layout)
    if layout in ("row-major", "row"):
        return lead + (h,), lead + (n,)
    m = 1
    for s in lead:
        m = m * s
    if layout == "swizzled":
        return lead + (h,), (((m + 127) // 128) * 128 * ((n + 3) // 4) * 4,)
    if _FP8_LAYOUTS.get(layout) == "column-major-packed":
        return lead + (h,), ((n + 3) // 4, 4 * (((m + 3) // 4) * 4))
    return lead + (h,), (n, ((m + 3) // 4) * 4)


# The FP8 option names as the native parser (args.rs) takes them, after `_name`.
_FP8_ELEMENTS = {"e4m3": "e4m3", "e4m3fn": "e4m3", "float8-e4m3fn": "e4m3", "e5m2": "e5m2", "float8-e5m2": "e5m2"}
_FP8_FORMATS = {"f32": "f32", "float32": "f32", "ue8m0": "ue8m0"}
_FP8_LAYOUTS = {
    "row-major": "row-major", "row": "row-major", "column-major": "column-major",
    "col-major": "column-major", "column": "column-major", "swizzled": "swizzled",
    "column-major-packed": "column-major-packed", "packed": "column-major-packed",
}


def _fp8_element(element: str) -> str:
    name = _FP8_ELEMENTS.get(_name(element))
    if name is None:
        raise ArgumentError(
            f'element = "{element}" is not supported: use "e4m3" (float8_e4m3fn) or "e5m2" '
            "(float8_e5m2)"
        )
    return name


def _check_fp8_dynamic(
    input, residual, weight, y_out, element, group_size, scale_format, scale_layout,
    ranks=(), name="input",
) -> Tuple[str, str, str]:
    """A dynamic-scale FP8 call's rules that need no data, in the kernels' order: the
    options, the row tensors, H against the group and the layout. Returns
    ``(element, scale format, layout)``."""
    elem = _fp8_element(element)
    if group_size not in (-1, 32, 64, 128):
        raise ArgumentError(
            f"group size {group_size} is not supported: use per-token scales (group "
            '"token"; -1 for the operators\' group_size), 32, 64 or 128'
        )
    fmt = _FP8_FORMATS.get(_name(scale_format))
    if fmt is None:
        raise ArgumentError(
            f'scale_format = "{scale_format}" is not supported for FP8 scales: use "f32" or '
            '"ue8m0"'
        )
    layout = _FP8_LAYOUTS.get(_name(scale_layout))
    if layout is None:
        raise ArgumentError(
            f'scale_layout = "{scale_layout}" is not supported: use "row-major", '
            '"column-major", "swizzled" or "column-major-packed"'
        )
    h = _check_rows(input, residual, weight, y_out, ranks, name)
    _check_fp8_hidden(h)
    g = h if group_size == -1 else group_size
    if h % g != 0:
        raise ArgumentError(
            f"hidden size H = {h} is not a multiple of the group size {g}: use H divisible by "
            f"{g}, another group size, or per-token scales (G = H)"
        )
    if layout == "swizzled" and (fmt != "ue8m0" or g != 32):
        raise ArgumentError(
            "the swizzled 128x4 scale layout is MXFP8's and needs UE8M0 scales in groups of 32 "
            f"(got {fmt} scales in groups of {g}): use UE8M0 with G = 32, or the row-major or "
            "column-major layout"
        )
    if layout == "column-major-packed" and (fmt != "ue8m0" or group_size == -1):
        got = "the row (per token)" if group_size == -1 else str(g)
        raise ArgumentError(
            "the packed column-major scale layout (DeepGEMM's packed UE8M0) needs UE8M0 scales "
            f"in groups of 32, 64 or 128 (got {fmt} scales in groups of {got}): use UE8M0 with "
            "G = 32, 64 or 128, or the row-major or column-major layout"
        )
    return elem, fmt, layout


def _check_fp8_hidden(h: Any) -> None:
    if h == 0:
        raise ArgumentError(
            "hidden size H is 0: the FP8 ops need H > 0 (a positive multiple of the group size)"
        )


def _check_fp8_outputs(
    input, out, scales_out, elem, fmt, group_size, layout, name="input"
) -> None:
    """Preallocated dynamic-scale FP8 outputs: their devices, dtypes and shapes (codes
    ``input``'s, scales their layout's; the swizzled ones any)."""
    required(out, "out")
    required(scales_out, "scales_out")
    _same_device(out, "out", input, name)
    _need_dtype(out, "out", (fp8_dtype(elem), torch.uint8))
    h = input.shape[-1]
    _check_row_shape(out, "out", input, h)
    _same_device(scales_out, "scales_out", input, name)
    _need_dtype(
        scales_out, "scales_out",
        (torch.uint8, torch.float8_e8m0fnu) if fmt == "ue8m0" else (torch.float32,),
    )
    n = 1 if group_size == -1 else h // group_size
    if layout == "row-major":
        _check_row_shape(scales_out, "scales_out", input, n)
    elif layout == "column-major":
        shape = tuple(scales_out.shape)
        if not (len(shape) == 1 or (len(shape) == 2 and shape[0] == n)):
            raise ArgumentError(
                f"scales_out has shape {list(shape)}; expected [{n}, 4*ceil(M/4)] or one flat "
                "buffer (the column-major layout [H/G, 4*ceil(M/4)])"
            )
    elif layout == "column-major-packed":
        shape = tuple(scales_out.shape)
        if not (len(shape) == 1 or (len(shape) == 2 and shape[0] == (n + 3) // 4)):
            raise ArgumentError(
                f"scales_out has shape {list(shape)}; expected [{(n + 3) // 4}, 16*ceil(M/4)] or "
                "one flat buffer (the packed column-major layout [ceil(H/G/4), 4*4*ceil(M/4)] "
                "bytes)"
            )


def _fake_fp8_outputs(input, element, group_size, scale_format, scale_layout):
    q_shape, s_shape = fp8_output_shapes(input, group_size, scale_layout)
    return (
        input.new_empty(q_shape, dtype=fp8_dtype(element)),
        input.new_empty(s_shape, dtype=fp8_scale_dtype(scale_format)),
    )


@torch.library.register_fake("fp4norm::add_rmsnorm_fp8quant")
def _fake_add_fp8(
    input, residual, weight, element="e4m3", group_size=-1, scale_format="f32",
    scale_layout="row-major", s_min=0.0, eps=1e-6, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    required(residual, "residual")
    _check_fp8_dynamic(input, residual, weight, y_out, element, group_size, scale_format, scale_layout)
    return _fake_fp8_outputs(input, element, group_size, scale_format, scale_layout)


@torch.library.register_fake("fp4norm::rmsnorm_fp8quant")
def _fake_rms_fp8(
    input, weight, element="e4m3", group_size=-1, scale_format="f32",
    scale_layout="row-major", s_min=0.0, eps=1e-6, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    _check_fp8_dynamic(input, None, weight, y_out, element, group_size, scale_format, scale_layout)
    return _fake_fp8_outputs(input, element, group_size, scale_format, scale_layout)


@torch.library.register_fake("fp4norm::allreduce_add_rmsnorm_fp8quant")
def _fake_allreduce_fp8(
    inputs, residual, weight, element="e4m3", group_size=-1, scale_format="f32",
    scale_layout="row-major", s_min=0.0, eps=1e-6, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    first, ranks = _rank_list(inputs)
    required(residual, "residual")
    _check_fp8_dynamic(
        first, residual, weight, y_out, element, group_size, scale_format, scale_layout, ranks,
        "inputs[0]",
    )
    return _fake_fp8_outputs(first, element, group_size, scale_format, scale_layout)


@torch.library.register_fake("fp4norm::add_rmsnorm_fp8quant.out")
def _fake_add_fp8_out(
    input, residual, weight, out, scales_out, element="e4m3", group_size=-1,
    scale_format="f32", scale_layout="row-major", s_min=0.0, eps=1e-6, y_out=None,
    enable_pdl=None, weight_bias=0.0,
):
    required(residual, "residual")
    elem, fmt, layout = _check_fp8_dynamic(
        input, residual, weight, y_out, element, group_size, scale_format, scale_layout
    )
    _check_fp8_outputs(input, out, scales_out, elem, fmt, group_size, layout)
    return None


@torch.library.register_fake("fp4norm::rmsnorm_fp8quant.out")
def _fake_rms_fp8_out(
    input, weight, out, scales_out, element="e4m3", group_size=-1, scale_format="f32",
    scale_layout="row-major", s_min=0.0, eps=1e-6, y_out=None, enable_pdl=None, weight_bias=0.0,
):
    elem, fmt, layout = _check_fp8_dynamic(
        input, None, weight, y_out, element, group_size, scale_format, scale_layout
    )
    _check_fp8_outputs(input, out, scales_out, elem, fmt, group_size, layout)
    return None


@torch.library.register_fake("fp4norm::allreduce_add_rmsnorm_fp8quant.out")
def _fake_allreduce_fp8_out(
    inputs, residual, weight, out, scales_out, element="e4m3", group_size=-1,
    scale_format="f32", scale_layout="row-major", s_min=0.0, eps=1e-6, y_out=None,
    enable_pdl=None, weight_bias=0.0,
):
    first, ranks = _rank_list(inputs)
    required(residual, "residual")
    elem, fmt, layout = _check_fp8_dynamic(
        first, residual, weight, y_out, element, group_size, scale_format, scale_layout, ranks,
        "inputs[0]",
    )
    _check_fp8_outputs(first, out, scales_out, elem, fmt, group_size, layout, "inputs[0]")
    return None


def _check_fp8_static(out, input, residual, weight, scale, y_out, element, ranks=(), name="input"):
    """FlashInfer's per-tensor-scale FP8 call: the row tensors, ``out`` (a float8 dtype,
    or uint8 with ``element``), ``scale`` (float32, one value), H > 0."""
    static_element = None if element is None else _fp8_element(element)
    required(out, "out")
    required(scale, "scale")
    h = _check_rows(input, residual, weight, y_out, ranks, name)
    _same_device(out, "out", input, name)
    typed = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}.get(out.dtype)
    if typed is not None and static_element is not None and typed != static_element:
        raise ArgumentTypeError(
            f'out has dtype {_word(out.dtype)} but element = "{static_element}": pass out of the '
            "element's float8 dtype (or uint8), or leave element None to take out's format"
        )
    if typed is None and not (static_element is not None and out.dtype == torch.uint8):
        raise ArgumentTypeError(
            f"out has dtype {_word(out.dtype)}; expected float8_e4m3fn or float8_e5m2 (its "
            "dtype picks the FP8 format), or uint8 with element"
        )
    _same_device(scale, "scale", input, name)
    _need_dtype(scale, "scale", (torch.float32,))
    if scale.dim() > 1 or scale.numel() != 1:
        raise ArgumentError(
            f"scale has shape {list(scale.shape)}: pass a float32 tensor of shape (1,) (or 0-d) "
            "on the input's device"
        )
    _check_fp8_hidden(h)


@torch.library.register_fake("fp4norm::rmsnorm_quant")
def _fake_rms_quant(
    out, input, weight, scale, eps=1e-6, enable_pdl=None, y_out=None, weight_bias=0.0,
    element=None,
):
    _check_fp8_static(out, input, None, weight, scale, y_out, element)
    return None


@torch.library.register_fake("fp4norm::fused_add_rmsnorm_quant")
def _fake_add_quant(
    out, input, residual, weight, scale, eps=1e-6, enable_pdl=None, y_out=None,
    weight_bias=0.0, element=None,
):
    required(residual, "residual")
    _check_fp8_static(out, input, residual, weight, scale, y_out, element)
    return None


@torch.library.register_fake("fp4norm::allreduce_fused_add_rmsnorm_quant")
def _fake_allreduce_quant(
    out, inputs, residual, weight, scale, eps=1e-6, enable_pdl=None, y_out=None,
    weight_bias=0.0, element=None,
):
    first, ranks = _rank_list(inputs)
    required(residual, "residual")
    _check_fp8_static(out, first, residual, weight, scale, y_out, element, ranks, "inputs[0]")
    return None


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------

_PREFIXES = (
    ("fp4norm.ArgumentError: ", ArgumentError),
    ("fp4norm.ArgumentTypeError: ", ArgumentTypeError),
    ("fp4norm.RuntimeError: ", RuntimeError),
)


def translate(e: RuntimeError) -> BaseException:
    """The fp4norm exception a native kernel's (or the dispatcher's argument parser's)
    RuntimeError stands for; other errors are returned unchanged."""
    msg = str(e)
    for prefix, cls in _PREFIXES:
        at = msg.find(prefix)
        if at >= 0:
            return cls(msg[at + len(prefix):].split("\n\nException raised from")[0])
    # The dispatcher's own argument check names the argument and the type it expected.
    if "Expected a value of type" in msg:
        first = msg.split("\n")[0]
        if "'ndarray'" in first:
            first += (
                " (a NumPy array: pass torch tensors for every array argument, or NumPy "
                "arrays for every one)"
            )
        return ArgumentTypeError(first)
    return e


# --------------------------------------------------------------------------------------
# The FlashInfer-signature functions, for torch tensors
# --------------------------------------------------------------------------------------


def _scale_tensor(value: Any, like: Tensor) -> Tensor:
    """A real number (Python's or NumPy's) as a (1,) float32 global scale on ``like``'s
    device."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(
            f"global_scale must be a float32 tensor of shape (1,) or (M,), a float or None; "
            f"got {type(value).__name__}"
        )
    return torch.full((1,), float(value), dtype=torch.float32, device=like.device)


def _preallocated_scale_dtype(block_size: Any, scale_format: Any) -> torch.dtype:
    # Only sizes the outputs fp4norm allocates for a partly preallocated call; the operator
    # itself checks block_size and scale_format (and refuses these outputs if they are bad).
    fmt = scale_format if isinstance(scale_format, str) else None
    return _scale_dtype(block_size, fmt)


def required(value: Any, name: str) -> None:
    """Refuses None for a tensor argument the operator requires, before the operator is
    called (its argument parser passes None on as an undefined tensor; its fake kernel,
    traced, would fail on it without naming it)."""
    if value is None:
        raise ArgumentTypeError(f"{name} is required, got None")


_SCALE_DTYPES = frozenset((torch.uint8, torch.float8_e4m3fn, torch.float8_e8m0fnu))


def _scale_bytes(t: Any, name: str) -> Any:
    """A caller's FP4 scale buffer as the operator takes it: as it is in a scale dtype
    (uint8, float8_e4m3fn, float8_e8m0fnu: the operator checks that it fits the format),
    else, as FlashInfer's add_rmsnorm_fp4quant takes any dtype, its bytes (a uint8 view;
    vLLM passes an int32 swizzled buffer), whose shape and size the operator checks."""
    if not isinstance(t, Tensor) or t.dtype in _SCALE_DTYPES:
        return t
    try:
        return t.view(torch.uint8)
    except RuntimeError:
        raise ArgumentError(
            f"{name} has dtype {_word(t.dtype)}, shape {list(t.shape)} and strides "
            f"{list(t.stride())}: fp4norm writes a scale buffer of another dtype than uint8 "
            "or float8 through its bytes, so its last dimension must be contiguous"
        ) from None


def _both_flag(value: Any) -> bool:
    """``output_both_sf_layouts``, which picks the operator overload: a bool (or NumPy's)."""
    if value is True or value is False:
        return value
    return bool(_api.flag(value, "output_both_sf_layouts"))


def _options(block_size: Any, swizzled: Any, enable_pdl: Any) -> Tuple[Any, Any, Any]:
    """``block_size``, ``is_sf_swizzled_layout`` and ``enable_pdl`` of the FP4 functions
    where one is not of its plain type: the types the NumPy path takes (an int, not a bool;
    a bool or NumPy bool; that or None), as the operator takes them. Symbolic values
    (traced) pass."""
    if type(block_size) is not int and not isinstance(block_size, torch.SymInt):
        block_size = _api.block_size_arg(block_size)
    if swizzled is not False and swizzled is not True and not isinstance(swizzled, torch.SymBool):
        swizzled = _api.flag(swizzled, "is_sf_swizzled_layout")
    if enable_pdl is not None and enable_pdl is not True and enable_pdl is not False:
        enable_pdl = _api.flag(enable_pdl, "enable_pdl", optional=True)
    return block_size, swizzled, enable_pdl


def _bias(weight_bias: Any) -> Tuple[Any, ...]:
    """The operators' trailing ``weight_bias`` argument: none for None (the schema's 0.0).
    A float only where the caller gave one: torch.compile lifts a float default it reads
    from a keyword-only parameter into a graph input and then compiles the graph twice."""
    return () if weight_bias is None else (weight_bias,)


def _call_operator(
    input: Tensor,
    residual: Optional[Tensor],
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
    inputs: Optional[list] = None,
) -> Tuple[Tensor, ...]:
    """:func:`fp4norm.add_rmsnorm_fp4quant` (``residual`` given) or
    :func:`fp4norm.rmsnorm_fp4quant` through the operators; every check is the operator's.
    With ``inputs`` (every rank's input, ``input`` being the first), the fused all-reduce's
    operators."""
    if scale_format is not None:
        scale_format = _fp4_format(scale_format)
    block_size, is_sf_swizzled_layout, enable_pdl = _options(
        block_size, is_sf_swizzled_layout, enable_pdl
    )
    if global_scale is not None and not isinstance(global_scale, Tensor):
        global_scale = _scale_tensor(global_scale, input)
    args = (
        input, residual, weight, y_fp4, block_scale, global_scale, eps, block_size,
        scale_format, is_sf_swizzled_layout, output_both_sf_layouts,
        block_scale_unswizzled, enable_pdl, y_out, weight_bias, inputs,
    )
    if _is_compiling():
        # Traced, the operator is called with no handler around it: a call its fake kernel
        # refuses then fails with Dynamo's error naming the fp4norm class and message (a
        # handler here would make it an "observed exception" without them).
        return _operator_call(*args)
    try:
        return _operator_call(*args)
    except RuntimeError as e:
        raise translate(e) from None


def _operator_call(
    input: Tensor,
    residual: Optional[Tensor],
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
    weight_bias: Any,
    inputs: Optional[list],
) -> Tuple[Tensor, ...]:
    """The operator call of :func:`_call_operator`: the functional overload where no
    output is given, else ``.out`` (a missing output allocated here)."""
    both = _both_flag(output_both_sf_layouts)
    if y_fp4 is None and block_scale is None and block_scale_unswizzled is None:
        if inputs is not None:
            return (ALLREDUCE_BOTH if both else ALLREDUCE)(
                inputs, residual, weight, global_scale, eps, block_size, scale_format,
                is_sf_swizzled_layout, y_out, enable_pdl, *_bias(weight_bias),
            )
        if residual is None:
            return (RMS_BOTH if both else RMS)(
                input, weight, global_scale, eps, block_size, scale_format,
                is_sf_swizzled_layout, y_out, enable_pdl, *_bias(weight_bias),
            )
        return (ADD_BOTH if both else ADD)(
            input, residual, weight, global_scale, eps, block_size, scale_format,
            is_sf_swizzled_layout, y_out, enable_pdl, *_bias(weight_bias),
        )
    swizzled = both or bool(is_sf_swizzled_layout)
    if y_fp4 is None or block_scale is None or (both and block_scale_unswizzled is None):
        block = block_size if block_size in (16, 32) else 16
        q_shape, s_shape, u_shape = output_shapes(input, block, swizzled, both)
        sdt = _preallocated_scale_dtype(block, scale_format)
        if y_fp4 is None:
            y_fp4 = torch.empty(q_shape, dtype=torch.float4_e2m1fn_x2, device=input.device)
        if block_scale is None:
            block_scale = torch.empty(s_shape, dtype=sdt, device=input.device)
        if both and block_scale_unswizzled is None:
            block_scale_unswizzled = torch.empty(u_shape, dtype=sdt, device=input.device)
    # A caller's scale buffer of another dtype is written through its bytes (returned as
    # it is), as FlashInfer does.
    sb = _scale_bytes(block_scale, "block_scale")
    unswizzled = _scale_bytes(block_scale_unswizzled, "block_scale_unswizzled") if both else None
    if inputs is not None:
        ALLREDUCE_OUT(
            inputs, residual, weight, y_fp4, sb, unswizzled, global_scale, eps,
            block_size, scale_format, swizzled, y_out, enable_pdl, *_bias(weight_bias),
        )
    elif residual is None:
        RMS_OUT(
            input, weight, y_fp4, sb, unswizzled, global_scale, eps, block_size,
            scale_format, swizzled, y_out, enable_pdl, *_bias(weight_bias),
        )
    else:
        ADD_OUT(
            input, residual, weight, y_fp4, sb, unswizzled, global_scale, eps,
            block_size, scale_format, swizzled, y_out, enable_pdl, *_bias(weight_bias),
        )
    if both:
        return (y_fp4, block_scale, block_scale_unswizzled)
    return (y_fp4, block_scale)


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_inference_mode = torch.is_inference_mode_enabled
_is_inference = Tensor.is_inference

_below_autograd = torch._C._AutoDispatchBelowAutograd

def _native_increment_version() -> Any:
    """torch._C._increment_version where it takes a tuple of tensors (the Python
    torch.autograd.graph.increment_version is one more frame around it), else that."""
    try:
        torch._C._increment_version((torch.empty(0),))
        return torch._C._increment_version
    except (AttributeError, TypeError):
        return torch.autograd.graph.increment_version


_increment_version = _native_increment_version()
# The C++ callables behind the overloads: the eager path calls them directly (an
# OpOverload's __call__ is one more Python frame per call).
_ADD_F, _ADD_B, _ADD_O = ADD._op, ADD_BOTH._op, ADD_OUT._op
_RMS_F, _RMS_B, _RMS_O = RMS._op, RMS_BOTH._op, RMS_OUT._op
# Their redispatch entries: straight to the CPU or CUDA kernel, skipping the dispatcher's
# key computation and the below-autograd guard (about 2 µs of an eager call).
_ADD_F_TO, _ADD_B_TO, _ADD_O_TO = (
    ADD._handle.redispatch_boxed, ADD_BOTH._handle.redispatch_boxed, ADD_OUT._handle.redispatch_boxed,
)
_RMS_F_TO, _RMS_B_TO, _RMS_O_TO = (
    RMS._handle.redispatch_boxed, RMS_BOTH._handle.redispatch_boxed, RMS_OUT._handle.redispatch_boxed,
)
_KEYS_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_KEYS_CUDA = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_profiler = torch.autograd.profiler


def _backend_keys(input: Any, others: Tuple[Any, ...] = ()) -> Any:
    """The dispatch keys of the kernel an eager call can go to directly, or None where the
    dispatcher must route it: a tensor subclass (fake, functional, distributed tensors, in
    ``input`` or in any of the call's ``others``), an active TorchDispatchMode, the profiler
    (which records operators in the dispatcher), or a device without a native kernel (meta).
    Only the autograd layer is skipped otherwise, and its work (the requires-grad refusal,
    the version counters) is done here."""
    if type(input) is not Tensor or _dispatch_modes() or _profiler._is_profiler_enabled:
        return None
    for t in others:  # None or a plain tensor, compared without isinstance (per call)
        if t is not None and type(t) is not Tensor and isinstance(t, Tensor):
            return None
    if input.is_cuda:
        return _KEYS_CUDA
    if input.is_cpu:
        return _KEYS_CPU
    return None


def _refuse_written(residual, y_out, y_fp4, block_scale, unswizzled) -> None:
    op_name = "fp4norm::add_rmsnorm_fp4quant" if residual is not None else "fp4norm::rmsnorm_fp4quant"
    for t, name in (
        (residual, "residual"), (y_out, "y_out"), (y_fp4, "y_fp4"),
        (block_scale, "block_scale"), (unswizzled, "block_scale_unswizzled"),
    ):
        if isinstance(t, Tensor):
            refuse_if_requires_grad(t, op_name, name)


def fused(
    input: Tensor,
    residual: Optional[Tensor],
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
) -> Tuple[Tensor, ...]:
    """The operators' call, with their Autograd kernel's work done here in eager mode: the
    same refusal of tensors that require grad and the same version-counter updates, without
    a Python kernel in the dispatch (which costs more than the native call itself). Traced
    by torch.compile, the operators are called as they are. The two common eager calls
    (every output allocated, or the two outputs given) take a short path: this runs once
    per transformer layer, so its Python is kept to a few attribute reads."""
    if weight is None:
        required(weight, "weight")
    if (
        type(block_size) is not int
        or (is_sf_swizzled_layout is not False and is_sf_swizzled_layout is not True)
        or (enable_pdl is not None and enable_pdl is not True and enable_pdl is not False)
    ):
        block_size, is_sf_swizzled_layout, enable_pdl = _options(
            block_size, is_sf_swizzled_layout, enable_pdl
        )
    if _is_compiling():
        return _call_operator(
            input, residual, weight, y_fp4, block_scale, global_scale, eps, block_size,
            scale_format, is_sf_swizzled_layout, output_both_sf_layouts,
            block_scale_unswizzled, enable_pdl, y_out, weight_bias,
        )
    if scale_format is not None:
        scale_format = _fp4_format(scale_format)
    both = output_both_sf_layouts
    if both is not False and both is not True:
        both = _both_flag(both)
    unswizzled = block_scale_unswizzled if both else None
    if _grad_enabled() and (
        getattr(residual, "requires_grad", False)
        or getattr(y_out, "requires_grad", False)
        or getattr(y_fp4, "requires_grad", False)
        or getattr(block_scale, "requires_grad", False)
        or getattr(unswizzled, "requires_grad", False)
    ):
        _refuse_written(residual, y_out, y_fp4, block_scale, unswizzled)
    if not _inference_mode():
        try:
            written_inference = (
                (residual is not None and _is_inference(residual))
                or (y_out is not None and _is_inference(y_out))
                or (y_fp4 is not None and _is_inference(y_fp4))
                or (block_scale is not None and _is_inference(block_scale))
                or (unswizzled is not None and _is_inference(unswizzled))
            )
        except TypeError:  # not a tensor: the operator's argument parser names it
            written_inference = False
        if written_inference:
            refuse_inference((
                (residual, "residual"), (y_out, "y_out"), (y_fp4, "y_fp4"),
                (block_scale, "block_scale"), (unswizzled, "block_scale_unswizzled"),
            ))
    if global_scale is not None and not isinstance(global_scale, Tensor):
        global_scale = _scale_tensor(global_scale, input)
    # Trailing arguments at the schema's defaults are not passed: the dispatcher fills them
    # natively, where the boxed call converts a Python float or int through its symbolic
    # checks (eps and block_size are most of the argument conversion of an eager call).
    defaults = (
        scale_format is None and is_sf_swizzled_layout is False and y_out is None
        and enable_pdl is None and weight_bias is None
    )
    if defaults and block_size == 16:
        short = (global_scale,) if type(eps) is float and eps == 1e-6 else (global_scale, eps)
    elif defaults:
        short = (global_scale, eps, block_size)
    if y_fp4 is None and block_scale is None and block_scale_unswizzled is None:
        if defaults:
            tail = short
        else:
            tail = (global_scale, eps, block_size, scale_format, is_sf_swizzled_layout, y_out, enable_pdl)
            if weight_bias is not None:
                tail += (weight_bias,)
        keys = _backend_keys(input, (residual, weight, global_scale, y_out))
        try:
            if keys is not None:
                if residual is None:
                    out = (_RMS_B_TO if both else _RMS_F_TO)(keys, input, weight, *tail)
                else:
                    out = (_ADD_B_TO if both else _ADD_F_TO)(keys, input, residual, weight, *tail)
            else:
                with _below_autograd():
                    if residual is None:
                        out = (_RMS_B if both else _RMS_F)(input, weight, *tail)
                    else:
                        out = (_ADD_B if both else _ADD_F)(input, residual, weight, *tail)
        except RuntimeError as e:
            raise translate(e) from None
        if residual is not None:
            _increment_version((residual,) if y_out is None else (residual, y_out))
        elif y_out is not None:
            _increment_version((y_out,))
        return out
    if not both and isinstance(y_fp4, Tensor) and isinstance(block_scale, Tensor):
        if defaults:
            tail = (None,) + short
        else:
            tail = (
                None, global_scale, eps, block_size, scale_format, is_sf_swizzled_layout, y_out,
                enable_pdl,
            )
            if weight_bias is not None:
                tail += (weight_bias,)
        # _backend_keys's subclass rule, unrolled: this is the path of every given-output call.
        plain = (
            type(y_fp4) is Tensor and type(block_scale) is Tensor and type(weight) is Tensor
            and (residual is None or type(residual) is Tensor)
            and (global_scale is None or type(global_scale) is Tensor)
            and (y_out is None or type(y_out) is Tensor)
        )
        keys = _backend_keys(input) if plain else None
        sb = block_scale if block_scale.dtype in _SCALE_DTYPES else _scale_bytes(block_scale, "block_scale")
        try:
            if keys is not None:
                if residual is None:
                    _RMS_O_TO(keys, input, weight, y_fp4, sb, *tail)
                else:
                    _ADD_O_TO(keys, input, residual, weight, y_fp4, sb, *tail)
            else:
                with _below_autograd():
                    if residual is None:
                        _RMS_O(input, weight, y_fp4, sb, *tail)
                    else:
                        _ADD_O(input, residual, weight, y_fp4, sb, *tail)
        except RuntimeError as e:
            raise translate(e) from None
        if residual is None:
            _increment_version((y_fp4, block_scale) if y_out is None else (y_fp4, block_scale, y_out))
        else:
            _increment_version(
                (y_fp4, block_scale, residual) if y_out is None
                else (y_fp4, block_scale, residual, y_out)
            )
        return (y_fp4, block_scale)
    written = [
        t for t in (residual, y_out, y_fp4, block_scale, unswizzled) if isinstance(t, Tensor)
    ]
    with _below_autograd():
        out = _call_operator(
            input, residual, weight, y_fp4, block_scale, global_scale, eps, block_size,
            scale_format, is_sf_swizzled_layout, both, block_scale_unswizzled, enable_pdl,
            y_out, weight_bias,
        )
    _increment_version(tuple(written))
    return out


def allreduce(
    inputs: Any,
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
) -> Tuple[Tensor, ...]:
    """:func:`fp4norm.allreduce_add_rmsnorm_fp4quant` through the
    ``allreduce_add_rmsnorm_fp4quant`` operators (their Autograd kernel refuses tensors
    that require grad and advances the version counters)."""
    inputs = rank_tensors(inputs)
    required(weight, "weight")
    return _call_operator(
        inputs[0], residual, weight, y_fp4, block_scale, global_scale, eps, block_size,
        scale_format, is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled,
        enable_pdl, y_out, weight_bias, inputs=inputs,
    )


def rank_tensors(inputs: Any) -> list:
    """The ranks' inputs of a fused all-reduce whose rank 0 is a tensor, checked to be
    tensors each, as a list (the operators' ``Tensor[]``): refused here by name, where the
    operator's argument parser would name only the list."""
    for k, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(
                f"inputs[{k}] is a {type(t).__name__} but inputs[0] is a torch.Tensor: pass "
                "every rank's input as a torch tensor"
            )
    return list(inputs)


def _route(input: Tensor, inputs: Optional[list]) -> Any:
    """The tensor whose kind decides where an eager call goes (:func:`_backend_keys`):
    ``input``, or for a fused all-reduce ``input`` only where every rank's input is a plain
    tensor, else None (the dispatcher's way): a tensor subclass among them must see the
    call."""
    if inputs is None or all(type(t) is Tensor for t in inputs):
        return input
    return None


def dequantize(
    y_fp4: Tensor,
    block_scale: Any,
    global_scale: Any,
    block_size: Any,
    scale_format: Any,
    is_sf_swizzled_layout: Any,
    m: Optional[int],
    h: Optional[int],
) -> Tensor:
    """:func:`fp4norm.dequantize` through the operator."""
    required(block_scale, "block_scale")
    block_size, is_sf_swizzled_layout, _ = _options(block_size, is_sf_swizzled_layout, None)
    if (m is None) != (h is None):
        raise ArgumentError("pass both m and h, or neither (they are then read from y_fp4's shape)")
    if m is not None:
        for value, name in ((m, "m"), (h, "h")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ArgumentTypeError(f"{name} must be a non-negative int, got {value!r}")
        lead = 1
        for s in y_fp4.shape[:-1]:
            lead *= s
        if y_fp4.dim() < 2 or lead != m or 2 * y_fp4.shape[-1] != h:
            if y_fp4.numel() != m * (h // 2) or h % 2:
                raise ArgumentError(
                    f"y_fp4 has {y_fp4.numel()} bytes but M·H/2 = {m * (h // 2)} for M = {m}, "
                    f"H = {h}"
                )
            if not y_fp4.is_contiguous():
                raise ArgumentError("y_fp4 must be contiguous: it is read as one flat buffer")
            y_fp4 = y_fp4.view(m, h // 2)
    elif y_fp4.dim() < 2:
        raise ArgumentError(
            f"y_fp4 has shape {list(y_fp4.shape)}: pass m and h for a flat buffer, or y_fp4 "
            "shaped [..., H/2]"
        )
    if scale_format is not None:
        scale_format = _fp4_format(scale_format)
    if global_scale is not None and not isinstance(global_scale, Tensor):
        global_scale = _scale_tensor(global_scale, y_fp4)
    if _is_compiling():
        return DEQUANTIZE(
            y_fp4, block_scale, global_scale, block_size, scale_format, is_sf_swizzled_layout
        )
    try:
        return DEQUANTIZE(
            y_fp4, block_scale, global_scale, block_size, scale_format, is_sf_swizzled_layout
        )
    except RuntimeError as e:
        raise translate(e) from None


# --------------------------------------------------------------------------------------
# The FP8 family (SPEC.md §8), for torch tensors
# --------------------------------------------------------------------------------------


def _run(
    op: Any,
    input: Tensor,
    args: Tuple[Any, ...],
    written: Tuple[Tuple[Any, str], ...],
    inputs: Optional[list] = None,
) -> Any:
    """One call of an FP8 operator from the Python functions, as :func:`fused` makes the FP4
    ones: traced as it is under torch.compile; in eager mode the work of its Autograd kernel
    (refusing to write a tensor that requires grad, advancing the version counters of the
    tensors it writes; ``written`` pairs each with its argument's name) is done here and
    the call goes straight to the CPU or CUDA kernel where nothing else would see it in the
    dispatcher. ``input`` (with ``inputs``, the ranks' of a fused all-reduce) routes it
    (:func:`_route`)."""
    if _is_compiling():
        return op(*args)  # no handler around it: see _call_operator
    try:
        tensors = tuple(t for t, _ in written if t is not None)
        if _grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
            for t, name in written:
                if isinstance(t, Tensor):
                    refuse_if_requires_grad(t, op._schema.name, name)
        if not _inference_mode():
            refuse_inference(written)
        keys = _backend_keys(_route(input, inputs), args)
        if keys is not None:
            result = op._handle.redispatch_boxed(keys, *args)
        else:
            with _below_autograd():
                result = op._op(*args)
    except RuntimeError as e:
        raise translate(e) from None
    if tensors:
        _increment_version(tensors)
    return result


def _fp8_scale(scale: Any, input: Tensor) -> Tensor:
    """A per-tensor scale as the operators take it: a tensor as it is (the operator checks
    its dtype, shape and device), a real number (Python's or NumPy's, as FlashInfer takes
    them) as a new float32 ``(1,)`` tensor on ``input``'s device."""
    if isinstance(scale, Tensor):
        return scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ArgumentTypeError(
            "scale must be a float32 tensor of shape (1,) on the input's device, or a float; "
            f"got {type(scale).__name__}"
        )
    return torch.full((1,), float(scale), dtype=torch.float32, device=input.device)


def quant_static(
    out: Any,
    input: Tensor,
    residual: Optional[Tensor],
    weight: Any,
    scale: Any,
    eps: Any,
    enable_pdl: Any,
    y_out: Any,
    weight_bias: Any,
    element: Optional[str] = None,
    inputs: Optional[list] = None,
) -> Tensor:
    """:func:`fp4norm.fused_add_rmsnorm_quant` (``residual`` given) or
    :func:`fp4norm.rmsnorm_quant` through the operators; returns the scale tensor used.
    ``element`` is given only for a uint8 ``out``. With ``inputs`` (every rank's input,
    ``input`` being the first) the fused all-reduce's operator."""
    required(out, "out")
    required(weight, "weight")
    if enable_pdl is not None and enable_pdl is not True and enable_pdl is not False:
        enable_pdl = _api.flag(enable_pdl, "enable_pdl", optional=True)
    scale = _fp8_scale(scale, input)
    tail = (eps, enable_pdl, y_out)
    if element is not None:
        tail += (0.0 if weight_bias is None else weight_bias, element)
    else:
        tail += _bias(weight_bias)
    if residual is None:
        _run(RMS_QUANT, input, (out, input, weight, scale) + tail, ((out, "out"), (y_out, "y_out")))
    else:
        op, rows = (ADD_QUANT, input) if inputs is None else (ALLREDUCE_QUANT, inputs)
        _run(
            op, input, (out, rows, residual, weight, scale) + tail,
            ((out, "out"), (residual, "residual"), (y_out, "y_out")), inputs,
        )
    return scale


def quant_dynamic(
    input: Tensor,
    residual: Optional[Tensor],
    weight: Any,
    out: Any,
    scales_out: Any,
    element: str,
    group_size: int,
    scale_format: str,
    scale_layout: str,
    s_min: Any,
    eps: Any,
    y_out: Any,
    enable_pdl: Any,
    weight_bias: Any,
    inputs: Optional[list] = None,
) -> Tuple[Tensor, Tensor]:
    """:func:`fp4norm.add_rmsnorm_fp8quant` (``residual`` given) or
    :func:`fp4norm.rmsnorm_fp8quant` with dynamic scales through the operators: the
    functional overload where no output is given, else ``.out`` (a missing one allocated
    here); every check is the operator's. With ``inputs`` (every rank's input, ``input``
    being the first) the fused all-reduce's operators."""
    options = (element, group_size, scale_format, scale_layout, s_min, eps, y_out, enable_pdl)
    options += _bias(weight_bias)
    if inputs is not None:
        rows: Tuple[Any, ...] = (inputs, residual, weight)
        ops = (ALLREDUCE_FP8, ALLREDUCE_FP8_OUT)
    elif residual is None:
        rows, ops = (input, weight), (RMS_FP8, RMS_FP8_OUT)
    else:
        rows, ops = (input, residual, weight), (ADD_FP8, ADD_FP8_OUT)
    if out is None and scales_out is None:
        return _run(
            ops[0], input, rows + options, ((residual, "residual"), (y_out, "y_out")), inputs
        )
    if out is None or scales_out is None:
        q_shape, s_shape = fp8_output_shapes(input, group_size, scale_layout)
        if out is None:
            out = torch.empty(q_shape, dtype=fp8_dtype(element), device=input.device)
        if scales_out is None:
            scales_out = torch.empty(
                s_shape, dtype=fp8_scale_dtype(scale_format), device=input.device
            )
    _run(
        ops[1], input, rows + (out, scales_out) + options,
        ((out, "out"), (scales_out, "scales_out"), (residual, "residual"), (y_out, "y_out")),
        inputs,
    )
    return out, scales_out


def _dtype_code(t: Any) -> Optional[str]:
    if not isinstance(t, Tensor):
        return None
    return _api._torch_dtype_codes(torch).get(t.dtype)


def quant(
    input: Tensor,
    residual: Optional[Tensor],
    weight: Any,
    out: Any = None,
    scales_out: Any = None,
    eps: Any = 1e-6,
    scale: Any = None,
    element: Any = None,
    group: Any = None,
    scale_format: Any = None,
    scale_layout: Any = None,
    s_min: Any = None,
    y_out: Any = None,
    enable_pdl: Any = None,
    weight_bias: Any = None,
    *,
    inputs: Optional[list] = None,
) -> Tuple[Any, Any]:
    """:func:`fp4norm.add_rmsnorm_fp8quant` / :func:`fp4norm.rmsnorm_fp8quant` for torch
    tensors: a per-tensor ``scale`` through FlashInfer's operators (``out`` allocated where
    not given; a uint8 ``out`` with the element named), dynamic scales through
    ``add_rmsnorm_fp8quant`` / ``rmsnorm_fp8quant``. The defaults are those of
    :func:`fp4norm.add_rmsnorm_fp8quant`, whose keyword-only arguments
    :func:`fp4norm.allreduce_add_rmsnorm_fp8quant` passes on by name; with ``inputs``
    (every rank's input, ``input`` being the first) the fused all-reduce's operators."""
    required(weight, "weight")
    if enable_pdl is not None and enable_pdl is not True and enable_pdl is not False:
        enable_pdl = _api.flag(enable_pdl, "enable_pdl", optional=True)
    code = _dtype_code(out)
    elem = _api.fp8_element(element, code)
    if _api.fp8_per_tensor(scale, scales_out, group, scale_format, scale_layout, s_min):
        if out is None:
            out = torch.empty(input.shape, dtype=fp8_dtype(elem), device=input.device)
        scale = quant_static(
            out, input, residual, weight, scale, eps, enable_pdl, y_out, weight_bias,
            elem if code == "u8" else None, inputs,
        )
        return out, scale
    return quant_dynamic(
        input, residual, weight, out, scales_out, elem, _api.fp8_group(group),
        "f32" if scale_format is None else scale_format,
        "row-major" if scale_layout is None else scale_layout,
        0.0 if s_min is None else s_min, eps, y_out, enable_pdl, weight_bias, inputs,
    )
