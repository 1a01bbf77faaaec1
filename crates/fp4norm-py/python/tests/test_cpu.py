"""fp4norm on the CPU backend: NumPy arrays (float16, ml_dtypes.bfloat16) and torch CPU
tensors (skipped, visibly, without torch).

Results are compared byte for byte with the Rust scalar reference exposed as
``fp4norm.reference`` and with hand-worked values; the residual update, ``y_out``, the
scale layouts and ``dequantize`` are also checked against SPEC.md restated in NumPy."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

import fp4norm
from fp4norm import reference
from fp4_helpers import (
    FORMATS,
    bits,
    check_swizzled_matches,
    ml_dtypes,
    np_dtype,
    rand,
    same_bytes,
    spec_dequant,
    spec_residual,
    spec_y,
    swizzled_len,
)

DTYPES = ["bf16", "f16"]


def make(rng, m, h, code, lead=None):
    shape = (m, h) if lead is None else tuple(lead) + (h,)
    x = rand(rng, shape, code)
    r = rand(rng, shape, code, scale=2.0)
    w = (1 + 0.25 * rng.standard_normal(h)).astype(np.float32).astype(np_dtype(code))
    return x, r, w


# ---------------------------------------------------------------------------------------
# Hand-worked values (SPEC.md; the README's example)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", DTYPES)
def test_hand_values_nvfp4(code):
    dt = np_dtype(code)
    m, h = 4, 64
    x = np.full((m, h), 0.25, dt)
    r = np.full((m, h), 1.0, dt)
    w = np.ones(h, dt)
    q, sf = fp4norm.add_rmsnorm_fp4quant(x, r, w)
    # residual 1.25 everywhere; y = 1.0; scale RN(1/6) = 0.171875 (E4M3 0x23);
    # 1 / 0.171875 = 5.8 -> E2M1 6.0 (code 7) in both nibbles.
    assert np.all(r.astype(np.float32) == 1.25)
    assert q.dtype == np.uint8 and q.shape == (m, h // 2) and np.all(q == 0x77)
    assert sf.dtype == np.uint8 and sf.shape == (m, h // 16) and np.all(sf == 0x23)
    # The swizzled layout of the same call: 128 x 4 tile, padding zero.
    r[...] = 1.0
    q2, sw = fp4norm.add_rmsnorm_fp4quant(x, r, w, is_sf_swizzled_layout=True)
    assert sw.shape == (512,) and np.all(q2 == 0x77)
    assert list(sw[:20]) == [0x23] * 4 + [0] * 12 + [0x23] * 4
    assert np.count_nonzero(sw) == m * 4


def test_hand_values_global_scale_and_mxfp4():
    dt = np.float16
    m, h = 2, 64
    x = np.zeros((m, h), dt)
    w = np.ones(h, dt)
    # gs = 2: s = RN(2 * 1 / 6) -> E4M3 0.34375 (0x2B); inv = 2 / 0.34375 = 5.82 -> 6.0.
    r = np.ones((m, h), dt)
    q, sf = fp4norm.add_rmsnorm_fp4quant(x, r, w, global_scale=np.array([2.0], np.float32))
    assert np.all(sf == 0x2B) and np.all(q == 0x77)
    # Per-row global scale: row 0 gs 1 (0x23), row 1 gs 2 (0x2B).
    r = np.ones((m, h), dt)
    _, sf = fp4norm.add_rmsnorm_fp4quant(x, r, w, global_scale=np.array([1.0, 2.0], np.float32))
    assert np.all(sf[0] == 0x23) and np.all(sf[1] == 0x2B)
    # MXFP4: amax / 6 = 1/6 rounds up to 2^-2 (UE8M0 125); 1.0 * 4 = 4.0 -> E2M1 code 6.
    r = np.ones((m, h), dt)
    q, sf = fp4norm.add_rmsnorm_fp4quant(x, r, w, block_size=32)
    assert sf.shape == (m, 2) and np.all(sf == 125) and np.all(q == 0x66)
    # Without a residual, on a negative input: -1.0 -> sign bit set, 0xF nibbles.
    q, sf = fp4norm.rmsnorm_fp4quant(-np.ones((m, h), dt), w)
    assert np.all(sf == 0x23) and np.all(q == 0xFF)


def test_sum_of_squares_order_case():
    """SPEC.md §1.2: the f64 sum of squares is the exact sum rounded once, whatever the
    order a backend adds in (crates/fp4norm/src/sumsq.rs). On this row (scripts/order-case.py) the
    element-order f64 sum gives one f32 ulp more rstd than the exact sum; worked out with
    Python's math.fsum: exact rstd 3.725231456641609e-09, y_0 = RN32(2^34 rstd) =
    63.99898910522461, RN32(gs y_0) = 6.375, s = RN32(6.375 / 6) = 1.0625: the E4M3 tie
    between 1.0 (0x38) and 1.125 (0x39), to even: 0x38 (the element order gives 0x39)."""
    import math

    if ml_dtypes is None:
        pytest.skip("ml_dtypes (bfloat16) not installed")
    bf = ml_dtypes.bfloat16
    h = 4096
    x = np.full((1, h), 181.0, dtype=bf)
    x[0, :3] = [2.0**34, 96468992.0, 468992.0]
    squares = [float(v) ** 2 for v in x[0].astype(np.float64)]
    eps = float(np.float32(1e-6))
    exact = np.float32(1.0 / math.sqrt(math.fsum(squares) / h + eps))
    # Left to right, one f64 rounding per add (not sum(): from Python 3.12 it compensates).
    element_order_sum = 0.0
    for square in squares:
        element_order_sum += square
    element_order = np.float32(1.0 / math.sqrt(element_order_sum / h + eps))
    assert exact != element_order  # the row still separates the two readings
    gs = np.array([0x3DCC00D3], np.uint32).view(np.float32)
    q, sf = fp4norm.add_rmsnorm_fp4quant(x, np.zeros((1, h), bf), np.ones(h, bf), global_scale=gs)
    assert sf[0, 0] == 0x38
    q_ref, sf_ref = reference.add_rmsnorm_fp4quant(x, np.zeros((1, h), bf), np.ones(h, bf), global_scale=gs)
    assert same_bytes(q, q_ref) and same_bytes(sf, sf_ref)


def test_hand_values_dequantize():
    # One NVFP4 block: codes 0x2 (1.0) and 0xF (-6.0), scale 2.0 (E4M3 0x40).
    q = np.full((1, 8), 0xF2, np.uint8)
    sf = np.array([[0x40]], np.uint8)
    out = fp4norm.dequantize(q, sf)
    assert out.dtype == np.float32 and out.shape == (1, 16)
    assert list(out[0, :4]) == [2.0, -12.0, 2.0, -12.0]
    out = fp4norm.dequantize(q, sf, global_scale=4.0)
    assert list(out[0, :2]) == [0.5, -3.0]
    # UE8M0 code 128 = 2.0, block 32, flat buffers with m and h.
    q = np.full(16, 0x31, np.uint8)  # 0.5 and 1.5
    out = fp4norm.dequantize(q, np.array([128], np.uint8), block_size=32, m=1, h=32)
    assert out.shape == (1, 32) and list(out[0, :2]) == [1.0, 3.0]


# ---------------------------------------------------------------------------------------
# Against the Rust reference and SPEC.md in NumPy
# ---------------------------------------------------------------------------------------

CASES = list(
    itertools.product(
        DTYPES,
        FORMATS,
        ["row", "swizzled", "both"],
        [True, False],  # residual
    )
)


@pytest.mark.parametrize("code,fmt,layout,with_residual", CASES)
def test_matches_reference(code, fmt, layout, with_residual):
    block, sfmt = fmt
    rng = np.random.default_rng(zlib.crc32(repr((code, fmt, layout, with_residual)).encode()))
    m, h = 130, 256  # more than one 128-row tile: swizzle padding rows
    x, r, w = make(rng, m, h, code)
    gs = rng.uniform(0.5, 4, m).astype(np.float32) if sfmt == "e4m3" else None
    kw = dict(
        global_scale=gs,
        eps=1e-5,
        block_size=block,
        scale_format=sfmt,
        is_sf_swizzled_layout=layout == "swizzled",
        output_both_sf_layouts=layout == "both",
    )
    r_fast, r_ref = r.copy(), r.copy()
    y_fast, y_ref = np.empty_like(x), np.empty_like(x)
    if with_residual:
        out = fp4norm.add_rmsnorm_fp4quant(x, r_fast, w, y_out=y_fast, **kw)
        ref = reference.add_rmsnorm_fp4quant(x, r_ref, w, y_out=y_ref, **kw)
        h_vals = spec_residual(x, r)
        assert same_bytes(r_fast, h_vals) and same_bytes(r_ref, h_vals)
    else:
        out = fp4norm.rmsnorm_fp4quant(x, w, y_out=y_fast, **kw)
        ref = reference.rmsnorm_fp4quant(x, w, y_out=y_ref, **kw)
        h_vals = x
        assert same_bytes(r_fast, r)
    assert len(out) == (3 if layout == "both" else 2)
    for a, b in zip(out, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert same_bytes(a, b)
    # y_out is SPEC.md steps 2-4 rounded to the dtype.
    assert same_bytes(y_fast, spec_y(h_vals, w, 1e-5).astype(x.dtype))
    assert same_bytes(y_fast, y_ref)
    nb = h // block
    if layout == "both":
        check_swizzled_matches(out[2], out[1], m, nb)
        row_major = out[2]
    elif layout == "row":
        assert out[1].shape == (m, nb)
        row_major = out[1]
    else:
        assert out[1].shape == (swizzled_len(m, nb),)
        row_major = None
    if row_major is not None:
        deq = fp4norm.dequantize(out[0], row_major, gs, block, sfmt)
        g = 1.0 if gs is None else gs
        assert same_bytes(deq, spec_dequant(out[0], row_major, m, h, block, sfmt, g))
    else:
        # Swizzled dequantisation equals the row-major one of the same call.
        row_kw = {**kw, "is_sf_swizzled_layout": False}
        if with_residual:
            _, rm = fp4norm.add_rmsnorm_fp4quant(x, r.copy(), w, **row_kw)
        else:
            _, rm = fp4norm.rmsnorm_fp4quant(x, w, **row_kw)
        check_swizzled_matches(rm, out[1], m, nb)
        a = fp4norm.dequantize(out[0], out[1], gs, block, sfmt, is_sf_swizzled_layout=True)
        b = fp4norm.dequantize(out[0], rm, gs, block, sfmt)
        assert same_bytes(a, b)


@pytest.mark.parametrize("m", [0, 1, 3, 128, 129])
def test_row_counts(m):
    rng = np.random.default_rng(m)
    x, r, w = make(rng, m, 64, "f16")
    r0 = r.copy()
    q, sw, rm = fp4norm.add_rmsnorm_fp4quant(x, r, w, output_both_sf_layouts=True)
    r_ref = r0.copy()
    q2, sw2, rm2 = reference.add_rmsnorm_fp4quant(x, r_ref, w, output_both_sf_layouts=True)
    assert q.shape == (m, 32) and rm.shape == (m, 4) and sw.shape == (swizzled_len(m, 4),)
    assert same_bytes(q, q2) and same_bytes(sw, sw2) and same_bytes(rm, rm2)
    assert same_bytes(r, r_ref)


def test_large_hidden_and_eps():
    rng = np.random.default_rng(7)
    x, r, w = make(rng, 9, 7168, "bf16")
    for eps in (0.0, 1e-6, 0.5):
        r1, r2 = r.copy(), r.copy()
        a = fp4norm.add_rmsnorm_fp4quant(x, r1, w, eps=eps, is_sf_swizzled_layout=True)
        b = reference.add_rmsnorm_fp4quant(x, r2, w, eps=eps, is_sf_swizzled_layout=True)
        assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1]) and same_bytes(r1, r2)


# ---------------------------------------------------------------------------------------
# Shapes, strides, outputs
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", DTYPES)
def test_3d_equals_2d(code):
    rng = np.random.default_rng(3)
    b, s, h = 3, 5, 128
    x, r, w = make(rng, b * s, h, code)
    r3 = r.reshape(b, s, h).copy()
    q3, sf3 = fp4norm.add_rmsnorm_fp4quant(x.reshape(b, s, h), r3, w)
    q2, sf2 = fp4norm.add_rmsnorm_fp4quant(x, r, w)
    assert q3.shape == (b, s, h // 2) and sf3.shape == (b, s, h // 16)
    assert same_bytes(q3, q2) and same_bytes(sf3, sf2) and same_bytes(r3, r)
    # swizzled scales of a 3-D input are flat; both layouts keep the row-major one 3-D.
    r3 = r.reshape(b, s, h).copy()
    q, sw, rm = fp4norm.rmsnorm_fp4quant(x.reshape(b, s, h), w, output_both_sf_layouts=True)
    assert sw.shape == (swizzled_len(b * s, h // 16),) and rm.shape == (b, s, h // 16)
    # 3-D with strided rows: a view into a wider buffer.
    big = np.zeros((b, s, h + 32), dtype=x.dtype)
    big[..., :h] = x.reshape(b, s, h)
    q4, sf4 = fp4norm.rmsnorm_fp4quant(big[..., :h], w)
    q5, sf5 = fp4norm.rmsnorm_fp4quant(x, w)
    assert same_bytes(q4, q5) and same_bytes(sf4, sf5)


@pytest.mark.parametrize("pad", [8, 3])
def test_strided_rows_in_place(pad):
    rng = np.random.default_rng(11)
    m, h = 6, 64
    x, r, w = make(rng, m, h, "bf16")
    xb = np.zeros((m, h + pad), x.dtype)
    rb = np.full((m, h + pad), 7.0, r.dtype)
    xb[:, :h] = x
    rb[:, :h] = r
    yb = np.full((m, h + pad), 9.0, x.dtype)
    r_ref = r.copy()
    y_ref = np.empty_like(x)
    a = fp4norm.add_rmsnorm_fp4quant(xb[:, :h], rb[:, :h], w, y_out=yb[:, :h])
    b = reference.add_rmsnorm_fp4quant(x, r_ref, w, y_out=y_ref)
    assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1])
    assert same_bytes(rb[:, :h], r_ref) and same_bytes(yb[:, :h], y_ref)
    # The gaps between rows are untouched.
    assert np.all(rb[:, h:].astype(np.float32) == 7.0)
    assert np.all(yb[:, h:].astype(np.float32) == 9.0)


def test_preallocated_outputs_written_in_place():
    rng = np.random.default_rng(5)
    m, h = 130, 128
    x, r, w = make(rng, m, h, "f16")
    r1, r2 = r.copy(), r.copy()
    auto = fp4norm.add_rmsnorm_fp4quant(x, r1, w, output_both_sf_layouts=True)
    q = np.full((m, h // 2), 0xAB, np.uint8)
    sw = np.full(swizzled_len(m, h // 16), 0xAB, np.uint8)  # padding must become zero
    rm = np.full((m, h // 16), 0xAB, np.uint8)
    out = fp4norm.add_rmsnorm_fp4quant(
        x, r2, w, q, sw, output_both_sf_layouts=True, block_scale_unswizzled=rm
    )
    assert out[0] is q and out[1] is sw and out[2] is rm
    for a, b in zip(auto, out):
        assert same_bytes(a, b)
    assert same_bytes(r1, r2)
    # Flat preallocated buffers of the right byte count work too; typed E4M3 scales too.
    if ml_dtypes is not None:
        sf = np.zeros(m * h // 16, ml_dtypes.float8_e4m3fn)
        q = np.zeros(m * h // 2, np.uint8)
        fp4norm.rmsnorm_fp4quant(x, w, q, sf)
        a = fp4norm.rmsnorm_fp4quant(x, w)
        assert same_bytes(q, a[0]) and same_bytes(sf, a[1])


def test_global_scale_forms():
    rng = np.random.default_rng(9)
    x, r, w = make(rng, 4, 64, "bf16")
    base = fp4norm.rmsnorm_fp4quant(x, w, global_scale=np.array([3.0], np.float32))
    numbers = (3.0, 3, np.float32(3.0), np.float64(3.0))
    for gs in numbers + (np.array(3.0, np.float32), np.full(4, 3.0, np.float32)):
        out = fp4norm.rmsnorm_fp4quant(x, w, global_scale=gs)
        assert same_bytes(out[0], base[0]) and same_bytes(out[1], base[1])
    # UE8M0 ignores the global scale.
    a = fp4norm.rmsnorm_fp4quant(x, w, global_scale=5.0, block_size=32)
    b = fp4norm.rmsnorm_fp4quant(x, w, block_size=32)
    assert same_bytes(a[1], b[1]) and same_bytes(a[0], b[0])


def test_misc_api():
    assert isinstance(fp4norm.__version__, str)
    assert fp4norm.scale_sizes(130, 256) == (130 * 128, 130 * 16, 256 * 4 * 4)
    assert fp4norm.scale_sizes(1, 64, 32) == (32, 2, 512)
    assert fp4norm.cuda_device_count() >= 0


# ---------------------------------------------------------------------------------------
# Bad arguments: the right exception, naming the argument, nothing written
# ---------------------------------------------------------------------------------------


class Guard:
    """A call's arrays, filled so that any write shows."""

    def __init__(self, m=4, h=64, code="bf16"):
        rng = np.random.default_rng(1)
        self.x, self.r, self.w = make(rng, m, h, code)
        self.r0 = self.r.copy()
        self.q = np.full((m, h // 2), 0xAB, np.uint8)
        self.sf = np.full((m, h // 16), 0xAB, np.uint8)

    def untouched(self):
        return same_bytes(self.r, self.r0) and np.all(self.q == 0xAB) and np.all(self.sf == 0xAB)


def raises(exc, *words):
    class Ctx:
        def __enter__(self):
            self.cm = pytest.raises(exc)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *a):
            ok = self.cm.__exit__(*a)
            msg = str(self.info.value)
            for wd in words:
                assert wd in msg, f"{wd!r} not in {msg!r}"
            return ok

    return Ctx()


BAD_CALLS = [
    # (description, exception, words in the message, kwargs transformer)
    ("input not an array", TypeError, ["input"], lambda g: dict(input=[[1.0]])),
    ("input float32", TypeError, ["input", "float32"], lambda g: dict(input=g.x.astype(np.float32))),
    ("input 1-D", ValueError, ["input"], lambda g: dict(input=g.x[0])),
    ("residual dtype", TypeError, ["residual"], lambda g: dict(residual=g.r.astype(np.float16))),
    ("weight dtype", TypeError, ["weight"], lambda g: dict(weight=g.w.astype(np.float16))),
    ("residual shape", ValueError, ["residual", "shape"], lambda g: dict(residual=np.zeros((5, 64), g.r.dtype))),
    ("weight shape", ValueError, ["weight"], lambda g: dict(weight=g.w[:32])),
    ("weight strided", ValueError, ["weight"], lambda g: dict(weight=np.repeat(g.w, 2)[::2])),
    ("input inner stride", ValueError, ["input", "contiguous"], lambda g: dict(input=np.repeat(g.x, 2, axis=1)[:, ::2])),
    ("residual inner stride", ValueError, ["residual", "contiguous"], lambda g: dict(residual=np.repeat(g.r, 2, axis=1)[:, ::2])),
    ("residual negative stride", ValueError, ["residual", "negative"], lambda g: dict(residual=g.r[::-1])),
    ("3-D not flattenable", ValueError, ["input", "flattened"], lambda g: dict(input=np.zeros((2, 3, 64), g.x.dtype).transpose(1, 0, 2), residual=np.zeros((3, 2, 64), g.x.dtype))),
    ("block size 8", ValueError, ["block_size"], lambda g: dict(block_size=8)),
    ("block size str", TypeError, ["block_size"], lambda g: dict(block_size="16")),
    ("H not multiple of block", ValueError, ["H = 48", "32"], lambda g: dict(block_size=32, input=g.x[:, :48].copy(), residual=g.r[:, :48].copy(), weight=g.w[:48].copy(), y_fp4=None, block_scale=None)),
    ("scale format", ValueError, ["scale_format"], lambda g: dict(scale_format="e5m2")),
    ("scale format type", TypeError, ["scale_format"], lambda g: dict(scale_format=4)),
    ("eps negative", ValueError, ["eps"], lambda g: dict(eps=-1e-6)),
    ("eps nan", ValueError, ["eps"], lambda g: dict(eps=float("nan"))),
    ("eps overflow", ValueError, ["eps"], lambda g: dict(eps=1e300)),
    ("eps type", TypeError, ["eps"], lambda g: dict(eps="1e-6")),
    ("global scale dtype", TypeError, ["global_scale"], lambda g: dict(global_scale=np.ones(1, np.float64))),
    ("global scale shape", ValueError, ["global_scale"], lambda g: dict(global_scale=np.ones(3, np.float32))),
    ("global scale 2-D", ValueError, ["global_scale"], lambda g: dict(global_scale=np.ones((4, 1), np.float32))),
    ("global scale strided", ValueError, ["global_scale"], lambda g: dict(global_scale=np.ones(8, np.float32)[::2])),
    ("y_fp4 size", ValueError, ["y_fp4"], lambda g: dict(y_fp4=np.zeros((4, 31), np.uint8))),
    ("y_fp4 dtype", TypeError, ["y_fp4"], lambda g: dict(y_fp4=np.zeros((4, 16), np.float16))),
    ("y_fp4 non-contiguous", ValueError, ["y_fp4", "contiguous"], lambda g: dict(y_fp4=np.zeros((4, 64), np.uint8)[:, ::2])),
    ("y_fp4 read-only", ValueError, ["y_fp4", "read-only"], lambda g: dict(y_fp4=np.broadcast_to(np.zeros(32, np.uint8), (4, 32)))),
    ("block_scale size", ValueError, ["block_scale"], lambda g: dict(block_scale=np.zeros((4, 3), np.uint8))),
    ("swizzled block_scale size", ValueError, ["block_scale", "swizzled"], lambda g: dict(block_scale=np.zeros(16, np.uint8), is_sf_swizzled_layout=True)),
    ("unswizzled size", ValueError, ["block_scale_unswizzled"], lambda g: dict(block_scale=None, output_both_sf_layouts=True, block_scale_unswizzled=np.zeros((4, 3), np.uint8))),
    ("block_scale dtype", TypeError, ["block_scale"], lambda g: dict(block_scale=np.zeros((4, 4), np.float32))),
    ("alias input residual", ValueError, ["input", "residual", "overlap"], lambda g: dict(input=g.r)),
    ("alias y_out residual", ValueError, ["residual", "y_out", "overlap"], lambda g: dict(y_out=g.r)),
    ("alias y_out input", ValueError, ["y_out", "overlap"], lambda g: dict(y_out=g.x)),
    ("alias scales y_fp4", ValueError, ["y_fp4", "block_scale", "overlap"], lambda g: dict(block_scale=g.q.reshape(-1)[:16].reshape(4, 4))),
    ("alias y_fp4 residual", ValueError, ["residual", "y_fp4", "overlap"], lambda g: dict(y_fp4=g.r.view(np.uint8).reshape(-1)[:128].reshape(4, 32))),
    ("residual read-only", ValueError, ["residual", "read-only"], lambda g: dict(residual=_readonly(g.r))),
    ("y_out dtype", TypeError, ["y_out"], lambda g: dict(y_out=np.zeros((4, 64), np.float32))),
    ("y_out shape", ValueError, ["y_out"], lambda g: dict(y_out=np.zeros((4, 128), g.x.dtype))),
    ("layout flag type", TypeError, ["is_sf_swizzled_layout"], lambda g: dict(is_sf_swizzled_layout="yes")),
]


def _readonly(a):
    v = a.view()
    v.flags.writeable = False
    return v


@pytest.mark.parametrize("desc,exc,words,change", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments(desc, exc, words, change):
    g = Guard()
    kw = dict(input=g.x, residual=g.r, weight=g.w, y_fp4=g.q, block_scale=g.sf)
    kw.update(change(g))
    with raises(exc, *words):
        fp4norm.add_rmsnorm_fp4quant(**kw)
    assert g.untouched(), "nothing may be written on error"


def test_misaligned_input():
    buf = np.zeros(4 * 64 * 2 + 1, np.uint8)
    x = np.frombuffer(buf.data, np.float16, 4 * 64, offset=1).reshape(4, 64)
    w = np.ones(64, np.float16)
    with raises(ValueError, "input", "aligned"):
        fp4norm.rmsnorm_fp4quant(x, w)


def test_bad_dequantize_arguments():
    q = np.zeros((4, 32), np.uint8)
    sf = np.zeros((4, 4), np.uint8)
    with raises(ValueError, "m and h"):
        fp4norm.dequantize(q, sf, m=4)
    with raises(ValueError, "block_scale"):
        fp4norm.dequantize(q, sf[:3])
    with raises(ValueError, "y_fp4"):
        fp4norm.dequantize(q.reshape(-1), sf)
    with raises(TypeError, "block_scale"):
        fp4norm.dequantize(q, sf.astype(np.float32))
    with raises(ValueError, "global_scale"):
        fp4norm.dequantize(q, sf, global_scale=np.ones(3, np.float32))
    with raises(ValueError, "block_size"):
        fp4norm.dequantize(q, sf, block_size=64)


def test_reference_refuses_nothing_else():
    g = Guard()
    with raises(ValueError, "weight"):
        reference.add_rmsnorm_fp4quant(g.x, g.r, g.w[:16])
    assert g.untouched()


# ---------------------------------------------------------------------------------------
# torch CPU tensors (skipped when torch is missing)
# ---------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed: torch CPU tests skipped")


def to_torch(torch, a):
    if a.dtype in (np.float16, np.uint8):
        return torch.from_numpy(a.copy())
    return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)


def to_numpy(t):
    """The bytes of a torch tensor as a NumPy uint8 array."""
    import torch

    return t.contiguous().view(torch.uint8).numpy()


def test_torch_global_scale_numbers():
    """On torch tensors a global scale given as a number, Python's or NumPy's, writes what
    the same value as a float32 tensor writes."""
    torch = _torch()
    rng = np.random.default_rng(9)
    x, r, w = make(rng, 4, 64, "bf16")
    xt, wt = to_torch(torch, x), to_torch(torch, w)
    base = fp4norm.rmsnorm_fp4quant(xt, wt, global_scale=torch.tensor([3.0]))
    for gs in (3.0, 3, np.float32(3.0), np.float64(3.0)):
        out = fp4norm.rmsnorm_fp4quant(xt, wt, global_scale=gs)
        for got, want in zip(out, base):
            assert same_bytes(to_numpy(got), to_numpy(want)), f"global_scale {gs!r} ({type(gs).__name__})"


@pytest.mark.parametrize("code", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_cpu_matches_numpy(code, fmt):
    torch = _torch()
    block, sfmt = fmt
    rng = np.random.default_rng(21)
    x, r, w = make(rng, 130, 128, code)
    r_np = r.copy()
    gs = np.array([1.5], np.float32)
    a = fp4norm.add_rmsnorm_fp4quant(
        x, r_np, w, global_scale=gs, block_size=block, scale_format=sfmt, output_both_sf_layouts=True
    )
    xt, rt, wt = to_torch(torch, x), to_torch(torch, r), to_torch(torch, w)
    b = fp4norm.add_rmsnorm_fp4quant(
        xt, rt, wt, global_scale=torch.tensor([1.5]), block_size=block, scale_format=sfmt,
        output_both_sf_layouts=True,
    )
    fp4_dt = getattr(torch, "float4_e2m1fn_x2", torch.uint8)
    scale_dt = torch.float8_e4m3fn if sfmt == "e4m3" else torch.uint8
    assert b[0].dtype == fp4_dt and b[0].shape == (130, 64)
    assert b[1].dtype == scale_dt and b[2].dtype == scale_dt
    for u, v in zip(a, b):
        assert same_bytes(u, to_numpy(v))
    assert same_bytes(r_np, to_numpy(rt))


def test_torch_cpu_3d_strided_preallocated():
    torch = _torch()
    rng = np.random.default_rng(4)
    x, r, w = make(rng, 2 * 65, 64, "bf16")
    xt = to_torch(torch, x).view(2, 65, 64)
    rbig = torch.zeros(2, 65, 80, dtype=torch.bfloat16)
    rbig[..., :64] = to_torch(torch, r).view(2, 65, 64)
    rt = rbig[..., :64]
    wt = to_torch(torch, w)
    q = torch.empty(2, 65, 32, dtype=torch.uint8)
    sf = torch.empty(2, 65, 4, dtype=torch.float8_e4m3fn)
    y = torch.empty(2, 65, 64, dtype=torch.bfloat16)
    out = fp4norm.add_rmsnorm_fp4quant(xt, rt, wt, q, sf, y_out=y)
    assert out[0] is q and out[1] is sf
    r_ref = r.copy()
    y_ref = np.empty_like(x)
    ref = reference.add_rmsnorm_fp4quant(x, r_ref, w, y_out=y_ref)
    assert same_bytes(to_numpy(q), ref[0]) and same_bytes(to_numpy(sf), ref[1])
    assert same_bytes(to_numpy(rt), r_ref) and same_bytes(to_numpy(y), y_ref)
    assert torch.all(rbig[..., 64:] == 0)
    d = fp4norm.dequantize(q, sf)
    assert d.dtype == torch.float32 and d.shape == (2, 65, 64)
    assert same_bytes(d.numpy(), fp4norm.dequantize(ref[0], ref[1]))


def test_torch_cpu_errors():
    torch = _torch()
    g = Guard()
    xt = to_torch(torch, g.x)
    rt = to_torch(torch, g.r)
    wt = to_torch(torch, g.w)
    r0 = rt.clone()
    with raises(TypeError, "residual", "NumPy"):
        fp4norm.add_rmsnorm_fp4quant(xt, g.r, wt)
    with raises(ValueError, "residual", "contiguous"):
        fp4norm.add_rmsnorm_fp4quant(xt, torch.cat([rt, rt], 1)[:, ::2], wt)
    with raises(TypeError, "y_fp4"):
        fp4norm.add_rmsnorm_fp4quant(xt, rt, wt, y_fp4=torch.empty(4, 32, dtype=torch.int16))
    with raises(TypeError, "block_scale"):
        fp4norm.add_rmsnorm_fp4quant(
            xt, rt, wt, block_scale=torch.empty(4, 4, dtype=torch.float8_e4m3fn), scale_format="ue8m0"
        )
    with raises(TypeError, "global_scale"):
        fp4norm.add_rmsnorm_fp4quant(xt, rt, wt, global_scale=torch.ones(1, dtype=torch.float64))
    with raises(ValueError, "input", "residual", "overlap"):
        fp4norm.add_rmsnorm_fp4quant(rt, rt, wt)
    assert torch.equal(rt.view(torch.int16), r0.view(torch.int16))


# ---------------------------------------------------------------------------------------
# Weight bias (SPEC.md §8: w' = RN32(w + bias); Gemma's (1 + w) is bias 1)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", DTYPES)
def test_weight_bias_one_on_zero_weights_is_unit_weights(code):
    """Zero weights with bias 1 are exactly unit weights (RN32(0 + 1) = 1): the same bytes
    as the plain op with weights of one, through the fast path and the reference."""
    rng = np.random.default_rng(11)
    x, r, _ = make(rng, 33, 256, code)
    dt = np_dtype(code)
    for fn in (fp4norm.add_rmsnorm_fp4quant, reference.add_rmsnorm_fp4quant):
        r1, r2 = r.copy(), r.copy()
        a = fn(x, r1, np.zeros(256, dt), is_sf_swizzled_layout=True, weight_bias=1.0)
        b = fn(x, r2, np.ones(256, dt), is_sf_swizzled_layout=True)
        assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1]) and same_bytes(r1, r2)


@pytest.mark.parametrize("code,fmt", list(itertools.product(DTYPES, FORMATS)))
@pytest.mark.parametrize("bias", [1.0, -0.5, 0.0, -0.0, 3e-3])
def test_weight_bias_matches_reference(code, fmt, bias):
    block, sfmt = fmt
    rng = np.random.default_rng(zlib.crc32(f"{code}{fmt}{bias}".encode()))
    x, r, w = make(rng, 19, 512, code)
    yo1, yo2 = np.empty_like(x), np.empty_like(x)
    r1, r2 = r.copy(), r.copy()
    kw = dict(block_size=block, scale_format=sfmt, output_both_sf_layouts=True, weight_bias=bias)
    a = fp4norm.add_rmsnorm_fp4quant(x, r1, w, y_out=yo1, **kw)
    b = reference.add_rmsnorm_fp4quant(x, r2, w, y_out=yo2, **kw)
    for u, v in zip(a, b):
        assert same_bytes(u, v)
    assert same_bytes(yo1, yo2) and same_bytes(r1, r2)
    # A nonzero bias changes the result (the weights are around 1, far from -bias).
    if bias != 0.0:
        plain = reference.add_rmsnorm_fp4quant(x, r.copy(), w, y_out=np.empty_like(x),
                                               block_size=block, scale_format=sfmt)
        assert not same_bytes(plain[0], a[0])
    q1 = fp4norm.rmsnorm_fp4quant(x, w, block_size=block, scale_format=sfmt, weight_bias=bias)
    q2 = reference.rmsnorm_fp4quant(x, w, block_size=block, scale_format=sfmt, weight_bias=bias)
    assert same_bytes(q1[0], q2[0]) and same_bytes(q1[1], q2[1])


@pytest.mark.parametrize(
    "bias,exc",
    [
        (float("nan"), fp4norm.ArgumentError),
        (float("inf"), fp4norm.ArgumentError),
        (-float("inf"), fp4norm.ArgumentError),
        (1e39, fp4norm.ArgumentError),  # finite in float64, infinite in float32
        ("1", fp4norm.ArgumentTypeError),
        (True, fp4norm.ArgumentTypeError),
    ],
)
def test_bad_weight_bias_writes_nothing(bias, exc):
    rng = np.random.default_rng(3)
    x, r, w = make(rng, 4, 64, "bf16")
    r0 = r.copy()
    q = np.full((4, 32), 0xAB, np.uint8)
    s = np.full((4, 4), 0xAB, np.uint8)
    with pytest.raises(exc, match="weight_bias"):
        fp4norm.add_rmsnorm_fp4quant(x, r, w, q, s, weight_bias=bias)
    assert same_bytes(r, r0) and np.all(q == 0xAB) and np.all(s == 0xAB)


REFERENCE_TWINS = [
    "add_rmsnorm_fp4quant", "rmsnorm_fp4quant", "allreduce_add_rmsnorm_fp4quant",
    "rmsnorm_quant", "fused_add_rmsnorm_quant", "fused_add_rmsnorm_fp8_block_quant",
    "add_rmsnorm_fp8quant", "rmsnorm_fp8quant", "allreduce_add_rmsnorm_fp8quant",
    "allreduce_fused_add_rmsnorm_quant",
]


@pytest.mark.parametrize("name", REFERENCE_TWINS)
def test_reference_functions_have_the_public_signatures(name):
    """fp4norm.reference.X takes X's arguments: the same names, order, kinds and defaults
    (``enable_pdl`` accepted and ignored), so that a call written for one runs on the other
    (README: "the same signatures")."""
    import inspect

    pub = inspect.signature(getattr(fp4norm, name))
    ref = inspect.signature(getattr(reference, name))
    assert [(p.name, p.kind, p.default) for p in ref.parameters.values()] == [
        (p.name, p.kind, p.default) for p in pub.parameters.values()
    ]


def test_reference_takes_positional_calls_written_for_the_functions():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 64)).astype(np.float16)
    r = rng.standard_normal((3, 64)).astype(np.float16)
    w = np.ones(64, np.float16)
    e4m3 = ml_dtypes.float8_e4m3fn
    outs = []
    for mod in (fp4norm, reference):
        rr, out, y = r.copy(), np.zeros((3, 64), e4m3), np.zeros((3, 64), np.float16)
        mod.fused_add_rmsnorm_quant(out, x, rr, w, 1.0, 1e-6, None)
        q, s = mod.add_rmsnorm_fp4quant(x, rr, w, None, None, None, 1e-6, 16, None, False, False, None, None, y)
        outs.append((rr, out, y, q, s))
    for a, b in zip(*outs):
        assert same_bytes(a, b)
