#!/usr/bin/env python3
"""Host cost of one eager call of fp4norm's PyTorch operator against PyTorch's own ops, in
one process: the per-call overhead an engine pays outside CUDA graphs.

    python3 scripts/torch-op-cost.py [--device cpu|cuda] [--m 1] [--h 4096] [--json out.json]
    python3 scripts/torch-op-cost.py --table cpu.json cuda.json   (BENCHMARKS.md's table)

Times back-to-back calls (rounds of --calls/15 calls, median of the rounds' means; on CUDA
the kernels are a few µs and asynchronous, so this is the host cost of a call):
torch.nn.functional.rms_norm, torch.add(out=), and fp4norm.add_rmsnorm_fp4quant (NVFP4,
bf16) with preallocated outputs and allocating them, plus the bare operator. Prints µs per
call and the ratio to rms_norm, outside and inside torch.inference_mode() (where engines
serve: the autograd layer is skipped there, and fp4norm's inference-tensor checks with it).
"""
import argparse
import json
import statistics
import sys
import time


def per_call_us(fn, calls, sync):
    rounds = 15
    n = max(1, calls // rounds)
    for _ in range(max(50, n)):
        fn()
    sync()
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        means.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(means)


def table(paths):
    """BENCHMARKS.md's eager-cost table from the --json files of one or more runs."""
    runs = [json.load(open(p)) for p in paths]
    names = list(runs[0]["us"])
    # One column per run and mode: "us" outside inference mode, "us_inference_mode" inside.
    cols = [(r, k) for r in runs for k in ("us", "us_inference_mode") if k in r]
    head = [f"{r['device']}{', inference mode' if k != 'us' else ''}: µs (× rms_norm)" for r, k in cols]
    print("| call | " + " | ".join(head) + " |")
    print("|---|" + "---|" * len(cols))
    for n in names:
        cells = []
        for r, k in cols:
            v, base = r[k][n], r[k]["torch.nn.functional.rms_norm"]
            cells.append(f"{v:.2f} ({v / base:.2f}×)")
        print(f"| {n} | " + " | ".join(cells) + " |")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--table":
        return table(sys.argv[2:])
    import torch

    import fp4norm

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--h", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.m, a.h, generator=g).to(torch.bfloat16).to(dev)
    r = torch.randn(a.m, a.h, generator=g).to(torch.bfloat16).to(dev)
    w = torch.randn(a.h, generator=g).to(torch.bfloat16).to(dev)
    out = torch.empty_like(x)
    q = torch.empty(a.m, a.h // 2, dtype=torch.float4_e2m1fn_x2, device=dev)
    s = torch.empty(a.m, a.h // 16, dtype=torch.float8_e4m3fn, device=dev)
    gs = torch.tensor([1.0], device=dev)
    F = torch.nn.functional
    rows = [
        ("torch.nn.functional.rms_norm", lambda: F.rms_norm(x, (a.h,), w, 1e-6)),
        ("torch.add(out=)", lambda: torch.add(x, r, out=out)),
        ("fp4norm, outputs preallocated", lambda: fp4norm.add_rmsnorm_fp4quant(x, r, w, q, s, gs)),
        ("fp4norm, outputs allocated", lambda: fp4norm.add_rmsnorm_fp4quant(x, r, w, global_scale=gs)),
        ("torch.ops.fp4norm (functional)", lambda: torch.ops.fp4norm.add_rmsnorm_fp4quant.default(x, r, w, gs)),
        ("torch.ops.fp4norm.out", lambda: torch.ops.fp4norm.add_rmsnorm_fp4quant.out(x, r, w, q, s, None, gs)),
    ]
    res = {name: per_call_us(fn, a.calls, sync) for name, fn in rows}
    with torch.inference_mode():
        res_inf = {name: per_call_us(fn, a.calls, sync) for name, fn in rows}
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"host cost per call, M = {a.m}, H = {a.h}, bf16, NVFP4, {name}, torch {torch.__version__}")
    print(f"{'call':36s} {'µs':>8s} {'× rms_norm':>11s} {'inference mode µs':>18s} {'×':>6s}")
    base, base_inf = res["torch.nn.functional.rms_norm"], res_inf["torch.nn.functional.rms_norm"]
    for k, v in res.items():
        print(f"{k:36s} {v:8.2f} {v / base:11.2f} {res_inf[k]:18.2f} {res_inf[k] / base_inf:6.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({
                "device": name, "m": a.m, "h": a.h, "torch": torch.__version__,
                "us": res, "us_inference_mode": res_inf,
            }, f, indent=1)


if __name__ == "__main__":
    main()
