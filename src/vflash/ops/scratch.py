"""Split-KV's scratch: the fp32 partials, their LSEs and the row tiles' arrival counters
that attention_kvcache_kernel's splits share within one launch.

One pool per (device, stream), grown as needed and reused call after call: the kernel
leaves every counter as it found it (zero), and launches on one stream run in order, so
a call may reuse what the one before it used. Calls on another stream get their own pool.
A call under CUDA-graph capture gets fresh tensors from the graph's private memory
instead: the pool may be regrown (and its old buffers freed) while the graph lives."""

import math
from typing import Dict, List, Optional, Tuple

import torch

from vflash.ops.direct_launch import current_raw_stream

MAX_VIEWS = 256  # carved (shapes -> views) entries kept before the table is cleared

_DTYPES = (torch.float32, torch.float32, torch.int32)
_pools: Dict[tuple, List[torch.Tensor]] = {}  # (device, stream) -> flat [partials, LSEs, counters]
_views: Dict[tuple, Tuple[torch.Tensor, ...]] = {}  # (device, stream, shapes) -> the pool's views


def split_scratch(splits: int, total_q: int, heads_q: int, head_dim: int, batch: int, heads_k: int,
                  row_tiles: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(partials [splits, total_q, Hq, D] fp32, their LSEs [splits, Hq, total_q] fp32,
    arrival counters [B, Hkv, row tiles] int32, all zero) for a launch on the current
    stream; contiguous, so a split's strides are the output's."""
    shapes = ((splits, total_q, heads_q, head_dim), (splits, heads_q, total_q), (batch, heads_k, row_tiles))
    stream: Optional[int] = None
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return tuple(_buffer(math.prod(s), dt, device).view(s) for s, dt in zip(shapes, _DTYPES))
        stream = current_raw_stream(device.index)
    key = (device, stream, shapes)
    views = _views.get(key)
    if views is None:
        views = _carve(device, stream, shapes)
        if len(_views) >= MAX_VIEWS:
            _views.clear()
        _views[key] = views
    return views


def _buffer(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # counters start at zero; the partials are written before they are read
    return (torch.zeros if dtype == torch.int32 else torch.empty)(n, dtype=dtype, device=device)


def _carve(device: torch.device, stream: Optional[int], shapes) -> Tuple[torch.Tensor, ...]:
    """Views of the (device, stream) pool, grown (at least doubled) where too small. A
    replaced buffer goes back to torch's caching allocator, which reuses it only after the
    stream's queued launches."""
    sizes = [math.prod(s) for s in shapes]
    pool = _pools.get((device, stream))
    if pool is None or any(b.numel() < n for b, n in zip(pool, sizes)):
        pool = [b if b is not None and b.numel() >= n else _buffer(max(n, 2 * (0 if b is None else b.numel())), dt,
                                                                    device)
                for b, n, dt in zip(pool or (None, None, None), sizes, _DTYPES)]
        _pools[(device, stream)] = pool
        for k in [k for k in _views if k[:2] == (device, stream)]:
            del _views[k]
    return tuple(b[:n].view(s) for b, n, s in zip(pool, sizes, shapes))


def clear() -> None:
    """Drop every pool (tests; a plan fetches its scratch per call, so none holds a stale one)."""
    _pools.clear()
    _views.clear()
