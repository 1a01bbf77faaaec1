"""The tensor-parallel fused all-reduce (SPEC.md §9) over a ``torch.distributed`` process
group: each rank's input is all-gathered (NCCL, or whatever backend the group runs), then
one kernel sums the ranks' rows in rank order and runs the op (FP4, or FP8 with a residual),
so every rank writes the bytes of the matching ``fp4norm.reference.allreduce_*`` function,
for any size and any all-gather algorithm. This is the portable path: it moves ``W`` times
the input through the all-gather where a reduce-scatter moves it once.

The process group is the keyword ``group`` (None: the default group), as in
``torch.distributed``, except in :func:`allreduce_add_rmsnorm_fp8quant`, whose ``group`` is
the FP8 scale group of :func:`fp4norm.add_rmsnorm_fp8quant`: there it is ``process_group``."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from ._errors import ArgumentError

Array = Any


def _gather(input: Any, group: Any) -> list:
    """This rank's ``input`` (its partial sum, a contiguous CUDA tensor) all-gathered from
    every rank of ``group`` (1 to 8 ranks) into one buffer, on torch's current stream: the
    ranks' inputs in rank order, views of that buffer."""
    import torch
    import torch.distributed as dist

    if not isinstance(input, torch.Tensor) or input.device.type != "cuda":
        raise ArgumentError("input must be a CUDA tensor (the all-gather runs on the GPU)")
    if not input.is_contiguous():
        raise ArgumentError("input must be contiguous: the all-gather reads it as one block")
    world = dist.get_world_size(group)
    if not 1 <= world <= 8:
        raise ArgumentError(f"the group has {world} ranks: the fused all-reduce sums 1 to 8")
    gathered = torch.empty((world,) + tuple(input.shape), dtype=input.dtype, device=input.device)
    dist.all_gather_into_tensor(gathered, input, group=group)
    return list(gathered.unbind(0))


def allreduce_add_rmsnorm_fp4quant(
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
    group: Any = None,
) -> Tuple[Array, ...]:
    """This rank's part of the fused all-reduce: ``input`` (this rank's partial sum, a
    contiguous CUDA tensor) is gathered from every rank of ``group`` (the default group if
    None, 1 to 8 ranks) into one buffer, then
    :func:`fp4norm.allreduce_add_rmsnorm_fp4quant` runs on the gathered rows, in rank
    order, on torch's current stream. ``residual`` and the outputs are this rank's, as in
    :func:`fp4norm.add_rmsnorm_fp4quant`; with the same residual on every rank (tensor
    parallelism keeps it replicated) every rank writes the same bytes."""
    from . import allreduce_add_rmsnorm_fp4quant as fused

    return fused(
        _gather(input, group), residual, weight, y_fp4, block_scale, global_scale, eps,
        block_size, scale_format, is_sf_swizzled_layout, output_both_sf_layouts,
        block_scale_unswizzled, enable_pdl, y_out, weight_bias=weight_bias,
    )


def allreduce_add_rmsnorm_fp8quant(
    input: Array, residual: Array, weight: Array, out: Optional[Array] = None,
    scales_out: Optional[Array] = None, eps: float = 1e-6, *, process_group: Any = None,
    **options: Any,
) -> Tuple[Array, Array]:
    """:func:`allreduce_add_rmsnorm_fp4quant` for the FP8 op: ``input`` gathered from every
    rank of ``process_group`` (the default group if None, 1 to 8 ranks), then
    :func:`fp4norm.allreduce_add_rmsnorm_fp8quant` on the gathered rows with this rank's
    ``residual``, ``weight`` and outputs; ``out``, ``scales_out``, ``eps`` and the
    keyword-only ``options`` (``group`` being the scale group) are
    :func:`fp4norm.add_rmsnorm_fp8quant`'s. Returns ``(out, scales)``."""
    from . import allreduce_add_rmsnorm_fp8quant as fused

    return fused(_gather(input, process_group), residual, weight, out, scales_out, eps, **options)


def allreduce_fused_add_rmsnorm_quant(
    out: Array, input: Array, residual: Array, weight: Array, scale: Union[Array, float],
    eps: float = 1e-6, enable_pdl: Optional[bool] = None, *, y_out: Optional[Array] = None,
    weight_bias: Optional[float] = None, group: Any = None,
) -> None:
    """:func:`allreduce_add_rmsnorm_fp4quant` for FlashInfer's per-tensor static scale:
    ``input`` gathered from every rank of ``group``, then
    :func:`fp4norm.allreduce_fused_add_rmsnorm_quant` on the gathered rows with this rank's
    ``out``, ``residual`` (updated in place), ``weight`` and ``scale``."""
    from . import allreduce_fused_add_rmsnorm_quant as fused

    fused(
        out, _gather(input, group), residual, weight, scale, eps, enable_pdl, y_out=y_out,
        weight_bias=weight_bias,
    )


__all__ = [
    "allreduce_add_rmsnorm_fp4quant",
    "allreduce_add_rmsnorm_fp8quant",
    "allreduce_fused_add_rmsnorm_quant",
]
