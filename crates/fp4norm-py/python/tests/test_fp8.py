"""The FP8 family of SPEC.md §8 in the Python module: FlashInfer's ``rmsnorm_quant`` /
``fused_add_rmsnorm_quant`` (a per-tensor static scale), its
``fused_add_rmsnorm_fp8_block_quant`` (1 x 128 blocks, checked against FlashInfer's own
scale formula too) and the dynamic-scale
``add_rmsnorm_fp8quant`` / ``rmsnorm_fp8quant`` (per token or per group of 32, 64, 128;
f32 or UE8M0 scales; row-major, column-major, swizzled or packed column-major), on NumPy
arrays and torch
tensors, through the ``torch.ops.fp4norm`` operators.

Every result is compared byte for byte with the Rust scalar reference
(``fp4norm.reference``, ``HostEngine::Reference``) and, on the CPU, with SPEC.md §8
restated in NumPy below (an independent model: ml_dtypes' float8 conversions behind a
saturating clip). Bad arguments raise before anything is written. The operators pass
``torch.library.opcheck`` and compile under ``torch.compile(fullgraph=True,
dynamic=True)`` without recompiling across M. A FlashInfer-shaped test repeats the
parametrisation of FlashInfer's own ``test_norm_quant`` / ``test_fused_add_rmsnorm_quant``
(tests/utils/test_norm.py), comparing bytes with the reference instead of values with a
tolerance. CUDA cases run where a GPU is present and are skipped, visibly, elsewhere;
torch cases are skipped, visibly, without torch.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

import fp4norm
from fp4norm import reference
from fp4_helpers import (
    bits,
    cuda_or_skip,
    devices_under_test,
    same_bytes,
    spec_residual,
    spec_y,
    swizzled_len,
    swizzled_offsets,
)

ml_dtypes = pytest.importorskip(
    "ml_dtypes", reason="ml_dtypes is not installed: FP8 tests (float8 and bfloat16 NumPy dtypes) skipped"
)

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    from torch_helpers import CompiledOnce, raw, same, torch_data as tdata

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed: torch FP8 cases skipped")

DEVICES = devices_under_test()
DTYPES = ["bf16", "f16"]
ELEMENTS = ["e4m3", "e5m2"]
NP_DTYPE = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}
NP_FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FMAX = {"e4m3": np.float32(448.0), "e5m2": np.float32(57344.0)}

# Every dynamic configuration (group, scale format, layout): the four groups with both
# formats in the row-major and column-major layouts, MXFP8's swizzled layout (UE8M0 in
# groups of 32, the only one it takes), and UE8M0 groups packed column-major (DeepGEMM's).
CONFIGS = [
    (g, f, lay)
    for g in ("token", 32, 64, 128)
    for f in ("f32", "ue8m0")
    for lay in ("row-major", "column-major")
] + [(32, "ue8m0", "swizzled")] + [(g, "ue8m0", "column-major-packed") for g in (32, 64, 128)]
CONFIG_IDS = [f"{g}-{f}-{lay}" for g, f, lay in CONFIGS]


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


# ---------------------------------------------------------------------------------------
# SPEC.md §8 in NumPy
# ---------------------------------------------------------------------------------------


def fp8_encode(v: np.ndarray, elem: str) -> np.ndarray:
    """The saturating FP8 encoder: round to nearest even over the finite values, beyond the
    maximum (and ±Inf) the maximum with the value's sign, NaN 0x7F."""
    v = np.asarray(v, np.float32)
    c = np.clip(v, -FMAX[elem], FMAX[elem])  # NaN stays NaN
    codes = c.astype(NP_FP8[elem]).view(np.uint8).copy()
    codes[np.isnan(v)] = 0x7F
    return codes


def fp8_value(codes: np.ndarray, elem: str) -> np.ndarray:
    return np.asarray(codes, np.uint8).view(NP_FP8[elem]).astype(np.float32)


def ue8m0_code(v: np.ndarray) -> np.ndarray:
    """SPEC.md §1.6's UE8M0 rule: 255 for NaN, 0 for 0, else clamp(e + 127, 0, 254) with
    e the smallest integer with 2^e >= v (+Inf: 254)."""
    v = np.asarray(v, np.float32)
    code = np.zeros(v.shape, np.uint8)
    finite = np.isfinite(v) & (v > 0)
    mant, exp = np.frexp(v[finite])  # v = mant * 2^exp, mant in [0.5, 1)
    e = np.where(mant == 0.5, exp - 1, exp)
    code[finite] = np.clip(e + 127, 0, 254)
    code[np.isinf(v)] = 254
    code[np.isnan(v)] = 255
    return code


def ue8m0_value(code: np.ndarray) -> np.ndarray:
    code = np.asarray(code, np.uint8)
    v = np.ldexp(np.float32(1), code.astype(np.int32) - 127).astype(np.float32)
    v[code == 255] = np.nan
    return v


def biased_weight(w: np.ndarray, bias: float) -> np.ndarray:
    """SPEC.md §8: w' = RN32(w + bias), a zero bias (either sign) leaving w as it is."""
    wf = w.astype(np.float32)
    return wf if bias == 0 else (wf + np.float32(bias)).astype(np.float32)


def canonical_nan(a: np.ndarray) -> np.ndarray:
    """float32 with every NaN as 0x7FFFFFFF (how fp4norm writes a NaN scale or value)."""
    a = np.array(a, np.float32)
    a.view(np.uint32)[np.isnan(a)] = 0x7FFFFFFF
    return a


def to_dtype(v: np.ndarray, dtype) -> np.ndarray:
    """RNdt: values rounded to the input dtype, every NaN as the canonical 0x7FFF."""
    with np.errstate(all="ignore"):
        out = np.asarray(v).astype(np.float32).astype(dtype)
    out.view(np.uint16)[np.isnan(out.astype(np.float32))] = 0x7FFF
    return out


