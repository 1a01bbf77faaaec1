"""fp4norm: fused residual add + RMSNorm + FP4 block quantisation (NVFP4, MXFP4 and the
other block/scale pairings), bit-exact to one contract (SPEC.md) on CPUs and NVIDIA GPUs
(sm_80 and newer: Ampere, Hopper, Blackwell).

A drop-in for FlashInfer's ``add_rmsnorm_fp4quant`` / ``rmsnorm_fp4quant`` (same
signatures, argument order, defaults, return values and output dtypes) that also runs on
Hopper and on the CPU:

* torch CUDA tensors run on the GPU, on torch's current stream of the tensors' device; a
  call never synchronises, so it can be captured in a CUDA graph (make one eager call of
  the same configuration first: kernels are compiled by NVRTC on first use, and compiling
  is not a stream operation);
* torch CPU tensors and NumPy arrays (``float16``, or ``ml_dtypes.bfloat16``) run on the
  CPU backend (multi-threaded; the GIL is released).

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
            ``[..., H/2]``; allocated if None.
        block_scale: output scales. Row-major ``[..., H/B]``, or with
            ``is_sf_swizzled_layout`` (or ``output_both_sf_layouts``) the 128x4 swizzled
            layout Blackwell block-scaled GEMMs read, a flat buffer of ``Mp*nK*4`` bytes
            (``Mp = 128*ceil(M/128)``, ``nK = ceil((H/B)/4)``) whose padding is zero.
            Allocated if None.
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


def cuda_device_count() -> int:
    """CUDA devices the driver reports (0 without a driver). Needs no torch."""
    return _core.cuda_device_count()


def cuda_device_info(device: int = 0) -> dict:
    """What fp4norm runs on CUDA device ``device``: ``name``, ``arch`` (the NVRTC target),
    ``hardware_e2m1``, and ``fast_conversions`` with its ``reason``: whether the kernels use
    the fast conversions (the conversion self-test passed on this GPU, driver and compiler)
    or the literal SPEC.md encoders (same bytes, slower). Opens the device and, the first
    time on this GPU, driver and compiler, runs the self-test. Needs no torch."""
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
    block_size, fmt = _api._block_and_format(block_size, scale_format)
    return _core.sizes(m, h, block_size, fmt)
