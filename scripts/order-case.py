"""One row on which the summation order of SPEC.md §1 step 2 changes the bytes.

SPEC.md says ss = sum of f64(h_i)^2 with "the summation order free", but f64 sums of bf16
squares are not exact in general. On this row (bf16, H = 4096, residual zero, w = 1,
eps 1e-6) the element-order sum gives rstd = 3.725231678686214e-09, while small squares
first, the GPU kernel's order and the exact sum give 3.725231456641609e-09, one f32 ulp
less; with the global scale below, block 0's E4M3 scale is then 1.0 (0x38) instead of
1.125 (0x39). Run on an H200 (2026-11-30): before fp4norm took the exact sum (src/sumsq.rs)
the CPU reference wrote 0x39 and the GPU 0x38; since, both write 0x38. This prints both
backends' block-0 scale byte and whether all output bytes agree.

    PYTHONPATH=/tmp/pyfp python3 scripts/order-case.py
"""

import struct
import sys

import torch

import fp4norm


def main():
    h = 4096
    x = torch.full((1, h), 181.0, dtype=torch.bfloat16)
    x[0, 0], x[0, 1], x[0, 2] = 17179869184.0, 96468992.0, 468992.0  # 2^34 and two bf16 values
    w = torch.ones(h, dtype=torch.bfloat16)
    gs_value = struct.unpack("f", struct.pack("I", 0x3DCC00D3))[0]  # 0.09961094707250595
    outs = {}
    for dev in ("cpu", "cuda"):
        if dev == "cuda" and not torch.cuda.is_available():
            print("cuda: not available (skipped)")
            continue
        r = torch.zeros(1, h, dtype=torch.bfloat16, device=dev)
        gs = torch.tensor([gs_value], device=dev)
        q, sf = fp4norm.add_rmsnorm_fp4quant(x.to(dev), r, w.to(dev), global_scale=gs)
        if dev == "cuda":
            torch.cuda.synchronize()
        sf_bytes = sf.view(torch.uint8).cpu()
        outs[dev] = (q.view(torch.uint8).cpu(), sf_bytes)
        print(f"{dev}: block 0 scale byte {int(sf_bytes.flatten()[0]):#04x}")
    if len(outs) == 2:
        same = all(torch.equal(a, b) for a, b in zip(outs["cpu"], outs["cuda"]))
        print("all output bytes equal" if same else "OUTPUT BYTES DIFFER between the CPU reference order and the GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
