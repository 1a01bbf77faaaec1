"""The fused all-reduce (SPEC.md §9) in front of the FP8 ops (§8) in Python, on host arrays,
torch CPU tensors and (where a GPU is present; skipped, visibly, elsewhere) CUDA tensors.

The contract: fp4norm.reference.allreduce_add_rmsnorm_fp8quant (and the static
allreduce_fused_add_rmsnorm_quant) writes, byte for byte, what the single-rank reference
writes on the ranks' sum computed here in NumPy (rank order, float32 per addition, one
rounding to the dtype), for W = 1 … 8 ranks, every scaling (per-token and per-group f32
and UE8M0 scales, row- and column-major, MXFP8's swizzled layout, a per-tensor static
scale; E4M3 and E5M2) and ranks holding NaN, ±Inf and values that cancel. Then every
entry point writes the reference's bytes into outputs poisoned first: the
fp4norm.allreduce_* functions, the torch.ops.fp4norm.allreduce_* operators (which pass
torch.library.opcheck and compile under torch.compile(fullgraph=True, dynamic=True)
without recompiling across M); their writes are PyTorch's (version counters, a leaf that
requires grad refused). Bad rank inputs are refused by name before anything is written.
"""

from __future__ import annotations

import numpy as np
import pytest

import fp4norm
from fp4norm import reference
from fp4_helpers import cuda_or_skip, devices_under_test, rank_sum, same_bytes
from test_fp8 import ELEMENTS, NP_DTYPE, NP_FP8, needs_torch, poisoned_scales, raw, same, seed_of, torch

DTYPES = ["bf16", "f16"]
# Every scaling of the FP8 op with a residual: per token (f32, with vLLM's floor, UE8M0),
# the three groups with both scale formats in both plain layouts, MXFP8, a static scale.
SCALINGS = (
    [
        ("token-f32", {}),
        ("token-f32-floor", {"s_min": 1.0 / (448 * 512)}),
        ("token-ue8m0", {"scale_format": "ue8m0"}),
    ]
    + [
        (f"g{g}-{fmt}-{lay}", {"group": g, "scale_format": fmt, "scale_layout": lay})
        for g in (32, 64, 128)
        for fmt in ("f32", "ue8m0")
        for lay in ("row-major", "column-major")
    ]
    + [("mxfp8", {"element": "e4m3", "group": 32, "scale_format": "ue8m0", "scale_layout": "swizzled"})]
    + [("tensor", {"scale": 0.375})]
)
SCALING_IDS = [name for name, _ in SCALINGS]
SCALE = 0.375  # the per-tensor static scale


def options(scaling, elem):
    """The keyword arguments of add_rmsnorm_fp8quant for one scaling; MXFP8's element is
    E4M3, every other one takes ``elem``."""
    name, kw = scaling
    return dict(kw) if name == "mxfp8" else dict(kw, element=elem)


def rank_data(rng, w, m, h, code, specials=True):
    """``w`` ranks' inputs (rank k's values scaled by k + 1), a residual and a weight, host
    arrays of dtype ``code``. With ``specials``, rows 1-5: a row that cancels across ranks, large values of
    opposite signs in ranks 0 and 1 with small ones in the last of three or more (the f32
    sum depends on the order), NaN in one rank, +Inf in the last, -Inf in rank 0 and +Inf in the last (NaN
    once summed)."""
    xs = [(rng.standard_normal((m, h)) * (k + 1)).astype(np.float32) for k in range(w)]
    if specials:
        _specials(xs)
    r = (2 * rng.standard_normal((m, h))).astype(np.float32)
    wt = (1 + 0.25 * rng.standard_normal(h)).astype(np.float32)
    dt = NP_DTYPE[code]
    return [x.astype(dt) for x in xs], r.astype(dt), wt.astype(dt)


