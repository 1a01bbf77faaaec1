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


def _rank_alias_cases(kind):
    """(description, written name, rank name, call) for rank inputs that overlap a buffer
    the call writes, on host arrays (``kind`` "numpy" or "torch" CPU tensors)."""
    dt = np_dtype("bf16")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 64)).astype(dt)
    r = rng.standard_normal((4, 64)).astype(dt)
    w = np.ones(64, dt)
    big = rng.standard_normal((6, 64)).astype(dt)  # residual = big[:4], a rank = big[2:]
    y = np.zeros((4, 64), dt)
    q8 = np.zeros((4, 64), np.uint8)
    if kind == "torch":
        torch = pytest.importorskip("torch")

        def t(a):
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == dt else torch.from_numpy(a)

        x, r, w, big, y = map(t, (x, r, w, big, y))
        q8 = torch.from_numpy(q8).view(torch.float8_e4m3fn)
    else:
        q8 = q8.view(fp4norm._api._np_fp8("e4m3"))
    ref = reference
    return [
        ("fp4 inputs[1] is residual", "residual", "inputs[1]",
         lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([x, r], r, w), (r,)),
        ("fp4 inputs[0] is residual", "residual", "inputs[0]",
         lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([r, x], r, w), (r,)),
        ("fp4 inputs[1] is y_out", "y_out", "inputs[1]",
         lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([x, y], r, w, y_out=y), (r, y)),
        ("fp4 inputs[1] overlaps the residual's rows", "residual", "inputs[1]",
         lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([x, big[2:]], big[:4], w), (big,)),
        ("fp4 reference", "residual", "inputs[1]",
         lambda: ref.allreduce_add_rmsnorm_fp4quant([x, r], r, w), (r,)),
        ("fp4 reference without residual, y_out", "y_out", "inputs[1]",
         lambda: ref.allreduce_rmsnorm_fp4quant([x, y], w, y_out=y), (y,)),
        ("fp8 inputs[1] is residual", "residual", "inputs[1]",
         lambda: fp4norm.allreduce_add_rmsnorm_fp8quant([x, r], r, w), (r,)),
        ("fp8 reference inputs[1] is y_out", "y_out", "inputs[1]",
         lambda: ref.allreduce_add_rmsnorm_fp8quant([x, y], r, w, y_out=y), (r, y)),
        ("fp8 static inputs[1] is residual", "residual", "inputs[1]",
         lambda: fp4norm.allreduce_fused_add_rmsnorm_quant(q8, [x, r], r, w, 1.0), (r, q8)),
        ("fp8 static reference", "residual", "inputs[1]",
         lambda: ref.allreduce_fused_add_rmsnorm_quant(q8, [x, r], r, w, 1.0), (r, q8)),
    ]


def _snapshot(arrays):
    return [bytes(np.asarray(a.view(np.uint8) if isinstance(a, np.ndarray) else a.view(__import__("torch").uint8).numpy())) for a in arrays]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_rank_input_overlapping_a_written_buffer_is_refused(kind):
    """On the host, as on the GPU, a rank's input may not overlap a buffer the call writes
    (the residual, y_out, the outputs): the host path used to sum the ranks into a fresh
    buffer first and accept it. Refused before anything is written, naming both."""
    for desc, written, rank, call, watched in _rank_alias_cases(kind):
        before = _snapshot(watched)
        with pytest.raises(fp4norm.ArgumentError, match="overlap") as info:
            call()
        msg = str(info.value)
        assert written in msg and rank in msg, (desc, msg)
        assert _snapshot(watched) == before, desc


def test_rank_input_overlap_through_the_operators():
    torch = pytest.importorskip("torch")
    ops = torch.ops.fp4norm
    x = torch.randn(4, 64).to(torch.bfloat16)
    r = torch.randn(4, 64).to(torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    r0 = r.clone()
    for call in (
        lambda: ops.allreduce_add_rmsnorm_fp4quant([x, r], r, w),
        lambda: ops.allreduce_add_rmsnorm_fp8quant([x, r], r, w),
        lambda: ops.allreduce_fused_add_rmsnorm_quant(torch.empty(4, 64, dtype=torch.float8_e4m3fn), [x, r], r, w, torch.ones(1)),
    ):
        with pytest.raises(RuntimeError, match=r"fp4norm.ArgumentError: residual and inputs\[1\] overlap"):
            call()
    assert torch.equal(r.view(torch.int16), r0.view(torch.int16))
    # Read-only rank inputs may alias each other (and rank 0's): the reference's bytes.
    r1, r2 = r.clone(), r.clone()
    got = fp4norm.allreduce_add_rmsnorm_fp4quant([x, x], r1, w)
    want = reference.allreduce_add_rmsnorm_fp4quant([x, x.clone()], r2, w)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))
    assert torch.equal(r1.view(torch.int16), r2.view(torch.int16))
