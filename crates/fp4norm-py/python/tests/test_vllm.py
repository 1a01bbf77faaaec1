"""vLLM's fused RMSNorm + FP8 operators computed by fp4norm (``fp4norm.vllm``): the four
functions and the ``torch.ops.fp4norm_vllm`` operators with vLLM's schemas,
``register_vllm_kernels`` on a stand-in namespace, and the arguments vLLM's NVFP4 fusion
passes to ``add_rmsnorm_fp4quant``.

Every output is poisoned first and compared byte for byte with ``fp4norm.reference`` called
the equivalent way, written here independently of the module's mapping: the scale floor is
computed from vLLM's formula ``1.0f / (FMAX * 512.0f)``, and transposed per-block scales are
checked against the row-major reference scales transposed by hand, in the storage itself
(padding, and the memory around a view, included). CUDA cases run where a GPU is present
and are skipped, visibly, elsewhere.
"""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: fp4norm.vllm needs it")

import fp4norm  # noqa: E402
from fp4norm import reference  # noqa: E402
from fp4norm import vllm as fv  # noqa: E402
from fp4_helpers import cuda_or_skip, devices_under_test  # noqa: E402
from torch_helpers import CompiledOnce, raw, same, torch_data as tdata  # noqa: E402

DEVICES = devices_under_test()
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
OPS = torch.ops.fp4norm_vllm

# vLLM's csrc/torch_bindings.cpp, copied as it is there.
VLLM_TEXT = {
    "rms_norm_static_fp8_quant": (
        "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, "
        "Tensor scale, float epsilon) -> ()"
    ),
    "fused_add_rms_norm_static_fp8_quant": (
        "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
        "Tensor! residual, Tensor weight, Tensor scale, float epsilon) -> ()"
    ),
    "rms_norm_dynamic_per_token_quant": (
        "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, "
        "Tensor weight, Tensor! scale, float epsilon, "
        "Tensor? scale_ub, Tensor!? residual) -> ()"
    ),
    "rms_norm_per_block_quant": (
        "rms_norm_per_block_quant(Tensor! result, Tensor input, "
        "Tensor weight, Tensor! scale, float epsilon, "
        "Tensor? scale_ub, Tensor!? residual, int group_size, "
        "bool is_scale_transposed) -> ()"
    ),
}

WRITTEN = {
    "rms_norm_static_fp8_quant": ["result"],
    "fused_add_rms_norm_static_fp8_quant": ["result", "residual"],
    "rms_norm_dynamic_per_token_quant": ["result", "scale", "residual"],
    "rms_norm_per_block_quant": ["result", "scale", "residual"],
}

# vLLM's min_scaling_factor: 1.0f / (qmax * 512.0f), in float32.
FLOOR = {
    torch.float8_e4m3fn: torch.tensor(1.0 / (448.0 * 512.0), dtype=torch.float32).item(),
    torch.float8_e5m2: torch.tensor(1.0 / (57344.0 * 512.0), dtype=torch.float32).item(),
}
SENTINEL = -123.0  # poison for f32 scales
POISON = 0xAB  # poison for FP8 codes
EPS = 1e-6

SIZES = [(m, h) for m in (1, 3, 4, 129) for h in (256, 4096)]
BLOCK_SIZES = [(m, h, g) for m, h in SIZES for g in (64, 128)] + [
    (m, 7168, 128) for m in (1, 3, 4, 129)
]


def mp4(m):
    return (m + 3) // 4 * 4


def poisoned_result(shape, device, fp8=torch.float8_e4m3fn):
    return torch.full(shape, POISON, dtype=torch.uint8, device=device).view(fp8)


def inputs(m, h, code, device, seed):
    x, r, w = tdata(m, h, DTYPES[code], device, seed=seed)
    return x, r, w


def host(t):
    return t.detach().cpu()


def seed_of(*parts):
    return zlib.crc32(repr(parts).encode())


# ---------------------------------------------------------------------------------------
# The schemas, and where the operators come from
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VLLM_TEXT))
def test_schemas_are_vllms(name):
    op = getattr(OPS, name).default
    assert str(op._schema) == str(torch._C.parse_schema("fp4norm_vllm::" + VLLM_TEXT[name]))
    assert fv.VLLM_SCHEMAS[name] == VLLM_TEXT[name]
    written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == WRITTEN[name]
    assert op._schema.returns == []


def test_per_block_schema_text():
    assert str(OPS.rms_norm_per_block_quant.default._schema) == (
        "fp4norm_vllm::rms_norm_per_block_quant(Tensor($0! -> ) result, Tensor input, "
        "Tensor weight, Tensor($1! -> ) scale, float epsilon, Tensor? scale_ub, "
        "Tensor($2! -> )? residual, int group_size, bool is_scale_transposed) -> ()"
    )