def _specials(xs):
    w = len(xs)
    if w > 1:
        xs[1][1] = -xs[0][1]
        xs[0][2, :8] = 3e4
        xs[1][2, :8] = -3e4
    if w > 2:
        xs[-1][2, :8] = 1e-3
    xs[w // 2][3, 5] = np.nan
    xs[-1][4, 7] = np.inf
    xs[0][5, 9] = -np.inf
    xs[-1][5, 9] = np.inf


def poisoned_codes(shape, elem):
    return np.full(shape, 0xAB, np.uint8).view(NP_FP8[elem])


# ---------------------------------------------------------------------------------------
# The contract, and the module on host arrays
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", DTYPES)
@pytest.mark.parametrize("scaling", SCALINGS, ids=SCALING_IDS)
@pytest.mark.parametrize("w", range(1, 9))
def test_reference_is_the_op_on_the_rank_sum_and_the_module_writes_it(w, scaling, code):
    elem = ELEMENTS[w % 2]
    kw = options(scaling, elem)
    rng = np.random.default_rng(seed_of(w, scaling[0], code))
    m, h = 13, 256  # M not a multiple of 4: column-major padding
    ranks, r, wt = rank_data(rng, w, m, h, code)
    total = rank_sum(ranks)
    assert same_bytes(fp4norm._api.allreduce_sum(ranks), total), "the rank sum"
    results = {}
    for entry in ("allreduce", "one rank on the sum", "module"):
        rr, y = r.copy(), np.empty_like(r)
        if entry == "allreduce":
            got = reference.allreduce_add_rmsnorm_fp8quant(ranks, rr, wt, y_out=y, **kw)
        elif entry == "one rank on the sum":
            got = reference.add_rmsnorm_fp8quant(total, rr, wt, y_out=y, **kw)
        else:
            out = poisoned_codes((m, h), kw["element"])
            sf = None if "scale" in kw else poisoned_scales(m, h, kw.get("group", "token"), kw.get("scale_format", "f32"), kw.get("scale_layout", "row-major"))
            if scaling[0] == "mxfp8":
                got = fp4norm.allreduce_add_rmsnorm_mxfp8quant(ranks, rr, wt, out, sf, y_out=y)
            else:
                got = fp4norm.allreduce_add_rmsnorm_fp8quant(ranks, rr, wt, out, sf, y_out=y, **kw)
            assert got[0] is out and (sf is None or got[1] is sf)
        results[entry] = (got[0], got[1], rr, y)
    for entry in ("one rank on the sum", "module"):
        for name, a, b in zip(("out", "scales", "residual", "y_out"), results["allreduce"], results[entry]):
            assert same_bytes(a, b), f"{entry}: {name} differs from the reference all-reduce"
    if "scale" in kw:  # FlashInfer's static form writes the same bytes
        for fn in (reference.allreduce_fused_add_rmsnorm_quant, fp4norm.allreduce_fused_add_rmsnorm_quant):
            out, rr = poisoned_codes((m, h), elem), r.copy()
            assert fn(out, ranks, rr, wt, SCALE) is None
            assert same_bytes(out, results["allreduce"][0]) and same_bytes(rr, results["allreduce"][2])


def test_static_scale_array_and_weight_bias():
    """The scale as a float32 (1,) array, eps and weight_bias passed on, a 3-D input."""
    rng = np.random.default_rng(5)
    ranks, r, wt = rank_data(rng, 3, 8, 96, "f16")
    ranks = [x.reshape(2, 4, 96) for x in ranks]
    r = r.reshape(2, 4, 96)
    scale = np.array([2.5], np.float32)
    out1, out2 = poisoned_codes((2, 4, 96), "e5m2"), poisoned_codes((2, 4, 96), "e5m2")
    r1, r2 = r.copy(), r.copy()
    fp4norm.allreduce_fused_add_rmsnorm_quant(out1, ranks, r1, wt, scale, 1e-3, weight_bias=1.0)
    reference.fused_add_rmsnorm_quant(out2, rank_sum(ranks), r2, wt, scale, 1e-3, weight_bias=1.0)
    assert same_bytes(out1, out2) and same_bytes(r1, r2)


# ---------------------------------------------------------------------------------------
# Bad rank inputs: refused by name before anything is written
# ---------------------------------------------------------------------------------------

KINDS = ["numpy", "cpu", "cuda"]
# (id, the rank inputs made from three good ones, exception, message pattern); `c` holds
# the kind's conversions: `other` (NumPy <-> torch), `f16`, `columns` (column-major).
BAD_RANKS = [
    ("empty", lambda xs, c: [], fp4norm.ArgumentError, "at least one rank"),
    ("nine", lambda xs, c: [xs[0]] * 9, fp4norm.ArgumentError, "1 to 8"),
    ("not-a-list", lambda xs, c: xs[0], fp4norm.ArgumentTypeError, "inputs must be a list"),
    ("shape", lambda xs, c: [xs[0], xs[1][:3]], fp4norm.ArgumentError, r"inputs\[1\] has shape"),
    ("dtype", lambda xs, c: [xs[0], xs[1], c["f16"](xs[2])], fp4norm.ArgumentTypeError, r"inputs\[2\] has dtype"),
    ("kind", lambda xs, c: [xs[0], c["other"](xs[1])], fp4norm.ArgumentTypeError, r"inputs\[1\]"),
    ("hidden-stride", lambda xs, c: [xs[0], xs[1], c["columns"](xs[2])], fp4norm.ArgumentError, r"inputs\[2\]"),
]


def _kind_data(kind):
    """Three ranks' inputs, a residual and a weight ([6, 64] bfloat16) of one kind, with
    the conversions BAD_RANKS uses."""
    if kind != "numpy":
        if torch is None:
            pytest.skip("torch is not installed: torch cases skipped")
        cuda_or_skip(kind)
    ranks, r, wt = rank_data(np.random.default_rng(1), 3, 6, 64, "bf16")
    if kind == "numpy":
        conv = {
            "other": (lambda a: torch.from_numpy(a.view(np.uint16))) if torch is not None else None,
            "f16": lambda a: a.astype(np.float16),
            "columns": np.asfortranarray,
        }
        return ranks, r, wt, conv

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).to(kind)

    conv = {
        "other": lambda a: a.cpu().view(torch.int16).numpy(),
        "f16": lambda a: a.half(),
        "columns": lambda a: a.t().contiguous().t(),
    }
    return [t(x) for x in ranks], t(r), t(wt), conv


