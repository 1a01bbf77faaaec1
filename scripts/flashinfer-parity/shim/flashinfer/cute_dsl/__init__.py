"""Stand-in for flashinfer.cute_dsl: fp4norm's add_rmsnorm_fp4quant / rmsnorm_fp4quant."""

from fp4norm import add_rmsnorm_fp4quant, rmsnorm_fp4quant

__all__ = ["add_rmsnorm_fp4quant", "rmsnorm_fp4quant"]
