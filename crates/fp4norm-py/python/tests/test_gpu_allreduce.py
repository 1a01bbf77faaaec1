"""The fused all-reduce (SPEC.md §9) from Python on CUDA: W = 1 … 8 ranks' inputs on one
device ("simulated ranks", the rows an all-gather leaves) through
fp4norm.allreduce_add_rmsnorm_fp4quant and, in front of the FP8 ops,
fp4norm.allreduce_add_rmsnorm_fp8quant / allreduce_add_rmsnorm_mxfp8quant /
allreduce_fused_add_rmsnorm_quant (the torch.ops operators), byte for byte against the
matching fp4norm.reference.allreduce_* function on CPU copies, outputs poisoned first; the
operators replayed in a CUDA graph and under torch.compile's CUDA graphs; the
torch.distributed path (fp4norm.distributed) on a one-rank NCCL group, and over real ranks
(one process per GPU, W = 1, 2, 4, 8 where the machine has that many GPUs); bad rank
inputs refused before any write. Skipped, visibly, without torch or CUDA."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: GPU tests skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: GPU tests skipped", allow_module_level=True)

import fp4norm  # noqa: E402
from fp4norm import reference  # noqa: E402
from torch_helpers import ranks_data, raw  # noqa: E402

DEV = torch.device("cuda", 0)
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def poisoned_outputs(kw, m, h, block_size, dev):
    """Preallocated outputs full of 0xAB, so that a byte the kernel misses shows."""
    fmt = "e4m3" if block_size == 16 else "ue8m0"
    _, rm_len, sw_len = fp4norm.scale_sizes(m, h, block_size, fmt)
    q = torch.full((m, h // 2), 0xAB, dtype=torch.uint8, device=dev)
    s = torch.full((sw_len if kw.get("is_sf_swizzled_layout") else rm_len,), 0xAB, dtype=torch.uint8, device=dev)
    return q, s


@pytest.mark.parametrize("code", ["bf16", "f16"])
@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("m,h,swizzled", [(1, 4096, True), (7, 64, False), (130, 2048, True), (33, 7168, False)])
def test_simulated_ranks_identical_to_reference(code, w, m, h, swizzled):
    dt = DTYPES[code]
    xs, r, wt = ranks_data(w, m, h, dt, seed=1000 * w + m)
    gs = torch.tensor([1.75], dtype=torch.float32)
    kw = dict(is_sf_swizzled_layout=swizzled)
    r_ref = r.clone()
    want = reference.allreduce_add_rmsnorm_fp4quant(
        xs, r_ref, wt, global_scale=gs, **kw
    )
    q, s = poisoned_outputs(kw, m, h, 16, DEV)
    r_gpu = r.to(DEV)
    got = fp4norm.allreduce_add_rmsnorm_fp4quant(
        [x.to(DEV) for x in xs], r_gpu, wt.to(DEV), q, s, gs.to(DEV), **kw
    )
    torch.cuda.synchronize()
    assert got[0] is q and got[1] is s
    assert torch.equal(raw(r_gpu), raw(r_ref)), "residual"
    assert torch.equal(raw(q), raw(want[0])), "y_fp4"
    assert torch.equal(raw(s).reshape(-1)[: raw(want[1]).numel()], raw(want[1])), "block_scale"


def test_mxfp4_both_layouts_and_gathered_rows():
    # The ranks' inputs as the rows of one all-gather buffer ([W, M, H], views).
    w, m, h = 4, 20, 1024
    xs, r, wt = ranks_data(w, m, h, torch.bfloat16, seed=7)
    gathered = torch.stack(xs).to(DEV)
    r_ref, r_gpu = r.clone(), r.to(DEV)
    kw = dict(block_size=32, output_both_sf_layouts=True, weight_bias=1.0)
    want = reference.allreduce_add_rmsnorm_fp4quant(xs, r_ref, wt, **kw)
    got = fp4norm.allreduce_add_rmsnorm_fp4quant(list(gathered.unbind(0)), r_gpu, wt.to(DEV), **kw)
    torch.cuda.synchronize()
    assert len(got) == 3
    for a, b in zip(got, want):
        assert torch.equal(raw(a), raw(b))
    assert torch.equal(raw(r_gpu), raw(r_ref))


def test_bad_rank_inputs_write_nothing():
    m, h = 4, 64
    xs, r, wt = ranks_data(2, m, h, torch.bfloat16, seed=3)
    r_gpu = r.to(DEV)
    before = r_gpu.clone()
    x0 = xs[0].to(DEV)
    with pytest.raises(fp4norm.ArgumentError, match=r"inputs\[1\]"):
        fp4norm.allreduce_add_rmsnorm_fp4quant([x0, torch.ones(m + 1, h, dtype=torch.bfloat16, device=DEV)], r_gpu, wt.to(DEV))
    with pytest.raises(fp4norm.ArgumentTypeError, match=r"inputs\[1\]"):
        fp4norm.allreduce_add_rmsnorm_fp4quant([x0, x0.half()], r_gpu, wt.to(DEV))
    with pytest.raises(fp4norm.ArgumentError, match=r"inputs\[1\]"):
        fp4norm.allreduce_add_rmsnorm_fp4quant([x0, xs[1]], r_gpu, wt.to(DEV))  # on the CPU
    with pytest.raises(fp4norm.ArgumentError, match="1 to 8"):
        fp4norm.allreduce_add_rmsnorm_fp4quant([x0] * 9, r_gpu, wt.to(DEV))
    with pytest.raises(fp4norm.ArgumentError, match="at least one rank"):
        fp4norm.allreduce_add_rmsnorm_fp4quant([], r_gpu, wt.to(DEV))
    torch.cuda.synchronize()
    assert torch.equal(raw(r_gpu), raw(before))


def test_cuda_graph_replay_and_compile_reduce_overhead():
    """The operator captured in a CUDA graph (preallocated outputs, poisoned before each
    replay) writes the reference's bytes for new inputs on every replay; under
    torch.compile(mode="reduce-overhead") (CUDA graphs by Inductor) the same as eager."""
    w, m, h = 4, 16, 4096
    xs, r, wt = ranks_data(w, m, h, torch.bfloat16, seed=21)
    xs_d, r_d, wt_d = [x.to(DEV) for x in xs], r.to(DEV), wt.to(DEV)
    kw = dict(is_sf_swizzled_layout=True)
    q, s = poisoned_outputs(kw, m, h, 16, DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles the kernel) outside the capture
        fp4norm.allreduce_add_rmsnorm_fp4quant(xs_d, r_d.clone(), wt_d, q, s, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4norm.allreduce_add_rmsnorm_fp4quant(xs_d, r_d, wt_d, q, s, **kw)
    for trial in range(3):
        new_xs, new_r, _ = ranks_data(w, m, h, torch.bfloat16, seed=100 + trial)
        for x_d, x in zip(xs_d, new_xs):
            x_d.copy_(x)
        r_d.copy_(new_r)
        q.fill_(0xAB)
        s.fill_(0xAB)
        graph.replay()
        torch.cuda.synchronize()
        r_ref = new_r.clone()
        want = reference.allreduce_add_rmsnorm_fp4quant(new_xs, r_ref, wt, **kw)
        assert torch.equal(raw(r_d), raw(r_ref)), f"replay {trial}: residual"
        assert torch.equal(raw(q), raw(want[0])), f"replay {trial}: y_fp4"
        assert torch.equal(raw(s).reshape(-1)[: raw(want[1]).numel()], raw(want[1])), f"replay {trial}"
    reduce_overhead_equals_eager(fp4norm.allreduce_add_rmsnorm_fp4quant, wt_d, h, **kw)


def reduce_overhead_equals_eager(fused, wt_d, h, **kw):
    """``fused`` (an fp4norm all-reduce function) on two ranks under
    torch.compile(mode="reduce-overhead") (CUDA graphs by Inductor) writes what it writes in
    eager mode, also as M changes."""
    torch._dynamo.reset()

    def norm(x0, x1, residual):
        return fused([x0, x1], residual, wt_d, **kw)

    compiled = torch.compile(norm, fullgraph=True, mode="reduce-overhead")
    for mm in (16, 16, 16, 64):
        ys, rr, _ = ranks_data(2, mm, h, torch.bfloat16, seed=mm)
        ys = [y.to(DEV) for y in ys]
        re, rc = rr.to(DEV), rr.to(DEV)
        qe, se = norm(ys[0], ys[1], re)
        qc, sc = compiled(ys[0], ys[1], rc)
        torch.cuda.synchronize()
        assert torch.equal(raw(qe), raw(qc)) and torch.equal(raw(se), raw(sc))
        assert torch.equal(raw(re), raw(rc))


# ---------------------------------------------------------------------------------------
# FP8 behind the all-reduce
# ---------------------------------------------------------------------------------------

FP8_CONFIGS = [
    dict(group="token"),
    dict(group="token", s_min=1.0 / (448 * 512)),
    dict(group="token", scale_format="ue8m0"),
    dict(group=32, scale_format="ue8m0", scale_layout="swizzled"),
    dict(group=64, scale_layout="column-major"),
    dict(group=128, scale_format="ue8m0"),
    dict(group=128, scale_layout="column-major"),
    dict(scale=0.375),
]
FP8_SHAPES = [(1, 4096), (7, 256), (130, 2048), (33, 7168)]
# Every W with every shape once; the configurations, dtypes and elements rotating.
FP8_CASES = [
    (w, m, h, FP8_CONFIGS[i % len(FP8_CONFIGS)], ("bf16", "f16")[(i // 8) % 2], ("e4m3", "e5m2")[(i // 3) % 2])
    for i, (w, (m, h)) in enumerate(itertools.product([1, 2, 3, 4, 5, 8], FP8_SHAPES))
]


def fp8_poisoned(m, h, cfg):
    """Preallocated FP8 outputs full of 0xAB: uint8 codes (their element named in the
    call) and, for dynamic scales, a flat scale buffer of the layout's length."""
    q = torch.full((m, h), 0xAB, dtype=torch.uint8, device=DEV)
    if "scale" in cfg:
        return q, None
    fmt = cfg.get("scale_format", "f32")
    _, n = fp4norm.fp8_scale_sizes(m, h, cfg["group"], fmt, cfg.get("scale_layout", "row-major"))
    size = 4 if fmt == "f32" else 1
    s = torch.full((n * size,), 0xAB, dtype=torch.uint8, device=DEV)
    return q, (s.view(torch.float32) if fmt == "f32" else s)