def _bytes(a):
    return bytes(raw(a).numpy()) if torch is not None and isinstance(a, torch.Tensor) else bytes(np.ascontiguousarray(a).view(np.uint8))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("desc,bad,exc,pattern", BAD_RANKS, ids=[b[0] for b in BAD_RANKS])
def test_bad_rank_inputs_write_nothing(kind, desc, bad, exc, pattern):
    xs, r, wt, conv = _kind_data(kind)
    if desc == "kind" and conv["other"] is None:
        pytest.skip("torch is not installed: no other kind of array")
    inputs = bad(xs, conv)
    if kind == "numpy":
        out, sf = poisoned_codes((6, 64), "e4m3"), poisoned_scales(6, 64, 32, "f32", "column-major")
    else:
        out = torch.full((6, 64), 0xAB, dtype=torch.uint8, device=kind).view(torch.float8_e4m3fn)
        sf = torch.full((2, 8), float("nan"), device=kind)
    before = [_bytes(a) for a in (r, out, sf)]
    calls = [
        lambda: fp4norm.allreduce_add_rmsnorm_fp8quant(inputs, r, wt, out, sf, group=32, scale_layout="column-major"),
        lambda: fp4norm.allreduce_fused_add_rmsnorm_quant(out, inputs, r, wt, 0.5),
        lambda: fp4norm.allreduce_add_rmsnorm_mxfp8quant(inputs, r, wt, scale_layout="row-major"),
    ]
    if kind != "cuda" and desc != "nine":  # the reference sums any number of ranks
        calls.append(lambda: reference.allreduce_add_rmsnorm_fp8quant(inputs, r, wt, group=64))
        calls.append(lambda: reference.allreduce_fused_add_rmsnorm_quant(out, inputs, r, wt, 0.5))
    for call in calls:
        with pytest.raises(exc, match=pattern):
            call()
    if kind != "numpy" and isinstance(inputs, list) and all(isinstance(a, torch.Tensor) for a in inputs):
        ops = torch.ops.fp4norm
        for call in (
            lambda: ops.allreduce_add_rmsnorm_fp8quant(inputs, r, wt),
            lambda: ops.allreduce_add_rmsnorm_fp8quant.out(inputs, r, wt, out, sf, group_size=32, scale_layout="column-major"),
            lambda: ops.allreduce_fused_add_rmsnorm_quant(out, inputs, r, wt, torch.ones(1, device=kind)),
        ):
            with pytest.raises(RuntimeError, match=pattern) as e:
                call()
            assert isinstance(fp4norm._ops.translate(e.value), exc), str(e.value)
    assert [_bytes(a) for a in (r, out, sf)] == before, "a refused call wrote something"


