"""The tensor-parallel fused all-reduce (SPEC.md §9) over a ``torch.distributed`` process
group: one kernel sums the ranks' rows in rank order and runs the op (FP4, or FP8 with a
residual), so every rank writes the bytes of the matching ``fp4norm.reference.allreduce_*``
function, whichever transport moved the ranks' inputs. Two transports, picked per call by
the keyword ``transport``:

* ``"gather"``: this rank's input is all-gathered (NCCL, or whatever backend the group
  runs) into one buffer, then the kernel reads the gathered rows. The portable path, for
  any size: it moves ``W`` times the input through the all-gather.
* ``"symmetric"``: peer access over PyTorch's symmetric memory
  (``torch.distributed._symmetric_memory``). The kernel copies this rank's rows into its
  buffer of a symmetric workspace, meets the other ranks' CTAs through signal pads (no host
  synchronisation), reads every rank's buffer over NVLink and runs the op: one kernel, no
  collective launch (docs/tensor-parallel.md). All ranks on one host (or one NVLink
  fabric), at most one row per SM (132 on an H200; more are refused: the kernel's ranks
  wait for each other's CTAs, which must all be resident). Two schedules: one-shot (every
  rank reads every rank's rows) and two-shot (each rank sums a ``1/W`` share of every
  row's vectors, then every rank reads the shares' sums: ``2·H`` elements a row read
  instead of ``W·H``, one more meeting). ``"symmetric"`` picks the schedule by the bytes
  two-shot saves (:func:`fp4norm._core.peer_two_shot`, the same rule as Rust's
  ``PeerStrategy::for_call``); ``"one_shot"`` and ``"two_shot"`` force one. Two-shot
  leaves the sums of this rank's share in its buffer, not its input.
* ``"auto"`` (the default): ``"symmetric"`` for at most :data:`SYMMETRIC_MAX_ROWS` rows
  where symmetric memory is available for the group (PyTorch has it, every rank on one
  host, the workspace could be set up), else ``"gather"``; inside ``torch.compile`` always
  ``"gather"``. Every rank decides alike, from the call's shape and from facts every rank
  shares.

Both transports write identical bytes. Every rank of the group must make the same calls
(shape, format, options, transport) in the same order, as with any collective; a rank that
does not leaves the others' kernels waiting for it.

**The workspace** (symmetric transport): one per process group and device, created by the
first symmetric call: a symmetric buffer for the ranks' inputs, grown to the largest call
seen, and a symmetric signal pad of u32 words (a word per CTA and rank of a call, at least
:data:`SIGNAL_PAD_WORDS`), zeroed and followed by a barrier of the group before its first
use; the kernel leaves the pads at 0, so a CUDA graph that captured a call replays it.
Creating or growing the workspace is collective (``rendezvous`` over the group): since
every rank makes the same calls, every rank grows it at the same call. It cannot grow
while a CUDA graph is being captured: make one eager call of the largest shape first
(which also compiles the kernel); during capture ``"auto"`` takes the all-gather for a call
the workspace does not fit (or before the group's first eager call), ``"symmetric"``
raises. Buffers of earlier sizes are kept, since a captured graph holds their addresses.
Calls on one workspace must not overlap in time: make them on one stream, or order the
streams.

**Zero copy**: :func:`symmetric_input_buffer` returns a view of this rank's workspace
buffer; an engine that writes its input there and passes that view as ``input`` saves the
kernel's copy.

The symmetric transport calls the native layer directly on torch's current stream (CUDA
graphs capture it); the ``torch.ops.fp4norm`` operators do not cover it, so
``torch.compile`` does not trace it.

The process group is the keyword ``group`` (None: the default group), as in
``torch.distributed``, except in :func:`allreduce_add_rmsnorm_fp8quant`, whose ``group`` is
the FP8 scale group of :func:`fp4norm.add_rmsnorm_fp8quant`: there it is ``process_group``."""

from __future__ import annotations

import math
import socket
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _api
from ._errors import ArgumentError, ArgumentTypeError

Array = Any

