"""Shared helpers of the tests that use torch (imported after ``pytest.importorskip``):
random inputs with the rows every case wants, the ranks' inputs of the all-reduce tests,
and tensors' bytes."""

from __future__ import annotations

import torch


def torch_data(m, h, dtype, device="cpu", seed=0, specials=False, lead=None):
    """Input, residual and weight. Row 1 is zero (an rstd of 1/sqrt(eps)), row 2 a thousand
    times larger; `specials` puts a NaN, an Inf and a block of tiny values in rows 3 to 5.
    `lead` reshapes input and residual to ``(*lead, h)``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g)
    r = torch.randn(m, h, generator=g) * 2
    w = 1 + 0.25 * torch.randn(h, generator=g)
    if m > 2:
        x[1] = 0
        r[1] = 0
        x[2] *= 1000
    if specials and m > 5:
        x[3, 5] = float("nan")
        x[4, 17] = float("inf")
        x[5, :16] = 1e-30  # subnormal-ish block
    x, r, w = (t.to(dtype).to(device) for t in (x, r, w))
    if lead is not None:
        x, r = x.reshape(*lead, h), r.reshape(*lead, h)
    return x, r, w


def ranks_data(w, m, h, dtype, seed):
    """``w`` ranks' inputs (rank k's scaled by k + 1, with a row that cancels across ranks,
    large values of opposite signs and a NaN), a residual and a weight, CPU tensors."""
    g = torch.Generator().manual_seed(seed)
    xs = [(torch.randn(m, h, generator=g) * (k + 1)).to(dtype) for k in range(w)]
    if m > 3:
        xs[0][1] = 0
        xs[-1][1] = 0
        xs[0][2, :8] = 1e4
        if w > 1:
            xs[1][2, :8] = -1e4
        xs[w // 2][3, 5] = float("nan")
    r = (torch.randn(m, h, generator=g) * 2).to(dtype)
    wt = (1 + 0.25 * torch.randn(h, generator=g)).to(dtype)
    return xs, r, wt


def raw(t):
    """The bytes of a tensor (any shape, dtype and device), flat, as a CPU uint8 tensor."""
    return t.detach().contiguous().view(torch.uint8).reshape(-1).cpu()


def raw_np(t):
    """:func:`raw` as a NumPy array."""
    return raw(t).numpy()


def same(a, b):
    return torch.equal(raw(a), raw(b))


def host(t):
    """A tensor as a NumPy array of its dtype (bf16 through ml_dtypes; 1-byte dtypes as
    uint8), for the reference functions."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.view(torch.uint8).numpy() if t.element_size() == 1 else t.numpy()


class CompiledOnce:
    """``torch.compile(fn, fullgraph=True, dynamic=True)`` with Inductor, counting Dynamo's
    frames: ``recompiles`` is how many it compiled after the first call, which a function
    that takes every M with one graph keeps at 0. (The first call itself may compile its
    frame twice: Dynamo restarts a frame's analysis once to specialise a Python float
    handed to an operator, as any operator's float argument is, such as an ``eps`` read
    from a module attribute, or, from torch 2.15 on, from a function's default.)"""

    def __init__(self, fn):
        from torch._dynamo.testing import CompileCounterWithBackend

        self.counter = CompileCounterWithBackend("inductor")
        self.fn = torch.compile(fn, fullgraph=True, dynamic=True, backend=self.counter)
        self.first = None

    def __call__(self, *args):
        out = self.fn(*args)
        if self.first is None:
            self.first = self.counter.frame_count
        return out

    @property
    def recompiles(self):
        return self.counter.frame_count - (self.first or 0)