def scale_buffer(vals: np.ndarray, m: int, n: int, layout: str) -> np.ndarray:
    """Scales `[m, n]` in a layout, padding zero (SPEC.md §3, §8)."""
    if layout == "row-major":
        return vals.reshape(m * n)
    if layout == "column-major":
        mp4 = 4 * ((m + 3) // 4)
        buf = np.zeros((n, mp4), vals.dtype)
        buf[:, :m] = vals.T
        return buf.reshape(-1)
    if layout == "column-major-packed":
        # DeepGEMM's packing: codes [Mp4, 4*ceil(n/4)] zero-padded, read as little-endian
        # 32-bit words [Mp4, ceil(n/4)], stored transposed (MN-major).
        mp4, n4 = 4 * ((m + 3) // 4), (n + 3) // 4
        padded = np.zeros((mp4, 4 * n4), np.uint8)
        padded[:m, :n] = vals.view(np.uint8)
        words = padded.view("<u4")
        return np.ascontiguousarray(words.T).view(np.uint8).reshape(-1).view(vals.dtype)
    buf = np.zeros(swizzled_len(m, n), vals.dtype)
    buf[swizzled_offsets(m, n).reshape(-1)] = vals.reshape(-1)
    return buf


def model(x, r, w, elem, group="token", fmt="f32", layout="row-major", s_min=0.0, eps=1e-6, bias=0.0, scale=None):
    """SPEC.md §8 for 2-D host arrays: ``(h, codes [M, H] uint8, scale buffer or None, y)``
    where ``h`` is the new residual (or ``x``) and ``y`` the f32 normalised values."""
    m, h = x.shape
    hv = to_dtype(spec_residual(x, r), x.dtype) if r is not None else x
    with np.errstate(all="ignore"):
        y = spec_y(hv, biased_weight(w, bias), eps).reshape(m, h)
        if scale is not None:
            inv = np.float32(1) / np.float32(scale)
            return hv, fp8_encode((y * inv).astype(np.float32), elem), None, y
        g = h if group == "token" else group
        n = h // g
        yg = y.reshape(m, n, g)
        amax = np.max(np.abs(yg), axis=2)  # a NaN anywhere makes it NaN
        v = (amax / FMAX[elem]).astype(np.float32)
        if fmt == "f32":
            s = np.where(v < np.float32(s_min), np.float32(s_min), v).astype(np.float32)
            inv = np.where(s == 0, np.float32(0), np.float32(1) / s).astype(np.float32)
            vals = canonical_nan(s)
        else:
            vals = ue8m0_code(v)
            # inv = 2^(127 - code), exact in f32 (NaN for code 255).
            inv = np.ldexp(np.float32(1), 127 - vals.astype(np.int32)).astype(np.float32)
            inv[vals == 255] = np.nan
        q = fp8_encode((yg * inv[:, :, None]).astype(np.float32).reshape(m, h), elem)
    return hv, q, scale_buffer(vals, m, n, layout), y


def make(rng, m, h, code, specials=False):
    """Input, residual, weight: normal values, a zero row and a large row (saturation); with
    ``specials`` rows with NaN, +Inf, -Inf, tiny values, and negative-zero weights."""
    dt = NP_DTYPE[code]
    x = rng.standard_normal((m, h)).astype(np.float32)
    r = (2 * rng.standard_normal((m, h))).astype(np.float32)
    w = (1 + 0.25 * rng.standard_normal(h)).astype(np.float32)
    if m > 2:
        x[1] = 0
        r[1] = 0
        x[2] *= 1000
    if specials and m > 7:
        x[3, 5] = np.nan
        x[4, h // 2] = np.inf
        x[5, 0] = -np.inf
        x[6] *= 1e-30
        r[6] = 0
        x[7, :] = -0.0
        r[7, :] = -0.0
        w[::7] = -0.0
    return x.astype(dt), r.astype(dt), w.astype(dt)


def scale_dtype(fmt):
    return np.float32 if fmt == "f32" else np.uint8


def poisoned_scales(m, h, group, fmt, layout):
    """A preallocated scale buffer of the right length, every byte 0xAB: padding left
    unwritten would show."""
    _, n = fp4norm.fp8_scale_sizes(m, h, group, fmt, layout)
    return np.full(n * np.dtype(scale_dtype(fmt)).itemsize, 0xAB, np.uint8).view(scale_dtype(fmt))


# ---------------------------------------------------------------------------------------
# NumPy: the CPU backend against the reference and the model
# ---------------------------------------------------------------------------------------

DYN_CASES = list(itertools.product(DTYPES, ELEMENTS, CONFIGS, [True, False]))


@pytest.mark.parametrize(
    "code,elem,config,with_residual",
    DYN_CASES,
    ids=[f"{c}-{e}-{g}-{f}-{lay}{'' if res else '-norez'}" for c, e, (g, f, lay), res in DYN_CASES],
)
def test_dynamic_matches_reference_and_model(code, elem, config, with_residual):
    group, fmt, layout = config
    rng = np.random.default_rng(seed_of(code, elem, config, with_residual))
    m, h = 130, 256  # M not a multiple of 4 nor of 128: column-major and swizzled padding
    x, r, w = make(rng, m, h, code)
    kw = dict(element=elem, group=group, scale_format=fmt, scale_layout=layout, eps=1e-5)
    out = np.full((m, h), 0xAB, np.uint8).view(NP_FP8[elem])
    sf = poisoned_scales(m, h, group, fmt, layout)
    y_fast, y_ref = np.empty_like(x), np.empty_like(x)
    r_fast, r_ref = r.copy(), r.copy()
    if with_residual:
        got = fp4norm.add_rmsnorm_fp8quant(x, r_fast, w, out, sf, y_out=y_fast, **kw)
        ref = reference.add_rmsnorm_fp8quant(x, r_ref, w, y_out=y_ref, **kw)
    else:
        got = fp4norm.rmsnorm_fp8quant(x, w, out, sf, y_out=y_fast, **kw)
        ref = reference.rmsnorm_fp8quant(x, w, y_out=y_ref, **kw)
    assert got[0] is out and got[1] is sf
    assert ref[0].dtype == NP_FP8[elem] and ref[0].shape == (m, h)
    assert ref[1].dtype == scale_dtype(fmt)
    assert same_bytes(out, ref[0]) and same_bytes(sf, ref[1])
    assert same_bytes(r_fast, r_ref) and same_bytes(y_fast, y_ref)
    hv, q, scales, y = model(x, r if with_residual else None, w, elem, group, fmt, layout, eps=1e-5)
    assert same_bytes(out, q), "codes differ from SPEC.md §8 in NumPy"
    assert same_bytes(sf, scales), "scales (or their padding) differ from SPEC.md §8 in NumPy"
    assert same_bytes(r_fast, hv if with_residual else r)
    assert same_bytes(y_fast, to_dtype(y, x.dtype))
    # Dequantisation is fp8_value * scale, exactly.
    d = fp4norm.dequantize_fp8(out, sf, group=group, scale_format=fmt, scale_layout=layout)
    assert d.dtype == np.float32 and d.shape == (m, h)
    g = h if group == "token" else group
    per_group = ue8m0_value(ref_scales_rm(sf, m, h // g, layout)) if fmt == "ue8m0" else ref_scales_rm(sf, m, h // g, layout)
    want = canonical_nan(fp8_value(bits(out), elem).reshape(m, h) * np.repeat(per_group, g, axis=1))
    assert same_bytes(d, want)


def ref_scales_rm(buf: np.ndarray, m: int, n: int, layout: str) -> np.ndarray:
    """Scales `[m, n]` read back from a layout."""
    if layout == "row-major":
        return buf.reshape(m, n)
    if layout == "column-major":
        return buf.reshape(n, -1)[:, :m].T
    if layout == "column-major-packed":
        n4 = (n + 3) // 4
        words = np.ascontiguousarray(buf).view(np.uint8).view("<u4").reshape(n4, -1)
        return np.ascontiguousarray(words.T[:m]).view(np.uint8)[:, :n].view(buf.dtype)
    return buf[swizzled_offsets(m, n)]


@pytest.mark.parametrize("elem", ELEMENTS)
@pytest.mark.parametrize("s_min", [0.0, 1.0 / (448 * 512), 0.05])
def test_f32_scale_floor(elem, s_min):
    """s = max(RN32(amax / FMAX), s_min) for f32 scales; rows of tiny values are floored."""
    rng = np.random.default_rng(seed_of(elem, s_min))
    x, r, w = make(rng, 12, 256, "bf16")
    x[4:8] = (x[4:8].astype(np.float32) * 1e-3).astype(x.dtype)
    r[4:8] = 0
    for group in ("token", 64):
        kw = dict(element=elem, group=group, s_min=s_min)
        a = fp4norm.add_rmsnorm_fp8quant(x, r.copy(), w, **kw)
        b = reference.add_rmsnorm_fp8quant(x, r.copy(), w, **kw)
        assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1])
        _, q, s, _ = model(x, r, w, elem, group, "f32", "row-major", s_min=s_min)
        assert same_bytes(a[0], q) and same_bytes(a[1], s)
        if s_min > 0:
            assert np.all(a[1] >= np.float32(s_min))


@pytest.mark.parametrize("code", DTYPES)
@pytest.mark.parametrize("bias", [0.0, -0.0, 1.0, -0.5])
def test_weight_bias(code, bias):
    """SPEC.md §8's weight bias (Gemma's (1 + w) is 1.0) on both kinds of scaling."""
    rng = np.random.default_rng(seed_of(code, bias))
    x, r, w = make(rng, 9, 256, code)
    for kw in (dict(group=32, scale_format="ue8m0", scale_layout="swizzled"), dict(scale=0.5, element="e5m2")):
        r1, r2 = r.copy(), r.copy()
        a = fp4norm.add_rmsnorm_fp8quant(x, r1, w, weight_bias=bias, **kw)
        b = reference.add_rmsnorm_fp8quant(x, r2, w, weight_bias=bias, **kw)
        assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1]) and same_bytes(r1, r2)
        mkw = dict(scale=0.5) if "scale" in kw else dict(group=32, fmt="ue8m0", layout="swizzled")
        _, q, _, _ = model(x, r, w, kw.get("element", "e4m3"), bias=bias, **mkw)
        assert same_bytes(a[0], q)
    # Zero weights with bias 1 are exactly unit weights.
    dt = NP_DTYPE[code]
    a = fp4norm.rmsnorm_fp8quant(x, np.zeros(256, dt), group=64, weight_bias=1.0)
    b = fp4norm.rmsnorm_fp8quant(x, np.ones(256, dt), group=64)
    assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1])


@pytest.mark.parametrize("code", DTYPES)
@pytest.mark.parametrize("elem", ELEMENTS)
@pytest.mark.parametrize("scale", [0.01, 1.0, 10.0, "array"])
@pytest.mark.parametrize("with_residual", [True, False])
def test_per_tensor_matches_reference_and_model(code, elem, scale, with_residual):
    """FlashInfer's rmsnorm_quant / fused_add_rmsnorm_quant on NumPy arrays: out's float8
    dtype picks the format; the general API with scale= writes the same bytes."""
    rng = np.random.default_rng(seed_of(code, elem, scale, with_residual))
    m, h = 33, 500  # any H for a per-tensor scale
    x, r, w = make(rng, m, h, code)
    s = np.array([0.37], np.float32) if scale == "array" else scale
    value = 0.37 if scale == "array" else scale
    out = np.full((m, h), 0xAB, np.uint8).view(NP_FP8[elem])
    ref = np.empty((m, h), NP_FP8[elem])
    r1, r2 = r.copy(), r.copy()
    if with_residual:
        assert fp4norm.fused_add_rmsnorm_quant(out, x, r1, w, s) is None
        reference.fused_add_rmsnorm_quant(ref, x, r2, w, s)
    else:
        assert fp4norm.rmsnorm_quant(out, x, w, s) is None
        reference.rmsnorm_quant(ref, x, w, s)
    assert same_bytes(out, ref) and same_bytes(r1, r2)
    hv, q, _, _ = model(x, r if with_residual else None, w, elem, scale=np.float32(value))
    assert same_bytes(out, q)
    assert same_bytes(r1, hv if with_residual else r)
    # The general API: (out, the scale as a (1,) float32 array).
    fn = (lambda **k: fp4norm.add_rmsnorm_fp8quant(x, r.copy(), w, **k)) if with_residual else (
        lambda **k: fp4norm.rmsnorm_fp8quant(x, w, **k)
    )
    q2, s2 = fn(scale=s, element=elem)
    assert same_bytes(q2, out) and q2.dtype == NP_FP8[elem]
    assert s2.dtype == np.float32 and s2.shape == (1,) and s2[0] == np.float32(value)
    # uint8 codes with the element named: the same bytes.
    q3 = np.zeros((m, h), np.uint8)
    fn(scale=s, element=elem, out=q3)
    assert same_bytes(q3, out)
    d = fp4norm.dequantize_fp8(out, s2, group="tensor")
    assert same_bytes(d, canonical_nan(fp8_value(bits(out), elem).reshape(m, h) * np.float32(value)))