TRANSPORTS = ("auto", "symmetric", "one_shot", "two_shot", "gather")
# The transports over symmetric memory: a schedule picked by size, or forced.
_SYMMETRIC = ("symmetric", "one_shot", "two_shot")
# "auto" picks the symmetric transport up to this many rows: its one kernel (no collective
# launch) wins while a call is latency-bound (decode), though every rank reads all W inputs.
SYMMETRIC_MAX_ROWS = 128
# The first signal pad's words: a word per CTA and rank, enough for every call of the
# one-shot regime (at most 128 rows) over 8 ranks; larger calls grow the pad.
SIGNAL_PAD_WORDS = 65536
# An upper bound of the kernel's CTAs per row (a thread-block cluster is at most 16 CTAs),
# for sizing pads from the rows alone: a pad sized by it never falls short on any rank.
_MAX_CTAS_PER_ROW = 16
# The smallest input buffer: growth doubles from here, so a few calls reach any size.
_MIN_BUFFER_BYTES = 1 << 20


class SymmetricMemoryUnavailable(RuntimeError):
    """PyTorch's symmetric memory cannot be set up for this process group and device (the
    message says why, with PyTorch's own error): raised by the ``"symmetric"`` transport
    and :func:`symmetric_input_buffer`; ``"auto"`` falls back to ``"gather"`` instead."""


# ---------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------


def _transport(transport: Any) -> str:
    """The transport's name, checked: one of :data:`TRANSPORTS`."""
    words = ", ".join(f'"{t}"' for t in TRANSPORTS)
    if not isinstance(transport, str):
        raise ArgumentTypeError(
            f"transport must be a str ({words}), got {type(transport).__name__}"
        )
    name = transport.strip().lower()
    if name not in TRANSPORTS:
        raise ArgumentError(f"transport = {transport!r} is not supported: use one of {words}")
    return name


def _cuda_input(input: Any) -> None:
    import torch

    if not isinstance(input, torch.Tensor) or input.device.type != "cuda":
        raise ArgumentError("input must be a CUDA tensor (the all-reduce runs on the GPU)")


def _world(group: Any) -> int:
    """The group's size, 1 to 8 (the kernel sums up to 8 ranks)."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if not 1 <= world <= 8:
        raise ArgumentError(f"the group has {world} ranks: the fused all-reduce sums 1 to 8")
    return world


def _gather(input: Any, group: Any) -> list:
    """This rank's ``input`` (its partial sum, a contiguous CUDA tensor) all-gathered from
    every rank of ``group`` (1 to 8 ranks) into one buffer, on torch's current stream: the
    ranks' inputs in rank order, views of that buffer."""
    import torch
    import torch.distributed as dist

    _cuda_input(input)
    if not input.is_contiguous():
        raise ArgumentError("input must be contiguous: the all-gather reads it as one block")
    if input.dim() not in (2, 3):
        raise ArgumentError(
            f"input must be 2-D [M, H] or 3-D [B, S, H]; got shape {list(input.shape)}"
        )
    world = _world(group)
    # The ranks' inputs concatenated along the first dimension, the output shape every
    # backend's all-gather takes (gloo's too), then viewed rank by rank.
    shape = tuple(input.shape)
    gathered = torch.empty(
        (world * shape[0],) + shape[1:], dtype=input.dtype, device=input.device
    )
    dist.all_gather_into_tensor(gathered, input, group=group)
    return list(gathered.view((world,) + shape).unbind(0))


# ---------------------------------------------------------------------------------------
# The symmetric workspace
# ---------------------------------------------------------------------------------------


def _symm_mem() -> Any:
    """``torch.distributed._symmetric_memory``, or SymmetricMemoryUnavailable."""
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:  # a torch built without it
        raise SymmetricMemoryUnavailable(
            f"torch.distributed._symmetric_memory cannot be imported: {e}"
        ) from e
    return symm_mem


