#!/usr/bin/env python3
"""The one case of FlashInfer's tests that fp4norm's exact numerics fail, reproduced on the
CPU with the test's own procedure, printing the bytes that differ and why.

    python3 scripts/flashinfer-parity/numerics_case.py [BATCH] [HIDDEN] [DEVICE]   (default 4 64 cpu)

`TestFusedVsSeparateFP4Quantize.test_nvfp4_fused_matches_separate` (bf16, no residual)
compares the fused op with "RMSNorm in float32, rounded to bf16, then a separate NVFP4
quantiser" and wants > 90 % of the block scales equal. fp4norm quantises the float32
normalised values (SPEC.md §1: no rounding to the dtype before quantisation), so a block
whose amax sits near a scale-code boundary can get the neighbouring code. The test draws
its data on the GPU (torch.manual_seed(42), then torch.randn on CUDA): with DEVICE cuda this
script draws the same data and prints the test's bytes; on the CPU the generator gives other
data (there the case passes). Needs torch and fp4norm; the stand-in quantiser comes from
shim/.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim"))
from flashinfer._quantize import fp4_quantize  # noqa: E402

import fp4norm  # noqa: E402


def llama_rms_norm(x, w, eps=1e-6):
    """FlashInfer's test reference: RMSNorm in float32, the result rounded to x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w.float()
    return y.to(x.dtype)


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    torch.manual_seed(42)
    x = torch.randn(batch, hidden, device=device, dtype=torch.bfloat16)
    w = torch.randn(hidden, device=device, dtype=torch.bfloat16)
    ref = llama_rms_norm(x, w)
    # The test's compute_global_scale: 448 · 6 / amax in Python floats, then float32.
    gs = torch.tensor(
        [448.0 * 6.0 / ref.abs().max().to(torch.float32).item()], dtype=torch.float32, device=device
    )
    q, s = fp4norm.rmsnorm_fp4quant(x, w, global_scale=gs, block_size=16)
    q_sep, s_sep = fp4_quantize(ref, gs, sf_vec_size=16, is_sf_swizzled_layout=False)
    s = s.view(torch.uint8).reshape(batch, -1)
    s_sep = s_sep.view(torch.uint8).reshape(batch, -1)
    q = q.view(torch.uint8).reshape(batch, -1)
    q_sep = q_sep.view(torch.uint8).reshape(batch, -1)
    blocks = hidden // 16
    same_scales = int((s == s_sep).sum())
    print(f"bf16 {batch} x {hidden} on {device}, global scale {gs.item():.6g}: "
          f"{same_scales} of {batch * blocks} block scales and "
          f"{int((q == q_sep).sum())} of {q.numel()} packed bytes agree")
    for r in range(batch):
        for b in range(blocks):
            if s[r, b] != s_sep[r, b]:
                sl = slice(16 * b, 16 * (b + 1))
                amax_bf16 = ref[r, sl].float().abs().max().item()
                print(f"  row {r} block {b}: fp4norm scale 0x{int(s[r, b]):02X}, separate "
                      f"0x{int(s_sep[r, b]):02X}; the separate quantiser's amax is the "
                      f"bf16-rounded {amax_bf16!r}, gs * amax / 6 = "
                      f"{gs.item() * amax_bf16 / 6:.6g}; "
                      f"packed bytes fp4norm {q[r, 8 * b:8 * (b + 1)].tolist()} vs "
                      f"{q_sep[r, 8 * b:8 * (b + 1)].tolist()}")


if __name__ == "__main__":
    main()
