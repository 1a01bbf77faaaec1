"""The fused all-reduce (SPEC.md §9) over PyTorch's symmetric memory: fp4norm.distributed's
transport="symmetric" (one kernel that copies this rank's rows into its workspace buffer,
meets the other ranks' CTAs through signal pads and reads every rank's buffer). Every
rank's bytes (codes, scales with their padding, residual; outputs poisoned first) equal
the fp4norm.reference.allreduce_* function over all ranks' inputs, and the
transport="gather" call's:

* one process, a one-rank NCCL group: FP4 (NVFP4 swizzled, MXFP4 row-major, both layouts
  with y_out and a Gemma weight bias), FP8 (per token, groups of 128, MXFP8, FlashInfer's
  static form), strided input rows, calls in a row (the pads back at 0 after each), the
  zero-copy input buffer and its growth, a CUDA graph captured and replayed with new
  inputs, "auto"'s choice, the operators' write rules (version counters, grad);
* several processes on one GPU (world size 2 and 4, all on cuda:0, a gloo group; decode
  shapes, so that every rank's grid is resident at once) and one process per GPU (2, 4, 8
  where the machine has them, NCCL);
* bad arguments refused before anything is written (the native checks of the peer
  arguments and the transport name need no GPU).

GPU cases skip, visibly, without CUDA. Where PyTorch cannot set up symmetric memory in a
configuration, its cases skip with PyTorch's own message; a rank that does not report in
time fails the case (a hang)."""

from __future__ import annotations

import os
import queue
import time
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: torch cases skipped")

import fp4norm  # noqa: E402
import fp4norm.distributed as fd  # noqa: E402
from fp4norm import _core, reference  # noqa: E402
from fp4_helpers import devices_under_test  # noqa: E402
from torch_helpers import ranks_data, raw  # noqa: E402

# The kernel needs no NVLink multicast: keep PyTorch's rendezvous from setting it up (here
# and in the spawned ranks, which inherit the environment).
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: GPU cases skipped")
DEV = torch.device("cuda", 0)
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# A spawned rank that has not reported by then is hung (its kernel waits for a peer); the
# ranks compile their kernels on first use, so allow for that.
RANK_TIMEOUT_S = float(os.environ.get("FP4NORM_RANK_TIMEOUT_S", "300"))


def poison(shape, dev, dtype=torch.uint8):
    """A tensor of 0xAB bytes, so that a byte the kernel misses shows."""
    size = torch.empty((), dtype=dtype).element_size()
    n = int(np.prod(shape)) * size
    return torch.full((n,), 0xAB, dtype=torch.uint8, device=dev).view(dtype).reshape(shape)


# ---------------------------------------------------------------------------------------
# The calls, shared by the one-process tests and the spawned ranks
# ---------------------------------------------------------------------------------------

# FP4 cases: (name, options of the call); "gs" adds a float32 global scale tensor.
FP4_CASES = {
    "nvfp4-swizzled": dict(is_sf_swizzled_layout=True, gs=1.75),
    "mxfp4-row-major": dict(block_size=32),
    "nvfp4-both-y_out-gemma": dict(output_both_sf_layouts=True, weight_bias=1.0, y_out=True, gs=0.5),
}
# FP8 cases: the options of add_rmsnorm_fp8quant, or "static" (FlashInfer's per-tensor form).
FP8_CASES = {
    "token-f32": dict(group="token", element="e4m3"),
    "g128-column-major": dict(group=128, scale_layout="column-major", element="e5m2"),
    "mxfp8": dict(group=32, scale_format="ue8m0", scale_layout="swizzled", element="e4m3"),
    "static": dict(static=0.375, element="e5m2"),
}


