"""Stand-in for flashinfer.cute_dsl: fp4norm's add_rmsnorm_fp4quant / rmsnorm_fp4quant."""

# Imported through the submodules, as FlashInfer's package does: importing a submodule
# binds its name on the package, so a test that imports `cute_dsl.add_rmsnorm_fp4quant`
# (the module) after `from cute_dsl import add_rmsnorm_fp4quant` (the function) would
# otherwise replace the function with the module.
from .add_rmsnorm_fp4quant import add_rmsnorm_fp4quant
from .rmsnorm_fp4quant import rmsnorm_fp4quant

__all__ = ["add_rmsnorm_fp4quant", "rmsnorm_fp4quant"]