def _signal_words(m: int, world: int) -> int:
    """Pad words that cover any call of ``m`` rows over ``world`` ranks: a word per CTA and
    rank, the CTAs at most :data:`_MAX_CTAS_PER_ROW` per row over the rows rounded up to
    a 128-row tile (the padding rows of the swizzled layouts get CTAs too)."""
    tiles = max(1, -(-m // 128))
    return max(SIGNAL_PAD_WORDS, tiles * 128 * _MAX_CTAS_PER_ROW * world)


def _grown(need: int, have: int, least: int) -> int:
    """The size a buffer of ``have`` grows to for ``need``: the next power of two, at
    least ``least``."""
    size = max(least, have, 1)
    while size < need:
        size *= 2
    return size


class _Workspace:
    """One process group's symmetric buffers on one device: the ranks' input buffers and
    signal pads, each rank's as mapped on this device, in rank order."""

    def __init__(self, group: Any, device: Any) -> None:
        import torch.distributed as dist

        self.group = group  # held: the registry's key is its id
        self.device = device
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.buffer: Any = None  # this rank's input buffer (uint8)
        self._buffer_handle: Any = None
        self.buffer_ptrs: List[int] = []
        self.pad: Any = None  # this rank's signal pad (int32 words)
        self._pad_handle: Any = None
        self.pad_ptrs: List[int] = []
        # Earlier buffers and pads with their handles: a captured graph holds their
        # addresses, so they live as long as the workspace.
        self.kept: List[Any] = []

    @property
    def buffer_bytes(self) -> int:
        return 0 if self.buffer is None else int(self.buffer.numel())

    @property
    def pad_words(self) -> int:
        return 0 if self.pad is None else int(self.pad.numel())

    def fits(self, m: int, row_bytes: int) -> bool:
        """Whether a call of ``m`` rows of ``row_bytes`` needs no growth."""
        return m * row_bytes <= self.buffer_bytes and _signal_words(m, self.world) <= self.pad_words

    def ensure(self, nbytes: int, words: int) -> None:
        """Grows the input buffer to ``nbytes`` and the pads to ``words`` where they are
        smaller (collective: every rank makes the same calls, so every rank grows here)."""
        import torch

        grow_buffer = nbytes > self.buffer_bytes or self.buffer is None
        grow_pad = words > self.pad_words or self.pad is None
        if not (grow_buffer or grow_pad):
            return
        with torch.cuda.device(self.device):
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "fp4norm.distributed: the symmetric workspace must grow for this call "
                    f"({nbytes} input bytes, {words} signal words per rank), which cannot "
                    "happen during CUDA graph capture: make one eager call of the largest "
                    "shape before capturing"
                )
            if grow_buffer:
                size = _grown(nbytes, self.buffer_bytes, _MIN_BUFFER_BYTES)
                buffer, handle, ptrs = self._allocate(size, torch.uint8)
                if self.buffer is not None:
                    self.kept.append((self.buffer, self._buffer_handle))
                self.buffer, self._buffer_handle, self.buffer_ptrs = buffer, handle, ptrs
            if grow_pad:
                size = _grown(words, self.pad_words, SIGNAL_PAD_WORDS)
                pad, handle, ptrs = self._allocate(size, torch.int32)
                # The kernel needs every pad at 0 before its first call: each rank zeroes
                # its own, then the barrier keeps every rank's next kernel (stream order)
                # from signalling into a pad not yet zeroed.
                pad.zero_()
                try:
                    handle.barrier(channel=0)
                except Exception as e:  # PyTorch's own refusal, reported as such
                    raise SymmetricMemoryUnavailable(
                        f"the symmetric-memory barrier failed: {type(e).__name__}: {e}"
                    ) from e
                if self.pad is not None:
                    self.kept.append((self.pad, self._pad_handle))
                self.pad, self._pad_handle, self.pad_ptrs = pad, handle, ptrs

    def _allocate(self, n: int, dtype: Any) -> Tuple[Any, Any, List[int]]:
        """A symmetric tensor of ``n`` elements, its handle and every rank's address of it
        as mapped on this device (rank order)."""
        symm_mem = _symm_mem()
        try:
            tensor = symm_mem.empty(n, dtype=dtype, device=self.device)
            handle = symm_mem.rendezvous(tensor, self.group)
        except Exception as e:  # PyTorch's own refusal, reported as such
            raise SymmetricMemoryUnavailable(
                f"torch symmetric memory could not be set up on {self.device}: "
                f"{type(e).__name__}: {e}"
            ) from e
        if handle is None:
            raise SymmetricMemoryUnavailable(
                "torch symmetric memory: rendezvous returned no handle (the tensor is not "
                "in a symmetric allocation)"
            )
        if int(handle.world_size) != self.world or int(handle.rank) != self.rank:
            raise SymmetricMemoryUnavailable(
                f"torch symmetric memory: the handle has rank {handle.rank} of "
                f"{handle.world_size}, the group rank {self.rank} of {self.world}"
            )
        bases = [int(p) for p in handle.buffer_ptrs]
        if len(bases) != self.world or not all(bases):
            raise SymmetricMemoryUnavailable(
                "torch symmetric memory: not every rank's buffer is mapped on this device "
                f"({bases}); the ranks must share one host or NVLink fabric"
            )
        # The tensor lies at the same offset of every rank's allocation (the ranks make
        # the same allocations): this rank's mapping gives the offset.
        nbytes = n * tensor.element_size()
        offset = int(tensor.data_ptr()) - bases[self.rank]
        if offset < 0 or offset + nbytes > int(handle.buffer_size):
            raise SymmetricMemoryUnavailable(
                f"torch symmetric memory: the tensor ({nbytes} bytes at offset {offset}) is "
                f"not inside this rank's buffer ({handle.buffer_size} bytes)"
            )
        return tensor, handle, [b + offset for b in bases]


# (id of the process group, device index) -> its workspace; the workspace holds the group,
# so the id is not reused while the entry lives.
_WORKSPACES: Dict[Tuple[int, int], _Workspace] = {}
# The same key -> why "auto" does not use symmetric memory there.
_UNAVAILABLE: Dict[Tuple[int, int], str] = {}


def _group_object(group: Any) -> Any:
    import torch.distributed as dist

    if group is None:
        group = dist.group.WORLD
        if group is None:
            raise ArgumentError(
                "the default process group is not initialized: call "
                "torch.distributed.init_process_group first, or pass group="
            )
    return group


def _key(group: Any, device: Any) -> Tuple[Any, int]:
    """A workspace's key: the group's name (unique for the process's life, unlike its
    id once a group is destroyed) and the device."""
    name = getattr(group, "group_name", None)
    return (name if name else id(group), int(device.index))


def _workspace(group: Any, device: Any) -> _Workspace:
    """The workspace of ``group`` (a ProcessGroup) on ``device``, created (collective) on
    first use with the one-shot regime's sizes."""
    key = _key(group, device)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _Workspace(group, device)
        ws.ensure(_MIN_BUFFER_BYTES, SIGNAL_PAD_WORDS)
        _WORKSPACES[key] = ws
    return ws


def _one_host(group: Any, device: Any) -> Optional[str]:
    """None where every rank of ``group`` runs on this host, on GPUs alike (SM count and
    compute capability: the kernel's launch table then gives every rank the same grid,
    whose CTAs meet rank by rank), else why not (collective)."""
    import torch
    import torch.distributed as dist

    if dist.get_world_size(group) == 1:
        return None
    prop = torch.cuda.get_device_properties(device)
    mine = (socket.gethostname(), prop.multi_processor_count, prop.major, prop.minor)
    names: List[Any] = [None] * dist.get_world_size(group)
    with torch.cuda.device(device):
        dist.all_gather_object(names, mine, group=group)
    hosts = sorted(set(n[0] for n in names))
    if len(hosts) > 1:
        return f"the ranks run on {len(hosts)} hosts ({', '.join(map(str, hosts))})"
    gpus = sorted(set(n[1:] for n in names))
    if len(gpus) > 1:
        return (
            "the ranks' GPUs differ (SMs, compute capability: "
            + ", ".join(f"{sm} SMs sm_{a}{b}" for sm, a, b in gpus)
            + "): the peer kernel needs equal grids on every rank"
        )
    return None


def _symmetric_reason(group: Any, device: Any) -> Optional[str]:
    """Why "auto" cannot use symmetric memory for ``group`` on ``device`` (None: it can,
    and the workspace exists). The same answer on every rank: after each rank's attempt,
    the ranks agree (a MIN all-reduce of their outcomes), since a set-up can fail on one
    rank alone (memory, a refused mapping) and ranks that chose differently would wait for
    each other forever."""
    import torch
    import torch.distributed as dist

    key = _key(group, device)
    if key in _WORKSPACES:
        return None
    if key in _UNAVAILABLE:
        return _UNAVAILABLE[key]
    try:
        try:
            symm_mem = _symm_mem()
            if symm_mem.get_backend(device) is None:
                raise SymmetricMemoryUnavailable(
                    "torch has no symmetric-memory backend for CUDA devices"
                )
            reason = _one_host(group, device)
            if reason is not None:
                raise SymmetricMemoryUnavailable(reason)
            _workspace(group, device)
            mine = None
        except SymmetricMemoryUnavailable as e:
            mine = str(e)
        ok = torch.tensor([0 if mine else 1], dtype=torch.int32, device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        if int(ok.item()) == 0:
            _WORKSPACES.pop(key, None)  # (kept by none: this group gathers from now on)
            raise SymmetricMemoryUnavailable(mine or "another rank could not set it up")
    except SymmetricMemoryUnavailable as e:
        _UNAVAILABLE[key] = str(e)
        warnings.warn(
            f"fp4norm.distributed: transport=\"auto\" uses the all-gather for this group on "
            f"{device}: {e}",
            RuntimeWarning,
            stacklevel=4,
        )
        return str(e)
    return None


def _use_symmetric(transport: Any, input: Any, group: Any) -> Tuple[bool, Any]:
    """``(symmetric?, the process group)`` for a call: the transport's name checked, then
    the input (a CUDA tensor) and the group's size (1 to 8); ``"auto"`` as the module
    docstring says."""
    import torch

    name = _transport(transport)
    _cuda_input(input)
    _world(group)
    if name == "gather":
        return False, group
    pg = _group_object(group)
    if name in _SYMMETRIC:
        return True, pg
    rows = math.prod(input.shape[:-1]) if input.dim() >= 1 else 0
    row_bytes = (input.shape[-1] if input.dim() >= 1 else 0) * input.element_size()
    if rows > SYMMETRIC_MAX_ROWS or torch.compiler.is_compiling():
        return False, group
    with torch.cuda.device(input.device):
        capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        # No collective can run during capture: the workspace as it stands decides (the
        # same on every rank, which made the same calls).
        ws = _WORKSPACES.get(_key(pg, input.device))
        return ws is not None and ws.fits(rows, row_bytes), pg
    return _symmetric_reason(pg, input.device) is None, pg


def _peers(input: Any, group: Any, transport: str) -> "_api.Peers":
    """The peers of a symmetric call with ``input`` (checked first: its dtype and rows),
    the workspace created or grown for it (collective), and the schedule: forced by
    ``transport``, else by ``_core.peer_two_shot`` (every rank decides alike)."""
    from . import _core

    x = _api._view(input, "input")
    x.need_dtype(("bf16", "f16"))
    _, m, h, _ = x.rows()
    ws = _workspace(group, input.device)
    ws.ensure(m * h * input.element_size(), _signal_words(m, ws.world))
    name = _transport(transport)
    if name in ("one_shot", "two_shot"):
        two_shot = name == "two_shot"
    else:
        two_shot = _core.peer_two_shot(m, h, x.dt, ws.world)
    return _api.Peers(ws.buffer_ptrs, h, ws.pad_ptrs, ws.pad_words, ws.rank, two_shot)


def _refuse_grad(op_name: str, written: List[Tuple[Any, str]]) -> None:
    """What the operators' Autograd kernel does before a write: a tensor that requires grad
    is refused (the symmetric transport bypasses the operators)."""
    import torch

    from ._ops import refuse_if_requires_grad

    if torch.is_grad_enabled():
        for t, name in written:
            if isinstance(t, torch.Tensor):
                refuse_if_requires_grad(t, op_name, name)


def _advance_versions(written: List[Tuple[Any, str]]) -> None:
    """Advances the version counter of every tensor written, as the operators do."""
    import torch

    from ._ops import _increment_version

    tensors = tuple(t for t, _ in written if isinstance(t, torch.Tensor))
    if tensors:
        _increment_version(tensors)


def symmetric_input_buffer(
    shape: Any, dtype: Any, *, group: Any = None, device: Any = None
) -> Array:
    """A view of this rank's input buffer in the symmetric workspace of ``group`` (the
    default group if None) on ``device`` (the current CUDA device if None): ``shape``
    (``[M, H]`` or ``[B, S, H]``) of ``dtype`` (bfloat16 or float16), contiguous. Write this
    rank's input there and pass the view as ``input`` with the symmetric transport (or
    "auto" at its sizes): the kernel then reads it where it lies instead of copying it in.

    Collective where it creates or grows the workspace: every rank calls it with the same
    shape. The view stays valid (its memory is kept) but stops being the workspace's buffer
    once a larger call grows it; passed then, it is copied in as any input is. Its contents
    are this rank's input only until the next call on the workspace (whose kernel may copy
    another input in, and whose two-shot schedule leaves the sums of this rank's share of
    the vectors there): write it before each call, on the stream of the calls (or a stream
    ordered after this rank's previous call): until that call has finished, a peer may
    still be reading the buffer.

    Raises SymmetricMemoryUnavailable where symmetric memory cannot be set up."""
    import torch

    given = shape
    try:
        shape = tuple(shape)
    except TypeError:
        shape = None
    if shape is None or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
    ):
        raise ArgumentTypeError(f"shape must be a tuple of non-negative ints, got {given!r}")
    if len(shape) not in (2, 3):
        raise ArgumentError(f"shape must be [M, H] or [B, S, H], got {list(shape)}")
    if dtype not in (torch.bfloat16, torch.float16):
        raise ArgumentTypeError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    _world(group)
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ArgumentError(f"device must be a CUDA device, got {dev}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    pg = _group_object(group)
    m, h = math.prod(shape[:-1]), shape[-1]
    nbytes = m * h * torch.empty((), dtype=dtype).element_size()
    ws = _workspace(pg, dev)
    ws.ensure(nbytes, _signal_words(m, ws.world))
    return ws.buffer[:nbytes].view(dtype).view(shape)


# ---------------------------------------------------------------------------------------
# The ops
# ---------------------------------------------------------------------------------------


def allreduce_add_rmsnorm_fp4quant(
    input: Array,
    residual: Array,
    weight: Array,
    y_fp4: Optional[Array] = None,
    block_scale: Optional[Array] = None,
    global_scale: Union[Array, float, None] = None,
    eps: float = 1e-6,
    block_size: int = 16,
    scale_format: Optional[str] = None,
    is_sf_swizzled_layout: bool = False,
    output_both_sf_layouts: bool = False,
    block_scale_unswizzled: Optional[Array] = None,
    enable_pdl: Optional[bool] = None,
    y_out: Optional[Array] = None,
    *,
    weight_bias: Optional[float] = None,
    group: Any = None,
    transport: str = "auto",
) -> Tuple[Array, ...]:
    """This rank's part of the fused all-reduce: ``input`` (this rank's partial sum, a CUDA
    tensor) summed with every other rank's of ``group`` (the default group if None, 1 to 8
    ranks), in rank order, then the op of :func:`fp4norm.add_rmsnorm_fp4quant` on the sum,
    on torch's current stream. ``residual`` and the outputs are this rank's; with the same
    residual on every rank (tensor parallelism keeps it replicated) every rank writes the
    same bytes, those of :func:`fp4norm.reference.allreduce_add_rmsnorm_fp4quant`.

    ``transport`` (one of :data:`TRANSPORTS`; see the module docstring)
    moves the inputs: ``"gather"`` all-gathers them (``input`` contiguous) and calls
    :func:`fp4norm.allreduce_add_rmsnorm_fp4quant` (the operators); ``"symmetric"`` runs
    one kernel over the group's symmetric workspace, directly through the native layer
    (no operator: not traced by ``torch.compile``; CUDA graphs capture it)."""
    _api.require_residual(residual)
    symmetric, pg = _use_symmetric(transport, input, group)
    if not symmetric:
        from . import allreduce_add_rmsnorm_fp4quant as fused

        return fused(
            _gather(input, group), residual, weight, y_fp4, block_scale, global_scale, eps,
            block_size, scale_format, is_sf_swizzled_layout, output_both_sf_layouts,
            block_scale_unswizzled, enable_pdl, y_out, weight_bias=weight_bias,
        )
    written = [
        (residual, "residual"), (y_out, "y_out"), (y_fp4, "y_fp4"),
        (block_scale, "block_scale"),
        (block_scale_unswizzled if output_both_sf_layouts else None, "block_scale_unswizzled"),
    ]
    _refuse_grad("fp4norm::allreduce_add_rmsnorm_fp4quant", written)
    out = _api.fused(
        input, residual, weight, y_fp4, block_scale, global_scale, eps, block_size,
        scale_format, is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled,
        enable_pdl, y_out, weight_bias, peers=_peers(input, pg, transport),
    )
    _advance_versions(written)
    return out


def _fp8_options(
    scale: Any = None, element: Any = None, group: Any = None, scale_format: Any = None,
    scale_layout: Any = None, s_min: Any = None, y_out: Any = None, enable_pdl: Any = None,
    weight_bias: Any = None,
) -> Tuple[Any, ...]:
    """The keyword-only arguments of :func:`fp4norm.add_rmsnorm_fp8quant`, in order (an
    unknown one is Python's TypeError)."""
    return (scale, element, group, scale_format, scale_layout, s_min, y_out, enable_pdl, weight_bias)


def allreduce_add_rmsnorm_fp8quant(
    input: Array, residual: Array, weight: Array, out: Optional[Array] = None,
    scales_out: Optional[Array] = None, eps: float = 1e-6, *, process_group: Any = None,
    transport: str = "auto", **options: Any,
) -> Tuple[Array, Array]:
    """:func:`allreduce_add_rmsnorm_fp4quant` for the FP8 op: ``input`` summed with every
    other rank's of ``process_group`` (the default group if None, 1 to 8 ranks), then
    :func:`fp4norm.add_rmsnorm_fp8quant` on the sum with this rank's ``residual``,
    ``weight`` and outputs; ``out``, ``scales_out``, ``eps`` and the keyword-only
    ``options`` (``group`` being the scale group) are :func:`fp4norm.add_rmsnorm_fp8quant`'s.
    ``transport`` as for :func:`allreduce_add_rmsnorm_fp4quant`. Returns ``(out, scales)``,
    the bytes of :func:`fp4norm.reference.allreduce_add_rmsnorm_fp8quant`."""
    _api.require_residual(residual)
    opts = _fp8_options(**options)
    symmetric, pg = _use_symmetric(transport, input, process_group)
    if not symmetric:
        from . import allreduce_add_rmsnorm_fp8quant as fused

        return fused(_gather(input, process_group), residual, weight, out, scales_out, eps, **options)
    scale, element, group, scale_format, scale_layout, s_min, y_out, enable_pdl, weight_bias = opts
    written = [(out, "out"), (scales_out, "scales_out"), (residual, "residual"), (y_out, "y_out")]
    _refuse_grad("fp4norm::allreduce_add_rmsnorm_fp8quant", written)
    result = _api.fused_fp8(
        input, residual, weight, out, scales_out, scale, element, group, scale_format,
        scale_layout, s_min, eps, y_out, enable_pdl, weight_bias,
        peers=_peers(input, pg, transport),
    )
    _advance_versions(written)
    return result


def allreduce_fused_add_rmsnorm_quant(
    out: Array, input: Array, residual: Array, weight: Array, scale: Union[Array, float],
    eps: float = 1e-6, enable_pdl: Optional[bool] = None, *, y_out: Optional[Array] = None,
    weight_bias: Optional[float] = None, group: Any = None, transport: str = "auto",
) -> None:
    """:func:`allreduce_add_rmsnorm_fp4quant` for FlashInfer's per-tensor static scale:
    ``input`` summed with every other rank's of ``group``, then
    :func:`fp4norm.fused_add_rmsnorm_quant` on the sum with this rank's ``out``,
    ``residual`` (updated in place), ``weight`` and ``scale``; the bytes of
    :func:`fp4norm.reference.allreduce_fused_add_rmsnorm_quant`. ``transport`` as for
    :func:`allreduce_add_rmsnorm_fp4quant`."""
    _api.require_residual(residual)
    symmetric, pg = _use_symmetric(transport, input, group)
    if not symmetric:
        from . import allreduce_fused_add_rmsnorm_quant as fused

        fused(
            out, _gather(input, group), residual, weight, scale, eps, enable_pdl, y_out=y_out,
            weight_bias=weight_bias,
        )
        return None
    written = [(out, "out"), (residual, "residual"), (y_out, "y_out")]
    _refuse_grad("fp4norm::allreduce_fused_add_rmsnorm_quant", written)
    _api.fused_fp8(
        input, residual, weight, out, None, scale, None, None, None, None, None, eps, y_out,
        enable_pdl, weight_bias, static=True, peers=_peers(input, pg, transport),
    )
    _advance_versions(written)
    return None


__all__ = [
    "SIGNAL_PAD_WORDS",
    "SYMMETRIC_MAX_ROWS",
    "TRANSPORTS",
    "SymmetricMemoryUnavailable",
    "allreduce_add_rmsnorm_fp4quant",
    "allreduce_add_rmsnorm_fp8quant",
    "allreduce_fused_add_rmsnorm_quant",
    "symmetric_input_buffer",
]
