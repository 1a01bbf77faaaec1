"""The exception classes of fp4norm.

A bad argument raises :class:`ArgumentError` (a ``ValueError``) or
:class:`ArgumentTypeError` (a ``TypeError``). Both also derive from ``AssertionError``,
which is what FlashInfer raises for the same mistakes, so code written against either
library catches them.
"""

from __future__ import annotations

__all__ = ["ArgumentError", "ArgumentTypeError"]


class ArgumentError(ValueError, AssertionError):
    """A bad argument value: shape, size, device, layout, block size, scale format, eps,
    global scale, aliasing or alignment. Raised before anything is written."""


class ArgumentTypeError(TypeError, AssertionError):
    """An argument of the wrong type or dtype. Raised before anything is written."""
