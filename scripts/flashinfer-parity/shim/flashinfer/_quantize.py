"""A separate FP4 quantizer of given values, for the tests that compare the fused op with
"add + RMSNorm, then fp4_quantize". It follows TensorRT-LLM's fp4 quantization formulas
(FlashInfer's `fp4_quantize`): E4M3 scales `gs · (amax · (1/6))`, output scale
`1 / (scale / gs)`, UE8M0 scales rounded up to a power of two; E2M1 round to nearest even,
saturating at 6. Plain PyTorch, float32."""

import torch

E4M3_MAX = 448.0


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    mag = (
        (a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75)
        + (a > 2.5) + (a >= 3.5) + (a > 5.0)
    )
    mag = torch.where(torch.isnan(v), torch.full_like(mag, 7), mag)
    sign = (torch.signbit(v) & ~torch.isnan(v)).to(torch.uint8) << 3
    return mag | sign


def _swizzle(sf: torch.Tensor) -> torch.Tensor:
    m, nb = sf.shape
    mp, nk = (m + 127) // 128 * 128, (nb + 3) // 4
    padded = torch.zeros(mp, nk * 4, dtype=sf.dtype, device=sf.device)
    padded[:m, :nb] = sf
    # [m_tile][k_tile][outer_m 32][inner_m 4][inner_k 4]
    return (
        padded.view(mp // 128, 4, 32, nk, 4).permute(0, 3, 2, 1, 4).contiguous().view(-1)
    )


def fp4_quantize(
    input: torch.Tensor,
    global_scale: torch.Tensor = None,
    sf_vec_size: int = 16,
    sf_use_ue8m0: bool = False,
    is_sf_swizzled_layout: bool = True,
    is_sf_8x4_layout: bool = False,
    enable_pdl=None,
):
    """(packed FP4 [..., H/2] uint8, block scales uint8: [M·H/B] or swizzled)."""
    assert not is_sf_8x4_layout, "the 8x4 layout is not part of this stand-in"
    h = input.shape[-1]
    x = input.reshape(-1, h).float()
    m = x.shape[0]
    blocks = x.view(m, h // sf_vec_size, sf_vec_size)
    amax = blocks.abs().amax(-1)
    if sf_use_ue8m0:
        v = amax * (1.0 / 6.0)
        e = torch.ceil(torch.log2(v.clamp_min(torch.finfo(torch.float32).tiny)))
        code = torch.where(v == 0, torch.zeros_like(e), (e + 127).clamp(0, 254)).to(torch.uint8)
        inv = torch.where(code == 0, torch.zeros_like(v), torch.exp2(127.0 - code.float()))
        sf = code
    else:
        gs = (global_scale if global_scale is not None else torch.ones(1, device=x.device)).float().reshape(-1)[0]
        s = gs * (amax * (1.0 / 6.0))
        s8 = s.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
        d = s8.float()
        inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / (d * (1.0 / gs)))
        sf = s8.view(torch.uint8)
    codes = _e2m1_codes(blocks * inv.unsqueeze(-1)).view(m, h)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    sf = _swizzle(sf) if is_sf_swizzled_layout else sf.reshape(-1)
    return packed.reshape(*input.shape[:-1], h // 2), sf
