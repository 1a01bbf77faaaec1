"""examples/llama_fp4_decode.py on its small preset (2 layers, hidden 1024, random
weights): (a) every fp4norm call the model's forward makes gives the scalar reference's
bytes for its exact inputs (y_fp4, swizzled scales, updated residual), the calls chain
one residual stream, the dequantised activations the linears read are SPEC.md §4 of
those bytes, and each global scale is 448 * 6 / amax of HF's own norm output on the
calibration prompt; (b) the fp4norm model's logits agree with the unquantised model's
within the example's stated tolerance (and the unquantised forward is HF's); (c) the
compiled decode step (fullgraph) gives eager's logits byte for byte on PyTorch's eager
kernels (backend="aot_eager", in a CUDA graph on CUDA) and stays within the tolerance
under inductor (CUDA graphs on CUDA). On the CPU always, on CUDA where present; skipped,
visibly, without torch or transformers."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: Llama example tests skipped")
pytest.importorskip(
    "transformers",
    minversion="5.17",
    reason="transformers >= 5.17 is not installed: Llama example tests skipped",
)

import fp4norm  # noqa: E402
from fp4norm import reference  # noqa: E402

from fp4_helpers import spec_dequant, swizzled_offsets  # noqa: E402
from torch_helpers import host, raw_np as raw  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "llama_fp4_decode.py"
LAYERS, PROMPT, STEPS, CALIB = 2, 16, 4, 64
# FP4NORM_TEST_DEVICES=cuda runs the CUDA cases only (a GPU machine's run; CI covers the CPU).
DEVICES = [
    d for d in ["cpu", "cuda"] if d in os.environ.get("FP4NORM_TEST_DEVICES", "cpu,cuda").split(",")
]


def load_example():
    if "llama_fp4_decode" not in sys.modules:
        spec = importlib.util.spec_from_file_location("llama_fp4_decode", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["llama_fp4_decode"] = module
        spec.loader.exec_module(module)
    return sys.modules["llama_fp4_decode"]


ex = load_example()


@pytest.fixture(scope="module", params=DEVICES, ids=DEVICES)
def setup(request):
    device = request.param
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device: CUDA Llama example tests skipped")
    config = ex.make_config(small=True, layers=LAYERS)
    hf = ex.build_model(config, device, seed=0)
    fp4 = ex.Fp4Llama(hf, mode="fp4")
    plain = ex.Fp4Llama(hf, mode="plain")
    sigma = ex.nvfp4_gaussian_rel_error()
    noisy = ex.Fp4Llama(hf, mode="noise", noise=sigma, seed=3)
    calib = ex.random_prompt(config, CALIB, 100, device)
    prompt = ex.random_prompt(config, PROMPT, 200, device)
    with torch.no_grad():
        amax = ex.calibrate(fp4, calib)
        plain_run = ex.decode(plain.forward, plain, ex.new_cache(plain, PROMPT + STEPS), prompt, STEPS)
        tokens = plain_run.tokens
        fp4_run = ex.decode(fp4.forward, fp4, ex.new_cache(fp4, PROMPT + STEPS), prompt, STEPS, tokens)
        noise_run = ex.decode(noisy.forward, noisy, ex.new_cache(noisy, PROMPT + STEPS), prompt, STEPS, tokens)
    return SimpleNamespace(
        device=torch.device(device), config=config, hf=hf, fp4=fp4, plain=plain, sigma=sigma,
        calib=calib, prompt=prompt, amax=amax, tokens=tokens, plain_run=plain_run,
        fp4_run=fp4_run, noise_run=noise_run,
    )


class Recorder:
    """Wraps fp4norm's functions, as the example calls them, recording each call's exact
    inputs (copied before the call: the residual is updated in place) and outputs."""

    def __init__(self, monkeypatch):
        self.calls = []
        self.dequant = []
        for name in ("add_rmsnorm_fp4quant", "rmsnorm_fp4quant", "dequantize"):
            monkeypatch.setattr(fp4norm, name, self.wrap(name, getattr(fp4norm, name)))

    def wrap(self, name, fn):
        def call(*args, **kwargs):
            if name == "dequantize":
                out = fn(*args, **kwargs)
                self.dequant.append(dict(args=[a.clone() for a in args[:3]], kwargs=kwargs, out=out.clone()))
                return out
            if name == "add_rmsnorm_fp4quant":
                x, residual, weight = args
            else:
                (residual, weight), x = args, None
            rec = dict(
                name=name, kwargs=dict(kwargs), weight=weight.detach().clone(),
                x=None if x is None else x.clone(), residual_before=residual.clone(),
                global_scale=kwargs["global_scale"].clone(),
            )
            q, s = fn(*args, **kwargs)
            rec.update(q=q.clone(), s=s.clone(), residual_after=residual.clone(), residual=residual)
            self.calls.append(rec)
            return q, s

        return call


def test_every_fp4norm_call_in_the_forward_matches_the_reference(setup, monkeypatch):
    s = setup
    rec = Recorder(monkeypatch)
    h = s.config.hidden_size
    with torch.no_grad():
        cache = ex.new_cache(s.fp4, PROMPT + 1)
        pos = torch.arange(PROMPT, device=s.device)[None]
        s.fp4(s.prompt, pos, cache)  # prefill: M = 16 rows
        s.fp4(s.tokens[:1].view(1, 1).to(s.device), torch.full((1, 1), PROMPT, device=s.device), cache)  # M = 1
    per_forward = 2 * LAYERS + 1
    assert len(rec.calls) == 2 * per_forward and len(rec.dequant) == 2 * per_forward
    for i, c in enumerate(rec.calls):
        k = i % per_forward
        # Layer 0's input_layernorm has nothing to add; every other norm is fused with an add.
        assert c["name"] == ("rmsnorm_fp4quant" if k == 0 else "add_rmsnorm_fp4quant")
        kw = c["kwargs"]
        assert (kw["block_size"], kw["scale_format"], kw["is_sf_swizzled_layout"]) == (16, "e4m3", True)
        assert kw["eps"] == s.config.rms_norm_eps
        assert kw["global_scale"] is s.fp4.global_scale(k)
        norm = ex.norm_modules(s.hf)[k]
        assert torch.equal(c["weight"], norm.weight.detach())
        m = c["residual_before"].numel() // h
        assert m == (PROMPT if i < per_forward else 1)

        # The scalar reference on NumPy copies of the exact inputs.
        ref_kw = dict(
            global_scale=host(c["global_scale"]), eps=kw["eps"], block_size=16, scale_format="e4m3",
            is_sf_swizzled_layout=True,
        )
        r_np = host(c["residual_before"]).reshape(m, h).copy()
        if c["x"] is None:
            q_ref, s_ref = reference.rmsnorm_fp4quant(r_np, host(c["weight"]), **ref_kw)
        else:
            q_ref, s_ref = reference.add_rmsnorm_fp4quant(
                host(c["x"]).reshape(m, h), r_np, host(c["weight"]), **ref_kw
            )
        assert np.array_equal(raw(c["q"]), q_ref.reshape(-1).view(np.uint8)), f"call {i}: y_fp4"
        assert np.array_equal(raw(c["s"]), s_ref.reshape(-1).view(np.uint8)), f"call {i}: swizzled scales"
        assert np.array_equal(raw(c["residual_after"]), r_np.reshape(-1).view(np.uint8)), f"call {i}: residual"

        # The activations the next linear reads: SPEC.md §4 of those bytes (NumPy, with the
        # swizzled scales unswizzled by SPEC.md §3's offsets).
        d = rec.dequant[i]
        assert torch.equal(d["args"][0].view(torch.uint8), c["q"].view(torch.uint8))
        assert torch.equal(d["args"][1].view(torch.uint8), c["s"].view(torch.uint8))
        assert torch.equal(d["args"][2], c["global_scale"])
        assert d["kwargs"] == dict(block_size=16, scale_format="e4m3", is_sf_swizzled_layout=True)
        nb = h // 16
        sf = raw(c["s"])[swizzled_offsets(m, nb)]
        expect = spec_dequant(raw(c["q"]), sf, m, h, 16, "e4m3", host(c["global_scale"]))
        got = d["out"].cpu().numpy()
        assert got.dtype == np.float32 and np.array_equal(got.reshape(m, h), expect), f"call {i}: dequantize"

    # One residual stream: each call's residual is the tensor the previous call updated.
    for f in range(2):
        calls = rec.calls[f * per_forward:(f + 1) * per_forward]
        for a, b in zip(calls, calls[1:]):
            assert b["residual"].data_ptr() == a["residual"].data_ptr()
            assert torch.equal(b["residual_before"].view(torch.int16), a["residual_after"].view(torch.int16))
        # The stream starts as the embeddings.
        ids = s.prompt if f == 0 else s.tokens[:1].view(1, 1).to(s.device)
        emb = s.hf.model.embed_tokens(ids).reshape(-1, h)
        assert torch.equal(calls[0]["residual_before"].view(torch.int16), emb.view(torch.int16))


def test_global_scales_are_448x6_over_amax_of_hf_norm_outputs(setup):
    """Against HF's own LlamaForCausalLM.forward (not the example's forward), with hooks.
    Exact on the CPU, where both forwards give the same bytes; on CUDA HF's forward takes
    another attention kernel (causal flash vs masked), so the amaxes may differ by a few
    bf16 ulps."""
    s = setup
    seen = {}
    norms = ex.norm_modules(s.hf)
    hooks = [
        n.register_forward_hook(lambda _m, _i, out, k=k: seen.__setitem__(k, out.abs().max().float().item()))
        for k, n in enumerate(norms)
    ]
    try:
        with torch.no_grad():
            s.hf(s.calib)
    finally:
        for hk in hooks:
            hk.remove()
    for k in range(len(norms)):
        want = np.float32(448.0 * 6.0 / seen[k])
        got = s.fp4.global_scale(k).cpu().numpy()
        assert got.shape == (1,) and got.dtype == np.float32, (k, got)
        if s.device.type == "cpu":
            assert got[0] == want, (k, got, want)
        else:
            assert abs(got[0] / want - 1) <= 0.02, (k, got, want)


def test_logits_agree_with_the_unquantised_model_within_tolerance(setup):
    s = setup
    # The noise level is NVFP4's rounding error on Gaussian data (a property of E2M1).
    assert 0.09 < s.sigma < 0.1
    # The unquantised forward is HF's: same logits as LlamaForCausalLM.forward on the prompt.
    with torch.no_grad():
        mine = s.plain(s.prompt, torch.arange(PROMPT, device=s.device)[None], ex.new_cache(s.plain, PROMPT))
        theirs = s.hf(s.prompt).logits
    diff = (mine.float() - theirs.float()).abs().max().item()
    assert diff <= 0.02 * theirs.float().abs().max().item(), diff
    if s.device.type == "cpu":
        # Greedy decoding through the example is HF's generate (CPU only: on CUDA HF's
        # DynamicCache path runs other attention kernels, and random-weight logits have
        # near-ties that a last-bit difference can flip).
        with torch.no_grad():
            gen = s.hf.generate(s.prompt, max_new_tokens=STEPS, do_sample=False)
        assert gen[0, PROMPT:].tolist() == s.plain_run.tokens.tolist()

    a = ex.agreement(s.fp4_run.logits, s.plain_run.logits)
    b = ex.agreement(s.noise_run.logits, s.plain_run.logits)
    assert a["one_minus_cos"] > 0, "the fp4norm model must differ from the unquantised one"
    assert ex.within_tolerance(a, b), (ex.describe(a), ex.describe(b))


def test_compiled_decode_matches_eager(setup):
    s = setup
    torch._dynamo.reset()
    cuda = s.device.type == "cuda"
    eager = s.fp4_run.logits
    with torch.no_grad():
        # Byte-exact: the fullgraph trace on PyTorch's eager kernels (in a CUDA graph on CUDA).
        cache = ex.new_cache(s.fp4, PROMPT + STEPS)
        step = ex.compile_step(s.fp4, s.device, backend="aot_eager")
        if cuda:
            ex.decode(s.fp4.forward, s.fp4, cache, s.prompt, 1, s.tokens)  # allocate the cache
            step = ex.cuda_graph_step(step, cache, PROMPT, s.device)
        exact = ex.decode(step, s.fp4, cache, s.prompt, STEPS, s.tokens)
        assert ex.same_bytes(exact.logits, eager), (exact.logits - eager).abs().max().item()

        # Inductor (the example's configuration; CUDA graphs on CUDA, none skipped): HF's
        # bf16 pointwise ops round differently, so the logits are held to the tolerance.
        torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] = 0
        with torch._inductor.config.patch({"triton.cudagraph_or_error": cuda}):
            step = ex.compile_step(s.fp4, s.device)
            cache = ex.new_cache(s.fp4, PROMPT + STEPS)
            ex.decode(step, s.fp4, cache, s.prompt, STEPS, s.tokens, cuda_graphs=cuda)  # compile, record
            compiled = ex.decode(step, s.fp4, cache, s.prompt, STEPS, s.tokens, cuda_graphs=cuda)
        assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
    assert compiled.tokens.tolist() == s.tokens.tolist()
    a = ex.agreement(compiled.logits, s.plain_run.logits)
    b = ex.agreement(s.noise_run.logits, s.plain_run.logits)
    assert ex.within_tolerance(a, b), (ex.describe(a), ex.describe(b))
