"""The fused all-reduce + op (SPEC.md §9) against NCCL all-reduce + the op, one process per
GPU, at decode sizes: bf16, NVFP4, swizzled scales. Run by torchrun on a multi-GPU host:

    PYTHONPATH=<fp4norm wheel> torchrun --nproc-per-node W scripts/allreduce-bench.py \
        [--rows 1,4,16,64,128,256,512] [--hidden 4096,8192] [--json FILE]

Per cell, µs per call of
  nccl+op    torch.distributed.all_reduce (NCCL; AVG, so that replays keep the magnitudes,
             at SUM's cost), then fp4norm.add_rmsnorm_fp4quant: the unfused path (its sum
             is NCCL's, not SPEC.md §9's: not bit-exact);
  one_shot   fp4norm.distributed.allreduce_add_rmsnorm_fp4quant(transport="one_shot"):
             one kernel reading every rank's input over symmetric memory;
  two_shot   the same, each rank summing a 1/W share first (transport="two_shot");
  gather     the same with transport="gather" (an all-gather, then the kernel).
The fp4norm paths are checked against each other once per cell (the same bytes on a
fresh residual). Timing: each path captured in a CUDA graph of --calls calls on every
rank (eager timing where capture fails, marked), replayed --reps times; the median per
call, then the slowest rank's. Rank 0 prints one line per cell and writes the JSON.
"""
import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

import fp4norm
import fp4norm.distributed as fd


def timed(fn, calls, reps):
    """(µs per call, "graph" or "eager"): fn captured CALLS times in a CUDA graph and
    replayed, or called eagerly where capture fails."""
    for _ in range(3):  # warm-up: kernels built, the workspace grown, NCCL connected
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    mode = "graph"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        run = graph.replay
    except Exception as e:  # a collective this torch/NCCL cannot capture
        if dist.get_rank() == 0:
            print(f"  (capture failed: {type(e).__name__}: {e}; timing eager calls)")
        mode = "eager"

        def run():
            for _ in range(calls):
                fn()

    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item()), mode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # (Not --m or --h: torchrun would take those as abbreviations of its own options.)
    ap.add_argument("--rows", default="1,4,16,64,128,256,512")
    ap.add_argument("--hidden", default="4096,8192")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    gs = torch.tensor([1.0], device=dev)
    opts = dict(global_scale=gs, is_sf_swizzled_layout=True)
    cells = []
    if rank == 0:
        print(f"{world} ranks, {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
        print("   M      H   nccl+op µs   one_shot µs (vs nccl+op)   two_shot µs (vs)   gather µs (vs)")
    for h in (int(v) for v in a.hidden.split(",")):
        shared = torch.Generator(device=dev).manual_seed(h)  # the same on every rank
        own = torch.Generator(device=dev).manual_seed(1000 * h + rank)
        w = torch.randn(h, device=dev, generator=shared).to(torch.bfloat16)
        for m in (int(v) for v in a.rows.split(",")):
            x = torch.randn(m, h, device=dev, generator=own).to(torch.bfloat16)
            r0 = torch.randn(m, h, device=dev, generator=shared).to(torch.bfloat16)
            # The fp4norm transports write the same bytes.
            peer = m <= fd.SYMMETRIC_MAX_ROWS  # (the peer-access kernel takes decode rows only)
            ours = ("one_shot", "two_shot", "gather") if peer else ("gather",)
            outs = []
            for t in ours:
                rt = r0.clone()
                q, s = fd.allreduce_add_rmsnorm_fp4quant(x, rt, w, transport=t, **opts)
                outs.append((q, s.view(torch.uint8), rt))
            same = all(all(torch.equal(a, b) for a, b in zip(o, outs[0])) for o in outs)
            xa = x.clone()
            r = r0.clone()
            paths = {
                "nccl+op": lambda: (dist.all_reduce(xa, op=dist.ReduceOp.AVG),
                                    fp4norm.add_rmsnorm_fp4quant(xa, r, w, **opts)),
                **{t: (lambda t=t: fd.allreduce_add_rmsnorm_fp4quant(x, r, w, transport=t, **opts))
                   for t in ours},
            }
            got = {name: timed(fn, a.calls, a.reps) for name, fn in paths.items()}
            for t in ("one_shot", "two_shot"):
                got.setdefault(t, (float("nan"), "-"))
            cell = dict(ranks=world, m=m, h=h, same_bytes=same,
                        **{name: dict(us=t, mode=mode) for name, (t, mode) in got.items()})
            cells.append(cell)
            if rank == 0:
                base = got["nccl+op"][0]
                marks = "".join(" (eager)" for _, mode in got.values() if mode == "eager")[:8]
                cols = "".join(f"   {got[t][0]:9.2f} ({got[t][0] / base:.2f}x)"
                               for t in ("one_shot", "two_shot", "gather"))
                print(f"{m:4d} {h:6d} {base:10.2f}{cols}"
                      f"{'' if same else '   BYTES DIFFER'}{marks}")
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__,
                           cells=cells), f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
