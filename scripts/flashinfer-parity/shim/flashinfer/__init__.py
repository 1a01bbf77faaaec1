"""Stand-in for `flashinfer` when its tests run against fp4norm (see ../../README.md)."""

from ._quantize import fp4_quantize

__all__ = ["fp4_quantize"]
