"""The tensor-parallel fused all-reduce (SPEC.md §9) over a ``torch.distributed`` process
group: each rank's input is all-gathered (NCCL, or whatever backend the group runs), then
one kernel sums the ranks' rows in rank order and runs the FP4 op, so every rank writes
the bytes of :func:`fp4norm.reference.allreduce_add_rmsnorm_fp4quant`, for any size and any
all-gather algorithm. This is the portable path: it moves ``W`` times the input through the
all-gather where a reduce-scatter moves it once."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from ._errors import ArgumentError

Array = Any


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
    from . import allreduce_add_rmsnorm_fp4quant as fused

    return fused(
        list(gathered.unbind(0)), residual, weight, y_fp4, block_scale, global_scale, eps,
        block_size, scale_format, is_sf_swizzled_layout, output_both_sf_layouts,
        block_scale_unswizzled, enable_pdl, y_out, weight_bias=weight_bias,
    )


__all__ = ["allreduce_add_rmsnorm_fp4quant"]