def test_operators_defined_by_importing_fp4norm_vllm_only():
    code = (
        "import torch, fp4norm\n"
        "print(hasattr(torch.ops.fp4norm_vllm, 'rms_norm_per_block_quant'))\n"
        "import fp4norm.vllm\n"
        "print(hasattr(torch.ops.fp4norm_vllm, 'rms_norm_per_block_quant'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_scale_floor_is_vllms():
    assert fv.scale_floor() == FLOOR[torch.float8_e4m3fn]
    assert fv.scale_floor(torch.float8_e5m2) == FLOOR[torch.float8_e5m2]


# ---------------------------------------------------------------------------------------
# Static per-tensor scale
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "norez"])
@pytest.mark.parametrize("code", list(DTYPES))
@pytest.mark.parametrize("m,h", SIZES, ids=[f"{m}x{h}" for m, h in SIZES])
@pytest.mark.parametrize("via_op", [False, True], ids=["function", "operator"])
def test_static(device, m, h, code, with_residual, via_op):
    cuda_or_skip(device)
    x, r, w = inputs(m, h, code, device, seed_of("static", m, h, code))
    for shape in ((), (1,), (1, 1)):
        scale = torch.full(shape, 0.0375, dtype=torch.float32, device=device)
        result = poisoned_result((m, h), device)
        ref = torch.empty(m, h, dtype=torch.float8_e4m3fn)
        r_ref = host(r).clone()
        r1 = r.clone()
        s_ref = torch.tensor([0.0375], dtype=torch.float32)
        if with_residual:
            reference.fused_add_rmsnorm_quant(ref, host(x), r_ref, host(w), s_ref, EPS)
            fn = OPS.fused_add_rms_norm_static_fp8_quant.default if via_op else fv.fused_add_rms_norm_static_fp8_quant
            assert fn(result=result, input=x, residual=r1, weight=w, scale=scale, epsilon=EPS) is None
            assert same(r1, r_ref)
        else:
            reference.rmsnorm_quant(ref, host(x), host(w), s_ref, EPS)
            fn = OPS.rms_norm_static_fp8_quant.default if via_op else fv.rms_norm_static_fp8_quant
            assert fn(result=result, input=x, weight=w, scale=scale, epsilon=EPS) is None
            assert same(r1, r)
        assert same(result, ref), shape


# ---------------------------------------------------------------------------------------
# Dynamic per-token scales
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "norez"])
@pytest.mark.parametrize("code", list(DTYPES))
@pytest.mark.parametrize("m,h", SIZES, ids=[f"{m}x{h}" for m, h in SIZES])
@pytest.mark.parametrize("via_op", [False, True], ids=["function", "operator"])
def test_per_token(device, m, h, code, with_residual, via_op):
    cuda_or_skip(device)
    x, r, w = inputs(m, h, code, device, seed_of("token", m, h, code))
    result = poisoned_result((m, h), device)
    scale = torch.full((m, 1), SENTINEL, dtype=torch.float32, device=device)
    r1 = r.clone() if with_residual else None
    fn = OPS.rms_norm_dynamic_per_token_quant.default if via_op else fv.rms_norm_dynamic_per_token_quant
    assert fn(result=result, input=x, weight=w, scale=scale, epsilon=EPS, scale_ub=None, residual=r1) is None
    floor = FLOOR[torch.float8_e4m3fn]
    if with_residual:
        r_ref = host(r).clone()
        q_ref, s_ref = reference.add_rmsnorm_fp8quant(host(x), r_ref, host(w), eps=EPS, group="token", s_min=floor)
        assert same(r1, r_ref)
    else:
        q_ref, s_ref = reference.rmsnorm_fp8quant(host(x), host(w), eps=EPS, group="token", s_min=floor)
    assert same(result, q_ref) and same(scale, s_ref)
    if m > 2 and not with_residual:
        assert scale[1, 0].item() == floor  # the zero row: vLLM's floor, not 0


# ---------------------------------------------------------------------------------------
# Dynamic per-block scales, every storage vLLM makes for them
# ---------------------------------------------------------------------------------------

LAYOUTS = ["row-major", "tma-full", "tma-minimal", "mpad-m", "tma-in-larger"]