@pytest.mark.parametrize("elem", ELEMENTS)
@pytest.mark.parametrize("config", [("token", "f32", "row-major"), (32, "ue8m0", "swizzled"), (128, "f32", "column-major"), (64, "ue8m0", "row-major"), "tensor"])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_edge_rows(elem, config, eps):
    """NaN, ±Inf, zero, tiny and negative-zero rows, negative-zero weights, eps = 0 (a zero
    row then has rstd = +Inf and NaN values): the formulas applied as written."""
    rng = np.random.default_rng(seed_of(elem, config, eps))
    x, r, w = make(rng, 16, 256, "f16", specials=True)
    if config == "tensor":
        kw, mkw = dict(scale=2.0), dict(scale=2.0)
    else:
        g, f, lay = config
        kw = dict(group=g, scale_format=f, scale_layout=lay)
        mkw = dict(group=g, fmt=f, layout=lay)
    y1, y2 = np.empty_like(x), np.empty_like(x)
    r1, r2 = r.copy(), r.copy()
    a = fp4norm.add_rmsnorm_fp8quant(x, r1, w, eps=eps, element=elem, y_out=y1, **kw)
    b = reference.add_rmsnorm_fp8quant(x, r2, w, eps=eps, element=elem, y_out=y2, **kw)
    assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1])
    assert same_bytes(r1, r2) and same_bytes(y1, y2)
    hv, q, s, y = model(x, r, w, elem, eps=eps, **mkw)
    assert same_bytes(a[0], q) and same_bytes(r1, hv) and same_bytes(y1, to_dtype(y, x.dtype))
    if s is not None:
        assert same_bytes(a[1], s)
    # A NaN input gives the NaN code 0x7F in its row or group, never a finite one.
    assert bits(a[0]).reshape(16, 256)[3, 5] == 0x7F


@pytest.mark.parametrize("elem", ELEMENTS)
@pytest.mark.parametrize("value", [0.0, -1.5, float("inf"), float("nan"), 1e-40, 3e38])
def test_per_tensor_scale_values_flow_through(elem, value):
    """Any per-tensor scale is accepted and flows through inv = RN32(1/s) (SPEC.md §8):
    s = 0 gives +Inf, a negative s negative codes, NaN NaN codes."""
    rng = np.random.default_rng(seed_of(elem, value))
    x, r, w = make(rng, 5, 96, "bf16")
    out, ref = np.empty((5, 96), NP_FP8[elem]), np.empty((5, 96), NP_FP8[elem])
    fp4norm.rmsnorm_quant(out, x, w, np.array([value], np.float32))
    reference.rmsnorm_quant(ref, x, w, value)
    _, q, _, _ = model(x, None, w, elem, scale=np.float32(value))
    assert same_bytes(out, ref) and same_bytes(out, q)


