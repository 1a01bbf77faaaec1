from fp4norm import add_rmsnorm_fp4quant

__all__ = ["add_rmsnorm_fp4quant"]
