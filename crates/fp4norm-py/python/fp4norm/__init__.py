"""fp4norm: fused residual add + RMSNorm + FP4 block quantisation (NVFP4, MXFP4 and the
other block/scale pairings) and its FP8 siblings, bit-exact to one contract (SPEC.md) on
CPUs and NVIDIA GPUs (sm_80 and newer: Ampere, Hopper, Blackwell).

A drop-in for FlashInfer's ``add_rmsnorm_fp4quant`` / ``rmsnorm_fp4quant`` (same
signatures, argument order, defaults, return values and output dtypes) that also runs on
Hopper and on the CPU:

* torch CUDA tensors run on the GPU, on torch's current stream of the tensors' device; a
  call never synchronises, so it can be captured in a CUDA graph (make one eager call of
  the same configuration first: kernels are compiled by NVRTC on first use, and compiling
  is not a stream operation);
* torch CPU tensors and NumPy arrays (``float16``, or ``ml_dtypes.bfloat16``) run on the
  CPU backend (multi-threaded; the GIL is released).

The FP8 family (SPEC.md §8), on the same backends and with the same conventions:
FlashInfer's ``rmsnorm_quant`` / ``fused_add_rmsnorm_quant`` (a per-tensor static scale;
``out``'s float8 dtype picks E4M3 or E5M2), ``fused_add_rmsnorm_fp8_block_quant`` (E4M3
in 1 x 128 blocks, f32 scales column-major, as FlashInfer documents it),
``add_rmsnorm_fp8quant`` /
``rmsnorm_fp8quant`` with dynamic scales (per token or per group of 32, 64, 128; f32 or
UE8M0; row-major, column-major, swizzled 128x4, or packed column-major as DeepGEMM reads
UE8M0 scales), the MXFP8 shorthands
``add_rmsnorm_mxfp8quant`` / ``rmsnorm_mxfp8quant``, and ``dequantize_fp8`` (host arrays).
FP8 codes are ``torch.float8_e4m3fn`` / ``float8_e5m2`` (NumPy: ml_dtypes' float8 types),
f32 scales ``float32``, UE8M0 scales ``uint8``.

Outputs are arrays of the input's kind. torch: ``y_fp4`` is ``torch.float4_e2m1fn_x2``
(``uint8`` on a torch without it), E4M3 scales ``torch.float8_e4m3fn``, UE8M0 scales
``torch.uint8``. NumPy: every byte output is ``uint8`` (view E4M3 scales with
``ml_dtypes.float8_e4m3fn`` if you want their values). Preallocated outputs of those
dtypes, or ``uint8`` (or ``float8_e8m0fnu`` for UE8M0 scales), are written in place.

Every bad argument raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (shape,
device, layout, block size, scale format, eps, global scale, aliasing, alignment), naming
the argument, before anything is written. Errors of the CUDA driver or the kernel
compiler raise ``RuntimeError``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Tuple, Union, overload

from . import _api, _core, reference
from ._errors import ArgumentError, ArgumentTypeError

try:
    import torch as _torch
except ImportError:  # NumPy only
    _torch_ops = None
    _Tensor: Any = ()
else:
    from . import _ops as _torch_ops

    _Tensor = _torch.Tensor

__version__: str = _core.__version__

__all__ = [
    "__version__",
    "add_rmsnorm_fp4quant",
    "rmsnorm_fp4quant",
    "dequantize",
    "allreduce_add_rmsnorm_fp4quant",
    "rmsnorm_quant",
    "fused_add_rmsnorm_quant",
    "fused_add_rmsnorm_fp8_block_quant",
    "add_rmsnorm_fp8quant",
    "rmsnorm_fp8quant",
    "add_rmsnorm_mxfp8quant",
    "rmsnorm_mxfp8quant",
    "allreduce_add_rmsnorm_fp8quant",
    "allreduce_add_rmsnorm_mxfp8quant",
    "allreduce_fused_add_rmsnorm_quant",
    "dequantize_fp8",
    "fp8_scale_sizes",
    "cuda_device_count",
    "cuda_device_info",
    "scale_sizes",
    "reference",
    "ArgumentError",
    "ArgumentTypeError",
]

Array = Any  # torch.Tensor or numpy.ndarray


@overload
def add_rmsnorm_fp4quant(
    input: Array,
    residual: Array,
    weight: Array,
    y_fp4: Optional[Array] = ...,
    block_scale: Optional[Array] = ...,
    global_scale: Union[Array, float, None] = ...,
    eps: float = ...,
    block_size: int = ...,
    scale_format: Optional[str] = ...,
    is_sf_swizzled_layout: bool = ...,
    output_both_sf_layouts: Literal[False] = ...,
    block_scale_unswizzled: Optional[Array] = ...,
    enable_pdl: Optional[bool] = ...,
    y_out: Optional[Array] = ...,
    *,
    weight_bias: Optional[float] = ...,
) -> Tuple[Array, Array]: ...
@overload
def add_rmsnorm_fp4quant(
    input: Array,
    residual: Array,
    weight: Array,
    y_fp4: Optional[Array] = ...,
    block_scale: Optional[Array] = ...,
    global_scale: Union[Array, float, None] = ...,
    eps: float = ...,
    block_size: int = ...,
    scale_format: Optional[str] = ...,
    is_sf_swizzled_layout: bool = ...,
    output_both_sf_layouts: Literal[True] = ...,
    block_scale_unswizzled: Optional[Array] = ...,
    enable_pdl: Optional[bool] = ...,
    y_out: Optional[Array] = ...,
    *,
    weight_bias: Optional[float] = ...,
) -> Tuple[Array, Array, Array]: ...


def add_rmsnorm_fp4quant(
    input: Array,
    residual: Array,
    weight: Array,
    y_fp4: Optional[Array] = None,
    block_scale: Optional[Array] = None,
    global_scale: Union[Array, float, None] = None,
    eps: float = 1e-6,
    block_size: int = 16,
    scale_format: Optional[str] = None,
    is_sf_swizzled_layout: bool = False,
    output_both_sf_layouts: bool = False,
    block_scale_unswizzled: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    y_out: Optional[Array] = None,
    *,
    weight_bias: Optional[float] = None,
) -> Union[Tuple[Array, Array], Tuple[Array, Array, Array]]:
    """Fused residual add + RMSNorm + FP4 quantisation (FlashInfer's signature).

    Computes, row by row (SPEC.md §1)::

        residual <- round_dtype(input + residual)          (in place)
        y        <- residual * rstd * weight                rstd = 1/sqrt(mean(residual^2) + eps)
        y_fp4    <- E2M1(y / block_scale), one scale per block of ``block_size`` elements

    Args:
        input: ``[M, H]`` or ``[B, S, H]``, bfloat16 or float16; read only. Rows may be
            strided (the last dimension must be contiguous).
        residual: same shape and dtype as ``input``; **updated in place** to
            ``input + residual``. Never copied: a layout fp4norm cannot write in place
            raises ValueError.
        weight: ``[H]``, same dtype, contiguous.
        y_fp4: output, packed FP4 (two values per byte, element 2j in the low nibble):
            ``[..., H/2]`` (a given one may also be ``[M, H/2]`` or flat; another shape
            of that size is refused); allocated if None.
        block_scale: output scales. Row-major ``[..., H/B]`` (or ``[M, H/B]``, or flat),
            or with ``is_sf_swizzled_layout`` (or ``output_both_sf_layouts``) the 128x4
            swizzled layout Blackwell block-scaled GEMMs read, ``Mp*nK*4`` bytes of any
            shape (``Mp = 128*ceil(M/128)``, ``nK = ceil((H/B)/4)``) whose padding is
            zero. Allocated if None. On torch a contiguous buffer of another dtype (an
            int32 one, say) is written through its bytes, as FlashInfer does, and returned
            as it is.
        global_scale: float32 ``(1,)`` (one scale) or ``(M,)`` (one per row) on the
            input's device, read by the kernel at run time (so a captured CUDA graph sees
            new values on replay); scales are ``RN(global_scale * amax / 6)``, as in
            FlashInfer's NVFP4. None means 1.0. Ignored by UE8M0 scales. A Python float
            is accepted too.
        eps: RMSNorm epsilon, finite and >= 0.
        block_size: 16 or 32.
        scale_format: ``"e4m3"`` or ``"ue8m0"``; None picks e4m3 for block 16 and ue8m0
            for block 32. Either format works with either block size.
        is_sf_swizzled_layout: write ``block_scale`` in the swizzled layout.
        output_both_sf_layouts: write both layouts in one pass: ``block_scale`` swizzled
            and ``block_scale_unswizzled`` row-major (overrides ``is_sf_swizzled_layout``).
        block_scale_unswizzled: the row-major output with ``output_both_sf_layouts``
            (allocated if None; ignored otherwise).
        enable_pdl: CUDA only, as in FlashInfer: None or True launch with programmatic
            dependent launch wherever the device has it (sm_90+), False never.
        y_out: optional preallocated output, same shape and dtype as ``input``: the
            normalised values before quantisation.
        weight_bias: keyword-only, added to every weight before it multiplies
            (``w' = RN32(w + weight_bias)``, SPEC.md §8; None or 0 leaves the weight as it
            is): 1.0 for Gemma-family norms, ``(1 + w)``. Finite.

    Returns:
        ``(y_fp4, block_scale)``, or ``(y_fp4, block_scale, block_scale_unswizzled)``
        with ``output_both_sf_layouts``; the given output arrays when preallocated.

    Raises:
        TypeError: an argument of the wrong type or dtype.
        ValueError: wrong shape, device mismatch, H not a multiple of the block, bad block
            size, scale format, eps or global scale, outputs aliasing inputs or each other.
        RuntimeError: the CUDA driver, NVRTC or a kernel compile failed.
    """
    if residual is None:
        _api.require_residual(residual, "rmsnorm_fp4quant")
    if isinstance(input, _Tensor):
        return _torch_ops.fused(
            input, residual, weight, y_fp4, block_scale, global_scale, eps, block_size,
            scale_format, is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled,
            enable_pdl, y_out, weight_bias,
        )
    return _api.fused(
        input,
        residual,
        weight,
        y_fp4,
        block_scale,
        global_scale,
        eps,
        block_size,
        scale_format,
        is_sf_swizzled_layout,
        output_both_sf_layouts,
        block_scale_unswizzled,
        enable_pdl,
        y_out,
        weight_bias,
    )


@overload
def rmsnorm_fp4quant(
    input: Array,
    weight: Array,
    y_fp4: Optional[Array] = ...,
    block_scale: Optional[Array] = ...,
    global_scale: Union[Array, float, None] = ...,
    eps: float = ...,
    block_size: int = ...,
    scale_format: Optional[str] = ...,
    is_sf_swizzled_layout: bool = ...,
    enable_pdl: Optional[bool] = ...,
    *,
    output_both_sf_layouts: Literal[False] = ...,
    block_scale_unswizzled: Optional[Array] = ...,
    y_out: Optional[Array] = ...,
    weight_bias: Optional[float] = ...,
) -> Tuple[Array, Array]: ...
@overload
def rmsnorm_fp4quant(
    input: Array,
    weight: Array,
    y_fp4: Optional[Array] = ...,
    block_scale: Optional[Array] = ...,
    global_scale: Union[Array, float, None] = ...,
    eps: float = ...,
    block_size: int = ...,
    scale_format: Optional[str] = ...,
    is_sf_swizzled_layout: bool = ...,
    enable_pdl: Optional[bool] = ...,
    *,
    output_both_sf_layouts: Literal[True],
    block_scale_unswizzled: Optional[Array] = ...,
    y_out: Optional[Array] = ...,
    weight_bias: Optional[float] = ...,
) -> Tuple[Array, Array, Array]: ...


def rmsnorm_fp4quant(
    input: Array,
    weight: Array,
    y_fp4: Optional[Array] = None,
    block_scale: Optional[Array] = None,
    global_scale: Union[Array, float, None] = None,
    eps: float = 1e-6,
    block_size: int = 16,
    scale_format: Optional[str] = None,
    is_sf_swizzled_layout: bool = False,
    enable_pdl: Optional[bool] = None,
    *,
    output_both_sf_layouts: bool = False,
    block_scale_unswizzled: Optional[Array] = None,
    y_out: Optional[Array] = None,
    weight_bias: Optional[float] = None,
) -> Union[Tuple[Array, Array], Tuple[Array, Array, Array]]:
    """RMSNorm + FP4 quantisation without a residual (FlashInfer's signature).

    Like :func:`add_rmsnorm_fp4quant` with ``h = input`` (nothing is written back).
    ``output_both_sf_layouts``, ``block_scale_unswizzled``, ``y_out`` and ``weight_bias``
    are keyword-only extensions (FlashInfer's ``rmsnorm_fp4quant`` has no both-layouts mode).
    """
    if isinstance(input, _Tensor):
        return _torch_ops.fused(
            input, None, weight, y_fp4, block_scale, global_scale, eps, block_size,
            scale_format, is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled,
            enable_pdl, y_out, weight_bias,
        )
    return _api.fused(
        input,
        None,
        weight,
        y_fp4,
        block_scale,
        global_scale,
        eps,
        block_size,
        scale_format,
        is_sf_swizzled_layout,
        output_both_sf_layouts,
        block_scale_unswizzled,
        enable_pdl,
        y_out,
        weight_bias,
    )


def allreduce_add_rmsnorm_fp4quant(
    inputs: Any,
    residual: Array,
    weight: Array,
    y_fp4: Optional[Array] = None,
    block_scale: Optional[Array] = None,
    global_scale: Union[Array, float, None] = None,
    eps: float = 1e-6,
    block_size: int = 16,
    scale_format: Optional[str] = None,
    is_sf_swizzled_layout: bool = False,
    output_both_sf_layouts: bool = False,
    block_scale_unswizzled: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    y_out: Optional[Array] = None,
    *,
    weight_bias: Optional[float] = None,
) -> Union[Tuple[Array, Array], Tuple[Array, Array, Array]]:
    """The tensor-parallel all-reduce fused in front of :func:`add_rmsnorm_fp4quant`
    (SPEC.md §9), over the ranks' inputs gathered on this device.

    ``inputs`` is the list of every rank's input in rank order (1 to 8 on a GPU), each of
    the shape and dtype of ``residual``; they are summed in float32 one addition at a time,
    rounded once to the dtype, then the op runs on the sum with this rank's ``residual``
    (updated in place to ``sum + residual``), ``weight`` and outputs. Every rank that calls
    it with the same inputs writes the same bytes, the bytes of
    :func:`fp4norm.reference.allreduce_add_rmsnorm_fp4quant`. On CUDA tensors one kernel
    reads every rank's input (e.g. the rows of an all-gather) and does it all; on host
    arrays the sum is taken first. :func:`fp4norm.distributed.allreduce_add_rmsnorm_fp4quant`
    gathers the inputs over a process group and calls this (or, over symmetric memory, runs
    one kernel that reads the other ranks' inputs where they lie). The other arguments are
    :func:`add_rmsnorm_fp4quant`'s. Torch tensors (CPU or CUDA) go through the
    ``torch.ops.fp4norm.allreduce_add_rmsnorm_fp4quant`` operators, which ``torch.compile``
    traces and CUDA graphs capture.
    """
    _api.require_residual(residual)
    inputs = _api.rank_inputs(inputs, 8)
    first = inputs[0]
    args = (
        residual, weight, y_fp4, block_scale, global_scale, eps, block_size, scale_format,
        is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled, enable_pdl,
        y_out, weight_bias,
    )
    if isinstance(first, _Tensor):
        return _torch_ops.allreduce(inputs, *args)
    written = _api.fp4_written(
        residual, y_fp4, block_scale, output_both_sf_layouts, block_scale_unswizzled, y_out
    )
    return _api.fused(_api.allreduce_sum(inputs, written), *args)


def dequantize(
    y_fp4: Array,
    block_scale: Array,
    global_scale: Union[Array, float, None] = None,
    block_size: int = 16,
    scale_format: Optional[str] = None,
    is_sf_swizzled_layout: bool = False,
    m: Optional[int] = None,
    h: Optional[int] = None,
) -> Array:
    """Packed FP4 + block scales back to float32 (SPEC.md §4), on the arrays' device.

    ``value = e2m1(q) * scale``, with ``scale = e4m3(code) / global_scale`` for E4M3 and
    ``2^(code - 127)`` for UE8M0. ``m`` and ``h`` (rows, hidden size) are read from
    ``y_fp4``'s shape ``[..., H/2]`` unless given (needed for a flat ``y_fp4``). Both
    inputs must be contiguous; on CUDA ``y_fp4`` must be 4-byte aligned.

    Returns:
        float32 ``[..., H]`` (``[m, h]`` when ``y_fp4`` is flat), of ``y_fp4``'s kind.
    """
    if isinstance(y_fp4, _Tensor):
        return _torch_ops.dequantize(
            y_fp4, block_scale, global_scale, block_size, scale_format, is_sf_swizzled_layout, m, h
        )
    return _api.dequantize(
        y_fp4, block_scale, global_scale, block_size, scale_format, is_sf_swizzled_layout, m, h
    )


# ---------------------------------------------------------------------------------------
# The FP8 family (SPEC.md §8)
# ---------------------------------------------------------------------------------------


def rmsnorm_quant(
    out: Array,
    input: Array,
    weight: Array,
    scale: Union[Array, float],
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
    *,
    y_out: Optional[Array] = None,
    weight_bias: Optional[float] = None,
) -> None:
    """RMSNorm + FP8 quantisation with a per-tensor static scale (FlashInfer's signature).

    Computes, row by row (SPEC.md §1 steps 2-4 and §8)::

        y   <- input * rstd * weight            rstd = 1/sqrt(mean(input^2) + eps), exact
        out <- FP8(y * RN32(1 / scale))         round to nearest even, saturating

    bit for bit as fp4norm's contract defines it (the same bytes on every backend).

    Args:
        out: preallocated output, ``input``'s shape (any shape of ``M*H`` elements),
            contiguous, **written in place**. Its dtype picks the element format:
            ``torch.float8_e4m3fn`` (max 448) or ``torch.float8_e5m2`` (max 57344); NumPy:
            ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``. Values beyond the format's
            maximum saturate to it; NaN gives ``0x7F``.
        input: ``[M, H]`` or ``[B, S, H]``, bfloat16 or float16, any ``H >= 1``; read
            only. Rows may be strided (the last dimension must be contiguous).
        weight: ``[H]``, same dtype, contiguous.
        scale: the per-tensor scale ``s``: a float32 tensor of shape ``(1,)`` (or 0-d) on
            the input's device, read by the kernel when it runs (so a captured CUDA graph
            sees new values on replay), or a Python float. Any value flows through the
            formula (``s = 0`` gives ``inv = +Inf``). Never copied or moved: one on
            another device raises ValueError.
        eps: RMSNorm epsilon, finite and >= 0.
        enable_pdl: CUDA only, as in FlashInfer: None or True launch with programmatic
            dependent launch wherever the device has it (sm_90+), False never.
        y_out: keyword-only extension: preallocated ``input``-shaped output for the
            normalised values before quantisation (``RNdt(y)``, the FP4 op's bits).
        weight_bias: keyword-only extension (FlashInfer's ``rmsnorm_quant`` has none):
            added to every weight, ``w' = RN32(w + weight_bias)`` (SPEC.md §8); 1.0 for
            Gemma-family ``(1 + w)`` norms. None or 0 leaves the weight as it is.

    Dequantise with ``out.float() * scale`` (:func:`dequantize_fp8` with
    ``group="tensor"``). Raises ``fp4norm.ArgumentTypeError`` / ``fp4norm.ArgumentError``
    (also AssertionErrors, as FlashInfer raises) before anything is written, and
    RuntimeError for driver and compiler failures.
    """
    if isinstance(input, _Tensor):
        _torch_ops.quant_static(
            out, input, None, weight, scale, eps, enable_pdl, y_out, weight_bias
        )
        return None
    _api.fused_fp8(
        input, None, weight, out, None, scale, None, None, None, None, None, eps, y_out,
        enable_pdl, weight_bias, static=True,
    )
    return None


def fused_add_rmsnorm_quant(
    out: Array,
    input: Array,
    residual: Array,
    weight: Array,
    scale: Union[Array, float],
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
    *,
    y_out: Optional[Array] = None,
    weight_bias: Optional[float] = None,
) -> None:
    """Fused residual add + RMSNorm + FP8 quantisation with a per-tensor static scale
    (FlashInfer's signature)::

        residual <- RNdt(input + residual)                           (in place)
        out      <- FP8(RN32(residual * rstd * weight) * RN32(1 / scale))

    As :func:`rmsnorm_quant` (every argument's contract is the same), with ``residual``:
    same shape and dtype as ``input``, **updated in place** and never copied (a layout
    fp4norm cannot write in place raises ValueError). ``input`` is only read (FlashInfer's
    operator declares it unchanged too). ``weight_bias`` and ``y_out`` are keyword-only
    extensions FlashInfer's ``fused_add_rmsnorm_quant`` does not have.
    """
    if residual is None:
        _api.require_residual(residual, "rmsnorm_quant")
    if isinstance(input, _Tensor):
        _torch_ops.quant_static(
            out, input, residual, weight, scale, eps, enable_pdl, y_out, weight_bias
        )
        return None
    _api.fused_fp8(
        input, residual, weight, out, None, scale, None, None, None, None, None, eps, y_out,
        enable_pdl, weight_bias, static=True,
    )
    return None


def fused_add_rmsnorm_fp8_block_quant(
    out: Array,
    block_scale: Array,
    normed_out: Optional[Array],
    input: Array,
    residual: Array,
    weight: Array,
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
    *,
    weight_bias: Optional[float] = None,
) -> None:
    """Fused residual add + RMSNorm + E4M3 quantisation in 1 x 128 blocks with f32 scales in
    the column-major layout DeepGEMM's block-scaled GEMMs read (FlashInfer's signature, as
    its documentation gives it)::

        residual   <- RNdt(input + residual)                      (in place)
        normed_out <- RNdt(y)           y as in add_rmsnorm_fp8quant (f32)
        s          <- max(RN32(amax(block of y) / 448), RN32(1e-4 / 448))
        out        <- E4M3(RN32(y * RN32(1 / s)))

    That is :func:`add_rmsnorm_fp8quant` with ``group=128``, ``scale_layout="column-major"``,
    ``y_out=normed_out``, E4M3 codes and the scale floor FlashInfer has (it floors each
    block's amax at 1e-4 before dividing by 448, which gives the same f32 scale).

    Args:
        out: the E4M3 codes, ``input``'s shape, ``float8_e4m3fn`` (or uint8); written in
            place.
        block_scale: float32 ``[H/128, 4*ceil(M/4)]``, contiguous (the logical ``[M, H/128]``
            scales are ``block_scale.T[:M]``); the padding columns are written as zeros.
        normed_out: the normalised values rounded to the input dtype, ``input``'s shape;
            None skips them (FlashInfer requires it).
        input, residual, weight, eps, enable_pdl, weight_bias: as in
            :func:`fused_add_rmsnorm_quant`; ``H`` a multiple of 128 (FlashInfer also wants
            a multiple of 256 and at most 16384; fp4norm does not).

    FlashInfer quantises the normalised values after rounding them to the input dtype;
    fp4norm quantises the f32 values (SPEC.md §8), so a code can differ
    (docs/flashinfer-parity.md). Raises as :func:`add_rmsnorm_fp8quant`, naming this
    function's arguments; nothing is written then.
    """
    _api.fp8_block_quant(
        add_rmsnorm_fp8quant, out, block_scale, normed_out, input, residual, weight, eps,
        weight_bias, enable_pdl=enable_pdl,
    )
    return None


def add_rmsnorm_fp8quant(
    input: Array,
    residual: Array,
    weight: Array,
    out: Optional[Array] = None,
    scales_out: Optional[Array] = None,
    eps: float = 1e-6,
    *,
    scale: Union[Array, float, None] = None,
    element: Optional[str] = None,
    group: Union[str, int, None] = None,
    scale_format: Optional[str] = None,
    scale_layout: Optional[str] = None,
    s_min: Optional[float] = None,
    y_out: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    weight_bias: Optional[float] = None,
) -> Tuple[Array, Array]:
    """Fused residual add + RMSNorm + FP8 quantisation with dynamic scales (per token or
    per group) or a per-tensor static scale (SPEC.md §8), bit-exact on every backend::

        residual <- RNdt(input + residual)                         (in place)
        y        <- RN32(RN32(residual * rstd) * w')               w' = RN32(w + weight_bias)
        s        <- RN32(amax(group) / FMAX)  (f32, floored at s_min; or UE8M0, rounded up)
        out      <- FP8(RN32(y * inv))        inv = RN32(1 / s)    (0 where s = 0)

    ``FMAX`` is 448 (E4M3) or 57344 (E5M2); NaN anywhere in a group makes its scale NaN.

    Args:
        input: ``[M, H]`` or ``[B, S, H]``, bfloat16 or float16; read only. Rows may be
            strided (the last dimension must be contiguous).
        residual: same shape and dtype, **updated in place**; never copied.
        weight: ``[H]``, same dtype, contiguous.
        out: the FP8 codes, ``input``'s shape: ``float8_e4m3fn`` / ``float8_e5m2`` (or
            uint8 with ``element``); NumPy: ml_dtypes' float8 types where installed.
            Allocated if None; a given one must be contiguous and is written in place.
        scales_out: the dynamic scales, allocated if None: float32 for ``"f32"``, uint8
            (or ``float8_e8m0fnu``) UE8M0 codes for ``"ue8m0"``; ``[..., H/G]`` row-major,
            ``[H/G, 4*ceil(M/4)]`` column-major (padding rows zero: the layout Hopper FP8
            GEMMs read), flat ``128*ceil(M/128) * 4*ceil((H/32)/4)`` swizzled 128x4
            (MXFP8's, padding zero), or ``[ceil(H/G/4), 4*Mp4]`` bytes packed column-major
            (``Mp4 = 4*ceil(M/4)``; ``.view(torch.int32)`` is DeepGEMM's packed UE8M0
            ``[ceil(H/G/4), Mp4]`` words, and ``.view(torch.int32).t()[:M]`` the ``[M,
            ceil(H/G/4)]`` view its Blackwell GEMMs take). Not with a per-tensor ``scale``.
        eps: RMSNorm epsilon, finite and >= 0.
        scale: a per-tensor static scale instead of dynamic ones (as
            :func:`fused_add_rmsnorm_quant`): a float32 ``(1,)`` array on the input's
            device (read when the kernel runs) or a float. Then ``group``,
            ``scale_format``, ``scale_layout``, ``s_min`` and ``scales_out`` must be None.
        element: ``"e4m3"`` or ``"e5m2"``; None takes ``out``'s float8 dtype, else E4M3.
        group: elements per scale: ``"token"`` (None; one scale per row, any ``H``), or
            32, 64, 128 (``H`` a multiple of it).
        scale_format: ``"f32"`` (None) or ``"ue8m0"`` (a power of two rounded up from
            ``amax / FMAX``).
        scale_layout: ``"row-major"`` (None), ``"column-major"``, ``"swizzled"``
            (UE8M0 scales in groups of 32 only: MXFP8) or ``"column-major-packed"`` (UE8M0
            scales in groups of 32, 64 or 128: four codes of a row's groups to a 32-bit
            word, DeepGEMM's packed scales, padding zero; SPEC.md §8).
        s_min: f32 scales only: the scale floor (``s = max(s, s_min)``), finite and >= 0;
            None or 0 is no floor (vLLM's per-token quant uses ``1 / (448 * 512)``).
        y_out: optional preallocated ``input``-shaped output: the normalised values
            before quantisation, rounded to the dtype.
        enable_pdl: CUDA only: None or True use programmatic dependent launch where the
            device has it (sm_90+), False never.
        weight_bias: added to every weight (1.0 for Gemma's ``(1 + w)``); None or 0 leaves
            it as it is.

    Returns:
        ``(out, scales)``: the given or allocated outputs; with a per-tensor ``scale``,
        ``scales`` is that scale as a float32 ``(1,)`` array (what :func:`dequantize_fp8`
        with ``group="tensor"`` multiplies by).

    Raises:
        TypeError: an argument of the wrong type or dtype (``fp4norm.ArgumentTypeError``).
        ValueError: wrong shape or device, ``H`` not a multiple of the group, a swizzled
            layout without UE8M0 scales in groups of 32, bad eps, s_min or weight_bias,
            outputs aliasing inputs or each other (``fp4norm.ArgumentError``). Nothing is
            written then.
        RuntimeError: the CUDA driver, NVRTC or a kernel compile failed.
    """
    if residual is None:
        _api.require_residual(residual, "rmsnorm_fp8quant")
    if isinstance(input, _Tensor):
        return _torch_ops.quant(
            input, residual, weight, out, scales_out, eps, scale, element, group, scale_format,
            scale_layout, s_min, y_out, enable_pdl, weight_bias,
        )
    return _api.fused_fp8(
        input, residual, weight, out, scales_out, scale, element, group, scale_format,
        scale_layout, s_min, eps, y_out, enable_pdl, weight_bias,
    )


def rmsnorm_fp8quant(
    input: Array,
    weight: Array,
    out: Optional[Array] = None,
    scales_out: Optional[Array] = None,
    eps: float = 1e-6,
    *,
    scale: Union[Array, float, None] = None,
    element: Optional[str] = None,
    group: Union[str, int, None] = None,
    scale_format: Optional[str] = None,
    scale_layout: Optional[str] = None,
    s_min: Optional[float] = None,
    y_out: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    weight_bias: Optional[float] = None,
) -> Tuple[Array, Array]:
    """RMSNorm + FP8 quantisation without a residual: :func:`add_rmsnorm_fp8quant` with
    ``h = input`` (nothing is written back), the same arguments and results."""
    if isinstance(input, _Tensor):
        return _torch_ops.quant(
            input, None, weight, out, scales_out, eps, scale, element, group, scale_format,
            scale_layout, s_min, y_out, enable_pdl, weight_bias,
        )
    return _api.fused_fp8(
        input, None, weight, out, scales_out, scale, element, group, scale_format,
        scale_layout, s_min, eps, y_out, enable_pdl, weight_bias,
    )


# MXFP8 (OCP MX): E4M3 elements, UE8M0 scales per 32 elements; the MXFP8 shorthands fix
# these arguments of the FP8 functions.
_MXFP8 = {"element": "e4m3", "group": 32, "scale_format": "ue8m0"}


def add_rmsnorm_mxfp8quant(
    input: Array,
    residual: Array,
    weight: Array,
    out: Optional[Array] = None,
    scales_out: Optional[Array] = None,
    eps: float = 1e-6,
    *,
    scale_layout: str = "swizzled",
    y_out: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    weight_bias: Optional[float] = None,
) -> Tuple[Array, Array]:
    """MXFP8: :func:`add_rmsnorm_fp8quant` with E4M3 elements and UE8M0 scales per group of
    32, in the swizzled 128x4 layout Blackwell's block-scaled GEMMs read (padding zero), or
    ``scale_layout="row-major"`` (``[..., H/32]``). ``H`` must be a multiple of 32.
    Returns ``(out, scales)``."""
    _api.require_residual(residual, "rmsnorm_mxfp8quant")
    return add_rmsnorm_fp8quant(
        input, residual, weight, out, scales_out, eps, scale_layout=scale_layout, y_out=y_out,
        enable_pdl=enable_pdl, weight_bias=weight_bias, **_MXFP8,
    )


def rmsnorm_mxfp8quant(
    input: Array,
    weight: Array,
    out: Optional[Array] = None,
    scales_out: Optional[Array] = None,
    eps: float = 1e-6,
    *,
    scale_layout: str = "swizzled",
    y_out: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    weight_bias: Optional[float] = None,
) -> Tuple[Array, Array]:
    """MXFP8 without a residual: :func:`add_rmsnorm_mxfp8quant` with ``h = input``."""
    return rmsnorm_fp8quant(
        input, weight, out, scales_out, eps, scale_layout=scale_layout, y_out=y_out,
        enable_pdl=enable_pdl, weight_bias=weight_bias, **_MXFP8,
    )


def allreduce_add_rmsnorm_fp8quant(
    inputs: Any,
    residual: Array,
    weight: Array,
    out: Optional[Array] = None,
    scales_out: Optional[Array] = None,
    eps: float = 1e-6,
    *,
    scale: Union[Array, float, None] = None,
    element: Optional[str] = None,
    group: Union[str, int, None] = None,
    scale_format: Optional[str] = None,
    scale_layout: Optional[str] = None,
    s_min: Optional[float] = None,
    y_out: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    weight_bias: Optional[float] = None,
) -> Tuple[Array, Array]:
    """The tensor-parallel all-reduce fused in front of :func:`add_rmsnorm_fp8quant`
    (SPEC.md §9, then §8), over the ranks' inputs gathered on this device, as
    :func:`allreduce_add_rmsnorm_fp4quant` is in front of the FP4 op.

    ``inputs`` is the list of every rank's input in rank order (1 to 8), each of the shape
    and dtype of ``residual``; they are summed in float32 one addition at a time and rounded
    once to the dtype, then :func:`add_rmsnorm_fp8quant` runs on the sum with this rank's
    ``residual`` (updated in place to ``sum + residual``), ``weight`` and outputs: every rank
    that calls it with the same inputs writes the same bytes, those of
    :func:`fp4norm.reference.allreduce_add_rmsnorm_fp8quant`. ``out``, ``scales_out``,
    ``eps`` and the keyword-only ``scale``, ``element``, ``group``, ``scale_format``,
    ``scale_layout``, ``s_min``, ``y_out``, ``enable_pdl`` and ``weight_bias`` are
    :func:`add_rmsnorm_fp8quant`'s, with its defaults and results.

    On CUDA tensors one kernel reads every rank's input (e.g. the rows of an all-gather:
    :func:`fp4norm.distributed.allreduce_add_rmsnorm_fp8quant`) and does it all; on host
    arrays the sum is taken first. Torch tensors (CPU or CUDA) go through the
    ``torch.ops.fp4norm.allreduce_add_rmsnorm_fp8quant`` operators (or, with a per-tensor
    ``scale``, ``allreduce_fused_add_rmsnorm_quant``), which ``torch.compile`` traces and
    CUDA graphs capture. A bad rank input raises ``fp4norm.ArgumentError`` /
    ``ArgumentTypeError`` naming it (``inputs[k]``) before anything is written.
    """
    _api.require_residual(residual)
    inputs = _api.rank_inputs(inputs, 8)
    options = dict(
        scale=scale, element=element, group=group, scale_format=scale_format,
        scale_layout=scale_layout, s_min=s_min, y_out=y_out, enable_pdl=enable_pdl,
        weight_bias=weight_bias,
    )
    if isinstance(inputs[0], _Tensor):
        tensors = _torch_ops.rank_tensors(inputs)
        return _torch_ops.quant(
            tensors[0], residual, weight, out, scales_out, eps, inputs=tensors, **options
        )
    written = (
        (out, "out"), (scales_out, "scales_out"), (residual, "residual"), (y_out, "y_out"),
    )
    return add_rmsnorm_fp8quant(
        _api.allreduce_sum(inputs, written), residual, weight, out, scales_out, eps, **options
    )


def allreduce_add_rmsnorm_mxfp8quant(
    inputs: Any,
    residual: Array,
    weight: Array,
    out: Optional[Array] = None,
    scales_out: Optional[Array] = None,
    eps: float = 1e-6,
    *,
    scale_layout: str = "swizzled",
    y_out: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    weight_bias: Optional[float] = None,
) -> Tuple[Array, Array]:
    """MXFP8 behind the fused all-reduce: :func:`allreduce_add_rmsnorm_fp8quant` with
    E4M3 elements and UE8M0 scales per group of 32, with :func:`add_rmsnorm_mxfp8quant`'s
    keyword-only arguments."""
    return allreduce_add_rmsnorm_fp8quant(
        inputs, residual, weight, out, scales_out, eps, scale_layout=scale_layout,
        y_out=y_out, enable_pdl=enable_pdl, weight_bias=weight_bias, **_MXFP8,
    )


def allreduce_fused_add_rmsnorm_quant(
    out: Array, inputs: Any, residual: Array, weight: Array, scale: Union[Array, float],
    eps: float = 1e-6, enable_pdl: Optional[bool] = None, *, y_out: Optional[Array] = None,
    weight_bias: Optional[float] = None,
) -> None:
    """The fused all-reduce (SPEC.md §9) in front of :func:`fused_add_rmsnorm_quant`
    (FlashInfer's per-tensor static scale): ``inputs``, every rank's input in rank order (1
    to 8), summed as :func:`allreduce_add_rmsnorm_fp8quant` sums them, then
    :func:`fused_add_rmsnorm_quant` on the sum with this rank's ``out``, ``residual``
    (updated in place), ``weight`` and ``scale``; every other argument is its. On CUDA
    tensors one kernel (the operator ``torch.ops.fp4norm.allreduce_fused_add_rmsnorm_quant``);
    the bytes of :func:`fp4norm.reference.allreduce_fused_add_rmsnorm_quant`."""
    _api.require_residual(residual)
    inputs = _api.rank_inputs(inputs, 8)
    if isinstance(inputs[0], _Tensor):
        tensors = _torch_ops.rank_tensors(inputs)
        _torch_ops.quant_static(
            out, tensors[0], residual, weight, scale, eps, enable_pdl, y_out, weight_bias,
            inputs=tensors,
        )
        return None
    written = ((out, "out"), (residual, "residual"), (y_out, "y_out"))
    return fused_add_rmsnorm_quant(
        out, _api.allreduce_sum(inputs, written), residual, weight, scale, eps, enable_pdl,
        y_out=y_out, weight_bias=weight_bias,
    )


def dequantize_fp8(
    q: Array,
    scales: Union[Array, float],
    *,
    element: Optional[str] = None,
    group: Union[str, int] = "token",
    scale_format: str = "f32",
    scale_layout: str = "row-major",
    m: Optional[int] = None,
    h: Optional[int] = None,
) -> Array:
    """FP8 codes and their scales back to float32 (SPEC.md §8), bit-exact:
    ``value = RN32(fp8_value(q) * scale)``, with the written scale of the element's group
    (f32, or ``2^(code - 127)`` for UE8M0) or, with ``group="tensor"``, the per-tensor
    scale ``s`` itself (quantising multiplied by ``RN32(1/s)``). A NaN is written as
    ``0x7FFFFFFF``.

    Host arrays only (NumPy, torch CPU tensors): fp4norm has no FP8 dequantisation kernel,
    and a CUDA tensor raises ValueError (pass ``.cpu()`` copies).

    Args:
        q: FP8 codes ``[..., H]``, contiguous: ``float8_e4m3fn`` / ``float8_e5m2`` (their
            dtype gives the format) or uint8 with ``element``.
        scales: as the quantising call wrote them (the layout's padding is not read); with
            ``group="tensor"``, the per-tensor scale (a float, or a float32 array of one
            value).
        element: ``"e4m3"`` or ``"e5m2"``; None takes ``q``'s float8 dtype.
        group, scale_format, scale_layout: those of the quantising call (``group`` also
            ``"tensor"``).
        m, h: rows and hidden size, read from ``q``'s shape unless given (for a flat ``q``).

    Returns:
        float32 ``q``'s shape (``[m, h]`` when ``m`` and ``h`` are given), of ``q``'s kind.
    """
    return _api.dequantize_fp8(q, scales, element, group, scale_format, scale_layout, m, h)


def fp8_scale_sizes(
    m: int,
    h: int,
    group: Union[str, int] = "token",
    scale_format: str = "f32",
    scale_layout: str = "row-major",
) -> Tuple[int, int]:
    """``(code bytes, scale elements)`` of an FP8 call on ``M`` rows of ``H``: ``M*H`` and
    the scale buffer's length with its padding (f32 values or UE8M0 bytes). Raises
    ValueError for a group, format or layout that ``H`` does not allow."""
    q_len, scales_len, _, _ = _core.fp8_sizes(
        _api.count_arg(m, "m"), _api.count_arg(h, "h"), _api.fp8_group(group), _api.fp8_name(scale_format, "scale_format", "f32"),
        _api.fp8_name(scale_layout, "scale_layout", "row-major"),
    )
    return q_len, scales_len


def cuda_device_count() -> int:
    """CUDA devices the driver reports (0 without a driver). Needs no torch."""
    return _core.cuda_device_count()


def cuda_device_info(device: int = 0) -> dict:
    """What fp4norm runs on CUDA device ``device``: ``name``, ``arch`` (the NVRTC target),
    ``hardware_e2m1``, and ``fast_conversions`` with its ``reason``: whether the kernels use
    the fast conversions (the conversion self-test passed on this GPU, driver and compiler)
    or the literal SPEC.md encoders (same bytes, slower). Opens the device and, the first
    time on this GPU, driver and compiler, runs the self-test. Needs no torch."""
    device = _api.count_arg(device, "device")
    fast, reason = _core.cuda_conversion_path(device)
    name, arch, hw = _core.cuda_device_info(device)
    return {
        "name": name,
        "arch": arch,
        "hardware_e2m1": hw,
        "fast_conversions": fast,
        "reason": reason,
    }


def scale_sizes(
    m: int, h: int, block_size: int = 16, scale_format: Optional[str] = None
) -> Tuple[int, int, int]:
    """Bytes of ``(y_fp4, row-major scales, swizzled scales)`` for ``M`` rows of ``H``."""
    m, h = _api.count_arg(m, "m"), _api.count_arg(h, "h")
    block_size, fmt = _api._block_and_format(block_size, scale_format)
    return _core.sizes(m, h, block_size, fmt)
