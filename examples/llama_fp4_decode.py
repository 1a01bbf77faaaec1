"""A Llama decoder whose every residual add + RMSNorm that feeds a linear is fp4norm's
fused add + RMSNorm + NVFP4 quantisation: prefill and decode with a static KV cache under
torch.compile (+ CUDA graphs on a GPU), timed and compared with the unquantised model.

The model is Hugging Face ``transformers``' ``LlamaForCausalLM`` built from a real
config (Llama-3.1-8B's values, written below: nothing is downloaded) with **random
weights** (seeded; the RMSNorm weights are drawn from U(0.5, 1.5) rather than left at
1.0 so that the norm weight matters), in bf16. ``--layers N`` keeps the first N layers;
``--small`` is a preset for CPU runs (4 layers, hidden 1024, 8 heads of 128, 2 KV heads,
vocab 32768, Llama-3.1's RoPE and eps).

What is replaced (``Fp4Llama.forward``, which calls the HF modules: embedding, rotary
embedding, attention with its KV cache update, MLP and lm_head; attention is not
re-implemented, only the causal mask over the static cache is built here):

* layer 0's ``input_layernorm``: ``fp4norm.rmsnorm_fp4quant`` of the embeddings (there
  is nothing to add yet; the embeddings become the residual stream);
* layer i > 0's ``input_layernorm``: ``fp4norm.add_rmsnorm_fp4quant`` fused with the
  residual add of layer i-1's MLP output;
* every ``post_attention_layernorm``: fused with the attention output's residual add;
* the final ``norm`` (feeding ``lm_head``): fused with the last MLP output's residual add.

Each call is NVFP4 (blocks of 16, E4M3 scales, ``RN(gs * amax / 6)``) with the scales in
the 128x4 swizzled layout that Blackwell block-scaled GEMMs read, and a per-norm global
scale ``gs`` held as a float32 device tensor (a module buffer: CUDA graphs read it at
replay). ``gs`` is calibrated the usual NVFP4 way, ``448 * 6 / amax`` of that norm's
output on a calibration prompt (random tokens, different from the evaluation prompt)
run through the unquantised model.

The linears then consume the FP4 activations through ``fp4norm.dequantize`` (float32,
rounded to bf16) and the HF module's own bf16 ``nn.Linear``. On Hopper (and on the CPU)
this stands in for a Blackwell FP4 GEMM (e.g. CUTLASS / cuBLASLt NVFP4 block-scaled
GEMM) that would read ``y_fp4`` and the swizzled scales directly: the activation values
the GEMM sees are the same FP4 x scale values (up to the bf16 rounding of
``e2m1 * e4m3 / gs`` here), but the speed of this dequantise + bf16 matmul path says
nothing about FP4 GEMM speed. The weights stay bf16 (a real NVFP4 checkpoint would also
quantise them); only the activations entering each linear are FP4.

The unquantised model runs through the same forward with the HF ``LlamaRMSNorm`` modules
and plain residual adds (exactly the math of HF's ``LlamaDecoderLayer``; the test checks
it against ``LlamaForCausalLM.forward``).

Run: prefill (eager; HF's StaticCache is meant to be filled outside the compiled region)
then ``--steps`` decode steps of one token, batch 1. The unquantised model decodes
greedily; the fp4norm model is fed the same tokens (teacher forcing), so the logits of
both are compared at the same positions. The decode step is compiled with
``torch.compile(fullgraph=True)``: on CUDA ``mode="reduce-overhead"`` (inductor + CUDA
graphs), on the CPU inductor without CUDA graphs. Each model is run eagerly once (the
reference logits), then once compiled to warm up (compile, CUDA-graph recording), then
once compiled and timed; the cache is reset in place between runs. Printed: per-step
decode latency of both models (median, mean, min; eager's median too), whether the
compiled logits equal the eager ones byte for byte, the byte-exact compiled check (below),
and the agreement of the fp4norm logits with the unquantised ones over the decoded steps:
cosine similarity (min, mean), max abs error (also relative to max |logit|), top-1
agreement, top-5 overlap, and the ratio of the logits' norms.

Tolerance (``TOLERANCE``; the script prints PASS/FAIL and the test asserts it): over the
decoded steps, the mean of 1 - cosine(fp4norm logits, unquantised logits) is at most 2x
that of a *noise-equivalent* model, and at every step the norm of the fp4norm logits is
within [0.9, 1.1] of the unquantised model's. The noise-equivalent model is the
unquantised model with independent Gaussian noise added to every norm output, of relative
RMS sigma = NVFP4's rounding error on Gaussian data (``nvfp4_gaussian_rel_error``: ~0.094,
computed from the E2M1 grid in NumPy, not from fp4norm). Why not a fixed cosine: with
random weights the error an FP4 activation causes is amplified by the random branches
(they are as large as the residual stream they add to), by an amount that depends on the
depth and width rather than on fp4norm. Measured on the CPU (seed 0): each quantisation
alone has cosine 0.9956 (sigma 0.094, as the format predicts); the logits' cosine is
~0.97 for the --small preset at 1-4 layers and ~0.95 at 16-32 layers, and for the 8B
shape 0.95 at 1 layer, 0.92 at 2, 0.85 at 4, 0.78 at 8 (the 32-layer 8B model is
expected lower still: not measured, no GPU here), while the noise-equivalent model lands
within a few per cent of the same values wherever both were measured (small preset at 1,
2, 4 and 16 layers, the 8B shape at 1 and 2). So the figures measure the random model's sensitivity; what the
tolerance asserts is that fp4norm's error is the size FP4 rounding should cost (a wrong
scale layout, global scale or stale residual costs far more than 2x, and a wrong global
scale in dequantisation moves the logits' norm, which cosine alone would miss). Top-1 /
top-5 agreement are printed, not asserted: random-weight logits are near-Gaussian, their
top candidates separated by a small fraction of their spread, so a few per cent of logit
noise reorders them; that says little about a trained model, whose top logits are far
apart.

torch.compile notes (torch 2.11, transformers 5.17):
* The decode step traces with ``fullgraph=True`` (no graph break) through HF's
  attention (sdpa), rotary embedding, MLP and StaticCache, and fp4norm's operators.
* Inductor's code does not give eager's bytes, for reasons outside fp4norm (measured
  on the CPU; expected on CUDA too, where Triton's ``tl.sigmoid`` and ``tl_math.cos``
  are not PyTorch's eager CUDA math, and the script prints what it finds): it fuses HF's bf16 pointwise ops (RoPE's ``q*cos + rotate_half(q)*sin``,
  SiLU(gate) * up) and rounds to bf16 once instead of after every op (on the CPU
  ``torch._inductor.config.emulate_precision_casts`` does not change that here: even
  ``(x * 1.7) * u`` in bf16 differs), and FP4 rounding turns a one-ulp change of an
  input into a different E2M1 code now and then. The compiled logits are therefore held
  to the same tolerance as the eager ones (the test checks it), and the byte-exact
  compiled check is ``torch.compile(fullgraph=True, backend="aot_eager")`` (the same
  trace, functionalised, on PyTorch's eager kernels), captured by hand in one CUDA graph
  on CUDA (``cuda_graph_step``): its logits equal eager's byte for byte.

On a GPU (H200, about 17 GB for the full 32-layer model):
    python examples/llama_fp4_decode.py                  # Llama-3.1-8B shape, 32 layers
    python examples/llama_fp4_decode.py --layers 4       # quicker
On a CPU:
    python examples/llama_fp4_decode.py --small
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

import fp4norm
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

# Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json), with transformers 5's
# rope_parameters holding rope_theta and the llama3 rope_scaling.
LLAMA_3_1_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    tie_word_embeddings=False,
    bos_token_id=128000,
    eos_token_id=128001,
    initializer_range=0.02,
    rope_parameters=dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
)

# A CPU-sized model of the same architecture (head_dim 128 and GQA 4:1 as in the 8B).
SMALL = dict(
    LLAMA_3_1_8B,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=32768,
    bos_token_id=0,
    eos_token_id=1,
)

# NVFP4: E2M1 values (max 6), blocks of 16, E4M3 block scales (max 448), swizzled 128x4.
E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4 = dict(block_size=16, scale_format="e4m3", is_sf_swizzled_layout=True)



def nvfp4_gaussian_rel_error(samples: int = 1 << 17, seed: int = 0) -> float:
    """The relative RMS error ``||Q(x) - x|| / ||x||`` of NVFP4 rounding on N(0, 1) data,
    from the format's definition alone (NumPy, not fp4norm): blocks of 16, scale
    ``amax / 6``, each value rounded to the nearest E2M1 magnitude (the E4M3 rounding of
    the scale is left out: it moves the error by well under 1 %). About 0.094."""
    import numpy as np

    x = np.random.default_rng(seed).standard_normal((samples // 16, 16))
    scale = np.abs(x).max(axis=1, keepdims=True) / E2M1_MAX
    grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    a = np.abs(x) / scale
    q = grid[np.abs(a[..., None] - grid).argmin(axis=-1)] * np.sign(x) * scale
    return float(np.sqrt(((q - x) ** 2).sum() / (x**2).sum()))


# The stated tolerance of the fp4norm model's logits against the unquantised model's (see
# the module docstring for why): over the decoded steps, the mean of 1 - cosine at most
# ERR_RATIO times that of the noise-equivalent model, and at every step the logits' norm
# within NORM_RATIO of the unquantised model's.
TOLERANCE = dict(err_ratio=2.0, norm_ratio=(0.9, 1.1))


def make_config(small: bool = False, layers: Optional[int] = None) -> LlamaConfig:
    values = dict(SMALL if small else LLAMA_3_1_8B)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers must be >= 1, got {layers}")
        values["num_hidden_layers"] = layers
    config = LlamaConfig(**values)
    config._attn_implementation = "sdpa"
    return config


def build_model(config: LlamaConfig, device: str, seed: int = 0) -> LlamaForCausalLM:
    """The HF model with random bf16 weights, created directly on ``device``."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval().requires_grad_(False)
    with torch.no_grad():
        g = torch.Generator(device=device).manual_seed(seed + 1)
        for norm in norm_modules(model):
            w = torch.empty(norm.weight.shape, dtype=torch.float32, device=device)
            norm.weight.copy_(w.uniform_(0.5, 1.5, generator=g).to(norm.weight.dtype))
    return model


