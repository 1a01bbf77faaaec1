"""The ``fp4norm::*`` PyTorch operators: ``torch.library.opcheck`` over dtypes, formats,
layouts, ``y_out`` and per-row global scales; bytes against the scalar reference; version
counters and the refusal of leaf tensors that require grad; FlashInfer's argument order
and exception classes; ``torch.compile`` (fullgraph, dynamic, no recompile across M,
bytes equal to eager; CUDA graphs on a GPU). On the CPU always, on CUDA where present;
skipped, visibly, without torch."""

from __future__ import annotations

import itertools
import os

import numpy as np

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: torch operator tests skipped")

import fp4norm  # noqa: E402
from fp4norm import reference  # noqa: E402

from fp4_helpers import FORMATS, same_bytes  # noqa: E402
from torch_helpers import CompiledOnce, host, raw_np as raw, torch_data as data  # noqa: E402

# FP4NORM_TEST_DEVICES=cuda runs the CUDA cases only (a GPU machine's run; CI covers the CPU).
DEVICES = [
    d
    for d in ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if d in os.environ.get("FP4NORM_TEST_DEVICES", "cpu,cuda").split(",")
]
DTYPES = [torch.bfloat16, torch.float16]
LAYOUTS = ["row-major", "swizzled", "both"]
ops = torch.ops.fp4norm


