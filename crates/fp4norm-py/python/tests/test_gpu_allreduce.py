"""The fused all-reduce (SPEC.md §9) from Python on CUDA: W = 1 … 8 ranks' inputs on one
device ("simulated ranks", the rows an all-gather leaves) through
fp4norm.allreduce_add_rmsnorm_fp4quant (the torch.ops operator), byte for byte against
fp4norm.reference.allreduce_add_rmsnorm_fp4quant on CPU copies, outputs poisoned first; the
operator replayed in a CUDA graph and under torch.compile's CUDA graphs; the
torch.distributed path (fp4norm.distributed) on a one-rank NCCL group, and over real ranks
(one process per GPU, W = 1, 2, 4, 8 where the machine has that many GPUs); bad rank
inputs refused before any write. Skipped, visibly, without torch or CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: GPU tests skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: GPU tests skipped", allow_module_level=True)

import fp4norm  # noqa: E402
from fp4norm import reference  # noqa: E402

DEV = torch.device("cuda", 0)
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def raw(t):
    return t.contiguous().view(torch.uint8).reshape(-1).cpu()


def ranks_data(w, m, h, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [(torch.randn(m, h, generator=g) * (k + 1)).to(dtype) for k in range(w)]
    if m > 3:
        xs[0][1] = 0  # cancellation across ranks: rank 1 gets minus rank 0's row
        xs[-1][1] = 0
        xs[0][2, :8] = 1e4
        if w > 1:
            xs[1][2, :8] = -1e4
        xs[w // 2][3, 5] = float("nan")
    r = (torch.randn(m, h, generator=g) * 2).to(dtype)
    wt = (1 + 0.25 * torch.randn(h, generator=g)).to(dtype)
    return xs, r, wt


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

    torch._dynamo.reset()

    def norm(x0, x1, residual):
        return fp4norm.allreduce_add_rmsnorm_fp4quant([x0, x1], residual, wt_d, **kw)

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


def test_torch_distributed_one_rank_group(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available: skipped")
    import fp4norm.distributed as fd

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=DEV)
    try:
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
    finally:
        dist.destroy_process_group()


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
        r_dev = r.to(dev)
        got = fd.allreduce_add_rmsnorm_fp4quant(
            xs[rank].to(dev), r_dev, wt.to(dev), is_sf_swizzled_layout=True
        )
        torch.cuda.synchronize()
        results.put((rank, [raw(t).numpy().tobytes() for t in (*got, r_dev)]))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("m,h", [(1, 4096), (128, 8192)])
def test_real_ranks_write_the_reference_bytes_on_every_rank(world, m, h, tmp_path):
    """SPEC.md §9 over real ranks: one process per GPU, NCCL, fp4norm.distributed; every
    rank's y_fp4, block scales and residual equal the host reference's bytes."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"{world} ranks need {world} GPUs; this machine has {torch.cuda.device_count()}")
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available: skipped")
    seed = 31 * world + m
    xs, r, wt = ranks_data(world, m, h, torch.bfloat16, seed)
    r_ref = r.clone()
    want = reference.allreduce_add_rmsnorm_fp4quant(xs, r_ref, wt, is_sf_swizzled_layout=True)
    want = [raw(t).numpy().tobytes() for t in (*want, r_ref)]
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
    for rank in range(world):
        for name, a, b in zip(("y_fp4", "block_scale", "residual"), got[rank], want):
            assert a == b, f"rank {rank}: {name} differs from the reference"
