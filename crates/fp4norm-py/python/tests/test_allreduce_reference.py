"""SPEC.md §9 in Python: fp4norm.reference.allreduce_add_rmsnorm_fp4quant over the ranks'
host arrays, against the op on a sum computed here in NumPy (rank order, float32 per
addition, one rounding to the dtype), byte for byte; the order the contract fixes, by hand;
bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import fp4norm
from fp4norm import reference
from fp4_helpers import np_dtype, rank_sum as numpy_sum, same_bytes


@pytest.mark.parametrize("code", ["bf16", "f16"])
@pytest.mark.parametrize("w", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("layout", ["row-major", "swizzled", "both"])
def test_fused_allreduce_matches_op_on_sum(code, w, layout):
    dt = np_dtype(code)
    rng = np.random.default_rng(10 * w)
    m, h = 7, 64
    ranks = [(rng.standard_normal((m, h)) * 3).astype(dt) for _ in range(w)]
    weight = (1 + 0.1 * rng.standard_normal(h)).astype(dt)
    r0 = rng.standard_normal((m, h)).astype(dt)
    kw = dict(global_scale=np.array([2.5], np.float32), is_sf_swizzled_layout=layout == "swizzled",
              output_both_sf_layouts=layout == "both")
    r1 = r0.copy()
    fused = reference.allreduce_add_rmsnorm_fp4quant(ranks, r1, weight, **kw)
    r2 = r0.copy()
    plain = reference.add_rmsnorm_fp4quant(numpy_sum(ranks), r2, weight, **kw)
    assert len(fused) == len(plain)
    for a, b in zip(fused, plain):
        assert same_bytes(a, b)
    assert same_bytes(r1, r2)
    # Without a residual.
    a = reference.allreduce_rmsnorm_fp4quant(ranks, weight, block_size=32)
    b = reference.rmsnorm_fp4quant(numpy_sum(ranks), weight, block_size=32)
    assert all(same_bytes(u, v) for u, v in zip(a, b))


def test_rank_order_is_part_of_the_contract():
    dt = np_dtype("bf16")
    tiny = np.float32(2.0**-24)
    one = lambda v: np.full((1, 16), v, np.float32).astype(dt)  # noqa: E731
    s1 = fp4norm._api.allreduce_sum([one(1.0), one(tiny), one(-1.0)])
    s2 = fp4norm._api.allreduce_sum([one(tiny), one(-1.0), one(1.0)])
    assert np.all(s1.view(np.uint16) == 0x0000)
    assert np.all(s2.view(np.uint16) == 0x3380)


def test_bad_inputs():
    dt = np_dtype("f16")
    x = np.ones((2, 32), dt)
    r = np.zeros((2, 32), dt)
    w = np.ones(32, dt)
    with pytest.raises(fp4norm.ArgumentError, match="at least one rank"):
        reference.allreduce_add_rmsnorm_fp4quant([], r, w)
    with pytest.raises(fp4norm.ArgumentError, match="inputs\\[1\\]"):
        reference.allreduce_add_rmsnorm_fp4quant([x, np.ones((3, 32), dt)], r, w)
    with pytest.raises(fp4norm.ArgumentTypeError, match="inputs\\[1\\]"):
        reference.allreduce_add_rmsnorm_fp4quant([x, x.astype(np.float32)], r, w)
    with pytest.raises(fp4norm.ArgumentTypeError):
        reference.allreduce_add_rmsnorm_fp4quant(x, r, w)
    assert np.all(r == 0)


@pytest.mark.parametrize("w", [1, 3, 8])
def test_op_on_host_arrays_is_the_reference(w):
    # fp4norm.allreduce_add_rmsnorm_fp4quant on host arrays (the CPU backend on the sum).
    dt = np_dtype("bf16")
    rng = np.random.default_rng(w)
    ranks = [rng.standard_normal((5, 128)).astype(dt) for _ in range(w)]
    weight = (1 + 0.1 * rng.standard_normal(128)).astype(dt)
    r0 = rng.standard_normal((5, 128)).astype(dt)
    r1, r2 = r0.copy(), r0.copy()
    got = fp4norm.allreduce_add_rmsnorm_fp4quant(ranks, r1, weight, is_sf_swizzled_layout=True)
    want = reference.allreduce_add_rmsnorm_fp4quant(ranks, r2, weight, is_sf_swizzled_layout=True)
    assert all(same_bytes(a, b) for a, b in zip(got, want))
    assert same_bytes(r1, r2)
    with pytest.raises(fp4norm.ArgumentError, match="1 to 8"):
        fp4norm.allreduce_add_rmsnorm_fp4quant(ranks * 9, r1, weight)