@pytest.mark.parametrize("config", CONFIGS + ["tensor"], ids=CONFIG_IDS + ["tensor"])
@pytest.mark.parametrize("m", [0, 1, 3, 5, 127, 129])
def test_row_counts_and_padding(config, m):
    """M = 0 writes nothing and allocates empty outputs of the layout's shape; other M
    write every padding element of the column-major (Mp4) and swizzled (Mp) layouts as 0."""
    h = 128
    rng = np.random.default_rng(seed_of(config, m))
    x, r, w = make(rng, m, h, "bf16")
    if config == "tensor":
        q, s = fp4norm.add_rmsnorm_fp8quant(x, r.copy(), w, scale=1.5)
        assert q.shape == (m, h) and s.shape == (1,)
        return
    g, f, lay = config
    n = 1 if g == "token" else h // g
    kw = dict(group=g, scale_format=f, scale_layout=lay)
    q, s = fp4norm.add_rmsnorm_fp8quant(x, r.copy(), w, **kw)
    assert q.shape == (m, h)
    shape = {
        "row-major": (m, n), "column-major": (n, 4 * ((m + 3) // 4)), "swizzled": (swizzled_len(m, n),),
        "column-major-packed": ((n + 3) // 4, 16 * ((m + 3) // 4)),
    }[lay]
    assert s.shape == shape and s.dtype == scale_dtype(f)
    sf = poisoned_scales(m, h, g, f, lay)
    out = np.full((m, h), 0xAB, np.uint8)
    rr = r.copy()
    fp4norm.add_rmsnorm_fp8quant(x, rr, w, out, sf, element="e4m3", **kw)
    ref = reference.add_rmsnorm_fp8quant(x, r.copy(), w, **kw)
    assert same_bytes(out, ref[0]) and same_bytes(sf, ref[1])
    _, _, model_s, _ = model(x, r, w, "e4m3", g, f, lay)
    assert same_bytes(sf, model_s)  # padding included


def test_3d_strided_and_typed_buffers():
    rng = np.random.default_rng(17)
    b, s, h = 3, 7, 192
    x, r, w = make(rng, b * s, h, "bf16")
    kw = dict(group=64, scale_format="ue8m0", scale_layout="row-major", element="e5m2")
    r3 = r.reshape(b, s, h).copy()
    q3, s3 = fp4norm.add_rmsnorm_fp8quant(x.reshape(b, s, h), r3, w, **kw)
    q2, s2 = fp4norm.add_rmsnorm_fp8quant(x, r.copy(), w, **kw)
    assert q3.shape == (b, s, h) and s3.shape == (b, s, 3)
    assert same_bytes(q3, q2) and same_bytes(s3, s2) and same_bytes(r3.reshape(-1, h), spec_residual(x, r))
    # Strided rows (views into wider buffers), written in place, gaps untouched.
    xb = np.zeros((b * s, h + 40), x.dtype)
    rb = np.full((b * s, h + 40), 7.0, r.dtype)
    xb[:, :h], rb[:, :h] = x, r
    q4, s4 = fp4norm.add_rmsnorm_fp8quant(xb[:, :h], rb[:, :h], w, **kw)
    assert same_bytes(q4, q2) and same_bytes(s4, s2)
    assert same_bytes(rb[:, :h], spec_residual(x, r)) and np.all(rb[:, h:].astype(np.float32) == 7.0)
    # Flat preallocated outputs of the right length; UE8M0 scales typed float8_e8m0fnu.
    qf = np.zeros(b * s * h, np.uint8)
    sf = np.zeros(b * s * 3, ml_dtypes.float8_e8m0fnu)
    fp4norm.add_rmsnorm_fp8quant(x, r.copy(), w, qf, sf, **kw)
    assert same_bytes(qf, q2) and same_bytes(sf, s2)


def test_mxfp8_convenience():
    rng = np.random.default_rng(23)
    x, r, w = make(rng, 130, 256, "f16")
    a = fp4norm.add_rmsnorm_mxfp8quant(x, r.copy(), w)
    b = fp4norm.add_rmsnorm_fp8quant(x, r.copy(), w, element="e4m3", group=32, scale_format="ue8m0", scale_layout="swizzled")
    assert a[0].dtype == NP_FP8["e4m3"] and a[1].dtype == np.uint8 and a[1].shape == (swizzled_len(130, 8),)
    assert same_bytes(a[0], b[0]) and same_bytes(a[1], b[1])
    c = fp4norm.rmsnorm_mxfp8quant(x, w, scale_layout="row-major")
    d = reference.rmsnorm_fp8quant(x, w, group=32, scale_format="ue8m0")
    assert c[1].shape == (130, 8) and same_bytes(c[0], d[0]) and same_bytes(c[1], d[1])
    assert fp4norm.fp8_scale_sizes(130, 256, 32, "ue8m0", "swizzled") == (130 * 256, swizzled_len(130, 8))
    assert fp4norm.fp8_scale_sizes(5, 64, "token", "f32", "column-major") == (320, 8)


def test_dequantize_fp8_edge_cases():
    # E5M2: 0x3C is 1.0, 0xC0 is -2.0; per token, scale 0.5.
    q = np.array([[0x3C, 0xC0] * 16], np.uint8)
    d = fp4norm.dequantize_fp8(q, np.array([[0.5]], np.float32), element="e5m2")
    assert list(d[0, :2]) == [0.5, -1.0]
    # A NaN scale or code gives 0x7FFFFFFF, whatever the operands.
    d = fp4norm.dequantize_fp8(q.view(ml_dtypes.float8_e5m2), np.array([[np.nan]], np.float32))
    assert np.all(d.view(np.uint32) == 0x7FFFFFFF)
    nan_codes = np.full((1, 32), 0xFF, np.uint8)
    d = fp4norm.dequantize_fp8(nan_codes, 2.0, element="e4m3", group="tensor")
    assert np.all(d.view(np.uint32) == 0x7FFFFFFF)
    # UE8M0 code 128 is 2.0; flat q with m and h.
    d = fp4norm.dequantize_fp8(np.full(64, 0x38, np.uint8), np.array([128, 126], np.uint8), element="e4m3", group=32, scale_format="ue8m0", m=1, h=64)
    assert d.shape == (1, 64) and d[0, 0] == 2.0 and d[0, 32] == 0.5
    with pytest.raises(fp4norm.ArgumentError, match="element"):
        fp4norm.dequantize_fp8(np.zeros((1, 32), np.uint8), np.ones((1, 1), np.float32))
    with pytest.raises(fp4norm.ArgumentError, match="scales"):
        fp4norm.dequantize_fp8(q.view(ml_dtypes.float8_e5m2), np.ones((2, 1), np.float32))


# ---------------------------------------------------------------------------------------
# Bad arguments: the right class, the argument named, nothing written
# ---------------------------------------------------------------------------------------


class Call:
    """Valid arguments of one FP8 call (NumPy, or torch on a device), every buffer poisoned
    so that any write shows."""

    def __init__(self, kind, m=4, h=64):
        self.kind = kind
        rng = np.random.default_rng(5)
        x, r, w = make(rng, m, h, "bf16")
        self.np = dict(x=x, r=r, w=w)
        self.x, self.r, self.w = self.arr(x), self.arr(r), self.arr(w)
        self.out = self.arr(np.full((m, h), 0xAB, np.uint8).view(NP_FP8["e4m3"]))
        self.out8 = self.arr(np.full((m, h), 0xAB, np.uint8))
        self.sf = self.arr(np.full(m, np.nan, np.float32).reshape(m, 1))
        self.y = self.arr(np.full((m, h), 0x5555, np.uint16).view(x.dtype))
        self.scale = self.arr(np.array([0.5], np.float32))
        self.written = (self.r, self.out, self.out8, self.sf, self.y)
        self.snap = [self.host(a).copy() for a in self.written]

    def arr(self, a):
        """A NumPy array as this call's kind of array."""
        if self.kind == "numpy":
            return a.copy()
        if a.dtype == ml_dtypes.bfloat16:
            t = torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
        elif a.dtype in (NP_FP8["e4m3"], NP_FP8["e5m2"]):
            dt = torch.float8_e4m3fn if a.dtype == NP_FP8["e4m3"] else torch.float8_e5m2
            t = torch.from_numpy(a.view(np.uint8).copy()).view(dt)
        else:
            t = torch.from_numpy(a.copy())
        return t.to(self.kind)

    def host(self, a):
        if self.kind == "numpy":
            return bits(a)
        return a.detach().cpu().contiguous().view(torch.uint8).reshape(-1).numpy()

    def untouched(self):
        return all(np.array_equal(self.host(a), b) for a, b in zip(self.written, self.snap))

    def zeros(self, shape, dtype):
        """A new array of a NumPy dtype (or a torch dtype name) of this kind."""
        if self.kind == "numpy":
            return np.zeros(shape, getattr(np, dtype, None) or getattr(ml_dtypes, dtype))
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=self.kind)


# Calls of the dynamic API: (id, exception, words in the message, changes).
DYNAMIC_BAD = [
    ("out float16", TypeError, ["out", "float16"], lambda c: dict(out=c.zeros((4, 64), "float16"))),
    ("out e5m2 with element e4m3", TypeError, ["out", "float8_e5m2", "element"], lambda c: dict(out=c.arr(np.zeros((4, 64), NP_FP8["e5m2"])), element="e4m3")),
    ("out too short", ValueError, ["out", "256"], lambda c: dict(out=c.out8[:3])),
    ("out non-contiguous", ValueError, ["out", "contiguous"], lambda c: dict(out=c.zeros((4, 128), "uint8")[:, ::2])),
    ("scales_out float16", TypeError, ["scales_out", "float16"], lambda c: dict(out=c.out8, scales_out=c.zeros((4, 1), "float16"))),
    ("scales_out uint8 for f32 scales", TypeError, ["scales_out", "uint8"], lambda c: dict(out=c.out8, scales_out=c.zeros((4, 1), "uint8"))),
    ("scales_out length", ValueError, ["scales_out", "4"], lambda c: dict(out=c.out8, scales_out=c.sf[:3])),
    ("scales_out row-major for column-major", ValueError, ["scales_out", "column-major"], lambda c: dict(out=c.out8, scales_out=c.sf, group=32, scale_layout="column-major")),
    ("per-tensor with scales_out", ValueError, ["scales_out", "per-tensor"], lambda c: dict(out=c.out8, scales_out=c.sf, scale=c.scale)),
    ("per-tensor with group", ValueError, ["group", "dynamic"], lambda c: dict(out=c.out8, scale=c.scale, group=32)),
    ("H not a multiple of the group", ValueError, ["H = 64", "128"], lambda c: dict(out=c.out8, group=128)),
    ("group 16", ValueError, ["group", "16"], lambda c: dict(out=c.out8, group=16)),
    ("group float", TypeError, ["group"], lambda c: dict(out=c.out8, group=32.0)),
    ("group name", ValueError, ["group", "tile"], lambda c: dict(out=c.out8, group="tile")),
    ("swizzled with f32", ValueError, ["swizzled", "UE8M0"], lambda c: dict(out=c.out8, group=32, scale_layout="swizzled")),
    ("swizzled with G 64", ValueError, ["swizzled", "64"], lambda c: dict(out=c.out8, group=64, scale_format="ue8m0", scale_layout="swizzled")),
    ("scale_format e4m3", ValueError, ["scale_format"], lambda c: dict(out=c.out8, scale_format="e4m3")),
    ("scale_format type", TypeError, ["scale_format"], lambda c: dict(out=c.out8, scale_format=32)),
    ("scale_layout both", ValueError, ["scale_layout"], lambda c: dict(out=c.out8, scale_layout="both")),
    ("element e3m4", ValueError, ["element"], lambda c: dict(out=c.out8, element="e3m4")),
    ("s_min negative", ValueError, ["s_min"], lambda c: dict(out=c.out8, s_min=-1e-3)),
    ("s_min nan", ValueError, ["s_min"], lambda c: dict(out=c.out8, s_min=float("nan"))),
    ("s_min inf", ValueError, ["s_min"], lambda c: dict(out=c.out8, s_min=float("inf"))),
    ("s_min with ue8m0", ValueError, ["s_min", "UE8M0"], lambda c: dict(out=c.out8, s_min=1e-3, scale_format="ue8m0")),
    ("eps negative", ValueError, ["eps"], lambda c: dict(out=c.out8, eps=-1.0)),
    ("weight_bias nan", ValueError, ["weight_bias"], lambda c: dict(out=c.out8, weight_bias=float("nan"))),
    ("residual shape", ValueError, ["residual", "shape"], lambda c: dict(out=c.out8, residual=c.arr(np.zeros((5, 64), ml_dtypes.bfloat16)))),
    ("weight length", ValueError, ["weight"], lambda c: dict(out=c.out8, weight=c.w[:32])),
    ("input float32", TypeError, ["input", "float32"], lambda c: dict(out=c.out8, input=c.zeros((4, 64), "float32"))),
    ("y_out dtype", TypeError, ["y_out"], lambda c: dict(out=c.out8, y_out=c.zeros((4, 64), "float16"))),
    ("out over residual", ValueError, ["overlap"], lambda c: dict(out=_bytes_of(c, c.r)[: 4 * 64].reshape(4, 64))),
    ("y_out is input", ValueError, ["input", "y_out", "overlap"], lambda c: dict(out=c.out8, y_out=c.x)),
    ("scales_out over out", ValueError, ["overlap"], lambda c: dict(out=c.out8, scales_out=_bytes_of(c, c.out8)[:16].view(_f32(c)).reshape(4, 1))),
]


def _bytes_of(c, a):
    return a.view(np.uint8).reshape(-1) if c.kind == "numpy" else a.view(torch.uint8).reshape(-1)


def _f32(c):
    return np.float32 if c.kind == "numpy" else torch.float32


# Calls of FlashInfer's rmsnorm_quant / fused_add_rmsnorm_quant.
STATIC_BAD = [
    ("out uint8", TypeError, ["out", "uint8", "float8_e4m3fn"], lambda c: dict(out=c.out8)),
    ("out float16", TypeError, ["out", "float16"], lambda c: dict(out=c.zeros((4, 64), "float16"))),
    ("out shape", ValueError, ["out", "256"], lambda c: dict(out=c.out[:3])),
    ("scale shape (2,)", ValueError, ["scale", "shape"], lambda c: dict(scale=c.arr(np.ones(2, np.float32)))),
    ("scale shape (1, 1)", ValueError, ["scale", "shape"], lambda c: dict(scale=c.arr(np.ones((1, 1), np.float32)))),
    ("scale float64", TypeError, ["scale", "float64"], lambda c: dict(scale=c.arr(np.ones(1, np.float64)))),
    ("scale str", TypeError, ["scale"], lambda c: dict(scale="0.5")),
    ("y_out over input", ValueError, ["input", "y_out", "overlap"], lambda c: dict(y_out=c.x)),
    ("eps nan", ValueError, ["eps"], lambda c: dict(eps=float("nan"))),
    ("weight_bias inf", ValueError, ["weight_bias"], lambda c: dict(weight_bias=float("inf"))),
    ("weight dtype", TypeError, ["weight"], lambda c: dict(weight=c.zeros((64,), "float16"))),
]

KINDS = ["numpy", "cpu", "cuda"]


def _kind_or_skip(kind):
    if kind != "numpy":
        if torch is None:
            pytest.skip("torch is not installed: torch FP8 cases skipped")
        cuda_or_skip(kind)
        if kind not in DEVICES:
            pytest.skip(f"{kind} not in FP4NORM_TEST_DEVICES")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("desc,exc,words,change", DYNAMIC_BAD, ids=[b[0] for b in DYNAMIC_BAD])
def test_bad_dynamic_calls_write_nothing(kind, desc, exc, words, change):
    _kind_or_skip(kind)
    c = Call(kind)
    kw = dict(input=c.x, residual=c.r, weight=c.w)
    kw.update(change(c))
    with pytest.raises(exc) as info:
        fp4norm.add_rmsnorm_fp8quant(**kw)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"
    assert isinstance(info.value, (fp4norm.ArgumentError, fp4norm.ArgumentTypeError))
    assert isinstance(info.value, AssertionError)  # as FlashInfer raises
    assert c.untouched(), "an error wrote into a buffer"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("desc,exc,words,change", STATIC_BAD, ids=[b[0] for b in STATIC_BAD])
def test_bad_static_calls_write_nothing(kind, with_residual, desc, exc, words, change):
    _kind_or_skip(kind)
    c = Call(kind)
    kw = dict(out=c.out, input=c.x, weight=c.w, scale=c.scale, y_out=c.y)
    if with_residual:
        kw["residual"] = c.r
    kw.update(change(c))
    fn = fp4norm.fused_add_rmsnorm_quant if with_residual else fp4norm.rmsnorm_quant
    with pytest.raises(exc) as info:
        fn(**kw)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"
    assert isinstance(info.value, AssertionError)
    assert c.untouched(), "an error wrote into a buffer"


@needs_torch
def test_scale_on_another_device_is_refused():
    """A per-tensor scale is read where the kernel runs, never copied: one on another
    device (here the meta device; on a GPU machine also a CPU scale for CUDA tensors, in
    test_cuda_scale_on_host_is_refused) is an error before anything is written."""
    c = Call("cpu")
    with pytest.raises(fp4norm.ArgumentError, match="scale"):
        fp4norm.fused_add_rmsnorm_quant(c.out, c.x, c.r, c.w, torch.ones(1, device="meta"))
    # A torch scale for NumPy arrays: one kind of array per call.
    n = Call("numpy")
    with pytest.raises(fp4norm.ArgumentTypeError, match="scale"):
        fp4norm.rmsnorm_quant(n.out, n.x, n.w, torch.ones(1))
    assert c.untouched() and n.untouched()


@pytest.mark.parametrize("kind", KINDS)
def test_number_scales_write_the_tensor_scales_bytes(kind):
    """A per-tensor scale given as a number, Python's or NumPy's (FlashInfer takes both),
    writes what the same value as a float32 tensor writes; a bool or a string is an error
    before anything is written."""
    _kind_or_skip(kind)
    want = Call(kind)
    fp4norm.fused_add_rmsnorm_quant(want.out, want.x, want.r, want.w, want.scale)
    for number in (0.5, np.float32(0.5), np.float64(0.5), np.float16(0.5)):
        c = Call(kind)
        fp4norm.fused_add_rmsnorm_quant(c.out, c.x, c.r, c.w, number)
        for got, ref in ((c.out, want.out), (c.r, want.r)):
            assert np.array_equal(c.host(got), want.host(ref)), f"scale {number!r} ({type(number).__name__})"
    for bad in (True, np.bool_(True), "0.5"):
        c = Call(kind)
        with pytest.raises(fp4norm.ArgumentTypeError, match="scale"):
            fp4norm.fused_add_rmsnorm_quant(c.out, c.x, c.r, c.w, bad)
        assert c.untouched(), f"scale {bad!r} wrote into a buffer"


def test_read_only_out_is_refused():
    c = Call("numpy")
    ro = c.out.view()
    ro.flags.writeable = False
    with pytest.raises(fp4norm.ArgumentError, match="out"):
        fp4norm.rmsnorm_quant(ro, c.x, c.w, 0.5)
    assert c.untouched()


# ---------------------------------------------------------------------------------------
# torch: the operators
# ---------------------------------------------------------------------------------------


TORCH_DTYPES = {"bf16": "bfloat16", "f16": "float16"}
FP8_TORCH = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
# Each configuration once, the dtype, element, residual and y_out rotating through it.
OP_CASES = [
    (DTYPES[i % 2], ELEMENTS[(i // 2) % 2], cfg, i % 3 != 2, i % 2 == 0)
    for i, cfg in enumerate(CONFIGS)
]


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "code,elem,config,with_residual,with_y",
    OP_CASES,
    ids=[f"{c}-{e}-{g}-{f}-{lay}{'' if r else '-norez'}{'-yout' if y else ''}" for c, e, (g, f, lay), r, y in OP_CASES],
)
def test_dynamic_operators_match_reference_and_pass_opcheck(device, code, elem, config, with_residual, with_y):
    cuda_or_skip(device)
    group, fmt, layout = config
    gsize = -1 if group == "token" else group
    dtype = getattr(torch, TORCH_DTYPES[code])
    m, h = 5, 256
    x, r, w = tdata(m, h, dtype, device, seed=seed_of(config))
    y = torch.empty_like(x) if with_y else None
    opts = dict(element=elem, group_size=gsize, scale_format=fmt, scale_layout=layout)
    ops = torch.ops.fp4norm
    r_ref = r.cpu().clone()
    y_ref = torch.empty_like(r_ref) if with_y else None
    rkw = dict(element=elem, group=group, scale_format=fmt, scale_layout=layout, y_out=y_ref)
    if with_residual:
        ref = reference.add_rmsnorm_fp8quant(x.cpu(), r_ref, w.cpu(), **rkw)
        r1 = r.clone()
        q, s = ops.add_rmsnorm_fp8quant(x, r1, w, y_out=y, **opts)
        assert same(r1, r_ref)
    else:
        ref = reference.rmsnorm_fp8quant(x.cpu(), w.cpu(), **rkw)
        q, s = ops.rmsnorm_fp8quant(x, w, y_out=y, **opts)
    assert q.dtype == getattr(torch, FP8_TORCH[elem]) and q.shape == (m, h) and q.device == x.device
    assert s.dtype == (torch.float32 if fmt == "f32" else torch.uint8)
    assert same(q, ref[0]) and same(s, ref[1]) and tuple(s.shape) == tuple(ref[1].shape)
    if with_y:
        assert same(y, y_ref)
    # .out into poisoned buffers: the same bytes, padding zero.
    q2 = torch.full((m, h), 0xAB, dtype=torch.uint8, device=device)
    s2 = torch.full(s.shape, 0xAB, dtype=torch.uint8, device=device).view(s.dtype) if s.dtype == torch.uint8 else torch.full(s.shape, float("nan"), device=device)
    if with_residual:
        ops.add_rmsnorm_fp8quant.out(x, r.clone(), w, q2, s2, y_out=y, **opts)
    else:
        ops.rmsnorm_fp8quant.out(x, w, q2, s2, y_out=y, **opts)
    assert same(q2, q) and same(s2, s)
    # opcheck (schema, fake kernel, autograd registration, AOT dispatch with dynamic
    # shapes). Its schema check compares written tensors with allclose, which PyTorch has
    # no float8 kernel for: the .out codes go in as uint8, which the operators accept too.
    if with_residual:
        torch.library.opcheck(ops.add_rmsnorm_fp8quant.default, (x, r.clone(), w), dict(y_out=y, **opts))
        torch.library.opcheck(ops.add_rmsnorm_fp8quant.out, (x, r.clone(), w, q2, s2), dict(y_out=y, **opts))
    else:
        torch.library.opcheck(ops.rmsnorm_fp8quant.default, (x, w), dict(y_out=y, **opts))
        torch.library.opcheck(ops.rmsnorm_fp8quant.out, (x, w, q2, s2), dict(y_out=y, **opts))


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("code", DTYPES)
@pytest.mark.parametrize("elem", ELEMENTS)
@pytest.mark.parametrize("with_residual", [True, False])
def test_static_operators_match_reference_and_pass_opcheck(device, code, elem, with_residual):
    """FlashInfer's operators: out (float8, its dtype the format) and residual written in
    place, nothing returned; a (1,) or 0-d scale tensor read where the kernel runs."""
    cuda_or_skip(device)
    dtype = getattr(torch, TORCH_DTYPES[code])
    fp8 = getattr(torch, FP8_TORCH[elem])
    m, h = 7, 104
    x, r, w = tdata(m, h, dtype, device, seed=seed_of(code, elem))
    ops = torch.ops.fp4norm
    for scale in (torch.tensor([0.25], device=device), torch.tensor(4.0, device=device)):
        ref = torch.empty(m, h, dtype=fp8)
        r_ref = r.cpu().clone()
        out = torch.empty(m, h, dtype=fp8, device=device)
        r1 = r.clone()
        if with_residual:
            reference.fused_add_rmsnorm_quant(ref, x.cpu(), r_ref, w.cpu(), scale.cpu())
            assert ops.fused_add_rmsnorm_quant(out, x, r1, w, scale) is None
            assert same(r1, r_ref)
        else:
            reference.rmsnorm_quant(ref, x.cpu(), w.cpu(), scale.cpu())
            assert ops.rmsnorm_quant(out, x, w, scale) is None
        assert same(out, ref)
    # opcheck: a uint8 out with the element named (allclose has no float8 kernel).
    u8 = torch.empty(m, h, dtype=torch.uint8, device=device)
    if with_residual:
        torch.library.opcheck(ops.fused_add_rmsnorm_quant.default, (u8, x, r.clone(), w, scale), dict(element=elem, weight_bias=1.0))
    else:
        torch.library.opcheck(ops.rmsnorm_quant.default, (u8, x, w, scale), dict(element=elem, y_out=torch.empty_like(x)))
    # With a float8 out, every check but the schema's allclose comparison.
    args = (out, x, r.clone(), w, scale) if with_residual else (out, x, w, scale)
    op = ops.fused_add_rmsnorm_quant.default if with_residual else ops.rmsnorm_quant.default
    torch.library.opcheck(op, args, test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


@needs_torch
def test_static_schemas_declare_flashinfer_mutations():
    """FlashInfer's mutation annotations: rmsnorm_quant writes out; fused_add_rmsnorm_quant
    writes out and residual (our y_out extension too); neither returns anything; input,
    weight and scale are read only."""
    for name, written in (("rmsnorm_quant", {"out", "y_out"}), ("fused_add_rmsnorm_quant", {"out", "residual", "y_out"})):
        schema = getattr(torch.ops.fp4norm, name).default._schema
        got = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert got == written, (name, got)
        assert len(schema.returns) == 0
        names = [a.name for a in schema.arguments]
        fi = ["out", "input", "residual", "weight", "scale", "eps", "enable_pdl"]
        if name == "rmsnorm_quant":
            fi.remove("residual")
        assert names[: len(fi)] == fi  # FlashInfer's order; extensions only after it


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_mutation_and_version_counters(device):
    cuda_or_skip(device)
    x, r, w = tdata(4, 64, torch.bfloat16, device)
    x0 = x.clone()
    out = torch.empty(4, 64, dtype=torch.float8_e4m3fn, device=device)
    y = torch.empty_like(x)
    scale = torch.tensor([0.5], device=device)
    before = [t._version for t in (out, r, y, x, scale)]
    fp4norm.fused_add_rmsnorm_quant(out, x, r, w, scale, y_out=y)
    after = [t._version for t in (out, r, y, x, scale)]
    assert after[0] > before[0] and after[1] > before[1] and after[2] > before[2]
    assert after[3] == before[3] and after[4] == before[4], "read-only inputs were bumped"
    assert torch.equal(x.view(torch.int16), x0.view(torch.int16)), "input must stay as it was"
    v = out._version
    fp4norm.rmsnorm_quant(out, x, w, 0.5)
    assert out._version > v
    # The dynamic API: functional outputs are new tensors; given ones written in place.
    v = r._version
    q, s = fp4norm.add_rmsnorm_fp8quant(x, r, w, group=32)
    assert r._version > v and not q.requires_grad
    q2, s2 = torch.empty_like(q), torch.empty_like(s)
    before = (q2._version, s2._version)
    got = fp4norm.rmsnorm_fp8quant(x, w, q2, s2, group=32)
    assert got[0] is q2 and got[1] is s2 and q2._version > before[0] and s2._version > before[1]
    # Called as operators (their Autograd kernel).
    v = (out._version, r._version)
    torch.ops.fp4norm.fused_add_rmsnorm_quant(out, x, r, w, scale)
    assert out._version > v[0] and r._version > v[1]
    v = r._version
    torch.ops.fp4norm.add_rmsnorm_fp8quant(x, r, w)
    assert r._version > v


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_leaf_that_requires_grad_is_refused(device):
    cuda_or_skip(device)
    x, r, w = tdata(4, 64, torch.bfloat16, device)
    leaf = r.clone().requires_grad_()
    before = raw(leaf)
    out = torch.empty(4, 64, dtype=torch.float8_e5m2, device=device)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        fp4norm.fused_add_rmsnorm_quant(out, x, leaf, w, 1.0)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        torch.ops.fp4norm.add_rmsnorm_fp8quant(x, leaf, w)
    with pytest.raises(RuntimeError, match="not differentiable"):
        fp4norm.add_rmsnorm_fp8quant(x, leaf * 1, w)
    assert torch.equal(raw(leaf), before)
    with torch.no_grad():
        fp4norm.fused_add_rmsnorm_quant(out, x, leaf, w, 1.0)
    q, s = fp4norm.add_rmsnorm_fp8quant(x, r, w.clone().requires_grad_(), group=64)
    assert not q.requires_grad and not s.requires_grad


@needs_torch
def test_direct_operator_errors_name_their_class():
    x, r, w = tdata(4, 64, torch.bfloat16, "cpu")
    out = torch.empty(4, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="fp4norm.ArgumentError: group size 16"):
        torch.ops.fp4norm.add_rmsnorm_fp8quant(x, r, w, group_size=16)
    with pytest.raises(RuntimeError, match="fp4norm.ArgumentTypeError: out has dtype uint8"):
        torch.ops.fp4norm.rmsnorm_quant(out.view(torch.uint8), x, w, torch.ones(1))
    with pytest.raises(RuntimeError, match="fp4norm.ArgumentError: scale_layout"):
        torch.ops.fp4norm.rmsnorm_fp8quant(x, w, scale_layout="tiles")
    # The Python functions raise the class itself.
    with pytest.raises(fp4norm.ArgumentError, match="H = 64"):
        fp4norm.add_rmsnorm_fp8quant(x, r, w, group=128)


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_flashinfer_argument_order(device):
    """Positional calls in FlashInfer's order write what keyword calls write."""
    cuda_or_skip(device)
    x, r, w = tdata(3, 96, torch.float16, device)
    scale = torch.tensor([2.0], device=device)
    results = []
    for positional in (True, False):
        out = torch.empty(3, 96, dtype=torch.float8_e4m3fn, device=device)
        rr = r.clone()
        if positional:
            fp4norm.fused_add_rmsnorm_quant(out, x, rr, w, scale, 1e-6, None)
        else:
            fp4norm.fused_add_rmsnorm_quant(out=out, input=x, residual=rr, weight=w, scale=scale, eps=1e-6, enable_pdl=None)
        results.append((raw(out), raw(rr)))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@needs_torch
def test_eager_calls_reach_modes_and_the_profiler_through_the_dispatcher():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, r, w = tdata(3, 64, torch.bfloat16, "cpu")
    results = []
    for route in ("direct", "mode", "profiler"):
        rr = r.clone()
        out = torch.empty(3, 64, dtype=torch.float8_e4m3fn)
        if route == "mode":
            with Seen() as seen:
                fp4norm.fused_add_rmsnorm_quant(out, x, rr, w, 0.5)
                q, s = fp4norm.add_rmsnorm_fp8quant(x, rr.clone(), w, group=32)
            assert "fp4norm.fused_add_rmsnorm_quant.default" in seen.ops, seen.ops
            assert "fp4norm.add_rmsnorm_fp8quant.default" in seen.ops, seen.ops
        elif route == "profiler":
            with torch.profiler.profile() as prof:
                fp4norm.fused_add_rmsnorm_quant(out, x, rr, w, 0.5)
            names = {e.key for e in prof.key_averages()}
            assert any("fp4norm::fused_add_rmsnorm_quant" in n for n in names), names
        else:
            fp4norm.fused_add_rmsnorm_quant(out, x, rr, w, 0.5)
        results.append((raw(rr), raw(out)))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_dynamic_no_recompile(device):
    """Every FP8 entry point under torch.compile(fullgraph=True, dynamic=True): one compile
    for every M, eager's bytes."""
    cuda_or_skip(device)

    h = 256
    _, _, w = tdata(1, h, torch.bfloat16, device)
    scale = torch.tensor([0.25], device=device)

    def block(x, residual):
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        fp4norm.fused_add_rmsnorm_quant(out, x, residual, w, scale)
        q1, s1 = fp4norm.add_rmsnorm_fp8quant(x, residual, w, group=128, scale_layout="column-major", s_min=1e-4)
        q2, s2 = fp4norm.rmsnorm_mxfp8quant(x, w, weight_bias=1.0)
        q3, _ = fp4norm.rmsnorm_fp8quant(x, w, scale=scale, element="e5m2")
        out2 = torch.empty(x.shape, dtype=torch.float8_e5m2, device=x.device)
        fp4norm.rmsnorm_quant(out2, x, w, 3.0)
        out3 = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        bs = torch.empty(h // 128, (x.shape[0] + 3) // 4 * 4, dtype=torch.float32, device=x.device)
        normed = torch.empty_like(x)
        fp4norm.fused_add_rmsnorm_fp8_block_quant(out3, bs, normed, x, residual, w)
        return out, q1, s1, q2, s2, q3, out2, out3, bs, normed

    torch._dynamo.reset()
    x0, r0, _ = tdata(7, h, torch.bfloat16, device)
    explained = torch._dynamo.explain(block)(x0, r0.clone())
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = CompiledOnce(block)
    for m in (7, 128, 1000):
        x, r, _ = tdata(m, h, torch.bfloat16, device, seed=m)
        r_eager, r_compiled = r.clone(), r.clone()
        eager = block(x, r_eager)
        comp = compiled(x, r_compiled)
        for a, b in zip(eager, comp):
            assert a.shape == b.shape and a.dtype == b.dtype and same(a, b)
        assert same(r_eager, r_compiled)
    assert compiled.recompiles == 0, f"recompiled {compiled.recompiles} frames for a new M"


# ---------------------------------------------------------------------------------------
# FlashInfer's fused_add_rmsnorm_fp8_block_quant (E4M3 in 1 x 128 blocks, DeepGEMM's layout)
# ---------------------------------------------------------------------------------------

# FlashInfer floors each block's amax at 1e-4 before dividing by 448.
BQ_AMAX_FLOOR = np.float32(1e-4)


def bq_data(rng, m, h, code):
    """``make``'s rows, and a row of values so small that its blocks' amax is under
    FlashInfer's floor (their scale is the floor's)."""
    x, r, w = make(rng, m, h, code)
    if m > 3:
        x[3] = (np.float32(1e-7) * rng.standard_normal(h)).astype(x.dtype)
        r[3] = 0
    return x, r, w


def bq_check(x, r, w, q, bs, normed, r_new):
    """``fused_add_rmsnorm_fp8_block_quant``'s outputs (host arrays, ``bs`` the whole
    column-major buffer) against the NumPy model of SPEC.md §8 and FlashInfer's formulas."""
    m, h = x.shape
    n, mp4 = h // 128, 4 * ((m + 3) // 4)
    floor = np.float32(BQ_AMAX_FLOOR / np.float32(448))
    hv, q_m, s_m, y = model(x, r, w, "e4m3", 128, "f32", "column-major", s_min=floor)
    assert same_bytes(r_new, hv) and same_bytes(q, q_m) and same_bytes(bs, s_m)
    assert same_bytes(normed, to_dtype(y, x.dtype))
    assert bs.shape == (n, mp4) and not bs[:, m:].any(), "padding columns must be zero"
    # FlashInfer's scale, max(amax, 1e-4) / 448 in f32: the same bytes as the floor above.
    amax = np.max(np.abs(y.reshape(m, n, 128)), axis=2)
    fi = (np.maximum(amax, BQ_AMAX_FLOOR) / np.float32(448)).astype(np.float32)
    assert same_bytes(bs[:, :m].T.copy(), fi)
    # The codes dequantise to normed_out within E4M3's rounding (a layout check).
    deq = fp8_value(np.asarray(q).view(np.uint8), "e4m3").reshape(m, n, 128) * bs[:, :m].T[:, :, None]
    ref = normed.astype(np.float32).reshape(m, n, 128)
    assert np.all(np.abs(deq - ref) <= np.abs(ref) / 8 + bs[:, :m].T[:, :, None] * 2.0**-6)


BQ_CASES = list(itertools.product([1, 19, 99], [128, 1024, 7168], DTYPES))


@pytest.mark.parametrize("m,h,code", BQ_CASES, ids=[f"{m}x{h}-{c}" for m, h, c in BQ_CASES])
def test_fp8_block_quant_numpy(m, h, code):
    """NumPy arrays, preallocated and poisoned; the CPU backend and the reference write the
    model's bytes and FlashInfer's scales."""
    rng = np.random.default_rng(seed_of("bq", m, h, code))
    x, r, w = bq_data(rng, m, h, code)
    for fn in (fp4norm.fused_add_rmsnorm_fp8_block_quant, reference.fused_add_rmsnorm_fp8_block_quant):
        rr = r.copy()
        q = np.full((m, h), 0xAB, np.uint8).view(NP_FP8["e4m3"])
        bs = np.full((h // 128, 4 * ((m + 3) // 4)), 0xAB, np.uint8).repeat(4, 1).view(np.float32)
        normed = np.full((m, h), 0xAB, np.uint8).repeat(2, 1).view(x.dtype)
        assert fn(q, bs, normed, x, rr, w) is None
        bq_check(x, r, w, q, bs, normed, rr)


BQ_BAD = [
    ("out None", TypeError, "out must be a preallocated", lambda a: a.update(out=None)),
    ("block_scale None", TypeError, "block_scale must be a preallocated", lambda a: a.update(block_scale=None)),
    ("E5M2 out", TypeError, "E4M3", lambda a: a.update(out=a["out"].view(NP_FP8["e5m2"]))),
    ("row-major scales", ValueError, "block_scale must have shape [H/128, 4*ceil(M/4)] = [2, 8]",
     lambda a: a.update(block_scale=np.zeros((8, 2), np.float32))),
    ("normed_out dtype", TypeError, "normed_out",
     lambda a: a.update(normed_out=np.zeros((8, 256), np.float32))),
    ("H not a multiple of 128", ValueError, "128",
     lambda a: a.update(input=a["input"][:, :192], residual=a["residual"][:, :192].copy(),
                        weight=a["weight"][:192].copy(), out=a["out"][:, :192].copy(),
                        normed_out=a["normed_out"][:, :192].copy(),
                        block_scale=np.zeros((1, 8), np.float32))),
]


@pytest.mark.parametrize("desc,exc,words,change", BQ_BAD, ids=[b[0] for b in BQ_BAD])
def test_fp8_block_quant_bad_calls(desc, exc, words, change):
    """FlashInfer's argument names in the message; nothing written."""
    rng = np.random.default_rng(1)
    x, r, w = bq_data(rng, 8, 256, "bf16")
    args = dict(
        out=np.zeros((8, 256), NP_FP8["e4m3"]), block_scale=np.zeros((2, 8), np.float32),
        normed_out=np.zeros((8, 256), x.dtype), input=x, residual=r.copy(), weight=w,
    )
    change(args)
    before = {k: None if v is None else v.copy() for k, v in args.items()}
    with pytest.raises(exc) as e:
        fp4norm.fused_add_rmsnorm_fp8_block_quant(**args)
    assert words in str(e.value), str(e.value)
    assert "scales_out" not in str(e.value) and "y_out" not in str(e.value), str(e.value)
    for k, v in args.items():
        assert v is None or same_bytes(v, before[k]), f"{k} was written"


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("code", DTYPES)
@pytest.mark.parametrize("m,h", [(1, 128), (19, 1024), (99, 4096), (989, 7168)])
def test_fp8_block_quant_flashinfer_shaped(m, h, code, device):
    """As FlashInfer's callers make the call: torch tensors, ``out`` float8_e4m3fn,
    ``block_scale`` float32 ``[H/128, round_up(M, 4)]`` and ``normed_out`` preallocated
    (poisoned here), on CUDA with PDL on and off; the model's bytes and FlashInfer's
    scales, the same bytes as the reference's."""
    cuda_or_skip(device)
    rng = np.random.default_rng(seed_of("bq-torch", m, h, code))
    x, r, w = bq_data(rng, m, h, code)
    t = lambda a: torch.from_numpy(a.view(np.uint16).copy()).view(getattr(torch, TORCH_DTYPES[code])).to(device)
    for enable_pdl in ([None] if device == "cpu" else [True, False]):
        rd = t(r)
        q = torch.full((m, h), 0xAB, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
        bs = torch.full((h // 128, 4 * ((m + 3) // 4)), float("nan"), dtype=torch.float32, device=device)
        normed = torch.full((m, h), 0xAB, dtype=torch.uint8, device=device).repeat(1, 2).view(rd.dtype)
        fp4norm.fused_add_rmsnorm_fp8_block_quant(q, bs, normed, t(x), rd, t(w), 1e-6, enable_pdl)
        host = lambda a, dt: raw(a).numpy().view(dt).reshape(a.shape)
        bq_check(
            x, r, w, host(q, NP_FP8["e4m3"]), host(bs, np.float32),
            host(normed, x.dtype), host(rd, x.dtype),
        )


# ---------------------------------------------------------------------------------------
# FlashInfer's own parametrisation (tests/utils/test_norm.py), bytes instead of tolerances
# ---------------------------------------------------------------------------------------

FI_BATCH = [1, 19, 99, 989]
FI_HIDDEN = [111, 500, 1024, 3072, 3584, 4096, 8192, 16384]
FI_DTYPES = ["float16", "bfloat16"]
FI_QUANT = ["float8_e4m3fn", "float8_e5m2"]
FI_SCALES = [0.01, 1.0, 10.0]


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant_dtype", FI_QUANT)
@pytest.mark.parametrize("dtype", FI_DTYPES)
@pytest.mark.parametrize("hidden_size", FI_HIDDEN)
@pytest.mark.parametrize("batch_size", FI_BATCH)
@pytest.mark.parametrize("op", ["rmsnorm_quant", "fused_add_rmsnorm_quant"])
def test_flashinfer_shaped(op, batch_size, hidden_size, dtype, quant_dtype, device):
    """FlashInfer's test_norm_quant / test_fused_add_rmsnorm_quant: the same batch sizes,
    hidden sizes (111 and 500 among them: rows that end in a partial 8-element vector),
    dtypes and quant dtypes, randn inputs and weights, a 0-d scale tensor (quant_scale
    0.01, 1.0, 10.0), contiguous and strided inputs (``x[:, :hidden]`` of a twice-wide
    buffer), and on CUDA enable_pdl on and off; every byte of ``out`` and of the residual
    equal to the reference's."""
    cuda_or_skip(device)
    dt, qdt = getattr(torch, dtype), getattr(torch, quant_dtype)
    g = torch.Generator().manual_seed(seed_of(op, batch_size, hidden_size, dtype, quant_dtype))
    w = torch.randn(hidden_size, generator=g).to(dt)
    wide = torch.randn(batch_size, hidden_size * 2, generator=g).to(dt)
    residual = torch.randn(batch_size, hidden_size, generator=g).to(dt) if op != "rmsnorm_quant" else None
    wide_d, wd = wide.to(device), w.to(device)
    for i, quant_scale in enumerate(FI_SCALES):
        # FlashInfer's contiguous and strided inputs: x, or x[:, :hidden] of a wide buffer.
        strided = i == 1
        x = wide[:, :hidden_size] if strided else wide[:, hidden_size:].contiguous()
        xd = wide_d[:, :hidden_size] if strided else x.to(device)
        scale = torch.tensor(quant_scale)  # 0-d, as FlashInfer's test passes it
        y_ref = torch.empty(batch_size, hidden_size, dtype=qdt)
        if op == "rmsnorm_quant":
            reference.rmsnorm_quant(y_ref, x, w, scale)
        else:
            r_ref = residual.clone()
            reference.fused_add_rmsnorm_quant(y_ref, x, r_ref, w, scale)
        sd = scale.to(device)
        for enable_pdl in ([None] if device == "cpu" else [True, False]):
            y = torch.empty(batch_size, hidden_size, dtype=qdt, device=device)
            if op == "rmsnorm_quant":
                fp4norm.rmsnorm_quant(y, xd, wd, sd, enable_pdl=enable_pdl)
            else:
                rd = residual.to(device, copy=True)
                fp4norm.fused_add_rmsnorm_quant(y, xd, rd, wd, sd, 1e-6, enable_pdl=enable_pdl)
                assert same(rd, r_ref), f"residual differs (scale {quant_scale})"
            assert same(y, y_ref), f"out differs (scale {quant_scale}, pdl {enable_pdl})"


# ---------------------------------------------------------------------------------------
# CUDA only (skipped, visibly, without a GPU)
# ---------------------------------------------------------------------------------------


def _cuda():
    if torch is None:
        pytest.skip("torch is not installed: CUDA FP8 cases skipped")
    cuda_or_skip("cuda")
    if "cuda" not in DEVICES:
        pytest.skip("cuda not in FP4NORM_TEST_DEVICES")


CUDA_CASES = [
    (c, e, cfg, m, h)
    for (c, e, cfg), (m, h) in zip(
        itertools.product(DTYPES, ELEMENTS, CONFIGS),
        itertools.cycle([(1, 4096), (130, 2048), (257, 7168), (1000, 1024), (3, 16384), (64, 8192)]),
    )
]


@pytest.mark.parametrize(
    "code,elem,config,m,h",
    CUDA_CASES,
    ids=[f"{c}-{e}-{g}-{f}-{lay}-M{m}-H{h}" for c, e, (g, f, lay), m, h in CUDA_CASES],
)
def test_cuda_dynamic_identical_to_cpu(code, elem, config, m, h):
    """Every dynamic configuration on the GPU at decode and prefill sizes: the CPU's bytes
    (codes, scales with padding, residual, y_out), NaN and Inf rows included."""
    _cuda()
    group, fmt, layout = config
    dtype = getattr(torch, TORCH_DTYPES[code])
    x, r, w = tdata(m, h, dtype, "cpu", seed=seed_of(code, elem, config))
    if m > 5:
        x[3, 5] = float("nan")
        x[4, 17] = float("inf")
    kw = dict(element=elem, group=group, scale_format=fmt, scale_layout=layout)
    y_cpu, r_cpu = torch.empty_like(x), r.clone()
    cpu = fp4norm.add_rmsnorm_fp8quant(x, r_cpu, w, y_out=y_cpu, **kw)
    y_gpu, r_gpu = torch.full_like(x, 7.0).cuda(), r.cuda()
    sf = torch.full(cpu[1].shape, 0xAB, dtype=torch.uint8, device="cuda").view(cpu[1].dtype) if fmt == "ue8m0" else torch.full(cpu[1].shape, float("nan"), device="cuda")
    gpu = fp4norm.add_rmsnorm_fp8quant(x.cuda(), r_gpu, w.cuda(), None, sf, y_out=y_gpu, **kw)
    rms = fp4norm.rmsnorm_fp8quant(x.cuda(), w.cuda(), **kw)
    rms_cpu = fp4norm.rmsnorm_fp8quant(x, w, **kw)
    torch.cuda.synchronize()
    assert gpu[1] is sf
    for a, b in zip(cpu, gpu):
        assert b.device.type == "cuda" and a.shape == b.shape and a.dtype == b.dtype and same(a, b)
    assert same(r_cpu, r_gpu) and same(y_cpu, y_gpu)
    assert same(rms[0], rms_cpu[0]) and same(rms[1], rms_cpu[1])


@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_cuda_graph_static_scale_between_replays(mode):
    """FlashInfer's per-tensor scale is read by the kernel: a captured graph replayed after
    ``scale.fill_`` quantises with the new value (the CPU's bytes for it)."""
    _cuda()
    m, h = 256, 4096
    x, r, w = tdata(m, h, torch.bfloat16, "cpu", seed=5)
    xg, wg, r0 = x.cuda(), w.cuda(), r.cuda()
    rg = r0.clone()
    scale = torch.tensor([1.0], device="cuda")
    out = torch.empty(m, h, dtype=torch.float8_e4m3fn, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compiles the kernel (not a stream operation)
        fp4norm.fused_add_rmsnorm_quant(out, xg, rg, wg, scale)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=mode):
        fp4norm.fused_add_rmsnorm_quant(out, xg, rg, wg, scale)
    for value in (1.0, 0.37, 8.0, 1e-3):
        rg.copy_(r0)
        scale.fill_(value)
        graph.replay()
        ref = torch.empty(m, h, dtype=torch.float8_e4m3fn)
        r_cpu = r.clone()
        fp4norm.fused_add_rmsnorm_quant(ref, x, r_cpu, w, torch.tensor([value]))
        torch.cuda.synchronize()
        assert same(out, ref), f"replay with scale {value}"
        assert same(rg, r_cpu)


def test_cuda_non_default_stream_and_pdl():
    _cuda()
    m, h = 512, 4096
    x, r, w = tdata(m, h, torch.float16, "cpu", seed=8)
    xs = torch.zeros(m, h, dtype=x.dtype, device="cuda")
    rg, wg = r.cuda(), w.cuda()
    x_host = x.pin_memory()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(50_000_000)  # a kernel on any other stream would read the zeros in xs
        xs.copy_(x_host, non_blocking=True)
        q, s = fp4norm.add_rmsnorm_fp8quant(xs, rg, wg, group=128, scale_layout="column-major")
    stream.synchronize()
    r_cpu = r.clone()
    cq, cs = fp4norm.add_rmsnorm_fp8quant(x, r_cpu, w, group=128, scale_layout="column-major")
    assert same(q, cq) and same(s, cs) and same(rg, r_cpu)
    a = fp4norm.rmsnorm_mxfp8quant(x.cuda(), wg, enable_pdl=True)
    b = fp4norm.rmsnorm_mxfp8quant(x.cuda(), wg, enable_pdl=False)
    torch.cuda.synchronize()
    assert same(a[0], b[0]) and same(a[1], b[1])


def test_cuda_scale_on_host_is_refused():
    _cuda()
    c = Call("cuda")
    with pytest.raises(fp4norm.ArgumentError, match="scale is on cpu"):
        fp4norm.fused_add_rmsnorm_quant(c.out, c.x, c.r, c.w, torch.ones(1))
    with pytest.raises(fp4norm.ArgumentError, match="host arrays only"):
        fp4norm.dequantize_fp8(c.out, 0.5, group="tensor")
    torch.cuda.synchronize()
    assert c.untouched()


def test_cuda_torch_compile_cuda_graphs():
    _cuda()
    torch._dynamo.reset()
    h = 512
    _, _, w = tdata(1, h, torch.bfloat16, "cuda")
    scale = torch.tensor([0.5], device="cuda")

    def block(x, residual):
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        fp4norm.fused_add_rmsnorm_quant(out, x, residual, w, scale)
        q, s = fp4norm.rmsnorm_mxfp8quant(x, w)
        return out, q, s

    compiled = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    for m in (16, 16, 16, 64):
        x, r, _ = tdata(m, h, torch.bfloat16, "cuda", seed=m)
        r_eager, r_compiled = r.clone(), r.clone()
        eager = block(x, r_eager)
        comp = compiled(x, r_compiled)
        for a, b in zip(eager, comp):
            assert same(a, b)
        assert same(r_eager, r_compiled)