@needs_torch
def test_rank_on_another_device_is_refused():
    cuda_or_skip("cuda")
    xs, r, wt, _ = _kind_data("cuda")
    before = _bytes(r)
    for inputs in ([xs[0], xs[1].cpu()], [xs[0].cpu(), xs[1]]):
        with pytest.raises(fp4norm.ArgumentError, match=r"inputs\[[01]\] is on cpu|is on cuda"):
            fp4norm.allreduce_add_rmsnorm_fp8quant(inputs, r, wt, group=32)
    assert _bytes(r) == before


# ---------------------------------------------------------------------------------------
# torch: the functions and the operators, on the CPU and on CUDA
# ---------------------------------------------------------------------------------------

DEVICES = devices_under_test()
TORCH_DTYPES = {"bf16": "bfloat16", "f16": "float16"}
FP8_TORCH = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
# Each scaling once, W, the dtype and the element rotating through them.
OP_CASES = [(s, (1, 2, 3, 5, 8)[i % 5], DTYPES[i % 2], ELEMENTS[(i // 2) % 2]) for i, s in enumerate(SCALINGS)]


def torch_ranks(w, m, h, code, device, seed, specials=True):
    ranks, r, wt = rank_data(np.random.default_rng(seed), w, m, h, code, specials)
    dtype = getattr(torch, TORCH_DTYPES[code])

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(dtype).to(device)

    return [t(x) for x in ranks], t(r), t(wt)


def poisoned_like(t, device):
    """A tensor of ``t``'s shape and dtype on ``device``, every byte 0xAB."""
    n = t.numel() * t.element_size()
    return torch.full((n,), 0xAB, dtype=torch.uint8, device=device).view(t.dtype).reshape(t.shape)


def operator_options(kw):
    """add_rmsnorm_fp8quant's keyword arguments as the operators take them (``group_size``,
    -1 per token)."""
    op = {k: v for k, v in kw.items() if k != "group"}
    op["group_size"] = -1 if kw.get("group", "token") == "token" else kw["group"]
    return op


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scaling,w,code,elem", OP_CASES, ids=[f"{s[0]}-w{w}-{c}-{e}" for s, w, c, e in OP_CASES])
def test_operators_and_functions_write_the_reference_and_pass_opcheck(device, scaling, w, code, elem):
    cuda_or_skip(device)
    kw = options(scaling, elem)
    m, h = 6, 256
    xs, r, wt = torch_ranks(w, m, h, code, device, seed=seed_of(scaling[0], w))
    ops = torch.ops.fp4norm
    r_ref = r.cpu().clone()
    want = reference.allreduce_add_rmsnorm_fp8quant([x.cpu() for x in xs], r_ref, wt.cpu(), **kw)
    # The function: preallocated outputs, poisoned.
    fp8 = getattr(torch, FP8_TORCH[kw["element"]])
    out = torch.full((m, h), 0xAB, dtype=torch.uint8, device=device).view(fp8)
    scales_out = None if "scale" in kw else poisoned_like(want[1], device)
    r1 = r.clone()
    got = fp4norm.allreduce_add_rmsnorm_fp8quant(xs, r1, wt, out, scales_out, **kw)
    assert got[0] is out and same(out, want[0]) and same(got[1], want[1]) and same(r1, r_ref)
    # Allocated outputs.
    q, s = fp4norm.allreduce_add_rmsnorm_fp8quant(xs, r.clone(), wt, **kw)
    assert q.dtype == fp8 and q.device == xs[0].device and same(q, want[0]) and same(s, want[1])
    scale = torch.tensor([SCALE], device=device)
    if "scale" in kw:
        out2, r2 = torch.empty(m, h, dtype=fp8, device=device), r.clone()
        assert ops.allreduce_fused_add_rmsnorm_quant(out2, xs, r2, wt, scale) is None
        assert same(out2, want[0]) and same(r2, r_ref)
    else:
        opts = operator_options(kw)
        r2 = r.clone()
        q, s = ops.allreduce_add_rmsnorm_fp8quant(xs, r2, wt, **opts)
        assert same(q, want[0]) and same(s, want[1]) and tuple(s.shape) == tuple(want[1].shape)
        assert same(r2, r_ref)
        q2, s2 = torch.full((m, h), 0xAB, dtype=torch.uint8, device=device), poisoned_like(s, device)
        ops.allreduce_add_rmsnorm_fp8quant.out(xs, r.clone(), wt, q2, s2, **opts)
        assert same(q2, q) and same(s2, s)
    # opcheck compares written tensors with allclose, NaN unequal to NaN: inputs without
    # NaN and Inf here.
    xs, r, wt = torch_ranks(w, m, h, code, device, seed_of(scaling[0], w), specials=False)
    if "scale" in kw:
        # A uint8 out with the element named (allclose has no float8 kernel).
        u8 = torch.empty(m, h, dtype=torch.uint8, device=device)
        torch.library.opcheck(ops.allreduce_fused_add_rmsnorm_quant.default, (u8, xs, r.clone(), wt, scale), dict(element=elem, weight_bias=1.0))
        return
    y = torch.empty_like(r)
    torch.library.opcheck(ops.allreduce_add_rmsnorm_fp8quant.default, (xs, r.clone(), wt), dict(y_out=y, **opts))
    torch.library.opcheck(ops.allreduce_add_rmsnorm_fp8quant.out, (xs, r.clone(), wt, q2, s2), opts)


@needs_torch
def test_schemas_are_the_single_rank_ones_with_the_ranks_inputs():
    """Each all-reduce operator's schema is its single-rank operator's with ``Tensor[]
    inputs`` in ``input``'s place: the same arguments, defaults, mutations and returns."""
    ops = torch.ops.fp4norm
    for ar, one in (
        (ops.allreduce_add_rmsnorm_fp8quant.default, ops.add_rmsnorm_fp8quant.default),
        (ops.allreduce_add_rmsnorm_fp8quant.out, ops.add_rmsnorm_fp8quant.out),
        (ops.allreduce_fused_add_rmsnorm_quant.default, ops.fused_add_rmsnorm_quant.default),
    ):
        a, b = ar._schema, one._schema
        want = str(b).split("(", 1)[1].replace("Tensor input,", "Tensor[] inputs,", 1)
        assert str(a).split("(", 1)[1] == want


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_version_counters_and_grad(device):
    cuda_or_skip(device)
    xs, r, wt = torch_ranks(2, 6, 64, "bf16", device, seed=3)
    out = torch.empty(6, 64, dtype=torch.float8_e4m3fn, device=device)
    x_versions = [x._version for x in xs]
    v = (r._version, out._version)
    fp4norm.allreduce_fused_add_rmsnorm_quant(out, xs, r, wt, 0.5)
    assert r._version > v[0] and out._version > v[1]
    v = r._version
    q, s = fp4norm.allreduce_add_rmsnorm_fp8quant(xs, r, wt, group=64)
    assert r._version > v and not q.requires_grad and not s.requires_grad
    for op, args in (
        (torch.ops.fp4norm.allreduce_add_rmsnorm_fp8quant, (xs, r, wt)),
        (torch.ops.fp4norm.allreduce_fused_add_rmsnorm_quant, (out, xs, r, wt, torch.ones(1, device=device))),
    ):
        v = r._version
        op(*args)
        assert r._version > v
    assert [x._version for x in xs] == x_versions, "the ranks' inputs are read only"
    leaf = r.float().bfloat16().detach().requires_grad_()
    before = raw(leaf)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        fp4norm.allreduce_add_rmsnorm_fp8quant(xs, leaf, wt)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        torch.ops.fp4norm.allreduce_add_rmsnorm_fp8quant(xs, leaf, wt)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        fp4norm.allreduce_fused_add_rmsnorm_quant(out, xs, leaf, wt, 0.5)
    with pytest.raises(RuntimeError, match="not differentiable"):
        fp4norm.allreduce_add_rmsnorm_fp8quant(xs, leaf * 1, wt)
    assert torch.equal(raw(leaf), before)


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_dynamic_no_recompile(device):
    """Every FP8 all-reduce entry point under torch.compile(fullgraph=True, dynamic=True): no
    graph break, one compile for every M, eager's bytes."""
    cuda_or_skip(device)
    from torch_helpers import CompiledOnce

    h = 256
    _, _, wt = torch_ranks(1, 6, h, "bf16", device, seed=0)
    scale = torch.tensor([0.25], device=device)

    def block(x0, x1, residual):
        out = torch.empty(x0.shape, dtype=torch.float8_e5m2, device=x0.device)
        fp4norm.allreduce_fused_add_rmsnorm_quant(out, [x0, x1], residual, wt, scale)
        q1, s1 = fp4norm.allreduce_add_rmsnorm_fp8quant(
            [x0, x1], residual, wt, group=128, scale_layout="column-major", s_min=1e-4
        )
        q2, s2 = fp4norm.allreduce_add_rmsnorm_mxfp8quant([x0, x1], residual, wt, weight_bias=1.0)
        q3, _ = fp4norm.allreduce_add_rmsnorm_fp8quant([x0, x1], residual, wt, scale=scale, element="e5m2")
        return out, q1, s1, q2, s2, q3

    torch._dynamo.reset()
    xs, r, _ = torch_ranks(2, 7, h, "bf16", device, seed=7)
    explained = torch._dynamo.explain(block)(xs[0], xs[1], r.clone())
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = CompiledOnce(block)
    for m in (7, 128, 1000):
        xs, r, _ = torch_ranks(2, m, h, "bf16", device, seed=m)
        r_eager, r_compiled = r.clone(), r.clone()
        eager = block(xs[0], xs[1], r_eager)
        comp = compiled(xs[0], xs[1], r_compiled)
        for a, b in zip(eager, comp):
            assert a.shape == b.shape and a.dtype == b.dtype and same(a, b)
        assert same(r_eager, r_compiled)
    assert compiled.recompiles == 0, f"recompiled {compiled.recompiles} frames for a new M"


@needs_torch
def test_distributed_refuses_host_tensors_before_gathering():
    """fp4norm.distributed gathers on the GPU: a CPU input is refused, named, before any
    collective (the one-rank NCCL group runs in test_gpu_allreduce.py)."""
    import fp4norm.distributed as fd

    xs, r, wt = torch_ranks(1, 6, 64, "bf16", "cpu", seed=2)
    before = raw(r)
    with pytest.raises(fp4norm.ArgumentError, match="CUDA tensor"):
        fd.allreduce_add_rmsnorm_fp8quant(xs[0], r, wt, group=32, process_group=None)
    with pytest.raises(fp4norm.ArgumentError, match="CUDA tensor"):
        fd.allreduce_fused_add_rmsnorm_quant(torch.empty(6, 64, dtype=torch.float8_e4m3fn), xs[0], r, wt, 1.0)
    assert torch.equal(raw(r), before)
