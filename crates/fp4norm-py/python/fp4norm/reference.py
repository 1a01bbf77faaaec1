"""The scalar reference of fp4norm (SPEC.md step by step, ``fp4norm::reference`` in
Rust), for host arrays: the executable spec the fast backends are checked against.

Same signatures and results as :func:`fp4norm.add_rmsnorm_fp4quant` and
:func:`fp4norm.rmsnorm_fp4quant`, and for the FP8 family (SPEC.md §8,
``fp4norm::fp8::reference`` in Rust) as :func:`fp4norm.rmsnorm_quant`,
:func:`fp4norm.fused_add_rmsnorm_quant`, :func:`fp4norm.fused_add_rmsnorm_fp8_block_quant`,
:func:`fp4norm.add_rmsnorm_fp8quant` and
:func:`fp4norm.rmsnorm_fp8quant`; much slower; torch CPU tensors and NumPy arrays only.
The ``allreduce_*`` functions are the tensor-parallel contract (SPEC.md §9): the ranks'
inputs summed in rank order, then the op.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from . import _api

Array = Any

__all__ = [
    "add_rmsnorm_fp4quant",
    "rmsnorm_fp4quant",
    "allreduce_add_rmsnorm_fp4quant",
    "allreduce_rmsnorm_fp4quant",
    "rmsnorm_quant",
    "fused_add_rmsnorm_quant",
    "fused_add_rmsnorm_fp8_block_quant",
    "add_rmsnorm_fp8quant",
    "rmsnorm_fp8quant",
    "allreduce_add_rmsnorm_fp8quant",
    "allreduce_fused_add_rmsnorm_quant",
]


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
) -> Tuple[Array, ...]:
    """:func:`fp4norm.add_rmsnorm_fp4quant` through the scalar reference (host arrays);
    ``enable_pdl`` is accepted and ignored."""
    _api.require_residual(residual, "reference.rmsnorm_fp4quant")
    return _api.fused(
        input, residual, weight, y_fp4, block_scale, global_scale, eps, block_size,
        scale_format, is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled,
        enable_pdl, y_out, weight_bias, backend="reference",
    )


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
) -> Tuple[Array, ...]:
    """:func:`fp4norm.rmsnorm_fp4quant` through the scalar reference (host arrays);
    ``enable_pdl`` is accepted and ignored."""
    return _api.fused(
        input, None, weight, y_fp4, block_scale, global_scale, eps, block_size,
        scale_format, is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled,
        enable_pdl, y_out, weight_bias, backend="reference",
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
) -> Tuple[Array, ...]:
    """SPEC.md §9, tensor parallel: the ranks' ``inputs`` (a list of host arrays, rank
    order) summed in float32 one addition at a time and rounded once to the dtype, then
    :func:`add_rmsnorm_fp4quant` on that sum with this rank's ``residual``, ``weight`` and
    outputs. The contract every transport of the fused all-reduce must match, byte for byte."""
    _api.require_residual(residual, "reference.allreduce_rmsnorm_fp4quant")
    written = _api.fp4_written(
        residual, y_fp4, block_scale, output_both_sf_layouts, block_scale_unswizzled, y_out
    )
    return add_rmsnorm_fp4quant(
        _api.allreduce_sum(inputs, written), residual, weight, y_fp4, block_scale, global_scale, eps,
        block_size, scale_format, is_sf_swizzled_layout, output_both_sf_layouts,
        block_scale_unswizzled, enable_pdl, y_out, weight_bias=weight_bias,
    )


def allreduce_rmsnorm_fp4quant(
    inputs: Any,
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
) -> Tuple[Array, ...]:
    """:func:`allreduce_add_rmsnorm_fp4quant` without a residual (``rmsnorm_fp4quant`` on
    the sum)."""
    written = _api.fp4_written(
        None, y_fp4, block_scale, output_both_sf_layouts, block_scale_unswizzled, y_out
    )
    return rmsnorm_fp4quant(
        _api.allreduce_sum(inputs, written), weight, y_fp4, block_scale, global_scale, eps, block_size,
        scale_format, is_sf_swizzled_layout, enable_pdl,
        output_both_sf_layouts=output_both_sf_layouts,
        block_scale_unswizzled=block_scale_unswizzled, y_out=y_out, weight_bias=weight_bias,
    )


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
    """:func:`fp4norm.rmsnorm_quant` through the scalar reference (host arrays);
    ``enable_pdl`` is accepted and ignored."""
    _api.fused_fp8(
        input, None, weight, out, None, scale, None, None, None, None, None, eps, y_out,
        enable_pdl, weight_bias, backend="reference", static=True,
    )


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
    """:func:`fp4norm.fused_add_rmsnorm_quant` through the scalar reference (host arrays);
    ``enable_pdl`` is accepted and ignored."""
    _api.require_residual(residual, "reference.rmsnorm_quant")
    _api.fused_fp8(
        input, residual, weight, out, None, scale, None, None, None, None, None, eps, y_out,
        enable_pdl, weight_bias, backend="reference", static=True,
    )


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
    """:func:`fp4norm.fused_add_rmsnorm_fp8_block_quant` through the scalar reference (host
    arrays); ``enable_pdl`` is accepted and ignored."""
    _api.fp8_block_quant(
        add_rmsnorm_fp8quant, out, block_scale, normed_out, input, residual, weight, eps,
        weight_bias, enable_pdl=enable_pdl,
    )


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
    """:func:`fp4norm.add_rmsnorm_fp8quant` through the scalar reference (host arrays);
    ``enable_pdl`` is accepted and ignored."""
    _api.require_residual(residual, "reference.rmsnorm_fp8quant")
    return _api.fused_fp8(
        input, residual, weight, out, scales_out, scale, element, group, scale_format,
        scale_layout, s_min, eps, y_out, enable_pdl, weight_bias, backend="reference",
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
    """:func:`fp4norm.rmsnorm_fp8quant` through the scalar reference (host arrays);
    ``enable_pdl`` is accepted and ignored."""
    return _api.fused_fp8(
        input, None, weight, out, scales_out, scale, element, group, scale_format,
        scale_layout, s_min, eps, y_out, enable_pdl, weight_bias, backend="reference",
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
    """SPEC.md §9 in front of §8 (``fp4norm::fp8::reference::allreduce_add_rmsnorm_fp8quant``
    in Rust): the ranks' ``inputs`` (a list of host arrays, rank order) summed in float32 one
    addition at a time and rounded once to the dtype, then :func:`add_rmsnorm_fp8quant` on
    that sum with this rank's ``residual``, ``weight`` and outputs; every other argument is
    its. The contract every transport of the fused all-reduce must match, byte for byte."""
    _api.require_residual(residual)
    written = ((out, "out"), (scales_out, "scales_out"), (residual, "residual"), (y_out, "y_out"))
    return add_rmsnorm_fp8quant(
        _api.allreduce_sum(inputs, written), residual, weight, out, scales_out, eps,
        scale=scale, element=element, group=group, scale_format=scale_format,
        scale_layout=scale_layout, s_min=s_min, y_out=y_out, enable_pdl=enable_pdl,
        weight_bias=weight_bias,
    )


def allreduce_fused_add_rmsnorm_quant(
    out: Array, inputs: Any, residual: Array, weight: Array, scale: Union[Array, float],
    eps: float = 1e-6, enable_pdl: Optional[bool] = None, *, y_out: Optional[Array] = None,
    weight_bias: Optional[float] = None,
) -> None:
    """:func:`allreduce_add_rmsnorm_fp8quant` for FlashInfer's per-tensor static scale:
    :func:`fused_add_rmsnorm_quant` on the ranks' sum (SPEC.md §9)."""
    _api.require_residual(residual)
    written = ((out, "out"), (residual, "residual"), (y_out, "y_out"))
    fused_add_rmsnorm_quant(
        out, _api.allreduce_sum(inputs, written), residual, weight, scale, eps, enable_pdl,
        y_out=y_out, weight_bias=weight_bias,
    )