@pytest.mark.parametrize(
    "w,m,h,cfg,code,elem", FP8_CASES,
    ids=[f"w{w}-{m}x{h}-{'-'.join(map(str, c.values()))}-{code}-{e}" for w, m, h, c, code, e in FP8_CASES],
)
def test_fp8_simulated_ranks_identical_to_reference(w, m, h, cfg, code, elem):
    xs, r, wt = ranks_data(w, m, h, DTYPES[code], seed=1000 * w + m)
    r_ref = r.clone()
    want = reference.allreduce_add_rmsnorm_fp8quant(xs, r_ref, wt, element=elem, **cfg)
    q, s = fp8_poisoned(m, h, cfg)
    r_gpu = r.to(DEV)
    got = fp4norm.allreduce_add_rmsnorm_fp8quant([x.to(DEV) for x in xs], r_gpu, wt.to(DEV), q, s, element=elem, **cfg)
    torch.cuda.synchronize()
    assert got[0] is q and (s is None or got[1] is s)
    assert torch.equal(raw(r_gpu), raw(r_ref)), "residual"
    assert torch.equal(raw(q), raw(want[0])), "out"
    assert torch.equal(raw(got[1]), raw(want[1])), "scales (and their padding)"
    if "scale" in cfg:  # FlashInfer's form, the scale read from device memory
        out = torch.full((m, h), 0xAB, dtype=torch.uint8, device=DEV).view(want[0].dtype)
        r_gpu = r.to(DEV)
        fp4norm.allreduce_fused_add_rmsnorm_quant(
            out, [x.to(DEV) for x in xs], r_gpu, wt.to(DEV), torch.tensor([cfg["scale"]], device=DEV)
        )
        torch.cuda.synchronize()
        assert torch.equal(raw(out), raw(want[0])) and torch.equal(raw(r_gpu), raw(r_ref))


