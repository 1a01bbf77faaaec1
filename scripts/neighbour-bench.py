"""fp4norm between GEMMs: does the previous kernel's shared-memory carve-out slow it down?

In a transformer layer the fused op runs right after GEMMs (cuBLAS kernels that use most of
each SM's unified L1 / shared storage as shared memory). A kernel with no carve-out
preference may run with the split its predecessor left, that is with a small L1, and the
traffic bound (`scripts/traffic-bound.cu occupancy`) loses ~7 points of copy bandwidth with
a small L1. This measures fp4norm in a CUDA graph of N x (bf16 GEMM -> fp4norm), against
N x GEMM and N x fp4norm alone: "in chain" = (pair - GEMM) per call, "alone" = fp4norm alone.
Run it twice, with and without FP4NORM_SMEM_CARVEOUT=0 (prefer the largest L1; the knob is
read once per process):

    PYTHONPATH=/tmp/pyfp python3 scripts/neighbour-bench.py
    FP4NORM_SMEM_CARVEOUT=0 PYTHONPATH=/tmp/pyfp python3 scripts/neighbour-bench.py

Needs PyTorch with CUDA and the fp4norm wheel; prints one line per shape.
"""

import os
import statistics
import sys

import torch

import fp4norm

DEV = "cuda"
SHAPES = [(16384, 4096), (8192, 8192), (1024, 4096), (128, 8192)]
GEMM = 2048  # a bf16 GEMM of GEMM x GEMM x GEMM between calls (~25 us on an H200)
PER_GRAPH = 20
REPS = 15


def graph_of(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()  # warm-up, kernel compilation and cuBLAS workspace outside the capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(PER_GRAPH):
            fn()
    return g


def per_call_us(g):
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / PER_GRAPH)
    return statistics.median(times)


def main():
    knob = os.environ.get("FP4NORM_SMEM_CARVEOUT", "unset")
    print(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  FP4NORM_SMEM_CARVEOUT={knob}")
    ga = torch.randn(GEMM, GEMM, device=DEV, dtype=torch.bfloat16)
    gb = torch.randn(GEMM, GEMM, device=DEV, dtype=torch.bfloat16)
    gc = torch.empty(GEMM, GEMM, device=DEV, dtype=torch.bfloat16)

    def gemm():
        torch.matmul(ga, gb, out=gc)

    t_gemm = per_call_us(graph_of(gemm))
    print(f"GEMM {GEMM}^3 bf16 alone: {t_gemm:.2f} us per call")
    print(f"{'M':>6} {'H':>6} {'alone us':>10} {'pair us':>10} {'in chain us':>12} {'chain/alone':>12}")
    for m, h in SHAPES:
        x = torch.randn(m, h, device=DEV, dtype=torch.bfloat16)
        r = torch.randn(m, h, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(h, device=DEV, dtype=torch.bfloat16)
        gs = torch.tensor([1.0], device=DEV)

        def op():
            fp4norm.add_rmsnorm_fp4quant(x, r, w, global_scale=gs)

        def pair():
            gemm()
            op()

        t_op = per_call_us(graph_of(op))
        t_pair = per_call_us(graph_of(pair))
        chain = t_pair - t_gemm
        print(f"{m:>6} {h:>6} {t_op:>10.2f} {t_pair:>10.2f} {chain:>12.2f} {chain / t_op:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