def cuda_or_skip(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device: CUDA operator tests skipped")


def poisoned(shape, dtype, device):
    return torch.full(shape, 0xAB, dtype=torch.uint8, device=device).view(dtype)


def layout_flags(layout):
    return dict(is_sf_swizzled_layout=layout == "swizzled", output_both_sf_layouts=layout == "both")


CASES = list(
    itertools.product(DTYPES, FORMATS, LAYOUTS, [False, True], [False, True], [True, False])
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype,fmt,layout,y_out,per_row,residual",
    CASES,
    ids=[
        f"{str(d)[6:]}-{b}{f}-{lay}{'-yout' if y else ''}{'-perrow' if p else ''}{'' if res else '-norez'}"
        for d, (b, f), lay, y, p, res in CASES
    ],
)
def test_operators_match_reference_and_pass_opcheck(device, dtype, fmt, layout, y_out, per_row, residual):
    """The functional and .out operators give the scalar reference's bytes, and
    torch.library.opcheck (schema, fake kernel, autograd registration, AOT dispatch with
    dynamic shapes) passes for both."""
    cuda_or_skip(device)
    block, sfmt = fmt
    m, h = 5, 128
    x, r, w = data(m, h, dtype, device, seed=m + h)
    gs = (torch.rand(m) + 0.5 if per_row else torch.tensor([1.75])).to(device)
    flags = layout_flags(layout)
    y = torch.empty_like(x) if y_out else None

    # The reference, on host copies.
    r_ref = host(r).copy()
    y_ref = np.empty_like(host(x)) if y_out else None
    ref_kw = dict(global_scale=host(gs), block_size=block, scale_format=sfmt, **flags, y_out=y_ref)
    if residual:
        ref = reference.add_rmsnorm_fp4quant(host(x), r_ref, host(w), **ref_kw)
    else:
        ref = reference.rmsnorm_fp4quant(host(x), host(w), **ref_kw)

    # The functional operators: .both for both layouts (three outputs), else .default.
    kw = dict(
        global_scale=gs, block_size=block, scale_format=sfmt,
        is_sf_swizzled_layout=layout == "swizzled", y_out=y,
    )
    overload = "both" if layout == "both" else "default"
    add_op = getattr(ops.add_rmsnorm_fp4quant, overload)
    rms_op = getattr(ops.rmsnorm_fp4quant, overload)
    r1 = r.clone()
    if residual:
        out = add_op(x, r1, w, **kw)
    else:
        out = rms_op(x, w, **kw)
    assert len(out) == (3 if layout == "both" else 2)
    q, s = out[:2]
    assert q.dtype == torch.float4_e2m1fn_x2 and q.shape == (m, h // 2)
    assert s.dtype == (torch.float8_e4m3fn if sfmt == "e4m3" else torch.uint8)
    assert np.array_equal(raw(q), ref[0].reshape(-1).view(np.uint8))
    assert np.array_equal(raw(s), ref[1].reshape(-1).view(np.uint8))
    if layout == "both":
        u = out[2]
        assert np.array_equal(raw(u), ref[2].reshape(-1).view(np.uint8))
    if residual:
        assert np.array_equal(raw(r1), r_ref.reshape(-1).view(np.uint8))
    if y_out:
        assert np.array_equal(raw(y), y_ref.reshape(-1).view(np.uint8))

    # .out into poisoned buffers: the same bytes.
    q2 = poisoned(q.shape, torch.uint8, device)
    s2 = poisoned(s.shape, s.dtype, device)
    u2 = poisoned((m, h // block), s.dtype, device) if layout == "both" else None
    out_kw = dict(
        global_scale=gs, block_size=block, scale_format=sfmt,
        is_sf_swizzled_layout=layout != "row-major", y_out=y,
    )
    r2 = r.clone()
    if residual:
        ops.add_rmsnorm_fp4quant.out(x, r2, w, q2, s2, u2, **out_kw)
        assert torch.equal(r1.view(torch.int16), r2.view(torch.int16))
    else:
        ops.rmsnorm_fp4quant.out(x, w, q2, s2, u2, **out_kw)
    assert np.array_equal(raw(q2), raw(q)) and np.array_equal(raw(s2), raw(s))
    if u2 is not None:
        assert np.array_equal(raw(u2), raw(u))

    # opcheck. Its schema check compares mutated tensors with allclose, which PyTorch has
    # no kernel for on float8: the .out outputs go in as uint8, which fp4norm accepts too.
    u8 = lambda t: None if t is None else t.view(torch.uint8)  # noqa: E731
    if residual:
        torch.library.opcheck(add_op, (x, r.clone(), w), kw)
        torch.library.opcheck(
            ops.add_rmsnorm_fp4quant.out, (x, r.clone(), w, q2, u8(s2), u8(u2)), out_kw
        )
    else:
        torch.library.opcheck(rms_op, (x, w), kw)
        torch.library.opcheck(ops.rmsnorm_fp4quant.out, (x, w, q2, u8(s2), u8(u2)), out_kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
def test_dequantize_operator(device, fmt, swizzled):
    cuda_or_skip(device)
    block, sfmt = fmt
    x, r, w = data(7, 64, torch.bfloat16, device, seed=3, lead=(7,))
    gs = torch.tensor([0.5], device=device)
    q, s = fp4norm.add_rmsnorm_fp4quant(
        x, r, w, global_scale=gs, block_size=block, scale_format=sfmt, is_sf_swizzled_layout=swizzled
    )
    d = ops.dequantize(q, s, gs, block, sfmt, swizzled)
    ref = fp4norm.dequantize(
        raw(q).reshape(q.shape), raw(s).reshape(s.shape), host(gs), block, sfmt, swizzled, 7, 64
    )
    assert d.dtype == torch.float32 and d.shape == (7, 64)
    # Bit for bit, NaNs included (SPEC.md §4: 0x7FFFFFFF on every backend).
    assert np.array_equal(d.cpu().numpy().view(np.uint32), ref.view(np.uint32))
    # opcheck clones inputs (PyTorch has no copy_ for packed FP4) and compares them with
    # allclose (no float8 kernel): the codes go in as uint8, which fp4norm accepts too.
    u8 = (q.view(torch.uint8), s.view(torch.uint8))
    assert torch.equal(ops.dequantize(*u8, gs, block, sfmt, swizzled).view(torch.int32), d.view(torch.int32))
    torch.library.opcheck(ops.dequantize.default, (*u8, gs, block, sfmt, swizzled))


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_writes_advance_version_counters(device):
    cuda_or_skip(device)
    x, r, w = data(4, 64, torch.bfloat16, device)
    y = torch.empty_like(x)
    v = r._version
    fp4norm.add_rmsnorm_fp4quant(x, r, w)
    assert r._version > v
    q = torch.empty(4, 32, dtype=torch.uint8, device=device)
    s = torch.empty(4, 4, dtype=torch.float8_e4m3fn, device=device)
    before = [t._version for t in (r, q, s, y)]
    fp4norm.add_rmsnorm_fp4quant(x, r, w, q, s, y_out=y)
    assert all(a > b for a, b in zip([t._version for t in (r, q, s, y)], before))
    v = y._version
    fp4norm.rmsnorm_fp4quant(x, w, y_out=y)
    assert y._version > v
    # Called as operators (their Autograd kernel) too.
    v = (r._version, y._version)
    ops.add_rmsnorm_fp4quant(x, r, w, y_out=y)
    assert r._version > v[0] and y._version > v[1]
    v = q._version
    ops.rmsnorm_fp4quant.out(x, w, q, s)
    assert q._version > v
    # Inside inference mode the functions advance normal tensors' counters as PyTorch's
    # in-place ops do (the operators' Autograd kernel is skipped there: docs/torch-operators.md).
    with torch.inference_mode():
        before = [t._version for t in (r, q, s, y)]
        fp4norm.add_rmsnorm_fp4quant(x, r, w, q, s, y_out=y)
        assert all(a > b for a, b in zip([t._version for t in (r, q, s, y)], before))
        v = r._version
        fp4norm.add_rmsnorm_fp4quant(x, r, w)
        assert r._version > v


@pytest.mark.parametrize("device", DEVICES)
def test_eager_calls_reach_modes_and_the_profiler_through_the_dispatcher(device):
    """An eager call goes straight to the backend kernel only where nothing would see the
    operator in the dispatcher: under a TorchDispatchMode or the profiler it is dispatched
    as usual, and both routes write the same bytes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    cuda_or_skip(device)

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, r, w = data(3, 64, torch.bfloat16, device)
    results = []
    for route in ("direct", "mode", "profiler"):
        rr = r.clone()
        q = torch.empty(3, 32, dtype=torch.uint8, device=device)
        s = torch.empty(3, 4, dtype=torch.float8_e4m3fn, device=device)
        if route == "mode":
            with Seen() as seen:
                fp4norm.add_rmsnorm_fp4quant(x, rr, w, q, s)
                fp4norm.add_rmsnorm_fp4quant(x, rr.clone(), w)
            assert "fp4norm.add_rmsnorm_fp4quant.out" in seen.ops, seen.ops
            assert "fp4norm.add_rmsnorm_fp4quant.default" in seen.ops, seen.ops
        elif route == "profiler":
            with torch.profiler.profile() as prof:
                fp4norm.add_rmsnorm_fp4quant(x, rr, w, q, s)
            names = {e.key for e in prof.key_averages()}
            assert any("fp4norm::add_rmsnorm_fp4quant" in n for n in names), names
        else:
            fp4norm.add_rmsnorm_fp4quant(x, rr, w, q, s)
        results.append((rr.view(torch.int16).cpu(), q.cpu(), s.view(torch.uint8).cpu()))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_positional_and_full_calls_write_the_same_bytes(device):
    cuda_or_skip(device)
    x, r, w = data(3, 64, torch.bfloat16, device)
    outs = []
    for full in (False, True):
        rr = r.clone()
        q = torch.empty(3, 32, dtype=torch.uint8, device=device)
        s = torch.empty(3, 4, dtype=torch.float8_e4m3fn, device=device)
        if full:
            ops.add_rmsnorm_fp4quant.out(
                x, rr, w, q, s, None, None, 1e-6, 16, None, False, None, None, 0.0
            )
        else:
            fp4norm.add_rmsnorm_fp4quant(x, rr, w, q, s)
        outs.append((rr.view(torch.int16).cpu(), q.cpu(), s.view(torch.uint8).cpu()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_leaf_that_requires_grad_is_refused(device):
    cuda_or_skip(device)
    x, r, w = data(4, 64, torch.bfloat16, device)
    leaf = r.clone().requires_grad_()
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
        fp4norm.add_rmsnorm_fp4quant(x, leaf, w)
    assert torch.equal(leaf.detach().view(torch.int16), before.view(torch.int16))
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        ops.add_rmsnorm_fp4quant(x, leaf, w)
    # A non-leaf that requires grad: refused too (the operators are not differentiable).
    with pytest.raises(RuntimeError, match="not differentiable"):
        fp4norm.add_rmsnorm_fp4quant(x, leaf * 1, w)
    assert torch.equal(leaf.detach().view(torch.int16), before.view(torch.int16))
    # As torch's own in-place ops: allowed under no_grad.
    with torch.no_grad():
        fp4norm.add_rmsnorm_fp4quant(x, leaf, w)
    # A weight that requires grad (an nn.Parameter) is only read: fine, outputs need no grad.
    q, s = fp4norm.add_rmsnorm_fp4quant(x, r, w.clone().requires_grad_())
    assert not q.requires_grad and not s.requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_flashinfer_argument_order_and_exception_classes(device):
    cuda_or_skip(device)
    x, r, w = data(4, 64, torch.bfloat16, device)
    y = torch.empty_like(x)
    # y_out is positional after enable_pdl, as in FlashInfer's add_rmsnorm_fp4quant.
    q, s = fp4norm.add_rmsnorm_fp4quant(x, r, w, None, None, None, 1e-6, 16, None, False, False, None, None, y)
    assert q.shape == (4, 32) and torch.isfinite(y.float()).all()
    bad = [
        (dict(block_size=8), fp4norm.ArgumentError, "block_size"),
        (dict(y_out=torch.empty(4, 32, dtype=torch.bfloat16, device=device)), fp4norm.ArgumentError, "y_out"),
        (dict(y_out=torch.empty(4, 64, dtype=torch.float16, device=device)), fp4norm.ArgumentTypeError, "y_out"),
        (dict(eps="1e-6"), fp4norm.ArgumentTypeError, "eps"),
        (dict(scale_format="e5m2"), fp4norm.ArgumentError, "scale_format"),
    ]
    for kw, cls, word in bad:
        r0 = r.clone()
        for catch in (cls, AssertionError, ValueError if issubclass(cls, ValueError) else TypeError):
            with pytest.raises(catch) as info:
                fp4norm.add_rmsnorm_fp4quant(x, r, w, **kw)
            assert word in str(info.value), str(info.value)
            assert type(info.value) is cls
        assert torch.equal(r.view(torch.int16), r0.view(torch.int16)), "nothing written on error"
    # H not a multiple of the block: FlashInfer asserts, fp4norm raises ArgumentError (an AssertionError).
    x48, r48, w48 = data(4, 48, torch.bfloat16, device)
    with pytest.raises(AssertionError, match="multiple of the block size 32"):
        fp4norm.add_rmsnorm_fp4quant(x48, r48, w48, block_size=32)


def test_direct_operator_errors_name_their_class():
    """Called as torch.ops, a bad argument is a RuntimeError whose message names the
    fp4norm class (the FlashInfer-signature functions raise that class itself)."""
    x, r, w = data(4, 64, torch.bfloat16, "cpu")
    with pytest.raises(RuntimeError, match="fp4norm.ArgumentError: block_size = 8"):
        ops.add_rmsnorm_fp4quant(x, r, w, block_size=8)
    with pytest.raises(RuntimeError, match="fp4norm.ArgumentTypeError: input has dtype float32"):
        ops.add_rmsnorm_fp4quant(x.float(), r, w)


@pytest.mark.parametrize("device", DEVICES)
def test_3d_strided_and_partly_preallocated(device):
    cuda_or_skip(device)
    x, r, w = data(2 * 9, 64, torch.float16, device, lead=(2, 9))
    big = torch.zeros(2, 9, 96, dtype=torch.float16, device=device)
    big[..., :64] = r
    rv = big[..., :64]
    s = torch.empty(2, 9, 2, dtype=torch.uint8, device=device)
    q, s_out, u = fp4norm.add_rmsnorm_fp4quant(
        x, rv, w, block_scale=None, block_size=32, output_both_sf_layouts=True
    )
    assert q.shape == (2, 9, 32) and u.shape == (2, 9, 2) and s_out.shape == (128 * 4,)
    r_ref = host(r).copy()
    ref = reference.add_rmsnorm_fp4quant(host(x), r_ref, host(w), block_size=32, output_both_sf_layouts=True)
    assert np.array_equal(raw(q), ref[0].reshape(-1).view(np.uint8))
    assert np.array_equal(raw(u), ref[2].reshape(-1).view(np.uint8))
    assert np.array_equal(raw(rv), r_ref.reshape(-1).view(np.uint8))
    assert torch.all(big[..., 64:] == 0)
    # Only the unswizzled output preallocated.
    q2, s2, u2 = fp4norm.add_rmsnorm_fp4quant(
        x, r.clone(), w, block_size=32, output_both_sf_layouts=True, block_scale_unswizzled=s
    )
    assert u2 is s


def decoder_block(h_dim, device):
    """linear -> add + RMSNorm + FP4 -> dequantize -> linear, the shape of a decoder layer."""
    g = torch.Generator().manual_seed(7)
    w1 = (torch.randn(h_dim, h_dim, generator=g) / h_dim**0.5).to(torch.bfloat16).to(device)
    w2 = (torch.randn(64, h_dim, generator=g) / h_dim**0.5).to(torch.bfloat16).to(device)
    norm_w = (1 + 0.1 * torch.randn(h_dim, generator=g)).to(torch.bfloat16).to(device)
    gs = torch.tensor([3.0], device=device)

    def block(x, residual):
        h = x @ w1.t()
        q, s = fp4norm.add_rmsnorm_fp4quant(h, residual, norm_w, global_scale=gs, is_sf_swizzled_layout=True)
        d = fp4norm.dequantize(q, s, gs, is_sf_swizzled_layout=True, m=x.shape[0], h=h_dim)
        return d.to(torch.bfloat16) @ w2.t(), q, s

    return block


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_dynamic_no_recompile(device):
    cuda_or_skip(device)

    torch._dynamo.reset()
    block = decoder_block(256, device)
    x0, r0, _ = data(7, 256, torch.bfloat16, device)
    explained = torch._dynamo.explain(block)(x0, r0.clone())
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = CompiledOnce(block)
    for m in (7, 128, 1000):
        x, r, _ = data(m, 256, torch.bfloat16, device, seed=m)
        r_eager, r_compiled = r.clone(), r.clone()
        ye, qe, se = block(x, r_eager)
        yc, qc, sc = compiled(x, r_compiled)
        assert np.array_equal(raw(qe), raw(qc)) and np.array_equal(raw(se), raw(sc))
        assert np.array_equal(raw(r_eager), raw(r_compiled)) and np.array_equal(raw(ye), raw(yc))
    assert compiled.recompiles == 0, f"recompiled {compiled.recompiles} frames for a new M"


def test_torch_compile_cuda_graphs():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: CUDA-graph compile test skipped")
    torch._dynamo.reset()
    block = decoder_block(256, "cuda")
    compiled = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    for m in (16, 16, 16, 64):
        x, r, _ = data(m, 256, torch.bfloat16, "cuda", seed=m)
        r_eager, r_compiled = r.clone(), r.clone()
        ye, qe, se = block(x, r_eager)
        yc, qc, sc = compiled(x, r_compiled)
        assert np.array_equal(raw(qe), raw(qc)) and np.array_equal(raw(se), raw(sc))
        assert np.array_equal(raw(r_eager), raw(r_compiled)) and np.array_equal(raw(ye), raw(yc))


@pytest.mark.parametrize("device", DEVICES)
def test_weight_bias_through_the_operators(device):
    """SPEC.md §8's weight bias (Gemma's (1 + w)) through the functional and .out
    operators: the reference's bytes, opcheck, and under torch.compile (fullgraph,
    dynamic) one compile across M with eager's bytes."""
    cuda_or_skip(device)
    m, h = 6, 256
    x, r, w = data(m, h, torch.bfloat16, device, seed=5)
    gs = torch.tensor([2.0], device=device)
    r_ref = host(r).copy()
    ref = reference.add_rmsnorm_fp4quant(
        host(x), r_ref, host(w), global_scale=host(gs), is_sf_swizzled_layout=True, weight_bias=1.0
    )
    r1 = r.clone()
    q, s = ops.add_rmsnorm_fp4quant(x, r1, w, gs, is_sf_swizzled_layout=True, weight_bias=1.0)
    assert np.array_equal(raw(q), ref[0].reshape(-1).view(np.uint8))
    assert np.array_equal(raw(s), ref[1].reshape(-1).view(np.uint8))
    assert np.array_equal(raw(r1), r_ref.reshape(-1).view(np.uint8))
    q2 = torch.empty_like(q)
    s2 = torch.empty_like(s)
    ops.add_rmsnorm_fp4quant.out(x, r.clone(), w, q2, s2, None, gs, is_sf_swizzled_layout=True,
                                 weight_bias=1.0)
    assert torch.equal(raw_t(q2), raw_t(q)) and torch.equal(raw_t(s2), raw_t(s))
    u8 = dict(dtype=torch.uint8, device=device)
    torch.library.opcheck(
        ops.add_rmsnorm_fp4quant.default, (x, r.clone(), w, gs),
        dict(is_sf_swizzled_layout=True, weight_bias=1.0),
    )
    torch.library.opcheck(
        ops.rmsnorm_fp4quant.out,
        (x, w, torch.empty(m, h // 2, **u8), torch.empty(m, h // 16, **u8)),
        dict(global_scale=gs, weight_bias=-0.5),
    )


    torch._dynamo.reset()

    def norm(x, residual):
        return fp4norm.add_rmsnorm_fp4quant(x, residual, w, global_scale=gs,
                                            is_sf_swizzled_layout=True, weight_bias=1.0)

    compiled = CompiledOnce(norm)
    for mm in (7, 128, 1000):
        xx, rr, _ = data(mm, h, torch.bfloat16, device, seed=mm)
        re, rc = rr.clone(), rr.clone()
        qe, se = norm(xx, re)
        qc, sc = compiled(xx, rc)
        assert torch.equal(raw_t(qe), raw_t(qc)) and torch.equal(raw_t(se), raw_t(sc))
        assert torch.equal(raw_t(re), raw_t(rc))
    assert compiled.recompiles == 0, f"recompiled {compiled.recompiles} frames for a new M"


def raw_t(t):
    return t.detach().contiguous().view(torch.uint8).reshape(-1)


# --------------------------------------------------------------------------------------
# The fused all-reduce's operators (SPEC.md §9)
# --------------------------------------------------------------------------------------


def ranks_data(w, m, h, dtype, device, seed):
    """Every rank's input (with a row that cancels across ranks), a residual, a weight."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(m, h, generator=g) * (k + 1) for k in range(w)]
    if w > 1 and m > 2:
        xs[1][1] = -xs[0][1]
        xs[0][2, :8] = 3e4
    r = torch.randn(m, h, generator=g) * 2
    wt = 1 + 0.25 * torch.randn(h, generator=g)
    return [x.to(dtype).to(device) for x in xs], r.to(dtype).to(device), wt.to(dtype).to(device)


AR_CASES = list(itertools.product([1, 2, 3, 8], DTYPES, LAYOUTS))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "w,dtype,layout", AR_CASES, ids=[f"w{w}-{str(d)[6:]}-{lay}" for w, d, lay in AR_CASES]
)
def test_allreduce_operators_match_reference_and_pass_opcheck(device, w, dtype, layout):
    """``allreduce_add_rmsnorm_fp4quant`` (functional, ``.both``, ``.out`` into poisoned
    buffers) writes the bytes of fp4norm.reference.allreduce_add_rmsnorm_fp4quant for 1 to
    8 ranks, and torch.library.opcheck passes for each overload."""
    cuda_or_skip(device)
    m, h = 5, 256
    xs, r, wt = ranks_data(w, m, h, dtype, device, seed=w)
    gs = torch.tensor([1.5], device=device)
    flags = layout_flags(layout)
    r_ref = host(r).copy()
    ref = reference.allreduce_add_rmsnorm_fp4quant(
        [host(x) for x in xs], r_ref, host(wt), global_scale=host(gs), weight_bias=0.5, **flags
    )
    kw = dict(global_scale=gs, is_sf_swizzled_layout=layout == "swizzled", weight_bias=0.5)
    op = ops.allreduce_add_rmsnorm_fp4quant.both if layout == "both" else ops.allreduce_add_rmsnorm_fp4quant.default
    r1 = r.clone()
    out = op(xs, r1, wt, **kw)
    assert len(out) == len(ref)
    for got, want in zip(out, ref):
        assert np.array_equal(raw(got), want.reshape(-1).view(np.uint8))
    assert np.array_equal(raw(r1), r_ref.reshape(-1).view(np.uint8))
    # .out into poisoned buffers.
    q2 = poisoned(out[0].shape, torch.uint8, device)
    s2 = poisoned(out[1].shape, torch.uint8, device)
    u2 = poisoned(out[2].shape, torch.uint8, device) if layout == "both" else None
    out_kw = dict(global_scale=gs, is_sf_swizzled_layout=layout != "row-major", weight_bias=0.5)
    r2 = r.clone()
    ops.allreduce_add_rmsnorm_fp4quant.out(xs, r2, wt, q2, s2, u2, **out_kw)
    assert np.array_equal(raw(q2), raw(out[0])) and np.array_equal(raw(s2), raw(out[1]))
    if u2 is not None:
        assert np.array_equal(raw(u2), raw(out[2]))
    assert np.array_equal(raw(r2), raw(r1))
    torch.library.opcheck(op, (xs, r.clone(), wt), kw)
    torch.library.opcheck(ops.allreduce_add_rmsnorm_fp4quant.out, (xs, r.clone(), wt, q2, s2, u2), out_kw)


@pytest.mark.parametrize("device", DEVICES)
def test_allreduce_operator_refusals_version_counters_and_grad(device):
    """Bad rank inputs are refused by the operator, with their name and class, before any
    write; the residual's version counter advances; a leaf that requires grad is refused."""
    cuda_or_skip(device)
    m, h = 4, 64
    xs, r, wt = ranks_data(3, m, h, torch.bfloat16, device, seed=3)
    before = r.clone()
    bad = [
        ([], fp4norm.ArgumentError, "at least one rank"),
        ([xs[0]] * 9, fp4norm.ArgumentError, "1 to 8"),
        ([xs[0], xs[1][:3]], fp4norm.ArgumentError, r"inputs\[1\] has shape"),
        ([xs[0], xs[1], xs[2].half()], fp4norm.ArgumentTypeError, r"inputs\[2\] has dtype"),
        ([xs[0], xs[1].t().contiguous().t()], fp4norm.ArgumentError, r"inputs\[1\]"),
    ]
    for inputs, cls, pattern in bad:
        with pytest.raises(RuntimeError, match=pattern) as e:
            ops.allreduce_add_rmsnorm_fp4quant(inputs, r, wt)
        assert isinstance(fp4norm._ops.translate(e.value), cls), str(e.value)
    with pytest.raises(fp4norm.ArgumentError, match=r"inputs\[1\] has shape"):
        fp4norm.allreduce_add_rmsnorm_fp4quant([xs[0], xs[1][:3]], r, wt)
    assert torch.equal(r.view(torch.int16), before.view(torch.int16))
    v = r._version
    fp4norm.allreduce_add_rmsnorm_fp4quant(xs, r, wt)
    assert r._version > v
    v = r._version
    ops.allreduce_add_rmsnorm_fp4quant(xs, r, wt)
    assert r._version > v
    leaf = r.float().requires_grad_().bfloat16().detach().requires_grad_()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        fp4norm.allreduce_add_rmsnorm_fp4quant(xs, leaf, wt)


@pytest.mark.parametrize("device", DEVICES)
def test_allreduce_torch_compile_fullgraph_dynamic_no_recompile(device):
    """The fused all-reduce under torch.compile (fullgraph, dynamic): no graph break, one
    compile across M, eager's bytes."""
    cuda_or_skip(device)

    torch._dynamo.reset()
    h = 256
    _, _, wt = ranks_data(1, 1, h, torch.bfloat16, device, seed=0)

    def norm(x0, x1, residual):
        return fp4norm.allreduce_add_rmsnorm_fp4quant([x0, x1], residual, wt, is_sf_swizzled_layout=True)

    xs, r, _ = ranks_data(2, 7, h, torch.bfloat16, device, seed=7)
    explained = torch._dynamo.explain(norm)(xs[0], xs[1], r.clone())
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = CompiledOnce(norm)
    for m in (7, 128, 1000):
        xs, r, _ = ranks_data(2, m, h, torch.bfloat16, device, seed=m)
        re, rc = r.clone(), r.clone()
        qe, se = norm(xs[0], xs[1], re)
        qc, sc = compiled(xs[0], xs[1], rc)
        assert torch.equal(raw_t(qe), raw_t(qc)) and torch.equal(raw_t(se), raw_t(sc))
        assert torch.equal(raw_t(re), raw_t(rc))
    assert compiled.recompiles == 0, f"recompiled {compiled.recompiles} frames for a new M"


# --------------------------------------------------------------------------------------
# Tensor subclasses in any argument
# --------------------------------------------------------------------------------------


def _two(t, u):
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(t, u)


SUBCLASS_ARGS = ["residual", "weight", "global_scale", "y_out", "y_fp4", "block_scale"]


@pytest.mark.parametrize("arg", SUBCLASS_ARGS)
def test_tensor_subclass_in_any_argument_reaches_its_dispatch(arg):
    """A tensor subclass (here TwoTensor, which runs an operator once per component) in an
    argument other than ``input`` must see the call through ``__torch_dispatch__``, as it
    does when the operator is called through torch.ops: the eager shortcut to the backend
    kernel is only for plain tensors. Bytes: each component as the reference writes it."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    r2 = (r.float() * 0.5).to(torch.bfloat16)
    kw = {}
    if arg == "residual":
        residual = _two(r.clone(), r2.clone())
    else:
        residual = _two(r.clone(), r.clone())  # written once per component
    if arg == "weight":
        kw["weight"] = _two(w, w)
    else:
        kw["weight"] = w
    if arg == "global_scale":
        kw["global_scale"] = _two(torch.tensor([2.0]), torch.tensor([2.0]))
    if arg == "y_out":
        kw["y_out"] = _two(torch.empty_like(x), torch.empty_like(x))
    if arg in ("y_fp4", "block_scale"):
        kw["y_fp4"] = _two(*(torch.empty(3, 32, dtype=torch.uint8) for _ in range(2)))
        kw["block_scale"] = _two(*(torch.empty(3, 4, dtype=torch.float8_e4m3fn) for _ in range(2)))
    got = fp4norm.add_rmsnorm_fp4quant(x, residual, **kw)
    for comp, r_in in (("a", r), ("b", r2 if arg == "residual" else r)):
        r_ref = host(r_in).copy()
        gs = 2.0 if arg == "global_scale" else None
        y_ref = np.empty(host(x).shape, host(x).dtype) if arg == "y_out" else None
        ref = reference.add_rmsnorm_fp4quant(host(x), r_ref, host(w), global_scale=gs, y_out=y_ref)
        for t, want in zip(got, ref):
            assert np.array_equal(raw(getattr(t, comp)), want.reshape(-1).view(np.uint8)), (arg, comp)
        assert np.array_equal(raw(getattr(residual, comp)), r_ref.reshape(-1).view(np.uint8))
        if y_ref is not None:
            assert np.array_equal(raw(getattr(kw["y_out"], comp)), y_ref.reshape(-1).view(np.uint8))


@pytest.mark.parametrize("arg", ["residual", "weight", "out", "scales_out", "inputs"])
def test_tensor_subclass_reaches_its_dispatch_in_the_fp8_functions(arg):
    """The FP8 functions (and the fused all-reduce) take the same care: a subclass in any
    tensor argument sees the operator."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    residual = _two(r.clone(), r.clone())
    weight = _two(w, w) if arg == "weight" else w
    out = scales = None
    if arg in ("out", "scales_out"):
        out = _two(*(torch.empty(3, 64, dtype=torch.float8_e4m3fn) for _ in range(2)))
        scales = _two(torch.empty(3, 1), torch.empty(3, 1))
    if arg == "inputs":
        got = fp4norm.allreduce_add_rmsnorm_fp8quant([x, _two(x, x)], residual, weight)
    else:
        got = fp4norm.add_rmsnorm_fp8quant(x, residual, weight, out, scales)
    for comp in ("a", "b"):
        r_ref = host(r).copy()
        if arg == "inputs":
            ref = reference.allreduce_add_rmsnorm_fp8quant([host(x), host(x)], r_ref, host(w))
        else:
            ref = reference.add_rmsnorm_fp8quant(host(x), r_ref, host(w))
        for t, want in zip(got, ref):
            assert np.array_equal(raw(getattr(t, comp)), want.reshape(-1).view(np.uint8)), (arg, comp)
        assert np.array_equal(raw(getattr(residual, comp)), r_ref.reshape(-1).view(np.uint8))
    # FlashInfer's static form too.
    res = _two(r.clone(), r.clone())
    q = torch.empty(3, 64, dtype=torch.float8_e4m3fn)
    fp4norm.fused_add_rmsnorm_quant(q, x, res, w, 1.0)
    r_ref = r.clone()
    q_ref = torch.empty(3, 64, dtype=torch.float8_e4m3fn)
    reference.fused_add_rmsnorm_quant(q_ref, x, r_ref, w, 1.0)
    for comp in ("a", "b"):
        assert np.array_equal(raw(getattr(res, comp)), raw(r_ref))
    assert np.array_equal(raw(q), raw(q_ref))


def test_tensor_without_storage_is_named_as_such():
    """Where a wrapper subclass does reach fp4norm's memory-reading code (the host
    reference, or the CPU kernel entered below the subclass's dispatch), the error says it
    has no storage, not that its storage was freed."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    with pytest.raises(fp4norm.ArgumentError, match="residual has no storage .a tensor subclass"):
        reference.add_rmsnorm_fp4quant(x, _two(r, r.clone()), w)
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    handle = ops.add_rmsnorm_fp4quant.default._handle
    with pytest.raises(RuntimeError, match="fp4norm.ArgumentError: weight has no storage .a tensor subclass"):
        handle.redispatch_boxed(keys, x, r.clone(), _two(w, w), None, 1e-6, 16, None, False, None, None)


# --------------------------------------------------------------------------------------
# scale_format: one set of spellings on every path
# --------------------------------------------------------------------------------------

BAD_SCALE_FORMATS = ["e4m3fn", "fp8", "e8m0", "E4M3FN", "", " e4m3", "nvfp4"]


@pytest.mark.parametrize("fmt", BAD_SCALE_FORMATS)
def test_scale_format_outside_the_documented_spellings_is_refused_on_every_path(fmt):
    """``scale_format`` is ``"e4m3"``, ``"ue8m0"`` (any case) or None on every path: the
    torch functions, NumPy, the reference, the operators and the fake kernels that
    torch.compile traces. Another spelling is an ArgumentError before anything runs (it
    used to work on torch eagerly, with a fake kernel that predicted another dtype, and to
    be refused on NumPy)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    xn, rn, wn = host(x), host(r).copy(), host(w)
    q, s = fp4norm.rmsnorm_fp4quant(x, w)
    qn, sn = host(q), host(s)
    r0 = r.clone()
    calls = [
        lambda: fp4norm.add_rmsnorm_fp4quant(x, r, w, scale_format=fmt),
        lambda: fp4norm.rmsnorm_fp4quant(x, w, scale_format=fmt, is_sf_swizzled_layout=True),
        lambda: fp4norm.add_rmsnorm_fp4quant(x, r, w, q, s, scale_format=fmt),
        lambda: fp4norm.add_rmsnorm_fp4quant(x, r, w, block_scale=s, scale_format=fmt),
        lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([x, x], r, w, scale_format=fmt),
        lambda: fp4norm.add_rmsnorm_fp4quant(xn, rn, wn, scale_format=fmt),
        lambda: reference.add_rmsnorm_fp4quant(xn, rn, wn, scale_format=fmt),
        lambda: fp4norm.dequantize(q, s, scale_format=fmt),
        lambda: fp4norm.dequantize(qn, sn, scale_format=fmt),
        lambda: fp4norm.scale_sizes(3, 64, 16, fmt),
    ]
    for call in calls:
        with pytest.raises(fp4norm.ArgumentError, match="scale_format"):
            call()
    assert torch.equal(r.view(torch.int16), r0.view(torch.int16))
    assert same_bytes(rn, host(r0))
    for op_call in (
        lambda: ops.rmsnorm_fp4quant(x, w, scale_format=fmt),
        lambda: ops.add_rmsnorm_fp4quant.out(x, r, w, q, s, scale_format=fmt),
        lambda: ops.dequantize(q, s, scale_format=fmt),
    ):
        with pytest.raises(RuntimeError, match="fp4norm.ArgumentError: scale_format"):
            op_call()
    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        with pytest.raises(fp4norm.ArgumentError, match="scale_format"):
            ops.rmsnorm_fp4quant(fx, fw, scale_format=fmt)


@pytest.mark.parametrize("fmt", ["E4M3", "UE8M0", "Ue8m0"])
def test_scale_format_in_any_case_agrees_with_its_fake_kernel(fmt):
    """The documented spellings in any case: eager bytes are the reference's, the fake
    kernel predicts the dtype eager returns (opcheck), torch.compile gives eager's bytes."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    got = fp4norm.rmsnorm_fp4quant(x, w, scale_format=fmt)
    want = reference.rmsnorm_fp4quant(host(x), host(w), scale_format=fmt.lower())
    for g, wnt in zip(got, want):
        assert np.array_equal(raw(g), wnt.reshape(-1).view(np.uint8))
    assert got[1].dtype == (torch.float8_e4m3fn if fmt.lower() == "e4m3" else torch.uint8)
    torch.library.opcheck(ops.rmsnorm_fp4quant.default, (x, w), dict(scale_format=fmt))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: fp4norm.rmsnorm_fp4quant(x, w, scale_format=fmt), fullgraph=True)
    for g, c in zip(got, compiled(x, w)):
        assert g.dtype == c.dtype and torch.equal(raw_t(g), raw_t(c))


# --------------------------------------------------------------------------------------
# None for a required tensor
# --------------------------------------------------------------------------------------


def test_none_for_a_required_tensor_is_named():
    """None where a tensor is required: the functions raise ArgumentTypeError naming the
    argument before calling an operator; the operators (whose parser lets None through as
    an undefined tensor) refuse it with the same class and name, not a libtorch failure."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    q, s = fp4norm.rmsnorm_fp4quant(x, w)
    out8 = torch.empty(3, 64, dtype=torch.float8_e4m3fn)
    r0 = r.clone()
    functions = [
        ("weight", lambda: fp4norm.add_rmsnorm_fp4quant(x, r, None)),
        ("weight", lambda: fp4norm.rmsnorm_fp4quant(x, None, q, s)),
        ("weight", lambda: fp4norm.add_rmsnorm_fp8quant(x, r, None)),
        ("weight", lambda: fp4norm.fused_add_rmsnorm_quant(out8, x, r, None, 1.0)),
        ("weight", lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([x, x], r, None)),
        ("out", lambda: fp4norm.rmsnorm_quant(None, x, w, 1.0)),
        ("out", lambda: fp4norm.fused_add_rmsnorm_quant(None, x, r, w, 1.0)),
        ("block_scale", lambda: fp4norm.dequantize(q, None)),
    ]
    for name, call in functions:
        with pytest.raises(fp4norm.ArgumentTypeError, match=rf"^{name} is required"):
            call()
    assert torch.equal(r.view(torch.int16), r0.view(torch.int16))
    operators = [
        ("input", lambda: ops.add_rmsnorm_fp4quant(None, r, w)),
        ("residual", lambda: ops.add_rmsnorm_fp4quant(x, None, w)),
        ("weight", lambda: ops.rmsnorm_fp4quant(x, None)),
        ("y_fp4", lambda: ops.rmsnorm_fp4quant.out(x, w, None, s)),
        ("block_scale", lambda: ops.add_rmsnorm_fp4quant.out(x, r, w, q, None)),
        ("residual", lambda: ops.add_rmsnorm_fp8quant(x, None, w)),
        ("residual", lambda: ops.allreduce_add_rmsnorm_fp4quant([x, x], None, w)),
        ("out", lambda: ops.rmsnorm_quant(None, x, w, torch.ones(1))),
        ("scale", lambda: ops.fused_add_rmsnorm_quant(out8, x, r, w, None)),
        ("residual", lambda: ops.fused_add_rmsnorm_quant(out8, x, None, w, torch.ones(1))),
        ("y_fp4", lambda: ops.dequantize(None, s)),
        ("block_scale", lambda: ops.dequantize(q, None)),
    ]
    for name, call in operators:
        with pytest.raises(RuntimeError, match=rf"fp4norm.ArgumentTypeError: {name} is required") as info:
            call()
        assert isinstance(fp4norm._ops.translate(info.value), fp4norm.ArgumentTypeError)
    assert torch.equal(r.view(torch.int16), r0.view(torch.int16))


# --------------------------------------------------------------------------------------
# Fake kernels check what needs no data
# --------------------------------------------------------------------------------------


def _fake_bad_calls():
    """(name, class, message words, call on meta tensors) for rules that need no data."""
    bf = torch.bfloat16

    def t(*shape, dtype=bf):
        return torch.empty(*shape, dtype=dtype, device="meta")

    x, r, w = t(5, 64), t(5, 64), t(64)
    return [
        ("H not a multiple of the block", fp4norm.ArgumentError, ["H = 65", "block size 16"],
         lambda: fp4norm.rmsnorm_fp4quant(t(5, 65), t(65))),
        ("H = 0", fp4norm.ArgumentError, ["H is 0"], lambda: ops.rmsnorm_fp4quant(t(5, 0), t(0))),
        ("float32 input", fp4norm.ArgumentTypeError, ["input", "float32"],
         lambda: fp4norm.rmsnorm_fp4quant(t(5, 64, dtype=torch.float32), t(64, dtype=torch.float32))),
        ("4-D input", fp4norm.ArgumentError, ["2-D"], lambda: ops.rmsnorm_fp4quant(t(1, 1, 5, 64), w)),
        ("weight dtype", fp4norm.ArgumentTypeError, ["weight", "float16"],
         lambda: fp4norm.add_rmsnorm_fp4quant(x, r, t(64, dtype=torch.float16))),
        ("weight shape", fp4norm.ArgumentError, ["weight", "(64,)"], lambda: fp4norm.add_rmsnorm_fp4quant(x, r, t(32))),
        ("residual shape", fp4norm.ArgumentError, ["residual", "shape"], lambda: fp4norm.add_rmsnorm_fp4quant(x, t(4, 64), w)),
        ("y_out dtype", fp4norm.ArgumentTypeError, ["y_out"],
         lambda: fp4norm.rmsnorm_fp4quant(x, w, y_out=t(5, 64, dtype=torch.float16))),
        ("block_size", fp4norm.ArgumentError, ["block_size = 8"], lambda: ops.rmsnorm_fp4quant(x, w, block_size=8)),
        ("global_scale dtype", fp4norm.ArgumentTypeError, ["global_scale"],
         lambda: ops.rmsnorm_fp4quant(x, w, t(1, dtype=torch.float16))),
        ("y_fp4 dtype", fp4norm.ArgumentTypeError, ["y_fp4"],
         lambda: fp4norm.rmsnorm_fp4quant(x, w, t(5, 32, dtype=torch.int8), t(5, 4, dtype=torch.uint8))),
        ("rank input shape", fp4norm.ArgumentError, ["inputs[1]"],
         lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([x, t(4, 64)], r, w)),
        ("dequantize H", fp4norm.ArgumentError, ["H = 48"],
         lambda: fp4norm.dequantize(t(5, 24, dtype=torch.uint8), t(5, 3, dtype=torch.uint8), block_size=32)),
        ("fp8 group", fp4norm.ArgumentError, ["H = 64", "group size 128"],
         lambda: fp4norm.rmsnorm_fp8quant(x, w, group=128)),
        ("fp8 swizzled f32", fp4norm.ArgumentError, ["swizzled"],
         lambda: fp4norm.add_rmsnorm_fp8quant(x, r, w, group=32, scale_layout="swizzled")),
        ("fp8 float32 input", fp4norm.ArgumentTypeError, ["input", "float32"],
         lambda: fp4norm.rmsnorm_fp8quant(t(5, 64, dtype=torch.float32), t(64, dtype=torch.float32))),
        ("fp8 scales_out dtype", fp4norm.ArgumentTypeError, ["scales_out"],
         lambda: ops.rmsnorm_fp8quant.out(x, w, t(5, 64, dtype=torch.float8_e4m3fn), t(5, 1, dtype=torch.float16))),
        ("fp8 static out dtype", fp4norm.ArgumentTypeError, ["out", "bfloat16"],
         lambda: ops.rmsnorm_quant(t(5, 64), x, w, t(1, dtype=torch.float32))),
        ("fp8 static scale shape", fp4norm.ArgumentError, ["scale"],
         lambda: fp4norm.fused_add_rmsnorm_quant(t(5, 64, dtype=torch.float8_e4m3fn), x, r, w, t(2, dtype=torch.float32))),
        ("fp8 rank dtype", fp4norm.ArgumentTypeError, ["inputs[1]"],
         lambda: fp4norm.allreduce_add_rmsnorm_fp8quant([x, t(5, 64, dtype=torch.float16)], r, w)),
    ]


FAKE_BAD = _fake_bad_calls()


@pytest.mark.parametrize("case", range(len(FAKE_BAD)), ids=[c[0] for c in FAKE_BAD])
def test_fake_kernels_refuse_what_needs_no_data(case):
    """Meta (and fake) tensors run the fake kernels: they refuse a call whose dtypes, ranks,
    hidden size or options are bad, with the kernels' class, rather than predict outputs
    (an H = 65 call used to give y_fp4 [5, 32])."""
    name, cls, words, call = FAKE_BAD[case]
    with pytest.raises(cls) as info:
        call()
    for word in words:
        assert word in str(info.value), (name, str(info.value))


def test_bad_calls_fail_when_traced():
    """Under torch.compile(fullgraph=True) a call the fake kernel refuses fails while
    tracing (Dynamo's TorchRuntimeError, a RuntimeError naming the fp4norm class and
    message), before any kernel runs; torch.export raises the fp4norm class itself."""
    x, r, w = data(5, 65, torch.bfloat16, "cpu")
    r0 = r.clone()
    torch._dynamo.reset()
    f = torch.compile(lambda x, r, w: fp4norm.add_rmsnorm_fp4quant(x, r, w), fullgraph=True)
    with pytest.raises(RuntimeError) as info:
        f(x, r, w)
    assert isinstance(info.value, torch._dynamo.exc.TorchRuntimeError), type(info.value)
    assert "ArgumentError" in str(info.value) and "H = 65" in str(info.value)
    assert torch.equal(r.view(torch.int16), r0.view(torch.int16))
    torch._dynamo.reset()
    g = torch.compile(lambda x, w: fp4norm.rmsnorm_fp8quant(x, w, group=32), fullgraph=True, dynamic=True)
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match="group size 32"):
        g(x, w)

    class Norm(torch.nn.Module):
        def forward(self, x, w):
            return fp4norm.rmsnorm_fp4quant(x, w)

    with pytest.raises(fp4norm.ArgumentError, match="H = 65"):
        torch.export.export(Norm(), (x, w))
    with pytest.raises(fp4norm.ArgumentTypeError, match="input has dtype float32"):
        torch.export.export(Norm(), (x.float(), w.float()))
    # A good call still exports, and its outputs are the eager ones.
    x64, _, w64 = data(5, 64, torch.bfloat16, "cpu")
    exported = torch.export.export(Norm(), (x64, w64))
    for a, b in zip(exported.module()(x64, w64), fp4norm.rmsnorm_fp4quant(x64, w64)):
        assert torch.equal(raw_t(a), raw_t(b))


# --------------------------------------------------------------------------------------
# Inference tensors are written only in inference mode
# --------------------------------------------------------------------------------------


def test_inference_tensor_is_not_written_outside_inference_mode():
    """A tensor made under torch.inference_mode() may not be updated in place outside it
    (PyTorch's own in-place ops refuse); fp4norm's functions and operators used to write
    it. Refused now, naming it, before anything is written; inside inference mode the call
    runs and writes the reference's bytes."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    with torch.inference_mode():
        r_inf = r.clone()
        y_inf = torch.empty_like(x)
        q_inf = torch.empty(3, 32, dtype=torch.uint8)
        s_inf = torch.empty(3, 4, dtype=torch.float8_e4m3fn)
        out_inf = torch.empty(3, 64, dtype=torch.float8_e4m3fn)
        x_inf = x.clone()
        demo = torch.zeros(3)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
        demo.add_(1)  # (PyTorch refuses it after writing; fp4norm before)
    before = [t.view(torch.uint8).clone() for t in (r_inf,)]
    calls = [
        ("residual", lambda: fp4norm.add_rmsnorm_fp4quant(x, r_inf, w)),
        ("residual", lambda: fp4norm.add_rmsnorm_fp4quant(x_inf, r_inf, w)),
        ("y_out", lambda: fp4norm.rmsnorm_fp4quant(x, w, y_out=y_inf)),
        ("y_fp4", lambda: fp4norm.rmsnorm_fp4quant(x, w, q_inf, torch.empty(3, 4, dtype=torch.float8_e4m3fn))),
        ("block_scale", lambda: fp4norm.add_rmsnorm_fp4quant(x, r.clone(), w, block_scale=s_inf)),
        ("residual", lambda: fp4norm.allreduce_add_rmsnorm_fp4quant([x, x], r_inf, w)),
        ("residual", lambda: fp4norm.add_rmsnorm_fp8quant(x, r_inf, w)),
        ("out", lambda: fp4norm.rmsnorm_quant(out_inf, x, w, 1.0)),
        ("residual", lambda: fp4norm.fused_add_rmsnorm_quant(torch.empty(3, 64, dtype=torch.float8_e4m3fn), x, r_inf, w, 1.0)),
        ("residual", lambda: reference.add_rmsnorm_fp4quant(x, r_inf, w)),
        ("y_out", lambda: reference.rmsnorm_fp8quant(x, w, y_out=y_inf)),
    ]
    for name, call in calls:
        with pytest.raises(fp4norm.ArgumentError, match=rf"^{name} is an inference tensor"):
            call()
    operators = [
        lambda: ops.add_rmsnorm_fp4quant(x, r_inf, w),
        lambda: ops.add_rmsnorm_fp4quant(x_inf, r_inf, w),
        lambda: ops.add_rmsnorm_fp8quant(x, r_inf, w),
        lambda: ops.allreduce_add_rmsnorm_fp4quant([x, x], r_inf, w),
    ]
    for call in operators:
        with pytest.raises(RuntimeError, match="fp4norm.ArgumentError: residual is an inference tensor") as info:
            call()
        assert isinstance(fp4norm._ops.translate(info.value), fp4norm.ArgumentError)
    assert all(torch.equal(a, t.view(torch.uint8)) for a, t in zip(before, (r_inf,)))
    # In inference mode: written, the reference's bytes.
    r_ref = host(r).copy()
    want = reference.add_rmsnorm_fp4quant(host(x), r_ref, host(w))
    with torch.inference_mode():
        got = fp4norm.add_rmsnorm_fp4quant(x, r_inf, w)
        ops.rmsnorm_fp4quant.out(x, w, q_inf, s_inf)
    for g, wnt in zip(got, want):
        assert np.array_equal(raw(g), wnt.reshape(-1).view(np.uint8))
    assert np.array_equal(raw(r_inf), r_ref.reshape(-1).view(np.uint8))


def test_device_and_layout_messages_say_what_they_mean():
    """A tensor on a device fp4norm has no kernel for is named with the device's name
    (not a type code); a buffer fp4norm reads as one block says it is read, an output that
    it is written."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    with pytest.raises(fp4norm.ArgumentError, match=r"^weight is on device meta: fp4norm runs on CPU and CUDA"):
        fp4norm.add_rmsnorm_fp4quant(x, r.clone(), w.to("meta"))
    with pytest.raises(fp4norm.ArgumentError, match=r"^global_scale must be contiguous .*: it is read as one flat buffer"):
        fp4norm.rmsnorm_fp4quant(x, w, global_scale=torch.ones(6)[::2])
    q, s = fp4norm.rmsnorm_fp4quant(x, w)
    with pytest.raises(fp4norm.ArgumentError, match=r"^block_scale must be contiguous .*: it is read as one flat buffer"):
        fp4norm.dequantize(q, torch.zeros(3, 8, dtype=torch.float8_e4m3fn)[:, ::2])
    with pytest.raises(fp4norm.ArgumentError, match=r"^block_scale must be contiguous .*: it is written as one flat buffer"):
        fp4norm.rmsnorm_fp4quant(x, w, q, torch.zeros(3, 8, dtype=torch.float8_e4m3fn)[:, ::2])


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_flags_and_block_size_take_the_same_types_on_every_path(kind):
    """The bool options (``is_sf_swizzled_layout``, ``output_both_sf_layouts``,
    ``enable_pdl``) take a bool or a NumPy bool, and nothing else, on torch and on NumPy;
    ``block_size=True`` is an ArgumentTypeError on both (torch used to read it as 1)."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    if kind == "numpy":
        x, r, w = host(x), host(r).copy(), host(w)
    copy = (lambda a: a.copy()) if kind == "numpy" else (lambda a: a.clone())
    want = reference.add_rmsnorm_fp4quant(host(x) if kind == "torch" else x, host(r).copy() if kind == "torch" else copy(r), host(w) if kind == "torch" else w, output_both_sf_layouts=True)
    got = fp4norm.add_rmsnorm_fp4quant(x, copy(r), w, output_both_sf_layouts=np.bool_(True), enable_pdl=np.bool_(False))
    assert len(got) == 3
    for g, wnt in zip(got, want):
        assert np.array_equal(raw(g) if kind == "torch" else g.reshape(-1).view(np.uint8), wnt.reshape(-1).view(np.uint8))
    got = fp4norm.rmsnorm_fp4quant(x, w, is_sf_swizzled_layout=np.bool_(True))
    assert tuple(got[1].shape) == (512,)
    q, s = fp4norm.rmsnorm_fp4quant(x, w)
    assert tuple(fp4norm.dequantize(q, s, is_sf_swizzled_layout=np.bool_(False)).shape) == (3, 64)
    bad = [
        ("output_both_sf_layouts", dict(output_both_sf_layouts=1)),
        ("is_sf_swizzled_layout", dict(is_sf_swizzled_layout=1)),
        ("is_sf_swizzled_layout", dict(is_sf_swizzled_layout="yes")),
        ("enable_pdl", dict(enable_pdl=0)),
        ("block_size", dict(block_size=True)),
    ]
    for name, kw in bad:
        for call in (
            lambda: fp4norm.add_rmsnorm_fp4quant(x, r, w, **kw),
            lambda: fp4norm.rmsnorm_fp4quant(x, w, q, s, **kw),
        ):
            with pytest.raises(fp4norm.ArgumentTypeError, match=rf"^{name} must be"):
                call()
    for kw in (dict(block_size=True), dict(is_sf_swizzled_layout=2)):
        with pytest.raises(fp4norm.ArgumentTypeError):
            fp4norm.dequantize(q, s, **kw)
    with pytest.raises(fp4norm.ArgumentTypeError, match="^enable_pdl must be a bool"):
        fp4norm.add_rmsnorm_fp8quant(x, r, w, enable_pdl=1)
    with pytest.raises(fp4norm.ArgumentTypeError, match="^output_both_sf_layouts must be a bool, got int"):
        fp4norm.add_rmsnorm_fp4quant(x, r, w, output_both_sf_layouts=1)
    with pytest.raises(fp4norm.ArgumentTypeError, match="^enable_pdl must be a bool or None, got numpy.int64"):
        fp4norm.add_rmsnorm_fp4quant(x, r, w, enable_pdl=np.int64(1))


def test_reference_refuses_to_write_a_tensor_that_requires_grad():
    """The host path (fp4norm.reference, and the NumPy-style path torch tensors take there)
    refuses, with grad mode on, to write a tensor that requires grad, as the operators do
    (it used to write a leaf in place)."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    leaf = r.clone().requires_grad_()
    before = leaf.detach().clone()
    out8 = torch.empty(3, 64, dtype=torch.float8_e4m3fn)
    calls = [
        lambda: reference.add_rmsnorm_fp4quant(x, leaf, w),
        lambda: reference.rmsnorm_fp4quant(x, w, y_out=torch.empty_like(x).requires_grad_()),
        lambda: reference.add_rmsnorm_fp8quant(x, leaf, w),
        lambda: reference.fused_add_rmsnorm_quant(out8, x, leaf, w, 1.0),
        lambda: reference.allreduce_add_rmsnorm_fp4quant([x, x], leaf, w),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
            call()
    with pytest.raises(RuntimeError, match="not differentiable"):
        reference.add_rmsnorm_fp4quant(x, leaf * 1, w)
    assert torch.equal(leaf.detach().view(torch.int16), before.view(torch.int16))
    with torch.no_grad():  # as PyTorch's own in-place ops: allowed without grad mode
        reference.add_rmsnorm_fp4quant(x, leaf, w)
    # A weight that requires grad is only read.
    reference.add_rmsnorm_fp4quant(x, r.clone(), w.clone().requires_grad_())


# --------------------------------------------------------------------------------------
# Preallocated outputs: the documented shapes; FlashInfer's leniency for scale buffers
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_outputs_of_another_shape_with_the_right_size_are_refused(kind):
    """A preallocated output of the right byte count but another shape (``[32, 3]`` for
    ``[3, 32]``) was written as if it had the documented one; refused now, naming it,
    before anything is written. Its rows flattened, or one flat buffer, are still taken."""
    x, r, w = data(3, 64, torch.bfloat16, "cpu")
    u8 = lambda *s: torch.zeros(*s, dtype=torch.uint8)  # noqa: E731
    f32 = lambda *s: torch.zeros(*s)  # noqa: E731
    e4m3 = lambda *s: torch.zeros(*s, dtype=torch.uint8).view(torch.float8_e4m3fn)  # noqa: E731
    conv = (lambda t: t) if kind == "torch" else (lambda t: host(t) if t.dtype != torch.float8_e4m3fn else t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn))
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x, r, w = conv(x), conv(r), conv(w)

    def b(a):
        return a.tobytes() if isinstance(a, np.ndarray) else raw(a).tobytes()

    r0 = b(r)
    bad = [
        ("y_fp4", lambda: fp4norm.add_rmsnorm_fp4quant(x, r, w, conv(u8(32, 3)), conv(u8(3, 4)))),
        ("block_scale", lambda: fp4norm.add_rmsnorm_fp4quant(x, r, w, conv(u8(3, 32)), conv(u8(4, 3)))),
        ("block_scale_unswizzled", lambda: fp4norm.add_rmsnorm_fp4quant(
            x, r, w, output_both_sf_layouts=True, block_scale_unswizzled=conv(u8(2, 6)))),
        ("scales_out", lambda: fp4norm.add_rmsnorm_fp8quant(
            x, r, w, None, conv(f32(4, 2)), group=32, scale_layout="column-major")),
        ("scales_out", lambda: fp4norm.add_rmsnorm_fp8quant(x, r, w, None, conv(f32(1, 3)))),
        ("out", lambda: fp4norm.add_rmsnorm_fp8quant(x, r, w, conv(e4m3(64, 3)), conv(f32(3, 1)))),
        ("y_fp4", lambda: reference.add_rmsnorm_fp4quant(x, r, w, conv(u8(32, 3)), conv(u8(3, 4)))),
    ]
    for name, call in bad:
        with pytest.raises(fp4norm.ArgumentError, match=rf"^{name} has shape"):
            call()
    assert b(r) == r0
    if kind == "torch":
        for call in (
            lambda: ops.add_rmsnorm_fp4quant.out(x, r, w, u8(32, 3), u8(3, 4)),
            lambda: ops.rmsnorm_fp8quant.out(x, w, e4m3(3, 64), f32(4, 2), group_size=32, scale_layout="column-major"),
        ):
            with pytest.raises(RuntimeError, match="fp4norm.ArgumentError: .* has shape"):
                call()
        assert b(r) == r0
    # Accepted: the documented shape, the rows flattened, one flat buffer (same bytes).
    x3, r3, w3 = data(6, 64, torch.bfloat16, "cpu", lead=(2, 3))
    x3, r3, w3 = conv(x3), conv(r3), conv(w3)
    want = reference.rmsnorm_fp4quant(x3, w3)
    for q_shape, s_shape in (((2, 3, 32), (2, 3, 4)), ((6, 32), (6, 4)), ((192,), (24,))):
        q, s = conv(u8(*q_shape)), conv(u8(*s_shape))
        got = fp4norm.rmsnorm_fp4quant(x3, w3, q, s)
        assert got[0] is q and got[1] is s
        assert b(q) == b(want[0]) and b(s) == b(want[1])


def test_flashinfer_scale_buffers_of_any_dtype_are_written_and_returned():
    """As FlashInfer's add_rmsnorm_fp4quant (which views block_scale as bytes), a caller's
    contiguous scale buffer of another dtype whose byte size is right is written in place
    and returned as it is: vLLM's int32 ``[128*ceil(M/128), ceil(H/64)]`` swizzled buffer,
    as int32, viewed as float8_e4m3fn (2-D or flattened); a row-major int32 buffer; an
    int16 unswizzled one. The float8 type of the other scale format stays refused."""
    m, h = 5, 256
    x, r, w = data(m, h, torch.bfloat16, "cpu")
    r_ref = host(r).copy()
    sw_ref = reference.add_rmsnorm_fp4quant(host(x), r_ref, host(w), is_sf_swizzled_layout=True)
    mp, k = 128 * ((m + 127) // 128), (h + 63) // 64
    buffers = [
        torch.zeros(mp, k, dtype=torch.int32),
        torch.zeros(mp, k, dtype=torch.int32).view(torch.float8_e4m3fn),
        torch.zeros(mp, k, dtype=torch.int32).view(torch.float8_e4m3fn).reshape(-1),
    ]
    for buf in buffers:
        rr = r.clone()
        q, s = fp4norm.add_rmsnorm_fp4quant(x, rr, w, block_scale=buf, is_sf_swizzled_layout=True)
        assert s is buf and s.dtype == buf.dtype and s.shape == buf.shape
        assert np.array_equal(raw(s), sw_ref[1].reshape(-1).view(np.uint8))
        assert np.array_equal(raw(q), sw_ref[0].reshape(-1).view(np.uint8))
        assert np.array_equal(raw(rr), r_ref.reshape(-1).view(np.uint8))
    # Row-major scales and the unswizzled layout in wider dtypes, preallocated codes too.
    both_ref = reference.rmsnorm_fp4quant(host(x), host(w), output_both_sf_layouts=True)
    q = torch.empty(m, h // 2, dtype=torch.uint8)
    s32 = torch.zeros(m, h // 16 // 4, dtype=torch.int32)
    got = fp4norm.rmsnorm_fp4quant(x, w, q, s32)
    assert got[1] is s32 and np.array_equal(raw(s32), both_ref[2].reshape(-1).view(np.uint8))
    u16 = torch.zeros(m, h // 16 // 2, dtype=torch.int16)
    got = fp4norm.rmsnorm_fp4quant(x, w, output_both_sf_layouts=True, block_scale_unswizzled=u16)
    assert got[2] is u16 and np.array_equal(raw(u16), both_ref[2].reshape(-1).view(np.uint8))
    assert np.array_equal(raw(got[1]), both_ref[1].reshape(-1).view(np.uint8))
    # Under torch.compile the caller's buffer is written and returned too.
    torch._dynamo.reset()
    buf = torch.zeros(mp, k, dtype=torch.int32)
    f = torch.compile(lambda x, r, w, b: fp4norm.add_rmsnorm_fp4quant(x, r, w, block_scale=b, is_sf_swizzled_layout=True), fullgraph=True)
    rr = r.clone()
    q, s = f(x, rr, w, buf)
    assert np.array_equal(raw(buf), sw_ref[1].reshape(-1).view(np.uint8))
    # A wrong byte count, or the other format's float8 type, is refused.
    with pytest.raises(fp4norm.ArgumentError, match="block_scale"):
        fp4norm.rmsnorm_fp4quant(x, w, block_scale=torch.zeros(mp, k - 1, dtype=torch.int32), is_sf_swizzled_layout=True)
    with pytest.raises(fp4norm.ArgumentTypeError, match="block_scale"):
        fp4norm.rmsnorm_fp4quant(x, w, block_scale=torch.zeros(m, 8, dtype=torch.float8_e4m3fn), block_size=32)


def test_fake_kernels_refuse_outputs_of_another_shape():
    def t(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    x, w = t(3, 64), t(64)
    with pytest.raises(fp4norm.ArgumentError, match="y_fp4 has shape"):
        ops.rmsnorm_fp4quant.out(x, w, t(32, 3, dtype=torch.uint8), t(3, 4, dtype=torch.uint8))
    with pytest.raises(fp4norm.ArgumentError, match="block_scale has shape"):
        ops.rmsnorm_fp4quant.out(x, w, t(3, 32, dtype=torch.uint8), t(4, 3, dtype=torch.uint8))
    with pytest.raises(fp4norm.ArgumentError, match="scales_out has shape"):
        ops.rmsnorm_fp8quant.out(x, w, t(3, 64, dtype=torch.float8_e4m3fn), t(4, 2, dtype=torch.float32), group_size=32, scale_layout="column-major")
    # The documented shapes pass.
    ops.rmsnorm_fp4quant.out(x, w, t(3, 32, dtype=torch.uint8), t(3, 4, dtype=torch.uint8))
    ops.rmsnorm_fp4quant.out(x, w, t(96, dtype=torch.uint8), t(12, dtype=torch.uint8))
    ops.rmsnorm_fp8quant.out(x, w, t(3, 64, dtype=torch.float8_e4m3fn), t(2, 4, dtype=torch.float32), group_size=32, scale_layout="column-major")