def test_fp8_gathered_rows_mxfp8_and_y_out():
    # The ranks' inputs as the rows of one all-gather buffer ([W, M, H], views).
    w, m, h = 4, 20, 1024
    xs, r, wt = ranks_data(w, m, h, torch.bfloat16, seed=8)
    gathered = torch.stack(xs).to(DEV)
    r_ref, r_gpu = r.clone(), r.to(DEV)
    y_ref, y_gpu = torch.empty_like(r), torch.empty(m, h, dtype=torch.bfloat16, device=DEV)
    want = reference.allreduce_add_rmsnorm_fp8quant(
        xs, r_ref, wt, element="e4m3", group=32, scale_format="ue8m0", scale_layout="swizzled",
        y_out=y_ref, weight_bias=1.0,
    )
    got = fp4norm.allreduce_add_rmsnorm_mxfp8quant(list(gathered.unbind(0)), r_gpu, wt.to(DEV), y_out=y_gpu, weight_bias=1.0)
    torch.cuda.synchronize()
    for a, b in zip((*got, r_gpu, y_gpu), (*want, r_ref, y_ref)):
        assert torch.equal(raw(a), raw(b))


def test_fp8_bad_rank_inputs_write_nothing():
    m, h = 4, 64
    xs, r, wt = ranks_data(2, m, h, torch.bfloat16, seed=3)
    r_gpu, x0, wt_d = r.to(DEV), xs[0].to(DEV), wt.to(DEV)
    out = torch.full((m, h), 0xAB, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    before = (raw(r_gpu), raw(out))
    bad = [
        ([x0, torch.ones(m + 1, h, dtype=torch.bfloat16, device=DEV)], fp4norm.ArgumentError, r"inputs\[1\]"),
        ([x0, x0.half()], fp4norm.ArgumentTypeError, r"inputs\[1\]"),
        ([x0, xs[1]], fp4norm.ArgumentError, r"inputs\[1\]"),  # on the CPU
        ([x0] * 9, fp4norm.ArgumentError, "1 to 8"),
        ([], fp4norm.ArgumentError, "at least one rank"),
    ]
    for inputs, cls, pattern in bad:
        with pytest.raises(cls, match=pattern):
            fp4norm.allreduce_add_rmsnorm_fp8quant(inputs, r_gpu, wt_d, group=32)
        with pytest.raises(cls, match=pattern):
            fp4norm.allreduce_fused_add_rmsnorm_quant(out, inputs, r_gpu, wt_d, 1.0)
    torch.cuda.synchronize()
    assert torch.equal(raw(r_gpu), before[0]) and torch.equal(raw(out), before[1])


def test_fp8_cuda_graph_replay_and_compile_reduce_overhead():
    """The FP8 all-reduce operators captured in a CUDA graph (preallocated outputs poisoned
    before each replay; the static scale's value changed between replays, read by the
    kernel) write the reference's bytes for new inputs on every replay; under
    torch.compile(mode="reduce-overhead") the same as eager."""
    w, m, h = 3, 16, 4096
    xs, r, wt = ranks_data(w, m, h, torch.bfloat16, seed=22)
    xs_d, r_d, wt_d = [x.to(DEV) for x in xs], r.to(DEV), wt.to(DEV)
    kw = dict(group=128, scale_layout="column-major")
    q, s = fp8_poisoned(m, h, kw)
    out = torch.empty(m, h, dtype=torch.float8_e5m2, device=DEV)
    scale = torch.tensor([0.5], device=DEV)
    r2_d = r_d.clone()

    def step():
        fp4norm.allreduce_add_rmsnorm_fp8quant(xs_d, r_d, wt_d, q, s, element="e4m3", **kw)
        fp4norm.allreduce_fused_add_rmsnorm_quant(out, xs_d, r2_d, wt_d, scale)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles the kernels) outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for trial in range(3):
        new_xs, new_r, _ = ranks_data(w, m, h, torch.bfloat16, seed=200 + trial)
        for x_d, x in zip(xs_d, new_xs):
            x_d.copy_(x)
        r_d.copy_(new_r)
        r2_d.copy_(new_r)
        scale.fill_(0.25 * (trial + 1))
        q.fill_(0xAB)
        s.view(torch.uint8).fill_(0xAB)
        out.view(torch.uint8).fill_(0xAB)
        graph.replay()
        torch.cuda.synchronize()
        r_ref, r2_ref = new_r.clone(), new_r.clone()
        want = reference.allreduce_add_rmsnorm_fp8quant(new_xs, r_ref, wt, element="e4m3", **kw)
        out_ref = torch.empty(m, h, dtype=torch.float8_e5m2)
        reference.allreduce_fused_add_rmsnorm_quant(out_ref, new_xs, r2_ref, wt, 0.25 * (trial + 1))
        assert torch.equal(raw(q), raw(want[0])) and torch.equal(raw(s), raw(want[1])), f"replay {trial}"
        assert torch.equal(raw(r_d), raw(r_ref)) and torch.equal(raw(r2_d), raw(r2_ref)), f"replay {trial}"
        assert torch.equal(raw(out), raw(out_ref)), f"replay {trial}: static"
    reduce_overhead_equals_eager(fp4norm.allreduce_add_rmsnorm_fp8quant, wt_d, h, **kw)


