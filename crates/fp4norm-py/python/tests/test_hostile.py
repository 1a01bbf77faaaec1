"""Hostile input and resource leaks of the Python module on the CPU (RELIABILITY.md).

test_cpu.py's BAD_CALLS covers one wrong argument per rule; this file adds what it does
not: every output *and* y_out checked for writes after an error, the remaining dtypes
(float64, int16, bool, byte-swapped, object), overlapping rows made with as_strided,
partial and interleaved aliasing, the global scale aliasing an output, non-contiguous
inner dimensions of y_out and 3-D inputs, M = 0 / H = 0, the raw `_core` entry point with
sizes past isize::MAX, torch tensors whose storage was freed or shrunk (skipped without
torch), and a leak test: 10^5 calls (reference counts, RSS), then 3·10^4 calls under
tracemalloc.
"""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
import textwrap
import time
import tracemalloc

import numpy as np
import pytest

import fp4norm
from fp4_helpers import ml_dtypes, same_bytes

as_strided = np.lib.stride_tricks.as_strided

M, H = 4, 64


class Call:
    """Valid float16 arguments of one call; every buffer filled so that any write shows."""

    def __init__(self):
        rng = np.random.default_rng(7)
        self.x = rng.standard_normal((M, H)).astype(np.float16)
        self.r = rng.standard_normal((M, H)).astype(np.float16)
        self.w = np.ones(H, np.float16)
        self.q = np.full((M, H // 2), 0xAB, np.uint8)
        self.sf = np.full((M, H // 16), 0xAB, np.uint8)
        self.y = np.full((M, H), 0x5555, np.uint16).view(np.float16)
        self.snap = [a.copy() for a in (self.x, self.r, self.w, self.q, self.sf, self.y)]

    def kwargs(self, **change):
        kw = dict(input=self.x, residual=self.r, weight=self.w, y_fp4=self.q, block_scale=self.sf, y_out=self.y)
        kw.update(change)
        return kw

    def untouched(self):
        now = (self.x, self.r, self.w, self.q, self.sf, self.y)
        return all(same_bytes(a, b) for a, b in zip(now, self.snap))


def expect(exc, words, **change):
    """Calls with one argument changed: `exc` whose message holds every word, no write."""
    c = Call()
    kw = c.kwargs(**{k: (v(c) if callable(v) else v) for k, v in change.items()})
    with pytest.raises(exc) as info:
        fp4norm.add_rmsnorm_fp4quant(**kw)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    assert c.untouched(), "an error wrote into a buffer"
    return c


BAD = [
    # dtypes
    ("input float64", TypeError, ["input", "float64"], dict(input=lambda c: c.x.astype(np.float64))),
    ("input int16", TypeError, ["input", "int16"], dict(input=lambda c: c.x.view(np.int16))),
    ("input bool", TypeError, ["input"], dict(input=lambda c: np.zeros((M, H), bool))),
    ("input object", TypeError, ["input"], dict(input=lambda c: c.x.astype(object))),
    ("input byte-swapped", TypeError, ["input"], dict(input=lambda c: c.x.astype(">f2"))),
    ("residual byte-swapped", TypeError, ["residual"], dict(residual=lambda c: c.r.astype(">f2"))),
    ("weight float32", TypeError, ["weight"], dict(weight=lambda c: c.w.astype(np.float32))),
    ("y_out uint16", TypeError, ["y_out", "uint16"], dict(y_out=lambda c: np.zeros((M, H), np.uint16))),
    ("y_fp4 int8", TypeError, ["y_fp4"], dict(y_fp4=lambda c: c.q.view(np.int8))),
    ("block_scale float16", TypeError, ["block_scale"], dict(block_scale=lambda c: np.zeros((M, 2), np.float16))),
    ("global_scale float16", TypeError, ["global_scale"], dict(global_scale=np.ones(1, np.float16))),
    ("global_scale list", TypeError, ["global_scale"], dict(global_scale=[1.0])),
    ("weight list", TypeError, ["weight"], dict(weight=[1.0] * H)),
    # shapes
    ("residual 3-D of the same size", ValueError, ["residual", "shape"], dict(residual=lambda c: c.r.reshape(2, 2, H))),
    ("input 4-D", ValueError, ["input"], dict(input=lambda c: c.x.reshape(1, 2, 2, H))),
    ("weight 2-D", ValueError, ["weight"], dict(weight=lambda c: c.w.reshape(1, H))),
    ("y_out rows", ValueError, ["y_out", "shape"], dict(y_out=lambda c: c.y[:3])),
    ("H = 0", ValueError, ["H", "0"], dict(input=np.zeros((M, 0), np.float16), residual=np.zeros((M, 0), np.float16), weight=np.zeros(0, np.float16), y_fp4=None, block_scale=None, y_out=None)),
    ("global_scale per-row length", ValueError, ["global_scale"], dict(global_scale=np.ones(M + 1, np.float32))),
    # strides
    ("y_out inner stride", ValueError, ["y_out", "contiguous"], dict(y_out=lambda c: np.zeros((M, 2 * H), np.float16)[:, ::2])),
    ("3-D input inner stride", ValueError, ["input", "contiguous"], dict(input=lambda c: np.zeros((2, 2, 2 * H), np.float16)[:, :, ::2], residual=lambda c: c.r.reshape(2, 2, H))),
    ("residual rows overlap (as_strided)", ValueError, ["residual", "stride"], dict(residual=lambda c: as_strided(c.r, shape=(M, H), strides=(2, 2)))),
    ("residual rows stride 0 (as_strided)", ValueError, ["residual", "stride"], dict(residual=lambda c: as_strided(c.r, shape=(M, H), strides=(0, 2)))),
    ("input rows stride 0 (broadcast)", ValueError, ["input", "stride"], dict(input=lambda c: np.broadcast_to(c.x[0], (M, H)))),
    ("y_out strides not a multiple of the element", ValueError, ["y_out", "element size"], dict(y_out=lambda c: as_strided(np.zeros(M * H * 2 + 8, np.float16), shape=(M, H), strides=(2 * H + 1, 2)))),
    # aliasing
    ("y_out shifted over residual", ValueError, ["residual", "y_out", "overlap"], dict(residual=lambda c: _shifted()[0], y_out=lambda c: _shifted()[1])),
    ("y_out interleaved with residual", ValueError, ["overlap"], dict(residual=lambda c: _interleaved()[:, :H], y_out=lambda c: _interleaved()[:, H:])),
    ("residual over weight", ValueError, ["residual", "weight", "overlap"], dict(weight=lambda c: c.r[1])),
    ("y_fp4 inside y_out", ValueError, ["y_out", "y_fp4", "overlap"], dict(y_fp4=lambda c: c.y.view(np.uint8).reshape(-1)[: M * H // 2].reshape(M, H // 2))),
    ("global_scale inside block_scale", ValueError, ["global_scale", "block_scale", "overlap"], dict(block_scale=lambda c: _u8()[:16].reshape(M, 4), global_scale=lambda c: _u8()[:4].view(np.float32))),
]

_SHARED = {}


def _shifted():
    """Two row views of one buffer, the second starting two rows in."""
    if "shifted" not in _SHARED:
        buf = np.zeros((M + 2, H), np.float16)
        _SHARED["shifted"] = (buf[:M], buf[2:])
    return _SHARED["shifted"]


def _interleaved():
    return _SHARED.setdefault("interleaved", np.zeros((M, 2 * H), np.float16))


def _u8():
    return _SHARED.setdefault("u8", np.zeros(64, np.uint8))


@pytest.mark.parametrize("desc,exc,words,change", BAD, ids=[b[0] for b in BAD])
def test_bad_call_names_the_argument_and_writes_nothing(desc, exc, words, change):
    _SHARED.clear()
    expect(exc, words, **change)
    for a in _SHARED.values():  # buffers shared by two arguments: still all zero
        for v in a if isinstance(a, tuple) else (a,):
            base = v.base if v.base is not None else v
            assert not np.any(base.view(np.uint8)), f"{desc}: a shared buffer was written"


def test_read_only_inputs_may_alias():
    """input and weight are only read: sharing memory is allowed and gives the same bytes."""
    c = Call()
    w = c.x[1].copy()
    want = fp4norm.add_rmsnorm_fp4quant(c.x, c.r.copy(), w)
    got = fp4norm.add_rmsnorm_fp4quant(c.x, c.r.copy(), c.x[1])
    assert all(same_bytes(a, b) for a, b in zip(want, got))


def test_zero_rows():
    x = np.zeros((0, H), np.float16)
    r = np.zeros((0, H), np.float16)
    q, sf = fp4norm.add_rmsnorm_fp4quant(x, r, np.ones(H, np.float16))
    assert q.shape == (0, H // 2) and sf.shape == (0, H // 16)
    sw = np.full(0, 0xAB, np.uint8)
    q2, sf2 = fp4norm.rmsnorm_fp4quant(x, np.ones(H, np.float16), block_scale=sw, is_sf_swizzled_layout=True)
    assert sf2 is sw


def test_dequantize_bad_arguments_name_the_argument():
    q = np.zeros((M, H // 2), np.uint8)
    sf = np.zeros((M, H // 16), np.uint8)
    for kw, exc, word in [
        (dict(y_fp4=q.astype(np.float32)), TypeError, "y_fp4"),
        (dict(y_fp4=np.zeros((M, H), np.uint8)[:, ::2]), ValueError, "y_fp4"),
        (dict(block_scale=np.zeros((M, 8), np.uint8)[:, ::2]), ValueError, "block_scale"),
        (dict(global_scale=np.ones(2, np.float32)), ValueError, "global_scale"),
        (dict(m=-1, h=H), TypeError, "m"),
        (dict(m=M, h=H + 16), ValueError, "y_fp4"),
        (dict(scale_format="e5m2"), ValueError, "scale_format"),
    ]:
        args = dict(y_fp4=q, block_scale=sf)
        args.update(kw)
        with pytest.raises(exc) as info:
            fp4norm.dequantize(**args)
        assert word in str(info.value), (kw, str(info.value))


def test_raw_core_refuses_sizes_past_isize_max():
    """`_core.fused` trusts the extents the Python layer derives from live arrays, but
    checks their byte size. Before that check, a row stride of 2^63 elements (or a weight
    of 2^63 elements with M = 0) made `extent * 2` wrap in the release build, so the
    overlap check saw a 32-byte (or empty) range and the call went on to build a slice
    longer than the address space (undefined behaviour; with this stride, "row 1" is row 0
    again). Run in a child process so that a regression cannot take pytest down."""
    code = textwrap.dedent(
        """
        import numpy as np
        from fp4norm import _core
        x = np.ones((2, 16), np.float16); r = x.copy(); w = np.ones(16, np.float16)
        q = np.zeros(16, np.uint8); sf = np.zeros(2, np.uint8)
        p = lambda a: a.ctypes.data
        for name, xv, wv in [
            ("stride", (p(x), 2, 16, 2**63), (p(w), 16)),
            ("weight", (p(x), 0, 2**63, 2**63), (p(w), 2**63)),
        ]:
            try:
                _core.fused("cpu", 0, 0, "f16", xv, None, wv, (p(q), q.size if xv[1] else 0),
                            (p(sf), sf.size if xv[1] else 0), None, None, None, 1e-6, 16, "e4m3")
                print(name, "accepted")
            except ValueError as e:
                print(name, "ValueError", e)
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"child died ({res.returncode}): {res.stderr[-2000:]}"
    lines = res.stdout.splitlines()
    assert len(lines) == 2, res.stdout
    for line in lines:
        assert "ValueError" in line and "overflow" in line.lower(), line


# ---------------------------------------------------------------------------------------
# Leaks: 10^5 calls on small arrays
# ---------------------------------------------------------------------------------------

LEAK_CALLS = 100_000
TRACED_CALLS = 30_000


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (resource.getpagesize() // 1024)


def test_no_leaks_over_100k_calls():
    rng = np.random.default_rng(3)
    m, h = 2, 32
    dt = ml_dtypes.bfloat16 if ml_dtypes is not None else np.float16
    x = rng.standard_normal((m, h)).astype(dt)
    r = rng.standard_normal((m, h)).astype(dt)
    w = np.ones(h, dt)
    q = np.zeros((m, h // 2), np.uint8)
    sf = np.zeros((m, h // 16), np.uint8)
    sw = np.zeros(fp4norm.scale_sizes(m, h)[2], np.uint8)
    y = np.zeros((m, h), dt)
    gs = np.ones(m, np.float32)
    bad_w = np.ones(h + 16, dt)
    watched = dict(x=x, r=r, w=w, q=q, sf=sf, sw=sw, y=y, gs=gs, bad_w=bad_w)

    def one(i):
        k = i % 6
        if k == 0:  # preallocated outputs, in place
            fp4norm.add_rmsnorm_fp4quant(x, r, w, q, sf)
        elif k == 1:  # allocated outputs, swizzled, scalar global scale (a temporary array)
            fp4norm.add_rmsnorm_fp4quant(x, r, w, global_scale=2.0, is_sf_swizzled_layout=True)
        elif k == 2:  # no residual, both layouts, y_out, per-row global scale
            fp4norm.rmsnorm_fp4quant(x, w, q, sw, gs, output_both_sf_layouts=True, block_scale_unswizzled=sf, y_out=y)
        elif k == 3:
            fp4norm.dequantize(q, sf, gs)
        elif k == 4:  # an error from the Python layer
            try:
                fp4norm.add_rmsnorm_fp4quant(x, r, bad_w)
            except ValueError:
                pass
        else:  # an error from Rust (overlap), after the pointers were handed over
            try:
                fp4norm.add_rmsnorm_fp4quant(x, r, w, y_out=r)
            except ValueError:
                pass

    for i in range(3000):  # warm-up: rayon's pool, NumPy caches, interned strings
        one(i)
    gc.collect()

    # Phase 1, 10^5 calls untraced: reference counts exact, RSS flat.
    refs0 = {k: sys.getrefcount(v) for k, v in watched.items()}
    rss0, maxrss0 = _rss_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    for i in range(LEAK_CALLS):
        one(i)
    gc.collect()
    secs = time.perf_counter() - t0
    refs1 = {k: sys.getrefcount(v) for k, v in watched.items()}
    rss1, maxrss1 = _rss_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    # Phase 2, tracemalloc over TRACED_CALLS more calls in four quarters (tracing costs ~4x
    # per call, so not over all 10^5). Starting the trace makes the interpreter's free lists
    # and caches refill under it: bounded growth, measured on the H200's Python 3.12 with
    # torch loaded at ~26 KB then ~15 KB over two 15000-call halves, flat after. A per-call
    # leak grows in every quarter: at half a byte per call, 3.7 KB each. So the test takes
    # the smallest growth of quarters 2-4, and names the lines that grew over them.
    tracemalloc.start()
    gc.collect()
    quarter = TRACED_CALLS // 4
    traced = [tracemalloc.get_traced_memory()[0]]
    snapshot, snapshot_bytes = None, 0
    for k in range(4):
        for i in range(quarter):
            one(i)
        gc.collect()
        traced.append(tracemalloc.get_traced_memory()[0] - snapshot_bytes)
        if k == 0:
            # The snapshot's own (traced) memory is counted out of what follows.
            snapshot = tracemalloc.take_snapshot()
            snapshot_bytes = tracemalloc.get_traced_memory()[0] - traced[1]
    growth = [str(d) for d in tracemalloc.take_snapshot().compare_to(snapshot, "lineno")[:8] if d.size_diff > 0]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    per_quarter = [b - a for a, b in zip(traced, traced[1:])]
    report = (
        f"{LEAK_CALLS} calls in {secs:.1f} s: RSS {rss0} -> {rss1} KiB, max RSS {maxrss0} -> "
        f"{maxrss1} KiB, refcounts {refs0} -> {refs1}; then {TRACED_CALLS} traced calls: "
        f"tracemalloc growth per {quarter} calls {per_quarter} B (peak {peak} B); "
        f"growth by line over quarters 2-4: {growth}"
    )
    print(report)
    assert refs1 == refs0, report
    assert rss1 - rss0 < 8 * 1024, report
    assert maxrss1 - maxrss0 < 16 * 1024, report
    assert traced[4] - traced[0] < 64 * 1024, report
    assert min(per_quarter[1:]) < 4 * 1024, report


def test_torch_tensor_with_freed_or_shrunk_storage_is_refused():
    """A torch tensor whose storage was freed (`untyped_storage().resize_(0)`, as FSDP-style
    code does) or shrunk keeps its shape; fp4norm must refuse it, naming it, before it
    writes anything."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    w = torch.ones(H, dtype=torch.bfloat16)
    for shrink_to in (0, M * H):  # freed; half of the bf16 bytes left
        r = torch.randn(M, H, generator=g).to(torch.bfloat16)
        x0 = x.clone()
        r.untyped_storage().resize_(shrink_to)
        with pytest.raises(ValueError) as info:
            fp4norm.add_rmsnorm_fp4quant(x, r, w)
        assert "residual" in str(info.value) and "storage" in str(info.value), str(info.value)
        assert torch.equal(x, x0)
    # A view into the middle of a storage that was shrunk below the view's end.
    base = torch.randn(2 * M, H, generator=g).to(torch.bfloat16)
    view = base[M:]
    base.untyped_storage().resize_(M * H * 2 + 16)
    with pytest.raises(ValueError, match="input.*storage"):
        fp4norm.rmsnorm_fp4quant(view, w)


# ---------------------------------------------------------------------------------------
# Empty batches: [B, 0, H] and [0, H], every function, NumPy and torch
# ---------------------------------------------------------------------------------------

EMPTY_H = 128
FP8_EMPTY_CONFIGS = [
    dict(),
    dict(group=32, scale_format="ue8m0", scale_layout="swizzled"),
    dict(group=128, scale_layout="column-major"),
    dict(group=32, scale_format="ue8m0", scale_layout="column-major"),
    dict(group=64, scale_format="ue8m0"),
    dict(scale=1.0),
]


def _empty_inputs(kind, lead):
    shape = lead + (EMPTY_H,)
    if kind == "numpy":
        return np.zeros(shape, np.float16), np.zeros(shape, np.float16), np.ones(EMPTY_H, np.float16)
    torch = pytest.importorskip("torch")
    z = torch.zeros(shape, dtype=torch.float16)
    return z, z.clone(), torch.ones(EMPTY_H, dtype=torch.float16)


def _zeros_like(a):
    # (torch has no zero fill for packed FP4; these buffers have no elements anyway)
    return np.zeros_like(a) if isinstance(a, np.ndarray) else a.new_empty(a.shape)


def _bytes(a):
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()
    import torch

    return a.detach().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()


def _empty_cases():
    cases = []
    for b, fmt in ((16, "e4m3"), (32, "ue8m0")):
        for lay in ("row-major", "swizzled", "both"):
            flags = dict(
                block_size=b, scale_format=fmt, is_sf_swizzled_layout=lay == "swizzled",
                output_both_sf_layouts=lay == "both",
            )
            for res in (True, False):
                name = f"fp4-{b}{fmt}-{lay}{'' if res else '-norez'}"
                cases.append((name, "fp4", res, flags))
    for i, cfg in enumerate(FP8_EMPTY_CONFIGS):
        for res in (True, False):
            cases.append((f"fp8-{i}{'' if res else '-norez'}", "fp8", res, cfg))
    cases.append(("static", "static", True, {}))
    cases.append(("static-norez", "static", False, {}))
    cases.append(("block-quant", "block", True, {}))
    return cases


EMPTY_CASES = _empty_cases()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("lead", [(2, 0), (0,)], ids=["2x0xH", "0xH"])
@pytest.mark.parametrize("name,family,res,kw", EMPTY_CASES, ids=[c[0] for c in EMPTY_CASES])
def test_empty_batches(kind, lead, name, family, res, kw):
    """A batch with no rows, 3-D ``[2, 0, H]`` or 2-D ``[0, H]``, goes through every function
    (allocated outputs, then the same outputs preallocated) and gives the reference's
    outputs: a tensor without elements is contiguous, whatever its strides say."""
    x, r, w = _empty_inputs(kind, lead)
    ref = fp4norm.reference
    if family == "fp4":
        def call(mod, **outs):
            if res:
                return mod.add_rmsnorm_fp4quant(x, r, w, **outs, **kw)
            return mod.rmsnorm_fp4quant(x, w, **outs, **kw)

        want = call(ref)
        got = call(fp4norm)
        names = ["y_fp4", "block_scale", "block_scale_unswizzled"][: len(want)]
        pre = {n: _zeros_like(a) for n, a in zip(names, want)}
        got_pre = call(fp4norm, **pre)
        assert all(g is pre[n] for n, g in zip(names, got_pre))
        deq = fp4norm.dequantize(
            got[0], got[-1], block_size=kw["block_size"], scale_format=kw["scale_format"]
        )
        assert tuple(deq.shape) == lead + (EMPTY_H,)
    elif family == "fp8":
        def call(mod, **outs):
            if res:
                return mod.add_rmsnorm_fp8quant(x, r, w, **outs, **kw)
            return mod.rmsnorm_fp8quant(x, w, **outs, **kw)

        want = call(ref)
        got = call(fp4norm)
        pre = {"out": _zeros_like(want[0])}
        if "scale" not in kw:
            pre["scales_out"] = _zeros_like(want[1])
        got_pre = call(fp4norm, **pre)
        assert got_pre[0] is pre["out"]
        if "scale" not in kw:
            assert got_pre[1] is pre["scales_out"]
            deq = fp4norm.dequantize_fp8(
                got[0], got[1], group=kw.get("group", "token"),
                scale_format=kw.get("scale_format", "f32"),
                scale_layout=kw.get("scale_layout", "row-major"),
            )
            assert tuple(deq.shape) == lead + (EMPTY_H,)
    else:
        def fp8_out():
            if kind == "numpy":
                return np.zeros(x.shape, ml_dtypes.float8_e4m3fn)
            import torch

            return torch.zeros(x.shape, dtype=torch.float8_e4m3fn)

        def call(mod):
            out = fp8_out()
            if family == "static":
                if res:
                    mod.fused_add_rmsnorm_quant(out, x, r, w, 1.0)
                else:
                    mod.rmsnorm_quant(out, x, w, 1.0)
                return (out,)
            bs = _zeros_like(np.zeros((1, 0), np.float32) if kind == "numpy" else x.new_zeros(1, 0).float())
            normed = _zeros_like(x)
            mod.fused_add_rmsnorm_fp8_block_quant(out, bs, normed, x, r, w)
            return (out, bs, normed)

        want = call(ref)
        got = got_pre = call(fp4norm)
    for g, p, wnt in zip(got, got_pre, want):
        assert tuple(g.shape) == tuple(wnt.shape) == tuple(p.shape), name
        assert _bytes(g) == _bytes(wnt) == _bytes(p), name


def test_empty_batches_through_the_operators():
    """The operators themselves, with ``[2, 0, H]`` and ``[0, H]`` inputs: functional and
    ``.out`` forms, column-major FP8 scales of no rows, dequantisation."""
    torch = pytest.importorskip("torch")
    ops = torch.ops.fp4norm
    w = torch.ones(EMPTY_H, dtype=torch.bfloat16)
    for lead in ((2, 0), (0,)):
        x = torch.zeros(lead + (EMPTY_H,), dtype=torch.bfloat16)
        q, s = ops.rmsnorm_fp4quant(x, w)
        assert q.shape == lead + (EMPTY_H // 2,) and s.shape == lead + (EMPTY_H // 16,)
        q2, s2, u2 = ops.add_rmsnorm_fp4quant.both(x, x.clone(), w)
        assert s2.shape == (0,) and u2.shape == lead + (EMPTY_H // 16,)
        ops.add_rmsnorm_fp4quant.out(x, x.clone(), w, torch.empty_like(q), torch.empty_like(s))
        assert ops.dequantize(q, s).shape == lead + (EMPTY_H,)
        out, sc = ops.add_rmsnorm_fp8quant(x, x.clone(), w, group_size=128, scale_layout="column-major")
        assert out.shape == x.shape and sc.shape == (1, 0)
        ops.rmsnorm_fp8quant.out(x, w, torch.empty_like(out), torch.empty_like(sc), group_size=128, scale_layout="column-major")
        ops.rmsnorm_quant(torch.empty_like(out), x, w, torch.ones(1))


# ---------------------------------------------------------------------------------------
# residual=None where the op adds a residual
# ---------------------------------------------------------------------------------------


def _no_residual_calls(x, w, out8):
    """Every function whose op adds a residual, called with residual=None; out8 an FP8
    ``out`` of x's shape."""
    ref = fp4norm.reference
    return [
        ("add_rmsnorm_fp4quant", lambda: fp4norm.add_rmsnorm_fp4quant(x, None, w), "rmsnorm_fp4quant"),
        ("add_rmsnorm_fp8quant", lambda: fp4norm.add_rmsnorm_fp8quant(x, None, w), "rmsnorm_fp8quant"),
        ("add_rmsnorm_mxfp8quant", lambda: fp4norm.add_rmsnorm_mxfp8quant(x, None, w), "rmsnorm_mxfp8quant"),
        ("fused_add_rmsnorm_quant", lambda: fp4norm.fused_add_rmsnorm_quant(out8, x, None, w, 1.0), "rmsnorm_quant"),
        ("fused_add_rmsnorm_fp8_block_quant", lambda: fp4norm.fused_add_rmsnorm_fp8_block_quant(
            out8, _col_major_scales(x), None, x, None, w), None),
        ("allreduce_add_rmsnorm_fp4quant", lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([x, x], None, w), None),
        ("allreduce_add_rmsnorm_fp8quant", lambda: fp4norm.allreduce_add_rmsnorm_fp8quant([x, x], None, w), None),
        ("allreduce_fused_add_rmsnorm_quant", lambda: fp4norm.allreduce_fused_add_rmsnorm_quant(
            out8, [x, x], None, w, 1.0), None),
        ("reference.add_rmsnorm_fp4quant", lambda: ref.add_rmsnorm_fp4quant(x, None, w), "rmsnorm_fp4quant"),
        ("reference.add_rmsnorm_fp8quant", lambda: ref.add_rmsnorm_fp8quant(x, None, w), "rmsnorm_fp8quant"),
        ("reference.fused_add_rmsnorm_quant", lambda: ref.fused_add_rmsnorm_quant(out8, x, None, w, 1.0), "rmsnorm_quant"),
        ("reference.fused_add_rmsnorm_fp8_block_quant", lambda: ref.fused_add_rmsnorm_fp8_block_quant(
            out8, _col_major_scales(x), None, x, None, w), None),
        ("reference.allreduce_add_rmsnorm_fp4quant", lambda: ref.allreduce_add_rmsnorm_fp4quant([x, x], None, w), None),
        ("reference.allreduce_add_rmsnorm_fp8quant", lambda: ref.allreduce_add_rmsnorm_fp8quant([x, x], None, w), None),
        ("reference.allreduce_fused_add_rmsnorm_quant", lambda: ref.allreduce_fused_add_rmsnorm_quant(
            out8, [x, x], None, w, 1.0), None),
    ]


def _col_major_scales(x):
    m = x.shape[0]
    if isinstance(x, np.ndarray):
        return np.zeros((x.shape[-1] // 128, (m + 3) // 4 * 4), np.float32)
    import torch

    return torch.zeros(x.shape[-1] // 128, (m + 3) // 4 * 4)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_residual_none_is_refused_where_the_op_adds_one(kind):
    """FlashInfer's residual ops require the residual; ``residual=None`` used to drop the
    residual add silently (the op without residual ran). Now an ArgumentTypeError naming
    it, pointing at the form without residual, before anything is written."""
    m, h = 4, 128
    if kind == "numpy":
        x = np.ones((m, h), np.float16)
        w = np.ones(h, np.float16)
        out8 = np.full((m, h), 0xAB, np.uint8).view(ml_dtypes.float8_e4m3fn)
    else:
        torch = pytest.importorskip("torch")
        x = torch.ones(m, h, dtype=torch.float16)
        w = torch.ones(h, dtype=torch.float16)
        out8 = torch.full((m, h), 0xAB, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for name, call, instead in _no_residual_calls(x, w, out8):
        with pytest.raises(fp4norm.ArgumentTypeError, match="residual is required") as info:
            call()
        if instead is not None:
            assert f"{instead} for no residual" in str(info.value), (name, str(info.value))
        assert isinstance(info.value, AssertionError)
    assert np.all(np.asarray(out8.view(np.uint8) if kind == "numpy" else out8.view(torch.uint8)) == 0xAB)


# ---------------------------------------------------------------------------------------
# Counts and indices: fp4norm's classes, naming the argument
# ---------------------------------------------------------------------------------------

BAD_COUNTS = [
    ("scale_sizes m negative", fp4norm.ArgumentError, "m", lambda: fp4norm.scale_sizes(-3, 64)),
    ("scale_sizes h 2**64", fp4norm.ArgumentError, "h", lambda: fp4norm.scale_sizes(3, 2**64)),
    ("scale_sizes h float", fp4norm.ArgumentTypeError, "h", lambda: fp4norm.scale_sizes(3, 64.0)),
    ("scale_sizes m bool", fp4norm.ArgumentTypeError, "m", lambda: fp4norm.scale_sizes(True, 64)),
    ("fp8_scale_sizes m float", fp4norm.ArgumentTypeError, "m", lambda: fp4norm.fp8_scale_sizes(3.0, 64)),
    ("fp8_scale_sizes h negative", fp4norm.ArgumentError, "h", lambda: fp4norm.fp8_scale_sizes(3, -64)),
    ("cuda_device_info negative", fp4norm.ArgumentError, "device", lambda: fp4norm.cuda_device_info(-1)),
    ("cuda_device_info str", fp4norm.ArgumentTypeError, "device", lambda: fp4norm.cuda_device_info("0")),
]


@pytest.mark.parametrize("desc,exc,name,call", BAD_COUNTS, ids=[b[0] for b in BAD_COUNTS])
def test_bad_counts_raise_fp4norm_errors_naming_the_argument(desc, exc, name, call):
    """A count or device index that is negative, too large for the native layer or not an
    int raised OverflowError / TypeError from the binding; now fp4norm's classes."""
    with pytest.raises(exc) as info:
        call()
    assert type(info.value) is exc
    assert str(info.value).startswith(name + " "), str(info.value)
    # Numpy integers are ints.
    assert fp4norm.scale_sizes(np.int64(3), np.int32(64)) == fp4norm.scale_sizes(3, 64)


def test_numpy_dequantize_checks_m_and_h_before_allocating():
    """NumPy dequantize / dequantize_fp8 with m and h that do not fit the input: an
    ArgumentError naming it, not NumPy's \"array is too big\" or a MemoryError from
    allocating the output first."""
    q = np.zeros(32, np.uint8)
    sf = np.zeros(4, np.uint8)
    for m, h in ((2**62, 2**62), (2**40, 64), (3, 64)):
        with pytest.raises(fp4norm.ArgumentError, match="y_fp4 has 32 bytes"):
            fp4norm.dequantize(q, sf, m=m, h=h)
    q8 = np.zeros(64, np.uint8)
    for m, h in ((2**40, 64), (2**62, 2**62), (2, 64)):
        with pytest.raises(fp4norm.ArgumentError, match="q has 64 codes"):
            fp4norm.dequantize_fp8(q8, np.ones(1, np.float32), element="e4m3", m=m, h=h)
    # The right m and h still work (and give the reference's values).
    assert fp4norm.dequantize(q, sf, m=1, h=64).shape == (1, 64)
    assert fp4norm.dequantize_fp8(q8, np.ones(1, np.float32), element="e4m3", m=1, h=64).shape == (1, 64)