def block_scale(layout, m, n, device):
    """``(scale, base, offset, ld)``: the [M, H/G] scale tensor as vLLM lays it out, the
    tensor holding its storage (poisoned) and, for column-major ones, where element
    (i, j) lies in ``base``: ``offset + i + j * ld``."""
    if layout == "row-major":
        base = torch.full((m, n), SENTINEL, dtype=torch.float32, device=device)
        return base, base, None, None
    if layout == "tma-full":  # [H/G, Mp4] storage, viewed transposed
        base = torch.full((n, mp4(m)), SENTINEL, dtype=torch.float32, device=device)
        return base[:, :m].t(), base, 0, mp4(m)
    if layout == "tma-minimal":  # vLLM's empty_strided: storage ends at the last element
        s = torch.empty_strided((m, n), (1, mp4(m)), dtype=torch.float32, device=device)
        s.as_strided((s.untyped_storage().nbytes() // 4,), (1,), 0).fill_(SENTINEL)
        return s, s.as_strided((s.untyped_storage().nbytes() // 4,), (1,), 0), 0, mp4(m)
    if layout == "mpad-m":  # column-major without the TMA padding
        base = torch.full((n, m), SENTINEL, dtype=torch.float32, device=device)
        return base.t(), base, 0, m
    if layout == "tma-in-larger":  # the minimal strided view inside a larger poisoned buffer
        off = 5
        base = torch.full((off + (n - 1) * mp4(m) + m + 7,), SENTINEL, dtype=torch.float32, device=device)
        return base.as_strided((m, n), (1, mp4(m)), off), base, off, mp4(m)
    raise AssertionError(layout)


def expected_storage(base, s_ref, offset, ld, layout, m):
    """What ``base`` must hold: the row-major reference scales transposed by hand into the
    column-major positions; fp4norm's zero padding where the storage is its [H/G, Mp4]
    buffer; the poison everywhere else."""
    want = torch.full(base.shape, SENTINEL, dtype=torch.float32).reshape(-1)
    if offset is None:
        return s_ref.reshape(-1)
    n = s_ref.shape[1]
    if layout == "tma-full" and mp4(m) != m:
        for j in range(n):
            want[offset + j * ld + m: offset + j * ld + mp4(m)] = 0.0
    for i in range(m):
        for j in range(n):
            want[offset + i + j * ld] = s_ref[i, j]
    return want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "norez"])
@pytest.mark.parametrize("code", list(DTYPES))
@pytest.mark.parametrize("m,h,g", BLOCK_SIZES, ids=[f"{m}x{h}-g{g}" for m, h, g in BLOCK_SIZES])
def test_per_block(device, m, h, g, code, with_residual):
    cuda_or_skip(device)
    x, r, w = inputs(m, h, code, device, seed_of("block", m, h, g, code))
    floor = FLOOR[torch.float8_e4m3fn]
    r_ref = host(r).clone()
    if with_residual:
        q_ref, s_ref = reference.add_rmsnorm_fp8quant(host(x), r_ref, host(w), eps=EPS, group=g, s_min=floor)
    else:
        q_ref, s_ref = reference.rmsnorm_fp8quant(host(x), host(w), eps=EPS, group=g, s_min=floor)
    assert s_ref.shape == (m, h // g)
    if m > 2 and not with_residual:
        assert (s_ref[1] == floor).all()  # the zero row: vLLM's floor, not 0
    for i, layout in enumerate(LAYOUTS):
        scale, base, offset, ld = block_scale(layout, m, h // g, device)
        result = poisoned_result((m, h), device)
        r1 = r.clone() if with_residual else None
        transposed = layout != "row-major"
        args = dict(
            result=result, input=x, weight=w, scale=scale, epsilon=EPS, scale_ub=None,
            residual=r1, group_size=g, is_scale_transposed=transposed,
        )
        if i % 2:
            assert OPS.rms_norm_per_block_quant.default(**args) is None
        else:
            assert fv.rms_norm_per_block_quant(**args) is None
        assert same(result, q_ref), layout
        if with_residual:
            assert same(r1, r_ref), layout
        got = host(base).reshape(-1)
        want = expected_storage(host(base), s_ref, offset, ld, layout, m)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), layout
        assert torch.equal(host(scale).contiguous(), s_ref), layout


@pytest.mark.parametrize("device", DEVICES)
def test_e5m2_results(device):
    """fp4norm computes E5M2 codes too (vLLM's fused kernels take E4M3 only), with the
    floor 1/(57344 * 512)."""
    cuda_or_skip(device)
    m, h = 5, 256
    x, r, w = inputs(m, h, "bf16", device, seed_of("e5m2"))
    fp8 = torch.float8_e5m2
    floor = FLOOR[fp8]
    result = poisoned_result((m, h), device, fp8)
    scale = torch.full((m, 1), SENTINEL, device=device)
    fv.rms_norm_dynamic_per_token_quant(result, x, w, scale, EPS, None, None)
    q_ref, s_ref = reference.rmsnorm_fp8quant(host(x), host(w), eps=EPS, element="e5m2", group="token", s_min=floor)
    assert same(result, q_ref) and same(scale, s_ref) and scale[1, 0].item() == floor
    result = poisoned_result((m, h), device, fp8)
    scale = torch.empty_strided((m, 2), (1, mp4(m)), device=device)
    r1, r_ref = r.clone(), host(r).clone()
    fv.rms_norm_per_block_quant(result, x, w, scale, EPS, None, r1, 128, True)
    q_ref, s_ref = reference.add_rmsnorm_fp8quant(host(x), r_ref, host(w), eps=EPS, element="e5m2", group=128, s_min=floor)
    assert same(result, q_ref) and torch.equal(host(scale).contiguous(), s_ref) and same(r1, r_ref)
    result = poisoned_result((m, h), device, fp8)
    fv.rms_norm_static_fp8_quant(result, x, w, torch.tensor([0.5], device=device), EPS)
    ref = torch.empty(m, h, dtype=fp8)
    reference.rmsnorm_quant(ref, host(x), host(w), torch.tensor([0.5]), EPS)
    assert same(result, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_three_dimensional_input(device):
    """[B, S, H] inputs, as vLLM takes [..., H]: the rows are B * S."""
    cuda_or_skip(device)
    b, s_, h = 2, 3, 256
    x, r, w = inputs(b * s_, h, "f16", device, seed_of("3d"))
    x3, r3 = x.view(b, s_, h), r.clone().view(b, s_, h)
    result = poisoned_result((b, s_, h), device)
    scale = torch.empty_strided((b * s_, 2), (1, 8), device=device)
    fv.rms_norm_per_block_quant(result, x3, w, scale, EPS, None, r3, 128, True)
    r_ref = host(r).clone()
    q_ref, s_ref = reference.add_rmsnorm_fp8quant(host(x), r_ref, host(w), eps=EPS, group=128, s_min=FLOOR[torch.float8_e4m3fn])
    assert same(result, q_ref) and same(r3, r_ref) and torch.equal(host(scale).contiguous(), s_ref)


# ---------------------------------------------------------------------------------------
# Refusals: a clear error naming the argument, nothing written
# ---------------------------------------------------------------------------------------


def refusal_cases(device):
    m, h = 5, 256
    x, r, w = inputs(m, h, "bf16", device, seed_of("refuse"))
    f8 = lambda: poisoned_result((m, h), device)  # noqa: E731
    tok = lambda: torch.full((m, 1), SENTINEL, device=device)  # noqa: E731
    blk = lambda: torch.full((m, 2), SENTINEL, device=device)  # noqa: E731
    ub = torch.tensor([1.0], device=device)
    i8 = lambda: torch.full((m, h), 7, dtype=torch.int8, device=device)  # noqa: E731
    fnuz = lambda: torch.full((m, h), 7, dtype=torch.uint8, device=device).view(torch.float8_e4m3fnuz)  # noqa: E731
    s1 = torch.tensor([0.5], device=device)
    A, T = fp4norm.ArgumentError, fp4norm.ArgumentTypeError
    tok_op, blk_op = "rms_norm_dynamic_per_token_quant", "rms_norm_per_block_quant"
    return [
        ("scale_ub", A, "scale_ub", tok_op, lambda q, s, rr: (q, x, w, s, EPS, ub, rr), f8, tok),
        ("scale_ub-block", A, "scale_ub", blk_op, lambda q, s, rr: (q, x, w, s, EPS, ub, rr, 128, False), f8, blk),
        ("int8", T, "result", tok_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr), i8, tok),
        ("int8-block", T, "result", blk_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr, 128, True), i8, blk),
        ("fnuz", T, "result", blk_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr, 128, False), fnuz, blk),
        ("fnuz-static", T, "result", "rms_norm_static_fp8_quant", lambda q, s, rr: (q, x, w, s1, EPS), fnuz, None),
        ("float32-input", T, "input", tok_op, lambda q, s, rr: (q, x.float(), w.float(), s, EPS, None, None), f8, tok),
        ("group-16", A, "group_size", blk_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr, 16, False), f8, lambda: torch.full((m, 16), SENTINEL, device=device)),
        ("group-256", A, "group_size", blk_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr, 256, False), f8, lambda: torch.full((m, 1), SENTINEL, device=device)),
        ("block-scale-shape", A, "scale", blk_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr, 64, False), f8, blk),
        ("block-scale-strided", A, "scale", blk_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr, 128, False), f8, lambda: torch.full((2, m), SENTINEL, device=device).t()),
        ("block-scale-overlap", A, "scale", blk_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr, 128, True), f8, lambda: torch.full((1, 2), SENTINEL, device=device).expand(m, 2)),
        ("block-scale-f64", T, "scale", blk_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr, 128, True), f8, lambda: torch.full((m, 2), SENTINEL, dtype=torch.float64, device=device)),
        ("token-scale-size", A, "scale", tok_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr), f8, blk),
        ("static-scale-shape", A, "scale", "fused_add_rms_norm_static_fp8_quant", lambda q, s, rr: (q, x, rr, w, torch.ones(2, device=device), EPS), f8, None),
        ("static-scale-dtype", T, "scale", "rms_norm_static_fp8_quant", lambda q, s, rr: (q, x, w, torch.ones(1, dtype=torch.float64, device=device), EPS), f8, None),
        ("result-shape", A, "result", blk_op, lambda q, s, rr: (q[:, :128], x, w, s, EPS, None, rr, 128, True), f8, blk),
        ("eps-nan", A, "eps", blk_op, lambda q, s, rr: (q, x, w, s, float("nan"), None, rr, 128, True), f8, lambda: torch.empty_strided((m, 2), (1, 8), device=device).fill_(SENTINEL)),
        ("residual-shape", A, "residual", tok_op, lambda q, s, rr: (q, x, w, s, EPS, None, rr[:, :128]), f8, tok),
    ], r


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("via_op", [False, True], ids=["function", "operator"])
def test_refusals_write_nothing(device, via_op):
    cuda_or_skip(device)
    cases, r = refusal_cases(device)
    for label, cls, needle, op, make_args, make_result, make_scale in cases:
        q = make_result()
        s = make_scale() if make_scale is not None else None
        rr = r.clone()
        before = [raw(t).clone() for t in (q, rr) + ((s,) if s is not None else ())]
        fn = getattr(OPS, op).default if via_op else getattr(fv, op)
        with pytest.raises(cls) as info:
            fn(*make_args(q, s, rr))
        assert needle in str(info.value), (label, str(info.value))
        assert op in str(info.value), (label, str(info.value))
        after = [raw(t) for t in (q, rr) + ((s,) if s is not None else ())]
        assert all(torch.equal(a, b) for a, b in zip(before, after)), label


