"""fp4norm's FP8 ops against torch.compile (Inductor) of the plain PyTorch formula, in one
process on one GPU: time per call and the speed-up. (Bandwidth against a same-run copy is
`fp4norm bench`'s job: `--format fp8-tensor,fp8-token,fp8-group128,mxfp8`.)

Formats (bf16 input, residual add, E4M3 elements):
  tensor   per-tensor static scale (FlashInfer's fused_add_rmsnorm_quant)
  token    per-token f32 scales, row-major (vLLM's dynamic per-token FP8)
  group128 f32 scales per group of 128, column-major [H/128, Mp4] (DeepSeek-style)
  mxfp8    UE8M0 scales per group of 32, swizzled 128x4 (the peer pads and swizzles too)

The peers use torch.rsqrt and a true division, so they are not bit-exact to SPEC.md; the
fraction of their codes equal to fp4norm's is printed. Timing: triton.testing's
do_bench_cudagraph (CUDA-graph replay), median. Prints one line per cell and writes JSON:

    PYTHONPATH=<fp4norm wheel> python3 scripts/fp8-peers.py [--json FILE] [MxH ...]
"""
import argparse
import json

import torch
import torch.nn.functional as F
import triton.testing as tt

import fp4norm

torch._dynamo.config.recompile_limit = 1024
torch._dynamo.config.cache_size_limit = 1024
DEV = "cuda"
EPS = 1e-6
FMAX = 448.0
FP8 = torch.float8_e4m3fn
SHAPES = ["1x4096", "16x8192", "128x8192", "1024x4096", "4096x8192", "16384x4096", "16384x8192", "8192x16384"]


def norm(x, r, w):
    h = x + r
    r.copy_(h)
    hf = h.float()
    return hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()


def peer_tensor(x, r, w, scale):
    y = norm(x, r, w)
    return (y * (1.0 / scale)).clamp(-FMAX, FMAX).to(FP8)


def peer_token(x, r, w):
    y = norm(x, r, w)
    s = y.abs().amax(-1, keepdim=True) / FMAX
    inv = torch.where(s == 0, torch.zeros_like(s), 1.0 / s)
    return (y * inv).clamp(-FMAX, FMAX).to(FP8), s


def peer_group128(x, r, w):
    m, h = x.shape
    y = norm(x, r, w).view(m, h // 128, 128)
    s = y.abs().amax(-1) / FMAX
    inv = torch.where(s == 0, torch.zeros_like(s), 1.0 / s)
    q = (y * inv[..., None]).clamp(-FMAX, FMAX).to(FP8).view(m, h)
    mp4 = (m + 3) // 4 * 4
    return q, F.pad(s.t(), (0, mp4 - m)).contiguous()


def peer_mxfp8(x, r, w):
    m, h = x.shape
    nb = h // 32
    y = norm(x, r, w).view(m, nb, 32)
    v = y.abs().amax(-1) / FMAX
    e = torch.ceil(torch.log2(v)).clamp(-127, 127)
    e = torch.where(v == 0, torch.full_like(e, -127), e)
    q = (y * torch.exp2(-e)[..., None]).clamp(-FMAX, FMAX).to(FP8).view(m, h)
    codes = (e + 127).to(torch.uint8)
    mp, kp = (m + 127) // 128 * 128, (nb + 3) // 4 * 4
    codes = F.pad(codes, (0, kp - nb, 0, mp - m))
    sw = codes.view(mp // 128, 4, 32, kp // 4, 4).permute(0, 3, 2, 1, 4).contiguous().view(-1)
    return q, sw


def bench(fn):
    return tt.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1000.0  # µs


def cells(fmt, m, h):
    g = torch.Generator(device=DEV).manual_seed(m * 131 + h)
    x = torch.randn(m, h, device=DEV, generator=g).to(torch.bfloat16)
    r0 = torch.randn(m, h, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.rand(h, device=DEV, generator=g) + 0.5).to(torch.bfloat16)
    r1, r2 = r0.clone(), r0.clone()
    out = torch.empty(m, h, device=DEV, dtype=FP8)
    scale = torch.tensor([0.02], device=DEV)
    if fmt == "tensor":
        ours = lambda: fp4norm.fused_add_rmsnorm_quant(out, x, r1, w, scale, EPS)
        peer = torch.compile(peer_tensor, fullgraph=True)
        theirs = lambda: peer(x, r2, w, scale)
    elif fmt == "token":
        sc = torch.empty(m, 1, device=DEV, dtype=torch.float32)
        ours = lambda: fp4norm.add_rmsnorm_fp8quant(x, r1, w, out, sc, EPS, group="token")
        peer = torch.compile(peer_token, fullgraph=True)
        theirs = lambda: peer(x, r2, w)
    elif fmt == "group128":
        sc = torch.empty(h // 128, (m + 3) // 4 * 4, device=DEV, dtype=torch.float32)
        ours = lambda: fp4norm.add_rmsnorm_fp8quant(
            x, r1, w, out, sc, EPS, group=128, scale_layout="column-major")
        peer = torch.compile(peer_group128, fullgraph=True)
        theirs = lambda: peer(x, r2, w)
    else:
        ours = lambda: fp4norm.add_rmsnorm_mxfp8quant(x, r1, w, out)
        peer = torch.compile(peer_mxfp8, fullgraph=True)
        theirs = lambda: peer(x, r2, w)
    # Agreement of the codes on the first call (same inputs for both).
    ours()
    got = peer(x, r0.clone(), w, scale) if fmt == "tensor" else peer(x, r0.clone(), w)[0]
    agree = (out.view(torch.uint8) == got.view(torch.uint8)).float().mean().item()
    return bench(ours), bench(theirs), agree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="fp8_peers.json")
    ap.add_argument("--formats", default="tensor,token,group128,mxfp8")
    ap.add_argument("shapes", nargs="*", default=SHAPES)
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for shape in a.shapes:
        m, h = (int(v) for v in shape.split("x"))
        for fmt in a.formats.split(","):
            ours, theirs, agree = cells(fmt, m, h)
            row = dict(fmt=fmt, M=m, H=h, fp4norm_us=ours, inductor_us=theirs,
                       speedup=theirs / ours, agree=agree)
            rows.append(row)
            print(f"{fmt:9} {m:6} x {h:6}  fp4norm {ours:9.2f} us  inductor {theirs:9.2f} us  "
                  f"{row['speedup']:5.2f}x  codes equal {agree:.4f}", flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
