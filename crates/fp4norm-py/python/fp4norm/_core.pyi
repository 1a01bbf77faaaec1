"""Type stubs of ``fp4norm._core``, the native (Rust) half of fp4norm.

The functions taking addresses are the raw layer under :mod:`fp4norm`: they trust the
addresses and extents they are given (derived by the Python layer from live arrays) and
check everything else. Use :func:`fp4norm.add_rmsnorm_fp4quant` and friends instead.
"""

from typing import List, Optional, Tuple

__version__: str

# (address, rows, cols, row stride in elements)
_Mat = Tuple[int, int, int, int]
# (address, length in elements)
_Buf = Tuple[int, int]

def fused(
    backend: str,
    device: int,
    stream: int,
    dtype: str,
    x: _Mat,
    residual: Optional[_Mat],
    weight: _Buf,
    y_fp4: _Buf,
    row_major: Optional[_Buf],
    swizzled: Optional[_Buf],
    y_out: Optional[_Mat],
    global_scale: Optional[_Buf],
    eps: float,
    block_size: int,
    scale_format: str,
    enable_pdl: Optional[bool] = None,
    weight_bias: float = 0.0,
    ranks: Optional[List[_Mat]] = None,
    peer_buffers: Optional[List[int]] = None,
    peer_row_stride: int = 0,
    signal_pads: Optional[List[int]] = None,
    signal_pad_words: int = 0,
    rank: int = 0,
    peer_two_shot: bool = False,
) -> None:
    """Residual add (if ``residual``) + RMSNorm + FP4 quantisation. ``backend`` is
    ``"cpu"``, ``"reference"`` (host memory) or ``"cuda"`` (device ``device``, raw
    ``stream`` handle; enqueued, never synchronised). ``dtype`` is ``"bf16"`` or
    ``"f16"``. The fused all-reduce of SPEC.md §9 in front (CUDA only): ``ranks``, the
    other ranks' inputs gathered on this device (``x`` is rank 0's), or ``peer_buffers``
    and ``signal_pads``, every rank's buffer and u32 signal pad as mapped on this device
    (rank order, 1 to 8; ``peer_row_stride`` elements between the buffers' rows,
    ``signal_pad_words`` words per pad, this ``rank``; ``x`` is this rank's input, and
    every rank makes the same call; ``peer_two_shot`` the two-shot schedule, which leaves
    the sums of this rank's share of the vectors in its buffer). Raises ValueError (bad argument) or RuntimeError
    (CUDA / NVRTC)."""

def dequantize(
    backend: str,
    device: int,
    stream: int,
    m: int,
    h: int,
    block_size: int,
    scale_format: str,
    y_fp4: _Buf,
    block_scale: _Buf,
    swizzled: bool,
    global_scale: Optional[_Buf],
    out: _Buf,
) -> None:
    """Packed FP4 + scale codes to ``m * h`` float32 at ``out``."""

def fused_fp8(
    backend: str,
    device: int,
    stream: int,
    dtype: str,
    x: _Mat,
    residual: Optional[_Mat],
    weight: _Buf,
    q: _Buf,
    scales: Optional[_Buf],
    static_scale: Optional[_Buf],
    scale_value: Optional[float],
    y_out: Optional[_Mat],
    element: str,
    group_size: int,
    scale_format: str,
    scale_layout: str,
    s_min: float,
    eps: float,
    weight_bias: float,
    enable_pdl: Optional[bool] = None,
    peer_buffers: Optional[List[int]] = None,
    peer_row_stride: int = 0,
    signal_pads: Optional[List[int]] = None,
    signal_pad_words: int = 0,
    rank: int = 0,
    peer_two_shot: bool = False,
) -> None:
    """Residual add (if ``residual``) + RMSNorm + FP8 quantisation (SPEC.md §8). A
    per-tensor scale by address (``static_scale``, one float32) or by value
    (``scale_value``); without either, dynamic scales (``group_size`` -1 per token, 32, 64,
    128) written to ``scales``. ``peer_buffers`` ... ``rank``: the fused all-reduce over
    peer access in front, as for :func:`fused`. Raises ValueError / TypeError (bad
    argument) or RuntimeError (CUDA / NVRTC)."""

def dequantize_fp8(
    m: int,
    h: int,
    element: str,
    scale_value: Optional[float],
    group_size: int,
    scale_format: str,
    scale_layout: str,
    q: _Buf,
    scales: Optional[_Buf],
    out: _Buf,
) -> None:
    """FP8 codes and scales (none with a per-tensor ``scale_value``) to ``m * h`` float32
    at ``out``; host memory only."""

def fp8_sizes(
    m: int, h: int, group_size: Optional[int], scale_format: str, scale_layout: str
) -> Tuple[int, int, int, int]:
    """(code bytes, scale elements, scale rows with padding, groups per row) of an FP8 call;
    ``group_size`` None is a per-tensor scale."""

def sizes(m: int, h: int, block_size: int, scale_format: str) -> Tuple[int, int, int]:
    """Bytes of (y_fp4, row-major scales, swizzled scales); ValueError for a bad shape."""

def cuda_device_count() -> int:
    """CUDA devices the driver reports (0 without a driver)."""

def cuda_device_info(ordinal: int) -> Tuple[str, str, bool]:
    """(name, NVRTC target such as ``sm_90``, hardware E2M1 conversion) of a device."""

def cuda_conversion_path(ordinal: int) -> Tuple[bool, str]:
    """(fast conversions in use, why): the conversion self-test's verdict for a device."""

def peer_two_shot(m: int, h: int, dtype: str, ranks: int) -> bool:
    """Whether the peer-access all-reduce of ``m`` rows of ``h`` elements of ``dtype`` over
    ``ranks`` ranks takes the two-shot schedule (the rule of ``PeerStrategy::for_call``)."""