def test_written_tensor_requiring_grad_is_refused():
    m, h = 3, 256
    x, r, w = inputs(m, h, "bf16", "cpu", seed_of("grad"))
    scale = torch.full((m, 1), SENTINEL, requires_grad=True)
    with pytest.raises(RuntimeError, match="scale"):
        fv.rms_norm_dynamic_per_token_quant(poisoned_result((m, h), "cpu"), x, w, scale, EPS, None, None)
    assert (scale.detach() == SENTINEL).all()


# ---------------------------------------------------------------------------------------
# opcheck and torch.compile
# ---------------------------------------------------------------------------------------


def opcheck_cases(device, m, result_dtype):
    h = 256
    x, r, w = inputs(m, h, "bf16", device, seed_of("opcheck", m))

    def res():
        return torch.zeros((m, h), dtype=result_dtype, device=device)

    s1 = torch.tensor([[0.25]], device=device)
    return [
        (OPS.rms_norm_static_fp8_quant.default, (res(), x, w, s1, EPS)),
        (OPS.fused_add_rms_norm_static_fp8_quant.default, (res(), x, r.clone(), w, s1, EPS)),
        (OPS.rms_norm_dynamic_per_token_quant.default, (res(), x, w, torch.zeros(m, 1, device=device), EPS, None, r.clone())),
        (OPS.rms_norm_dynamic_per_token_quant.default, (res(), x, w, torch.zeros(m, 1, device=device), EPS, None, None)),
        (OPS.rms_norm_per_block_quant.default, (res(), x, w, torch.zeros(m, 2, device=device), EPS, None, r.clone(), 128, False)),
        (OPS.rms_norm_per_block_quant.default, (res(), x, w, torch.empty_strided((m, 4), (1, mp4(m)), device=device).zero_(), EPS, None, r.clone(), 64, True)),
        (OPS.rms_norm_per_block_quant.default, (res(), x, w, torch.zeros(2, mp4(m), device=device)[:, :m].t(), EPS, None, None, 128, True)),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [3, 8])