def norm_modules(model: LlamaForCausalLM) -> List[torch.nn.Module]:
    """The 2L+1 RMSNorms in forward order: input_layernorm, post_attention_layernorm of
    each layer, then the final norm."""
    norms: List[torch.nn.Module] = []
    for layer in model.model.layers:
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    norms.append(model.model.norm)
    return norms


def causal_mask(position_ids: torch.Tensor, cache_len: int) -> torch.Tensor:
    """``[B, 1, S, cache_len]`` bool (True = attend): key slot k is visible from a query at
    position p when k <= p (the static cache holds position k in slot k)."""
    k = torch.arange(cache_len, device=position_ids.device)
    return k[None, None, None, :] <= position_ids[:, None, :, None]


class Fp4Llama(torch.nn.Module):
    """A forward over an HF ``LlamaForCausalLM`` (sharing its weights) whose norms are

    * ``mode="fp4"``: fp4norm calls (fused residual add + RMSNorm + NVFP4), each followed
      by ``fp4norm.dequantize`` into the next linear;
    * ``mode="plain"``: the HF RMSNorms with plain residual adds: the unquantised model;
    * ``mode="noise"``: the unquantised model with independent Gaussian noise of relative
      RMS ``noise`` added to each norm output (eager only): the "noise-equivalent" model
      the tolerance is measured against (see the module docstring).
    """

    def __init__(self, hf: LlamaForCausalLM, mode: str = "fp4", noise: float = 0.0, seed: int = 0):
        super().__init__()
        if mode not in ("fp4", "plain", "noise"):
            raise ValueError(f"mode must be 'fp4', 'plain' or 'noise', got {mode!r}")
        self.hf = hf
        self.mode = mode
        self.n_norms = 2 * len(hf.model.layers) + 1
        device = hf.lm_head.weight.device
        self.noise = noise
        self.generator = torch.Generator(device=device).manual_seed(seed) if mode == "noise" else None
        # One global scale per norm, a (1,) float32 buffer on the device; calibrate()
        # writes them in place.
        for k in range(self.n_norms):
            self.register_buffer(f"gs{k}", torch.ones(1, dtype=torch.float32, device=device))

    def global_scale(self, k: int) -> torch.Tensor:
        return getattr(self, f"gs{k}")

    def norm(
        self,
        k: int,
        norm: torch.nn.Module,
        x: Optional[torch.Tensor],
        residual: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``residual <- residual + x`` (no add when ``x`` is None), then RMSNorm with
        norm ``k``; returns (the normalised activations the next linear reads, the
        residual stream)."""
        if self.mode != "fp4":
            if x is not None:
                residual = residual + x
            y = norm(residual)
            if self.mode == "noise":
                yf = y.float()
                rms = yf.pow(2).mean(-1, keepdim=True).sqrt()
                n = torch.randn(y.shape, generator=self.generator, device=y.device)
                y = (yf + n * (rms * self.noise)).to(y.dtype)
            return y, residual
        shape = residual.shape
        h = shape[-1]
        r2 = residual.view(-1, h)  # a view: fp4norm updates the residual stream in place
        gs = self.global_scale(k)
        eps = float(norm.variance_epsilon)
        if x is None:
            q, s = fp4norm.rmsnorm_fp4quant(r2, norm.weight, global_scale=gs, eps=eps, **NVFP4)
        else:
            q, s = fp4norm.add_rmsnorm_fp4quant(
                x.reshape(-1, h), r2, norm.weight, global_scale=gs, eps=eps, **NVFP4
            )
        # Stand-in for an FP4 GEMM: the FP4 x scale values, as bf16, into the bf16 linear.
        y = fp4norm.dequantize(q, s, gs, **NVFP4)
        return y.to(residual.dtype).view(shape), residual

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: StaticCache
    ) -> torch.Tensor:
        """Logits ``[B, S, V]`` (bf16) of tokens ``input_ids [B, S]`` at positions
        ``position_ids [B, S]``, appending their keys and values to ``cache``."""
        m = self.hf.model
        hidden = m.embed_tokens(input_ids)
        position_embeddings = m.rotary_emb(hidden, position_ids=position_ids)
        mask = causal_mask(position_ids, cache.get_max_length())
        residual = hidden  # the embeddings start the residual stream
        branch: Optional[torch.Tensor] = None  # the last branch output, not yet added
        for i, layer in enumerate(m.layers):
            h, residual = self.norm(2 * i, layer.input_layernorm, branch, residual)
            attn, _ = layer.self_attn(
                hidden_states=h,
                position_embeddings=position_embeddings,
                attention_mask=mask,
                past_key_values=cache,
            )
            h, residual = self.norm(2 * i + 1, layer.post_attention_layernorm, attn, residual)
            branch = layer.mlp(h)
        h, residual = self.norm(self.n_norms - 1, m.norm, branch, residual)
        return self.hf.lm_head(h)


def new_cache(model: Fp4Llama, max_len: int) -> StaticCache:
    return StaticCache(config=model.hf.config, max_cache_len=max_len)


@torch.no_grad()
def calibrate(model: Fp4Llama, calib_ids: torch.Tensor) -> List[float]:
    """Sets each norm's global scale to ``448 * 6 / amax`` of that norm's output on
    ``calib_ids`` through the unquantised model (HF's RMSNorm modules, seen by forward
    hooks); returns the amaxes."""
    plain = Fp4Llama(model.hf, mode="plain")
    amax: Dict[int, float] = {}
    hooks = []
    for k, norm in enumerate(norm_modules(model.hf)):
        def hook(_mod, _inp, out, k=k):
            amax[k] = max(amax.get(k, 0.0), out.detach().abs().max().float().item())
        hooks.append(norm.register_forward_hook(hook))
    try:
        s = calib_ids.shape[1]
        cache = new_cache(plain, s)
        pos = torch.arange(s, device=calib_ids.device)[None].expand_as(calib_ids)
        plain(calib_ids, pos, cache)
    finally:
        for h in hooks:
            h.remove()
    for k in range(model.n_norms):
        a = amax[k]
        if not (a > 0 and math.isfinite(a)):
            raise RuntimeError(f"norm {k}: calibration amax is {a}")
        model.global_scale(k).fill_(E4M3_MAX * E2M1_MAX / a)
    return [amax[k] for k in range(model.n_norms)]


@dataclass
class Run:
    logits: torch.Tensor  # [steps, V] float32, on the CPU: the decode steps' logits
    tokens: torch.Tensor  # [steps] int64: the token fed at each decode step
    step_s: List[float]  # wall time of each decode step


def decode(
    step: Callable[..., torch.Tensor],
    model: Fp4Llama,
    cache: StaticCache,
    prompt: torch.Tensor,
    steps: int,
    tokens: Optional[torch.Tensor] = None,
    cuda_graphs: bool = False,
) -> Run:
    """Prefill ``prompt [1, S]`` eagerly, then ``steps`` decode steps through ``step``
    (``model.forward`` or a compiled version of it). Greedy unless ``tokens [steps]``
    gives the token to feed at each step."""
    device = prompt.device
    cache.reset()
    s = prompt.shape[1]
    pos = torch.arange(s, device=device)[None]
    logits = model(prompt, pos, cache)[:, -1]
    fed, out, times = [], [], []
    pos = torch.full((1, 1), s, dtype=torch.long, device=device)
    for t in range(steps):
        tok = tokens[t].view(1, 1).to(device) if tokens is not None else logits.argmax(-1).view(1, 1)
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        sync(device)
        t0 = time.perf_counter()
        logits = step(tok, pos, cache)[:, -1]
        sync(device)
        times.append(time.perf_counter() - t0)
        logits = logits.float().clone()  # outlives the next CUDA-graph replay
        fed.append(tok.view(()).cpu())
        out.append(logits[0].cpu())
        pos = pos + 1
    return Run(torch.stack(out), torch.stack(fed), times)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compile_step(model: Fp4Llama, device: torch.device, **kwargs) -> Callable[..., torch.Tensor]:
    """The decode step under torch.compile, fullgraph: on CUDA ``mode="reduce-overhead"``
    (inductor + CUDA graphs) unless ``kwargs`` name a backend or mode; on the CPU inductor
    (the default)."""
    if device.type == "cuda" and "backend" not in kwargs:
        kwargs.setdefault("mode", "reduce-overhead")
    return torch.compile(model.forward, fullgraph=True, dynamic=False, **kwargs)


def cuda_graph_step(
    step: Callable[..., torch.Tensor], cache: StaticCache, prompt_len: int, device: torch.device
) -> Callable[..., torch.Tensor]:
    """``step`` (e.g. ``torch.compile(..., backend="aot_eager")``: a fullgraph trace run
    on PyTorch's eager kernels) captured by hand in one CUDA graph for one-token decode
    steps on ``cache``; returns a step with ``step``'s signature that copies its inputs
    into the graph's and replays it. Eager kernels in a graph give eager's bytes: this is
    the byte-exact CUDA-graph check (inductor's own kernels round HF's bf16 pointwise
    ops differently; see the module docstring). The warm-up calls advance ``cache``:
    :func:`decode` resets it."""
    if not all(layer.is_initialized for layer in cache.layers):
        raise ValueError("fill the cache (an eager prefill) before capturing a graph on it")
    tok = torch.zeros((1, 1), dtype=torch.long, device=device)
    pos = torch.full((1, 1), prompt_len, dtype=torch.long, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):  # compiles (dynamo) and runs every kernel once before capture
            step(tok, pos, cache)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(tok, pos, cache)

    def replay(t: torch.Tensor, p: torch.Tensor, c: StaticCache) -> torch.Tensor:
        if c is not cache:
            raise ValueError("this CUDA graph was captured on another cache")
        tok.copy_(t)
        pos.copy_(p)
        graph.replay()
        return out

    return replay


def agreement(logits: torch.Tensor, ref: torch.Tensor) -> Dict[str, float]:
    """Agreement of ``logits [steps, V]`` with ``ref [steps, V]`` (float32)."""
    cos = torch.nn.functional.cosine_similarity(logits, ref, dim=-1)
    err = (logits - ref).abs().max().item()
    top1 = (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()
    t5, r5 = logits.topk(5, dim=-1).indices, ref.topk(5, dim=-1).indices
    overlap = torch.tensor(
        [len(set(a.tolist()) & set(b.tolist())) / 5 for a, b in zip(t5, r5)]
    ).mean().item()
    ratio = logits.norm(dim=-1) / ref.norm(dim=-1)
    return dict(
        cos_min=cos.min().item(),
        cos_mean=cos.mean().item(),
        one_minus_cos=(1 - cos.double()).mean().item(),
        max_abs_err=err,
        max_abs_err_rel=err / ref.abs().max().item(),
        top1=top1,
        top5_overlap=overlap,
        norm_ratio_min=ratio.min().item(),
        norm_ratio_max=ratio.max().item(),
    )


def within_tolerance(fp4: Dict[str, float], noise: Dict[str, float]) -> bool:
    """The stated tolerance: fp4norm's agreement ``fp4`` against the noise-equivalent
    model's ``noise`` (both from :func:`agreement` against the unquantised model)."""
    lo, hi = TOLERANCE["norm_ratio"]
    return (
        fp4["one_minus_cos"] <= TOLERANCE["err_ratio"] * noise["one_minus_cos"]
        and lo <= fp4["norm_ratio_min"]
        and fp4["norm_ratio_max"] <= hi
    )


def random_prompt(config: LlamaConfig, length: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (1, length), generator=g).to(device)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    )


def describe(a: Dict[str, float]) -> str:
    return (
        f"cosine min {a['cos_min']:.5f} mean {a['cos_mean']:.5f} (mean 1-cos "
        f"{a['one_minus_cos']:.5f}); max abs err {a['max_abs_err']:.4f} "
        f"({a['max_abs_err_rel']:.3f} of max |logit|); top-1 {a['top1']:.3f}; top-5 overlap "
        f"{a['top5_overlap']:.3f}; norm ratio {a['norm_ratio_min']:.4f}..{a['norm_ratio_max']:.4f}"
    )


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="CPU-sized preset (4 layers, hidden 1024)")
    p.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--calib-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=None, help="decode steps (default 64 on CUDA, 16 on CPU)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    steps = args.steps or (64 if device.type == "cuda" else 16)
    cuda_graphs = device.type == "cuda"

    config = make_config(args.small, args.layers)
    t0 = time.perf_counter()
    hf = build_model(config, args.device, args.seed)
    params = sum(p.numel() for p in hf.parameters())
    print(
        f"model: Llama ({'small preset' if args.small else 'Llama-3.1-8B config'}), "
        f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, intermediate "
        f"{config.intermediate_size}, {config.num_attention_heads} heads / "
        f"{config.num_key_value_heads} KV heads, vocab {config.vocab_size}, "
        f"{params / 1e9:.2f} B params, bf16, random weights (seed {args.seed}), on {device} "
        f"[built in {time.perf_counter() - t0:.1f} s]"
    )
    print(
        f"torch {torch.__version__}, fp4norm {fp4norm.__version__}, "
        f"{torch.cuda.get_device_name(device) if cuda_graphs else 'CPU'}"
    )

    sigma = nvfp4_gaussian_rel_error()
    fp4 = Fp4Llama(hf, mode="fp4")
    plain = Fp4Llama(hf, mode="plain")
    noisy = Fp4Llama(hf, mode="noise", noise=sigma, seed=args.seed + 300)
    with torch.no_grad():
        amax = calibrate(fp4, random_prompt(config, args.calib_len, args.seed + 100, device))
        print(
            f"calibration ({args.calib_len} random tokens, unquantised model): {len(amax)} norms, "
            f"amax {min(amax):.3g} .. {max(amax):.3g}, global scales "
            f"{E4M3_MAX * E2M1_MAX / max(amax):.4g} .. {E4M3_MAX * E2M1_MAX / min(amax):.4g}"
        )
        prompt = random_prompt(config, args.prompt_len, args.seed + 200, device)
        max_len = args.prompt_len + steps
        results = {}
        tokens = None
        for name, model in (("unquantised", plain), ("fp4norm", fp4)):
            cache = new_cache(model, max_len)
            eager = decode(model.forward, model, cache, prompt, steps, tokens)
            if tokens is None:
                tokens = eager.tokens  # the unquantised model's greedy tokens, fed to all
            step = compile_step(model, device)
            t1 = time.perf_counter()
            decode(step, model, cache, prompt, steps, tokens, cuda_graphs)  # compile, record
            warm = time.perf_counter() - t1
            timed = decode(step, model, cache, prompt, steps, tokens, cuda_graphs)
            results[name] = (eager, timed, warm)
        # Byte-exact compiled check of the fp4norm model: the same fullgraph trace on
        # PyTorch's eager kernels (backend="aot_eager"), in a hand-captured CUDA graph on
        # CUDA.
        cache = new_cache(fp4, max_len)
        exact_step = compile_step(fp4, device, backend="aot_eager")
        if cuda_graphs:
            decode(fp4.forward, fp4, cache, prompt, 1, tokens)  # allocates the cache
            exact_step = cuda_graph_step(exact_step, cache, args.prompt_len, device)
        exact = decode(exact_step, fp4, cache, prompt, steps, tokens)
        noise_run = decode(noisy.forward, noisy, new_cache(noisy, max_len), prompt, steps, tokens)
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]

    mode = (
        "torch.compile(fullgraph, mode='reduce-overhead': CUDA graphs)"
        if cuda_graphs
        else "torch.compile(fullgraph) (CPU: inductor, no CUDA graphs)"
    )
    print(f"\nprompt {args.prompt_len} random tokens, {steps} decode steps, batch 1; decode step: {mode}")
    for name, (eager, timed, warm) in results.items():
        ms = [t * 1e3 for t in timed.step_s]
        eq = same_bytes(timed.logits, eager.logits)
        diff = (timed.logits - eager.logits).abs().max().item()
        print(
            f"  {name:11s} decode step: median {statistics.median(ms):8.3f} ms, mean "
            f"{statistics.mean(ms):8.3f} ms, min {min(ms):8.3f} ms   (eager: median "
            f"{statistics.median(eager.step_s) * 1e3:8.3f} ms; compile + warm-up pass {warm:.1f} s)"
        )
        print(
            f"  {'':11s} compiled logits vs eager: "
            f"{'bytes equal' if eq else f'NOT bytes equal, max abs diff {diff:.3g}'}"
        )
    eager_fp4 = results["fp4norm"][0].logits
    exact_what = (
        "torch.compile(fullgraph, backend='aot_eager') in a CUDA graph"
        if cuda_graphs
        else "torch.compile(fullgraph, backend='aot_eager')"
    )
    print(
        f"  fp4norm, {exact_what}: logits vs eager: "
        + ("bytes equal" if same_bytes(exact.logits, eager_fp4) else
           f"NOT bytes equal, max abs diff {(exact.logits - eager_fp4).abs().max().item():.3g}")
    )
    if cuda_graphs and skips:
        print(f"  WARNING: torch.compile skipped CUDA graphs {skips} time(s) (see its log above)")
    ref = results["unquantised"][1].logits
    got = results["fp4norm"][1].logits
    a = agreement(got, ref)
    b = agreement(noise_run.logits, results["unquantised"][0].logits)
    ok = within_tolerance(a, b)
    lo, hi = TOLERANCE["norm_ratio"]
    print(
        f"\nlogits vs the unquantised model over {steps} decoded steps (same tokens fed):\n"
        f"  fp4norm (compiled):                {describe(a)}\n"
        f"  noise-equivalent (eager, sigma {sigma:.4f}): {describe(b)}\n"
        f"  tolerance: fp4norm mean 1-cos <= {TOLERANCE['err_ratio']} x noise-equivalent's "
        f"({a['one_minus_cos']:.5f} vs {TOLERANCE['err_ratio'] * b['one_minus_cos']:.5f}), "
        f"norm ratio in [{lo}, {hi}]: {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