@pytest.fixture
def one_rank_group(tmp_path):
    """A one-rank NCCL process group (the default group) for the test's duration."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available: skipped")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=DEV)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_torch_distributed_one_rank_group(one_rank_group):
    import fp4norm.distributed as fd

    m, h = 9, 2048
    xs, r, wt = ranks_data(1, m, h, torch.bfloat16, seed=11)
    r_ref, r_gpu = r.clone(), r.to(DEV)
    want = reference.allreduce_add_rmsnorm_fp4quant(xs, r_ref, wt, is_sf_swizzled_layout=True)
    got = fd.allreduce_add_rmsnorm_fp4quant(xs[0].to(DEV), r_gpu, wt.to(DEV), is_sf_swizzled_layout=True)
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(raw(a), raw(b))
    assert torch.equal(raw(r_gpu), raw(r_ref))
    with pytest.raises(fp4norm.ArgumentError, match="contiguous"):
        fd.allreduce_add_rmsnorm_fp4quant(xs[0].to(DEV).t().contiguous().t(), r_gpu, wt.to(DEV))


def test_torch_distributed_one_rank_group_fp8(one_rank_group):
    """fp4norm.distributed's FP8 forms: the dynamic one (``group`` the scale group, the
    process group ``process_group``) and FlashInfer's static one (``group`` the process
    group), each the reference's bytes."""
    import fp4norm.distributed as fd

    m, h = 9, 2048
    xs, r, wt = ranks_data(1, m, h, torch.bfloat16, seed=12)
    kw = dict(group=128, scale_format="ue8m0", scale_layout="column-major", element="e5m2")
    r_ref, r_gpu = r.clone(), r.to(DEV)
    want = reference.allreduce_add_rmsnorm_fp8quant(xs, r_ref, wt, **kw)
    got = fd.allreduce_add_rmsnorm_fp8quant(xs[0].to(DEV), r_gpu, wt.to(DEV), process_group=None, **kw)
    torch.cuda.synchronize()
    for a, b in zip((*got, r_gpu), (*want, r_ref)):
        assert torch.equal(raw(a), raw(b))
    out_ref = torch.empty(m, h, dtype=torch.float8_e4m3fn)
    out = torch.full((m, h), 0xAB, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    reference.allreduce_fused_add_rmsnorm_quant(out_ref, xs, r_ref, wt, 0.5)
    scale = torch.tensor([0.5], device=DEV)
    fd.allreduce_fused_add_rmsnorm_quant(out, xs[0].to(DEV), r_gpu, wt.to(DEV), scale, group=None)
    torch.cuda.synchronize()
    assert torch.equal(raw(out), raw(out_ref)) and torch.equal(raw(r_gpu), raw(r_ref))


# The FP8 call of the real-ranks test: per-group f32 scales, column-major (Hopper's GEMMs).
REAL_FP8 = dict(group=128, scale_layout="column-major")


def _real_rank(rank, world, store_path, m, h, seed, results):
    """One rank of test_real_ranks_write_the_reference_bytes_on_every_rank (a spawned
    process): its input of the shared data, the residual every rank holds, the fused
    all-reduce over NCCL; its outputs' bytes go back to the parent."""
    import torch.distributed as dist

    import fp4norm.distributed as fd

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group(
        "nccl", store=dist.FileStore(store_path, world), rank=rank, world_size=world, device_id=dev
    )
    try:
        xs, r, wt = ranks_data(world, m, h, torch.bfloat16, seed)
        r_dev, r8_dev = r.to(dev), r.to(dev)
        got = fd.allreduce_add_rmsnorm_fp4quant(
            xs[rank].to(dev), r_dev, wt.to(dev), is_sf_swizzled_layout=True
        )
        got8 = fd.allreduce_add_rmsnorm_fp8quant(xs[rank].to(dev), r8_dev, wt.to(dev), **REAL_FP8)
        torch.cuda.synchronize()
        results.put((rank, [raw(t).numpy().tobytes() for t in (*got, r_dev, *got8, r8_dev)]))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("m,h", [(1, 4096), (128, 8192)])
def test_real_ranks_write_the_reference_bytes_on_every_rank(world, m, h, tmp_path):
    """SPEC.md §9 over real ranks: one process per GPU, NCCL, fp4norm.distributed; every
    rank's y_fp4, block scales and residual, and its FP8 codes, scales and residual, equal
    the host reference's bytes."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"{world} ranks need {world} GPUs; this machine has {torch.cuda.device_count()}")
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available: skipped")
    seed = 31 * world + m
    xs, r, wt = ranks_data(world, m, h, torch.bfloat16, seed)
    r_ref, r8_ref = r.clone(), r.clone()
    want = reference.allreduce_add_rmsnorm_fp4quant(xs, r_ref, wt, is_sf_swizzled_layout=True)
    want8 = reference.allreduce_add_rmsnorm_fp8quant(xs, r8_ref, wt, **REAL_FP8)
    want = [raw(t).numpy().tobytes() for t in (*want, r_ref, *want8, r8_ref)]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_real_rank, args=(k, world, str(tmp_path / "store"), m, h, seed, results))
        for k in range(world)
    ]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"a rank exited with {p.exitcode}"
    names = ("y_fp4", "block_scale", "residual", "fp8 out", "fp8 scales", "fp8 residual")
    for rank in range(world):
        for name, a, b in zip(names, got[rank], want):
            assert a == b, f"rank {rank}: {name} differs from the reference"