def test_opcheck(device, m):
    """All four of opcheck's tests. Its schema test compares written tensors with allclose,
    which PyTorch lacks for float8: that run takes uint8 results (E4M3 codes, which the
    operators accept); float8 results go through the other three. A weight that requires
    grad makes the autograd-registration test run (it skips when nothing requires grad)."""
    cuda_or_skip(device)
    for op, args in opcheck_cases(device, m, torch.uint8):
        torch.library.opcheck(op, args)
    for op, args in opcheck_cases(device, m, torch.float8_e4m3fn):
        torch.library.opcheck(op, args, test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    for op, args in opcheck_cases(device, m, torch.float8_e4m3fn):
        weight_index = 3 if "fused_add" in op._schema.name else 2
        args = list(args)
        args[weight_index] = args[weight_index].clone().requires_grad_(True)
        torch.library.opcheck(op, tuple(args), test_utils=("test_autograd_registration",))


def vllm_block(x, residual, w, static_scale):
    """What vLLM's fusion pass emits, with its keyword arguments, fp4norm's operators in
    place of torch.ops._C's; outputs allocated as vLLM allocates them."""
    m, h = x.shape
    fp8 = torch.float8_e4m3fn
    out1 = torch.empty(x.shape, dtype=fp8, device=x.device)
    OPS.fused_add_rms_norm_static_fp8_quant.default(
        result=out1, input=x, residual=residual, weight=w, scale=static_scale, epsilon=1e-6
    )
    out2 = torch.empty(x.shape, dtype=fp8, device=x.device)
    OPS.rms_norm_static_fp8_quant.default(result=out2, input=x, weight=w, scale=static_scale, epsilon=1e-5)
    out3 = torch.empty(x.shape, dtype=fp8, device=x.device)
    s3 = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    OPS.rms_norm_dynamic_per_token_quant.default(
        result=out3, input=x, weight=w, scale=s3, epsilon=1e-6, scale_ub=None, residual=residual
    )
    out4 = torch.empty(x.shape, dtype=fp8, device=x.device)
    tma_m = (m + 3) // 4 * 4
    s4 = torch.empty_strided((m, h // 128), (1, tma_m), dtype=torch.float32, device=x.device)
    OPS.rms_norm_per_block_quant.default(
        result=out4, input=x, weight=w, scale=s4, epsilon=1e-6, scale_ub=None,
        residual=residual, group_size=128, is_scale_transposed=True,
    )
    out5 = torch.empty(x.shape, dtype=fp8, device=x.device)
    s5 = torch.empty((m, h // 64), dtype=torch.float32, device=x.device)
    OPS.rms_norm_per_block_quant.default(
        result=out5, input=x, weight=w, scale=s5, epsilon=1e-6, scale_ub=None,
        residual=None, group_size=64, is_scale_transposed=False,
    )
    return out1, out2, out3, s3, out4, s4.contiguous(), out5, s5


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_gives_eager_bytes(device):
    cuda_or_skip(device)
    h = 256
    _, _, w = inputs(1, h, "bf16", device, seed_of("compile-w"))
    static_scale = torch.tensor([[0.125]], device=device)
    torch._dynamo.reset()
    x0, r0, _ = inputs(7, h, "bf16", device, 7)
    explained = torch._dynamo.explain(vllm_block)(x0, r0.clone(), w, static_scale)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = CompiledOnce(vllm_block)
    # M = 1 and M % 4 == 0 come last: Dynamo specialises a size of 1, and Inductor's
    # reinplacing guards on whether vLLM's empty_strided scale is dense (M % 4 == 0).
    for i, m in enumerate((3, 5, 129, 1, 4)):
        x, r, _ = inputs(m, h, "bf16", device, seed_of("compile", m))
        r_eager, r_compiled = r.clone(), r.clone()
        eager = vllm_block(x, r_eager, w, static_scale)
        got = compiled(x, r_compiled, w, static_scale)
        for a, b in zip(eager, got):
            assert a.shape == b.shape and a.dtype == b.dtype and same(a, b), m
        assert same(r_eager, r_compiled)
        if i == 2:
            assert compiled.recompiles == 0, f"recompiled {compiled.recompiles} frames for a new M"


# ---------------------------------------------------------------------------------------
# register_vllm_kernels on stand-in namespaces
# ---------------------------------------------------------------------------------------

MARK = 0x11  # what the stand-in "vLLM" kernels write


def stand_in_kernel(result, *args):
    result.view(torch.uint8).fill_(MARK)


def define_stand_in(namespace, schemas):
    lib = torch.library.Library(namespace, "DEF")
    for name, text in schemas.items():
        lib.define(text)
        lib.impl(name, stand_in_kernel, "CPU")
    return lib


STAND_IN = define_stand_in("fp4norm_vllm_test", VLLM_TEXT)
STAND_IN_PARTIAL = define_stand_in(
    "fp4norm_vllm_test_partial", {k: VLLM_TEXT[k] for k in ("rms_norm_static_fp8_quant", "rms_norm_per_block_quant")}
)
# A later vLLM's per-block operator (an appended bool scale_ue8m0): not the schema fp4norm computes.
STAND_IN_OTHER = define_stand_in(
    "fp4norm_vllm_test_other",
    {
        "rms_norm_static_fp8_quant": VLLM_TEXT["rms_norm_static_fp8_quant"],
        "rms_norm_per_block_quant": VLLM_TEXT["rms_norm_per_block_quant"].replace(
            "bool is_scale_transposed)", "bool is_scale_transposed, bool scale_ue8m0=False)"
        ),
    },
)


def test_register_vllm_kernels_on_a_stand_in_namespace():
    names = fv.register_vllm_kernels(namespace="fp4norm_vllm_test", dispatch_keys=("CPU",))
    assert sorted(names) == sorted(f"fp4norm_vllm_test::{n}" for n in VLLM_TEXT)
    assert fv.register_vllm_kernels(namespace="fp4norm_vllm_test", dispatch_keys=("CPU",)) == []
    ns = torch.ops.fp4norm_vllm_test
    m, h = 5, 256
    x, r, w = inputs(m, h, "bf16", "cpu", seed_of("register"))
    floor = FLOOR[torch.float8_e4m3fn]
    # Per-block, transposed, vLLM's keyword arguments: fp4norm's bytes.
    result = poisoned_result((m, h), "cpu")
    scale = torch.empty_strided((m, 2), (1, mp4(m)))
    r1, r_ref = r.clone(), r.clone()
    ns.rms_norm_per_block_quant.default(
        result=result, input=x, weight=w, scale=scale, epsilon=EPS, scale_ub=None,
        residual=r1, group_size=128, is_scale_transposed=True,
    )
    q_ref, s_ref = reference.add_rmsnorm_fp8quant(x, r_ref, w, eps=EPS, group=128, s_min=floor)
    assert same(result, q_ref) and torch.equal(scale.contiguous(), s_ref) and same(r1, r_ref)
    # Per token and static.
    result, scale = poisoned_result((m, h), "cpu"), torch.full((m, 1), SENTINEL)
    ns.rms_norm_dynamic_per_token_quant.default(result, x, w, scale, EPS, None, None)
    q_ref, s_ref = reference.rmsnorm_fp8quant(x, w, eps=EPS, group="token", s_min=floor)
    assert same(result, q_ref) and same(scale, s_ref)
    result, ref = poisoned_result((m, h), "cpu"), torch.empty(m, h, dtype=torch.float8_e4m3fn)
    r1, r_ref = r.clone(), r.clone()
    ns.fused_add_rms_norm_static_fp8_quant.default(result, x, r1, w, torch.tensor(0.5), EPS)
    reference.fused_add_rmsnorm_quant(ref, x, r_ref, w, torch.tensor([0.5]), EPS)
    assert same(result, ref) and same(r1, r_ref)
    # What fp4norm cannot compute goes to the kernel that was there before.
    i8 = torch.zeros((m, h), dtype=torch.int8)
    ns.rms_norm_dynamic_per_token_quant.default(i8, x, w, torch.empty(m, 1), EPS, None, None)
    assert (i8.view(torch.uint8) == MARK).all()
    q = poisoned_result((m, h), "cpu")
    ns.rms_norm_per_block_quant.default(q, x, w, torch.empty(m, 2), EPS, torch.tensor([1.0]), None, 128, False)
    assert (q.view(torch.uint8) == MARK).all()


def test_the_fallback_reaches_a_kernel_registered_through_the_stable_abi():
    """vLLM registers its CUDA kernels through PyTorch's stable C ABI, as boxed kernels; the
    fallback of register_vllm_kernels takes the kernel that was there before through
    torch.library.get_kernel and calls it boxed. fp4norm's own CPU kernels are registered
    the same way (from Rust through the C shim), so one of them stands in for vLLM's."""
    op = torch.ops.fp4norm.fused_add_rmsnorm_quant.default
    previous = fv._previous_kernel(op, "CPU")
    if previous is None:
        pytest.skip("torch.library.get_kernel needs torch >= 2.9: no fallback to test")
    m, h = 5, 256
    x, r, w = inputs(m, h, "bf16", "cpu", seed_of("stable-abi"))
    got, want = poisoned_result((m, h), "cpu"), poisoned_result((m, h), "cpu")
    r1, r2 = r.clone(), r.clone()
    scale = torch.tensor([0.5])
    keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    previous.call_boxed(keyset, got, x, r1, w, scale, EPS, None, None, 0.0, None)
    reference.fused_add_rmsnorm_quant(want, x, r2, w, scale, EPS)
    assert same(got, want) and same(r1, r2)
    assert not same(r1, r), "the boxed call did not write the residual"


def test_register_vllm_kernels_registers_only_existing_operators():
    names = fv.register_vllm_kernels(namespace="fp4norm_vllm_test_partial", dispatch_keys="CPU")
    assert sorted(names) == [
        "fp4norm_vllm_test_partial::rms_norm_per_block_quant",
        "fp4norm_vllm_test_partial::rms_norm_static_fp8_quant",
    ]
    assert fv.register_vllm_kernels(namespace="fp4norm_vllm_no_such_namespace", dispatch_keys=("CPU",)) == []


def test_register_vllm_kernels_refuses_other_schemas():
    with pytest.raises(fp4norm.ArgumentError, match="scale_ue8m0") as info:
        fv.register_vllm_kernels(namespace="fp4norm_vllm_test_other", dispatch_keys=("CPU",))
    assert "nothing was registered" in str(info.value)
    # The static operator, whose schema matches, was not registered either.
    m, h = 3, 256
    x, _, w = inputs(m, h, "bf16", "cpu", seed_of("other"))
    result = poisoned_result((m, h), "cpu")
    torch.ops.fp4norm_vllm_test_other.rms_norm_static_fp8_quant.default(result, x, w, torch.tensor([1.0]), EPS)
    assert (result.view(torch.uint8) == MARK).all()
    with pytest.raises(fp4norm.ArgumentError, match="dispatch_keys"):
        fv.register_vllm_kernels(namespace="fp4norm_vllm_test", dispatch_keys=("XLA",))
    with pytest.raises(fp4norm.ArgumentError, match="own"):
        fv.register_vllm_kernels(namespace="fp4norm_vllm")


# ---------------------------------------------------------------------------------------
# vLLM's NVFP4 fusion: the arguments it passes to FlashInfer's add_rmsnorm_fp4quant
# ---------------------------------------------------------------------------------------

FP4 = getattr(torch, "float4_e2m1fn_x2", None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("swizzled", [True, False], ids=["swizzled", "row-major"])
@pytest.mark.parametrize("m,h", [(1, 256), (3, 4096), (129, 256)])
def test_add_rmsnorm_fp4quant_takes_vllms_nvfp4_arguments(device, m, h, swizzled):
    """vllm/compilation/passes/fusion/rms_quant_fusion.py calls
    ``_FLASHINFER_ADD_RMSNORM_FP4QUANT(input, residual, weight, y_fp4=..., ...)`` with
    these arguments; fp4norm.add_rmsnorm_fp4quant takes them and writes the reference's
    bytes into vLLM's buffers."""
    cuda_or_skip(device)
    x, r, w = inputs(m, h, "bf16", device, seed_of("nvfp4", m, h))
    result = torch.full((m, h // 2), POISON, dtype=torch.uint8, device=device)
    if swizzled:
        block = torch.full((128 * -(-m // 128), -(-h // 64)), -1, dtype=torch.int32, device=device)
    else:
        block = torch.full((m, h // 16), POISON, dtype=torch.uint8, device=device)
    unswizzled = torch.full((m, h // 16), POISON, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    input_global_scale = torch.tensor([3.5], device=device)
    r1 = r.clone()
    fp4norm.add_rmsnorm_fp4quant(
        x, r1, w,
        y_fp4=result.view(FP4) if FP4 is not None else result,
        block_scale=block.view(torch.float8_e4m3fn),
        global_scale=input_global_scale.reshape(1),
        eps=EPS,
        block_size=16,
        scale_format="e4m3",
        is_sf_swizzled_layout=swizzled,
        output_both_sf_layouts=False,
        block_scale_unswizzled=unswizzled,
    )
    r_ref = host(r).clone()
    y_ref, s_ref = reference.add_rmsnorm_fp4quant(
        host(x), r_ref, host(w), global_scale=torch.tensor([3.5]), eps=EPS, block_size=16,
        scale_format="e4m3", is_sf_swizzled_layout=swizzled,
    )
    assert torch.equal(raw(result), raw(y_ref))
    assert torch.equal(raw(block), raw(s_ref))
    assert same(r1, r_ref)
    assert (raw(unswizzled) == POISON).all()  # the dummy is not written
