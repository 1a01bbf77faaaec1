"""Shared helpers of the fp4norm Python tests: test data, byte views, and the parts of
SPEC.md that are easy to restate in NumPy (residual add, normalised values, scale
layouts, dequantisation) as independent checks of the module's plumbing."""

from __future__ import annotations

import math
import os

import numpy as np

try:
    import ml_dtypes
except ImportError:  # bfloat16 NumPy cases are skipped
    ml_dtypes = None

# (block size, scale format) pairings: NVFP4, MXFP4 and the two mixed ones.
FORMATS = [(16, "e4m3"), (32, "ue8m0"), (16, "ue8m0"), (32, "e4m3")]

E2M1 = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32
)


def np_dtype(code: str):
    if code == "f16":
        return np.float16
    if ml_dtypes is None:
        import pytest

        pytest.skip("ml_dtypes is not installed: NumPy bfloat16 cases skipped")
    return ml_dtypes.bfloat16


def rand(rng: np.random.Generator, shape, code: str, scale: float = 1.0) -> np.ndarray:
    """Random values in dtype `code`, with a zero row and a large-valued row when there
    are enough rows (zero blocks, saturating scales)."""
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    flat = v.reshape(-1, shape[-1])
    if flat.shape[0] > 2:
        flat[1] = 0
        flat[2] *= 1000
    return v.astype(np_dtype(code))


def rank_sum(ranks) -> np.ndarray:
    """SPEC.md §9's reduction restated in NumPy, independently of fp4norm: the ranks' inputs
    added in rank order in float32 (one rounding per addition), then rounded once to their
    dtype (ml_dtypes' bfloat16 or float16), every NaN as the canonical 0x7FFF fp4norm
    writes."""
    with np.errstate(all="ignore"):  # Inf - Inf and overflow are part of the contract
        acc = ranks[0].astype(np.float32)
        for r in ranks[1:]:
            acc = (acc + r.astype(np.float32)).astype(np.float32)
        out = acc.astype(ranks[0].dtype)
    out.view(np.uint16)[np.isnan(acc)] = 0x7FFF
    return out


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bytes of an array (any dtype), for exact comparisons."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def same_bytes(a, b) -> bool:
    return np.array_equal(bits(np.asarray(a)), bits(np.asarray(b)))


def spec_residual(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """SPEC.md §1 step 1: RNdt(RN32(x + r))."""
    return (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)


def spec_y(h: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """SPEC.md §1 steps 2-4 in f32 (y before rounding to the dtype); rows of h are the
    last axis."""
    h2 = h.reshape(-1, h.shape[-1])
    # The exact sum of the squares rounded once (SPEC.md §1.2): math.fsum is correctly
    # rounded; np.sum's pairwise order is not.
    ss = np.array([math.fsum(row) for row in h2.astype(np.float64) ** 2], dtype=np.float64)
    rstd = (1.0 / np.sqrt(ss / h2.shape[1] + np.float64(np.float32(eps)))).astype(np.float32)
    y = (h2.astype(np.float32) * rstd[:, None]).astype(np.float32) * w.astype(np.float32)
    return y.astype(np.float32).reshape(h.shape)


def swizzled_offsets(m: int, nb: int) -> np.ndarray:
    """SPEC.md §3: byte offset of (row, block) in the swizzled 128x4 layout, [m, nb]."""
    nk = (nb + 3) // 4
    row = np.arange(m)[:, None]
    b = np.arange(nb)[None, :]
    return (row // 128) * nk * 512 + (b // 4) * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4 + (b % 4)


def swizzled_len(m: int, nb: int) -> int:
    return 128 * ((m + 127) // 128) * 4 * ((nb + 3) // 4)


def check_swizzled_matches(row_major: np.ndarray, swizzled: np.ndarray, m: int, nb: int) -> None:
    """The swizzled buffer holds the row-major codes at SPEC.md §3 offsets, zero elsewhere."""
    rm = bits(row_major).reshape(m, nb)
    sw = bits(swizzled)
    assert sw.size == swizzled_len(m, nb)
    off = swizzled_offsets(m, nb)
    assert np.array_equal(sw[off], rm)
    pad = np.ones(sw.size, dtype=bool)
    pad[off.reshape(-1)] = False
    assert not np.any(sw[pad]), "swizzled padding must be zero"


def scale_values(codes: np.ndarray, fmt: str) -> np.ndarray:
    codes = bits(codes)
    if fmt == "ue8m0":
        with np.errstate(over="ignore"):
            v = np.ldexp(np.float32(1), codes.astype(np.int32) - 127).astype(np.float32)
        v[codes == 255] = np.nan
        return v
    if ml_dtypes is None:
        import pytest

        pytest.skip("ml_dtypes is not installed: E4M3 decoding skipped")
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def spec_dequant(q: np.ndarray, sf_row_major: np.ndarray, m: int, h: int, block: int, fmt: str, gs) -> np.ndarray:
    """SPEC.md §4: e2m1(q) * scale, E4M3 as RN32(RN32(e2m1 * d) / gs)."""
    qb = bits(q).reshape(m, h // 2)
    nib = np.empty((m, h), dtype=np.uint8)
    nib[:, 0::2] = qb & 0xF
    nib[:, 1::2] = qb >> 4
    e = E2M1[nib]
    s = np.repeat(scale_values(sf_row_major, fmt).reshape(m, h // block), block, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        if fmt == "ue8m0":
            return (e * s).astype(np.float32)
        g = np.broadcast_to(np.asarray(gs, dtype=np.float32).reshape(-1, 1), (m, 1))
        return ((e * s).astype(np.float32) / g).astype(np.float32)


def devices_under_test() -> list:
    """The devices torch cases are parametrised over: ``cpu`` and ``cuda``, those named in
    FP4NORM_TEST_DEVICES (default both; ``cuda`` alone is a GPU machine's run, CI covers
    the CPU). A ``cuda`` case calls :func:`cuda_or_skip`, so it shows as skipped, with the
    reason, where no GPU is present."""
    wanted = os.environ.get("FP4NORM_TEST_DEVICES", "cpu,cuda").split(",")
    return [d for d in ("cpu", "cuda") if d in wanted]


def cuda_or_skip(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            import pytest

            pytest.skip("no CUDA device: CUDA cases skipped")