def fp4_run(name, x, r, wt, dev, call):
    """One FP4 case on this rank: poisoned outputs on ``dev``, ``call(x, r, wt, q, s,
    **kw)`` (``r`` a fresh copy, updated in place), the bytes of everything written."""
    kw = dict(FP4_CASES[name])
    gs = kw.pop("gs", None)
    want_y = kw.pop("y_out", False)
    lead, h = tuple(x.shape[:-1]), x.shape[-1]
    m = int(np.prod(lead))
    block = kw.get("block_size", 16)
    fmt = "e4m3" if block == 16 else "ue8m0"
    _, rm_len, sw_len = fp4norm.scale_sizes(m, h, block, fmt)
    both = kw.get("output_both_sf_layouts", False)
    swizzled = both or kw.get("is_sf_swizzled_layout", False)
    q = poison(lead + (h // 2,), dev)
    s = poison((sw_len,), dev) if swizzled else poison(lead + (h // block,), dev)
    if both:
        kw["block_scale_unswizzled"] = poison(lead + (h // block,), dev)
    if want_y:
        kw["y_out"] = poison(tuple(x.shape), dev, x.dtype)
    if gs is not None:
        kw["global_scale"] = torch.tensor([gs], dtype=torch.float32, device=dev)
    r = r.to(dev)
    got = call(x, r, wt, q, s, **kw)
    assert got[0] is q and got[1] is s, "the preallocated outputs are returned"
    outs = [q, s, r] + [kw[k] for k in ("block_scale_unswizzled", "y_out") if k in kw]
    return [raw(t).numpy().tobytes() for t in outs]


def fp4_reference(name, xs, r, wt):
    kw = dict(FP4_CASES[name])
    gs = kw.pop("gs", None)
    want_y = kw.pop("y_out", False)
    r = r.clone()
    y = torch.empty_like(r) if want_y else None
    got = reference.allreduce_add_rmsnorm_fp4quant(
        xs, r, wt, global_scale=None if gs is None else torch.tensor([gs]), y_out=y, **kw
    )
    outs = [got[0], got[1], r] + ([got[2]] if len(got) == 3 else []) + ([y] if want_y else [])
    return [raw(t).numpy().tobytes() for t in outs]


def fp8_run(name, x, r, wt, dev, transport, process_group=None):
    """One FP8 case on this rank through fp4norm.distributed, poisoned outputs."""
    kw = dict(FP8_CASES[name])
    m, h = int(np.prod(x.shape[:-1])), x.shape[-1]
    r = r.to(dev)
    q = poison(tuple(x.shape), dev)  # uint8 codes, the element named
    if "static" in kw:
        out = q.view(getattr(torch, {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[kw["element"]]))
        scale = torch.tensor([kw["static"]], dtype=torch.float32, device=dev)
        assert fd.allreduce_fused_add_rmsnorm_quant(
            out, x, r, wt, scale, group=process_group, transport=transport
        ) is None
        return [raw(t).numpy().tobytes() for t in (q, r)]
    fmt = kw.get("scale_format", "f32")
    _, n = fp4norm.fp8_scale_sizes(m, h, kw["group"], fmt, kw.get("scale_layout", "row-major"))
    s = poison((n,), dev, torch.float32 if fmt == "f32" else torch.uint8)
    got = fd.allreduce_add_rmsnorm_fp8quant(
        x, r, wt, q, s, process_group=process_group, transport=transport, **kw
    )
    assert got[0] is q and got[1] is s
    return [raw(t).numpy().tobytes() for t in (q, s, r)]


def fp8_reference(name, xs, r, wt):
    kw = dict(FP8_CASES[name])
    r = r.clone()
    if "static" in kw:
        dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[kw["element"]]
        out = torch.empty(xs[0].shape, dtype=dt)
        reference.allreduce_fused_add_rmsnorm_quant(out, xs, r, wt, kw["static"])
        return [raw(t).numpy().tobytes() for t in (out, r)]
    q, s = reference.allreduce_add_rmsnorm_fp8quant(xs, r, wt, **kw)
    return [raw(t).numpy().tobytes() for t in (q, s, r)]


def fp4_call(transport, group=None):
    def call(x, r, wt, q, s, **kw):
        gs = kw.pop("global_scale", None)
        return fd.allreduce_add_rmsnorm_fp4quant(
            x, r, wt, q, s, gs, group=group, transport=transport, **kw
        )

    return call


def assert_same(got, want, what):
    assert len(got) == len(want), what
    for k, (a, b) in enumerate(zip(got, want)):
        assert a == b, f"{what}: output {k} differs from the reference"


# ---------------------------------------------------------------------------------------
# No GPU needed: the native checks of the peer arguments, the transport name, host inputs
# ---------------------------------------------------------------------------------------


def _native_fp4(backend, peers=None, ranks=None):
    """A valid host FP4 call of ``_core.fused`` (live NumPy arrays) with peer arguments."""
    m, h = 2, 64
    x = np.zeros((m, h), np.float16)
    r = np.zeros((m, h), np.float16)
    w = np.ones(h, np.float16)
    q = np.zeros(m * h // 2, np.uint8)
    s = np.zeros(m * h // 16, np.uint8)
    mat = lambda a: (a.ctypes.data, m, h, h)  # noqa: E731
    args = (
        backend, 0, 0, "f16", mat(x), mat(r), (w.ctypes.data, h), (q.ctypes.data, q.size),
        (s.ctypes.data, s.size), None, None, None, 1e-6, 16, "e4m3",
    )
    _core.fused(*args, None, 0.0, ranks, **(peers or {}))


def _native_fp8(backend, peers=None):
    m, h = 2, 64
    x = np.zeros((m, h), np.float16)
    r = np.zeros((m, h), np.float16)
    w = np.ones(h, np.float16)
    q = np.zeros(m * h, np.uint8)
    s = np.zeros(m, np.float32)
    mat = lambda a: (a.ctypes.data, m, h, h)  # noqa: E731
    _core.fused_fp8(
        backend, 0, 0, "f16", mat(x), mat(r), (w.ctypes.data, h), (q.ctypes.data, q.size),
        (s.ctypes.data, s.size), None, None, None, "e4m3", -1, "f32", "row-major", 0.0, 1e-6,
        0.0, None, **(peers or {}),
    )


def _peers(n, pads=None, rank=0, words=4096):
    # Addresses the native layer must refuse before it uses any: never dereferenced.
    return dict(
        peer_buffers=[0x10000 * (k + 1) for k in range(n)], peer_row_stride=64,
        signal_pads=[0x900000 + 0x10000 * k for k in range(n if pads is None else pads)],
        signal_pad_words=words, rank=rank,
    )


@pytest.mark.parametrize("native", [_native_fp4, _native_fp8], ids=["fp4", "fp8"])
def test_native_peer_arguments_refused_before_any_launch(native):
    """``_core``'s peer arguments are checked (1 to 8 ranks, a pad per rank, this rank among
    them, the CUDA backend, both lists together) before any device is touched: the "cuda"
    cases here run without a GPU because they are refused first."""
    native("cpu")  # the plain host call is valid
    cases = [
        ("cpu", _peers(2), "CUDA backend only"),
        ("reference", _peers(1), "CUDA backend only"),
        ("cuda", _peers(9), "9 ranks: .* 1 to 8"),
        ("cuda", _peers(0), "0 ranks: .* 1 to 8"),
        ("cuda", _peers(3, pads=2), "2 signal pads for 3 ranks"),
        ("cuda", _peers(2, rank=2), "rank 2 of 2 ranks"),
        ("cuda", dict(peer_buffers=[0x10000]), "come together"),
        ("cuda", dict(signal_pads=[0x10000]), "come together"),
    ]
    for backend, peers, pattern in cases:
        with pytest.raises(fp4norm.ArgumentError, match=pattern):
            native(backend, peers)
    if native is _native_fp4:
        with pytest.raises(fp4norm.ArgumentError, match="not both"):
            _native_fp4("cuda", _peers(2), ranks=[(0x10000, 2, 64, 64)])


def test_peers_reach_the_native_layer_which_refuses_host_tensors():
    """fp4norm._api passes its peers to ``_core`` (FP4 and FP8): on host tensors the native
    layer refuses them, before anything is written."""
    from fp4norm import _api

    xs, r, wt = ranks_data(1, 4, 64, torch.bfloat16, seed=2)
    before = raw(r)
    peers = _api.Peers([0x10000, 0x20000], 64, [0x30000, 0x40000], 4096, 1)
    with pytest.raises(fp4norm.ArgumentError, match="CUDA backend only"):
        _api.fused(xs[0], r, wt, None, None, None, 1e-6, 16, None, False, False, None, None, None, peers=peers)
    with pytest.raises(fp4norm.ArgumentError, match="CUDA backend only"):
        _api.fused_fp8(xs[0], r, wt, None, None, None, None, 32, None, None, None, 1e-6, None, None, None, peers=peers)
    assert torch.equal(raw(r), before)


DEVICES = devices_under_test()


@pytest.mark.parametrize("device", DEVICES)
def test_bad_transport_and_host_input_refused_before_anything(device):
    """A transport that does not exist, or of the wrong type, and a host input are refused
    by every function of fp4norm.distributed (and the zero-copy helper's bad arguments)
    before any collective or write: no process group is needed to see it."""
    if device == "cuda" and not HAS_CUDA:
        pytest.skip("no CUDA device: CUDA cases skipped")
    xs, r, wt = ranks_data(1, 4, 64, torch.bfloat16, seed=1)
    x, r, wt = xs[0].to(device), r.to(device), wt.to(device)
    out = poison((4, 64), device, torch.float8_e4m3fn)
    before = (raw(r), raw(out))
    calls = [
        lambda t, xx: fd.allreduce_add_rmsnorm_fp4quant(xx, r, wt, transport=t),
        lambda t, xx: fd.allreduce_add_rmsnorm_fp8quant(xx, r, wt, group=32, transport=t),
        lambda t, xx: fd.allreduce_fused_add_rmsnorm_quant(out, xx, r, wt, 0.5, transport=t),
    ]
    for call in calls:
        with pytest.raises(fp4norm.ArgumentError, match="transport = 'nccl' is not supported"):
            call("nccl", x)
        with pytest.raises(fp4norm.ArgumentTypeError, match="transport must be a str"):
            call(None, x)
        for t in fd.TRANSPORTS:
            with pytest.raises(fp4norm.ArgumentError, match="CUDA tensor"):
                call(t, x.cpu())
    with pytest.raises(TypeError, match="unexpected keyword"):
        fd.allreduce_add_rmsnorm_fp8quant(x, r, wt, groups=32, transport="symmetric")
    with pytest.raises(fp4norm.ArgumentTypeError, match="dtype"):
        fd.symmetric_input_buffer((4, 64), torch.float32)
    with pytest.raises(fp4norm.ArgumentError, match=r"\[M, H\]"):
        fd.symmetric_input_buffer((64,), torch.bfloat16)
    with pytest.raises(fp4norm.ArgumentTypeError, match="shape"):
        fd.symmetric_input_buffer(64, torch.bfloat16)
    assert torch.equal(raw(r), before[0]) and torch.equal(raw(out), before[1])


def test_schedule_rule_is_rusts():
    """"symmetric" picks two-shot by the rule of Rust's PeerStrategy::for_call: never for 1
    or 2 ranks, from fewer rows the more ranks there are, alike for both 2-byte dtypes."""
    from fp4norm import _core

    for w in (1, 2):
        assert not _core.peer_two_shot(128, 16384, "bf16", w)
    assert not _core.peer_two_shot(1, 4096, "bf16", 8)
    assert _core.peer_two_shot(128, 8192, "bf16", 8)
    first = {
        w: next(m for m in range(1, 4097) if _core.peer_two_shot(m, 8192, "bf16", w))
        for w in (3, 4, 8)
    }
    assert first[8] < first[4] < first[3]
    assert all(_core.peer_two_shot(m, 8192, "f16", w) for w, m in first.items())
    with pytest.raises(fp4norm.ArgumentTypeError, match="unsupported dtype"):
        _core.peer_two_shot(1, 64, "f32", 4)


def test_signal_words_cover_the_one_shot_regime():
    """The first pad covers every call of "auto"'s symmetric sizes over 8 ranks; larger
    calls get larger pads (a word per CTA and rank, 16 CTAs per row at most)."""
    assert fd._signal_words(fd.SYMMETRIC_MAX_ROWS, 8) <= fd.SIGNAL_PAD_WORDS
    assert fd._signal_words(0, 1) == fd.SIGNAL_PAD_WORDS
    assert fd._signal_words(16384, 8) == 16384 * 16 * 8
    assert fd._signal_words(1000, 8) == 1024 * 16 * 8
    assert fd._grown(3 << 20, 0, 1 << 20) == 4 << 20
    assert fd._grown(5, 8, 1) == 8


# ---------------------------------------------------------------------------------------
# One process, a one-rank group
# ---------------------------------------------------------------------------------------


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank NCCL process group (the default group) with its symmetric workspace on
    cuda:0 set up; skipped, with PyTorch's message, where symmetric memory cannot be."""
    if not HAS_CUDA:
        pytest.skip("no CUDA device: GPU cases skipped")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available: skipped")
    torch.cuda.set_device(DEV)
    dist.init_process_group(
        "nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
        device_id=DEV,
    )
    try:
        try:
            fd.symmetric_input_buffer((1, 64), torch.bfloat16)
        except fd.SymmetricMemoryUnavailable as e:
            pytest.skip(f"torch symmetric memory cannot be set up on one rank: {e}")
        yield fd._WORKSPACES[fd._key(dist.group.WORLD, DEV)]
    finally:
        dist.destroy_process_group()


def pads_at_zero(ws):
    torch.cuda.synchronize()
    return int(ws.pad.count_nonzero()) == 0


@pytest.mark.parametrize("code", ["bf16", "f16"])
@pytest.mark.parametrize("name", list(FP4_CASES))
@pytest.mark.parametrize("m,h", [(1, 4096), (7, 2048), (128, 7168)])
def test_one_rank_fp4_symmetric_equals_reference_and_gather(one_rank, name, code, m, h):
    xs, r, wt = ranks_data(1, m, h, DTYPES[code], seed=17 * m + h)
    want = fp4_reference(name, xs, r, wt)
    x, wt_d = xs[0].to(DEV), wt.to(DEV)
    for transport in ("symmetric", "one_shot", "two_shot", "gather", "auto"):
        got = fp4_run(name, x, r, wt_d, DEV, fp4_call(transport))
        torch.cuda.synchronize()
        assert_same(got, want, f"transport={transport}")
    assert pads_at_zero(one_rank)


@pytest.mark.parametrize("name", list(FP8_CASES))
@pytest.mark.parametrize("m,h", [(1, 4096), (13, 2048), (128, 7168)])
def test_one_rank_fp8_symmetric_equals_reference_and_gather(one_rank, name, m, h):
    xs, r, wt = ranks_data(1, m, h, torch.bfloat16, seed=29 * m + h)
    want = fp8_reference(name, xs, r, wt)
    x, wt_d = xs[0].to(DEV), wt.to(DEV)
    for transport in ("symmetric", "one_shot", "two_shot", "gather", "auto"):
        got = fp8_run(name, x, r, wt_d, DEV, transport)
        torch.cuda.synchronize()
        assert_same(got, want, f"transport={transport}")
    assert pads_at_zero(one_rank)


def test_one_rank_calls_in_a_row_leave_the_pads_at_zero(one_rank):
    """Calls of different grids one after the other (FP4, FP8, FP4 of one row, 3-D input,
    strided rows): each writes the reference's bytes, and every pad word is 0 after each."""
    steps = [
        ("fp4", "nvfp4-swizzled", 5, 4096),
        ("fp8", "g128-column-major", 64, 1024),
        ("fp4", "mxfp4-row-major", 1, 8192),
        ("fp8", "static", 9, 512),
        ("fp4", "nvfp4-both-y_out-gemma", 33, 2048),
    ]
    for k, (op, name, m, h) in enumerate(steps):
        xs, r, wt = ranks_data(1, m, h, torch.bfloat16, seed=100 + k)
        wt_d = wt.to(DEV)
        if op == "fp4":
            want = fp4_reference(name, xs, r, wt)
            # Strided rows: a view into a wider buffer, which the kernel copies in.
            wide = torch.zeros(m, h + 64, dtype=torch.bfloat16, device=DEV)
            wide[:, :h] = xs[0].to(DEV)
            got = fp4_run(name, wide[:, :h], r, wt_d, DEV, fp4_call("symmetric"))
        else:
            want = fp8_reference(name, xs, r, wt)
            x = xs[0].to(DEV).reshape(1, m, h) if name == "static" else xs[0].to(DEV)
            got = fp8_run(name, x, r.reshape(x.shape), wt_d, DEV, "symmetric")
        torch.cuda.synchronize()
        assert_same(got, want, f"step {k} ({op} {name}, {m}x{h})")
        assert pads_at_zero(one_rank), f"step {k}: a signal word is not 0"


def test_one_rank_zero_copy_buffer_and_growth(one_rank):
    """symmetric_input_buffer's view is this rank's buffer (the kernel skips its copy);
    a larger shape grows the workspace (kept: the old view still works, copied in)."""
    m, h = 16, 4096
    xs, r, wt = ranks_data(1, m, h, torch.bfloat16, seed=5)
    buf = fd.symmetric_input_buffer((m, h), torch.bfloat16)
    assert buf.shape == (m, h) and buf.is_contiguous()
    assert buf.data_ptr() == one_rank.buffer_ptrs[one_rank.rank]
    buf.copy_(xs[0].to(DEV))
    want = fp4_reference("nvfp4-swizzled", xs, r, wt)
    for transport in ("symmetric", "auto"):
        got = fp4_run("nvfp4-swizzled", buf, r, wt.to(DEV), DEV, fp4_call(transport))
        torch.cuda.synchronize()
        assert_same(got, want, f"zero copy, transport={transport}")
        assert torch.equal(raw(buf), raw(xs[0])), "the buffer holds this rank's input"
    # Growth: a shape past the first buffer; the old view is kept alive, and copied in.
    # (Wider than whatever the tests before this one grew the workspace to.)
    before = one_rank.buffer_bytes
    hb = 8192
    while 128 * hb * 2 <= before:
        hb *= 2
    big = fd.symmetric_input_buffer((128, hb), torch.bfloat16)
    assert one_rank.buffer_bytes >= 128 * hb * 2 > before
    assert big.data_ptr() == one_rank.buffer_ptrs[0] != buf.data_ptr()
    got = fp4_run("nvfp4-swizzled", buf, r, wt.to(DEV), DEV, fp4_call("symmetric"))
    torch.cuda.synchronize()
    assert_same(got, want, "an old view after growth")
    xs, r, wt = ranks_data(1, 128, hb, torch.bfloat16, seed=6)
    big.copy_(xs[0].to(DEV))
    got = fp8_run("mxfp8", big, r, wt.to(DEV), DEV, "symmetric")
    torch.cuda.synchronize()
    assert_same(got, fp8_reference("mxfp8", xs, r, wt), "zero copy after growth")
    assert pads_at_zero(one_rank)


def test_one_rank_cuda_graph_replay(one_rank):
    """The symmetric calls (FP4 and FP8) captured in one CUDA graph after an eager warm-up
    write the reference's bytes for new inputs on every replay (outputs poisoned before
    each); the pads are 0 after each replay."""
    m, h = 16, 4096
    xs, r, wt = ranks_data(1, m, h, torch.bfloat16, seed=40)
    x_d, r_d, r8_d, wt_d = xs[0].to(DEV), r.to(DEV), r.to(DEV), wt.to(DEV)
    gs = torch.tensor([1.5], device=DEV)
    _, _, sw_len = fp4norm.scale_sizes(m, h, 16, "e4m3")
    q, s = poison((m, h // 2), DEV), poison((sw_len,), DEV)
    kw8 = dict(group=128, scale_layout="column-major", element="e4m3")
    q8 = poison((m, h), DEV)
    s8 = poison((fp4norm.fp8_scale_sizes(m, h, 128, "f32", "column-major")[1],), DEV, torch.float32)

    def step(res, res8):
        fd.allreduce_add_rmsnorm_fp4quant(
            x_d, res, wt_d, q, s, gs, is_sf_swizzled_layout=True, transport="symmetric"
        )
        fd.allreduce_add_rmsnorm_fp8quant(x_d, res8, wt_d, q8, s8, transport="symmetric", **kw8)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles the kernels outside the capture
        step(r_d.clone(), r8_d.clone())
    torch.cuda.current_stream().wait_stream(side)
    # (Wider than whatever the tests before this one grew the workspace to.)
    hw = 16384
    while one_rank.fits(fd.SYMMETRIC_MAX_ROWS, hw * 2):
        hw *= 2
    huge = torch.empty(fd.SYMMETRIC_MAX_ROWS, hw, dtype=torch.bfloat16, device=DEV)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(r_d, r8_d)
        # During capture "auto" decides from the workspace as it stands: no collective.
        decided = (fd._use_symmetric("auto", x_d, None)[0], fd._use_symmetric("auto", huge, None)[0])
    assert decided == (True, False)
    for trial in range(3):
        new_xs, new_r, _ = ranks_data(1, m, h, torch.bfloat16, seed=300 + trial)
        x_d.copy_(new_xs[0])
        r_d.copy_(new_r)
        r8_d.copy_(new_r)
        gs.fill_(0.5 + trial)
        for t in (q, s, q8):
            t.fill_(0xAB)
        s8.view(torch.uint8).fill_(0xAB)
        graph.replay()
        torch.cuda.synchronize()
        r_ref, r8_ref = new_r.clone(), new_r.clone()
        want = reference.allreduce_add_rmsnorm_fp4quant(
            new_xs, r_ref, wt, global_scale=torch.tensor([0.5 + trial]), is_sf_swizzled_layout=True
        )
        want8 = reference.allreduce_add_rmsnorm_fp8quant(new_xs, r8_ref, wt, **kw8)
        for name, a, b in (
            ("y_fp4", q, want[0]), ("block_scale", s, want[1]), ("residual", r_d, r_ref),
            ("fp8 out", q8, want8[0]), ("fp8 scales", s8, want8[1]), ("fp8 residual", r8_d, r8_ref),
        ):
            assert torch.equal(raw(a), raw(b)), f"replay {trial}: {name}"
        assert pads_at_zero(one_rank), f"replay {trial}: a signal word is not 0"


def test_one_rank_auto_rule_and_write_rules(one_rank):
    """"auto" is symmetric up to SYMMETRIC_MAX_ROWS rows, the all-gather past them; the
    symmetric transport keeps the operators' write rules (a residual that requires grad is
    refused before any write, version counters advance) and refuses a bad residual before
    anything is written."""
    h = 64
    rows = lambda m: torch.zeros(m, h, dtype=torch.bfloat16, device=DEV)  # noqa: E731
    assert fd._use_symmetric("auto", rows(fd.SYMMETRIC_MAX_ROWS), None)[0] is True
    assert fd._use_symmetric("auto", rows(fd.SYMMETRIC_MAX_ROWS + 1), None)[0] is False
    assert fd._use_symmetric("gather", rows(1), None)[0] is False
    assert fd._use_symmetric("symmetric", rows(4096), None)[0] is True
    xs, r, wt = ranks_data(1, 4, h, torch.bfloat16, seed=9)
    x, r_d, wt_d = xs[0].to(DEV), r.to(DEV), wt.to(DEV)
    v = r_d._version
    fd.allreduce_add_rmsnorm_fp4quant(x, r_d, wt_d, transport="symmetric")
    assert r_d._version > v
    leaf = r.to(DEV).float().bfloat16().detach().requires_grad_()
    before = raw(leaf)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        fd.allreduce_add_rmsnorm_fp4quant(x, leaf, wt_d, transport="symmetric")
    with pytest.raises(RuntimeError, match="leaf Variable"):
        fd.allreduce_add_rmsnorm_fp8quant(x, leaf, wt_d, transport="symmetric")
    out = poison((4, h), DEV, torch.float8_e4m3fn)
    bad_r = torch.zeros(5, h, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(fp4norm.ArgumentError, match="residual has shape"):
        fd.allreduce_fused_add_rmsnorm_quant(out, x, bad_r, wt_d, 0.5, transport="symmetric")
    torch.cuda.synchronize()
    assert torch.equal(raw(leaf), before) and torch.equal(raw(out), raw(poison((4, h), "cpu")))
    assert pads_at_zero(one_rank)


# ---------------------------------------------------------------------------------------
# Several ranks: spawned processes
# ---------------------------------------------------------------------------------------

# (kind, case, M, H): decode shapes, every rank's grid small enough to be resident with
# the others' on one GPU.
MULTI_STEPS = [
    ("fp4", "nvfp4-swizzled", 16, 4096),
    ("fp8", "g128-column-major", 16, 4096),
    ("fp4", "mxfp4-row-major", 5, 2048),
    ("fp8", "static", 3, 1024),
    ("fp8", "mxfp8", 9, 1024),
    ("fp4", "nvfp4-both-y_out-gemma", 16, 4096),
]
# One process per GPU: also prefill-like rows (each GPU's grid advances on its own).
PER_GPU_STEPS = MULTI_STEPS + [("fp4", "nvfp4-swizzled", 128, 8192), ("fp8", "token-f32", 128, 7168)]


def _steps_reference(steps, world, seed):
    want = []
    for k, (op, name, m, h) in enumerate(steps):
        xs, r, wt = ranks_data(world, m, h, torch.bfloat16, seed + k)
        want.append(fp4_reference(name, xs, r, wt) if op == "fp4" else fp8_reference(name, xs, r, wt))
    return want


def _steps_on_rank(steps, rank, world, seed, dev, transport, zero_copy):
    """This rank's outputs of every step (its input of the shared data); with
    ``zero_copy`` its input written into the symmetric buffer first. The pads are checked
    at 0 after each symmetric step, between two barriers: a rank that has finished its
    call may already have sent its next call's first signal into this rank's pad, which
    is the protocol working, not a word left behind."""
    import torch.distributed as dist

    got = []
    for k, (op, name, m, h) in enumerate(steps):
        xs, r, wt = ranks_data(world, m, h, torch.bfloat16, seed + k)
        x = xs[rank].to(dev)
        if zero_copy:
            x = fd.symmetric_input_buffer((m, h), torch.bfloat16, device=dev)
            x.copy_(xs[rank].to(dev))
        if op == "fp4":
            got.append(fp4_run(name, x, r, wt.to(dev), dev, fp4_call(transport)))
        else:
            got.append(fp8_run(name, x, r, wt.to(dev), dev, transport))
        torch.cuda.synchronize(dev)
        if transport in fd._SYMMETRIC:
            dist.barrier()  # every rank's call done
            ws = fd._WORKSPACES.get(fd._key(dist.group.WORLD, dev))
            left = int(ws.pad.count_nonzero())
            dist.barrier()  # every rank's pad read before any rank's next call
            if left != 0:
                raise AssertionError(f"step {k}: a signal word is not 0 after the call")
    return got


def _rank_main(rank, world, backend, per_gpu, store_path, seed, results):
    """One spawned rank: a process group (``backend``), its symmetric workspace (a refusal
    of PyTorch's is reported as a skip with its message), then the steps; its outputs'
    bytes, or its traceback, go back to the parent."""
    if not per_gpu:
        # Several ranks on one GPU: PyTorch refuses overlapping devices unless told.
        os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    import torch.distributed as dist

    stage = "process group"
    try:
        dev = torch.device("cuda", rank if per_gpu else 0)
        try:
            torch.cuda.set_device(dev)
            torch.empty(1, device=dev)
        except Exception as e:  # e.g. a GPU in exclusive-process mode: a configuration
            results.put((rank, "skip", f"rank {rank} cannot open {dev}: {type(e).__name__}: {e}"))
            return
        kwargs = dict(device_id=dev) if backend == "nccl" else {}
        dist.init_process_group(
            backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world, **kwargs
        )
        try:
            # The workspace set up as "auto" does on a fresh group (hosts and GPUs compared,
            # the ranks agreeing); its refusal is reported as a skip, with its reason.
            stage = "symmetric workspace"
            reason = fd._symmetric_reason(fd._group_object(None), dev)
            if reason is not None:
                results.put((rank, "skip", reason))
                return
            stage = "calls"
            steps = PER_GPU_STEPS if per_gpu else MULTI_STEPS
            # "auto" first: on a fresh group it sets the workspace up itself (and compares
            # the ranks' hosts and GPUs), then decides alike on every rank.
            out = {
                "auto": _steps_on_rank(steps, rank, world, seed, dev, "auto", False),
                "one_shot": _steps_on_rank(steps, rank, world, seed, dev, "one_shot", False),
                "two_shot": _steps_on_rank(steps, rank, world, seed, dev, "two_shot", False),
                "zero copy": _steps_on_rank(steps, rank, world, seed, dev, "one_shot", True),
                "zero copy, two-shot": _steps_on_rank(steps, rank, world, seed, dev, "two_shot", True),
            }
            if per_gpu:  # NCCL: the all-gather too
                out["gather"] = _steps_on_rank(steps, rank, world, seed, dev, "gather", False)
            results.put((rank, "ok", out))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", f"rank {rank}, {stage}:\n{traceback.format_exc()}"))


def _run_ranks(world, backend, per_gpu, store_path, seed):
    """Spawns the ranks and collects their reports: ``({rank: (status, payload)}, {rank:
    exit code})``. A rank that has not reported within RANK_TIMEOUT_S (or soon after
    another rank failed, or after it died) is missing from the reports; every rank still
    running then is killed."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(k, world, backend, per_gpu, store_path, seed, results))
        for k in range(world)
    ]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + RANK_TIMEOUT_S
    try:
        while len(got) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, status, payload = results.get(timeout=min(left, 5.0))
            except queue.Empty:
                if all(not procs[k].is_alive() for k in range(world) if k not in got):
                    break  # the ranks still missing died without a report
                continue
            got[rank] = (status, payload)
            if status != "ok":  # the others may wait for this rank forever: a short grace
                deadline = min(deadline, time.monotonic() + 20)
        while len(got) < world:  # reports already sent by ranks that have exited
            try:
                rank, status, payload = results.get(timeout=1.0)
            except queue.Empty:
                break
            got[rank] = (status, payload)
    finally:
        for p in procs:
            p.join(timeout=30 if len(got) == world else 1)
            if p.is_alive():
                p.kill()
                p.join()
    return got, {k: p.exitcode for k, p in enumerate(procs)}


def _check_ranks(reports, world, steps, seed, transports):
    got, exit_codes = reports
    errors = [payload for status, payload in got.values() if status == "error"]
    if errors:
        pytest.fail("\n\n".join(errors))
    skips = [payload for status, payload in got.values() if status == "skip"]
    if skips and len(skips) == world:
        pytest.skip(f"{world} ranks cannot be set up here: {skips[0]}")
    # Some ranks skipped and others did not report or went on: not a configuration.
    assert not skips, f"{len(skips)} of {world} ranks skipped ({skips[0]}); the others: " + str(
        {k: v[0] for k, v in got.items()}
    )
    missing = sorted(set(range(world)) - set(got))
    assert not missing, (
        f"ranks {missing} did not report within {RANK_TIMEOUT_S} s (exit codes "
        f"{ {k: exit_codes[k] for k in missing} }; killed: a hang; negative: a crash)"
    )
    want = _steps_reference(steps, world, seed)
    for rank in range(world):
        out = got[rank][1]
        assert sorted(out) == sorted(transports)
        for transport in transports:
            for k, (step, a, b) in enumerate(zip(steps, out[transport], want)):
                assert_same(a, b, f"rank {rank}, {transport}, step {k} {step}")


@needs_cuda
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_as_processes_on_one_gpu(world, tmp_path):
    """``world`` processes on cuda:0, a gloo group, symmetric memory over it: every rank's
    bytes (copying its input in, and writing it into the zero-copy buffer) equal the
    reference over all ranks' inputs."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available: skipped")
    seed = 1000 + world
    got = _run_ranks(world, "gloo", False, str(tmp_path / "store"), seed)
    _check_ranks(
        got, world, MULTI_STEPS, seed,
        ("auto", "one_shot", "two_shot", "zero copy", "zero copy, two-shot"),
    )


@needs_cuda
@pytest.mark.parametrize("world", [2, 4, 8])
def test_ranks_one_process_per_gpu(world, tmp_path):
    """One process per GPU, NCCL: every rank's bytes over the symmetric transport (copy and
    zero copy), the all-gather and "auto" equal the reference over all ranks' inputs."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"{world} ranks need {world} GPUs; this machine has {torch.cuda.device_count()}")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available: skipped")
    seed = 2000 + world
    got = _run_ranks(world, "nccl", True, str(tmp_path / "store"), seed)
    _check_ranks(
        got, world, PER_GPU_STEPS, seed,
        ("one_shot", "two_shot", "zero copy", "zero copy, two-shot", "gather", "auto"),
    )
