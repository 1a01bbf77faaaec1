from fp4norm import rmsnorm_fp4quant

__all__ = ["rmsnorm_fp4quant"]
