"""Split-KV's scratch: the fp32 partials, their LSEs and the row tiles' arrival counters
that attention_kvcache_kernel's splits share within one launch.

One pool per (device, stream), grown as needed and reused call after call: the kernel
leaves every counter as it found it (zero), and launches on one stream run in order, so
a call may reuse what the one before it used. Calls on another stream get their own pool.
A call under CUDA-graph capture gets fresh tensors from the graph's private memory
instead (the pool may be regrown, its old buffers freed, while the graph lives), and so
does a call whose partials pass POOL_MAX_BYTES (its kernel outweighs an allocation; the
pool does not grow to it). `clear()` gives the pools back to torch's caching allocator.
"""

import math
from typing import Callable, Dict, List, Optional, Tuple

import torch

from vflash.ops.direct_launch import current_raw_stream

POOL_MAX_BYTES = 64 << 20  # partials larger than this are allocated per call
_DTYPES = (torch.float32, torch.float32, torch.int32)
_pools: Dict[tuple, List[torch.Tensor]] = {}  # (device, stream) -> flat [partials, LSEs, counters]
_generation = 0  # bumped whenever a pool is replaced or dropped: carved views are stale


def split_scratch(splits: int, total_q: int, heads_q: int, head_dim: int, batch: int, heads_k: int,
                  row_tiles: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(partials [splits, total_q, Hq, D] fp32, their LSEs [splits, Hq, total_q] fp32,
    arrival counters [B, Hkv, row tiles] int32, all zero) for a launch on the current
    stream; contiguous (the kernel takes the partials' strides apart from the output's)."""
    return scratch_fetcher(splits, total_q, heads_q, head_dim, batch, heads_k, row_tiles, device)()


def scratch_fetcher(splits: int, total_q: int, heads_q: int, head_dim: int, batch: int, heads_k: int,
                    row_tiles: int, device: torch.device) -> Callable[[], Tuple[torch.Tensor, ...]]:
    """split_scratch for fixed sizes as a function of no arguments (a launch plan's, called
    every call): the views carved last time are returned while the stream and the pools are
    the same."""
    shapes = ((splits, total_q, heads_q, head_dim), (splits, heads_q, total_q), (batch, heads_k, row_tiles))
    sizes = tuple(math.prod(s) for s in shapes)
    pooled = sizes[0] * 4 <= POOL_MAX_BYTES
    cuda, index = device.type == "cuda", device.index
    last = [None, -1, None]  # stream, generation, views

    def fetch() -> Tuple[torch.Tensor, ...]:
        if not pooled or (cuda and torch.cuda.is_current_stream_capturing()):
            return tuple(_buffer(n, dt, device).view(s) for n, s, dt in zip(sizes, shapes, _DTYPES))
        stream = current_raw_stream(index) if cuda else None
        if last[0] != stream or last[1] != _generation or last[2] is None:
            last[2] = _carve(device, stream, sizes, shapes)
            last[0], last[1] = stream, _generation
        return last[2]
    return fetch


def _buffer(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # counters start at zero; the partials are written before they are read
    return (torch.zeros if dtype == torch.int32 else torch.empty)(n, dtype=dtype, device=device)


def _carve(device: torch.device, stream: Optional[int], sizes, shapes) -> Tuple[torch.Tensor, ...]:
    """Views of the (device, stream) pool, grown (at least doubled, up to POOL_MAX_BYTES of
    partials) where too small. A replaced buffer goes back to torch's caching allocator, which
    reuses it only after the stream's queued launches."""
    global _generation
    pool = _pools.get((device, stream))
    if pool is None or any(b.numel() < n for b, n in zip(pool, sizes)):
        old = pool or (None, None, None)
        limits = (POOL_MAX_BYTES // 4, POOL_MAX_BYTES // 4, None)
        pool = [b if b is not None and b.numel() >= n else
                _buffer(max(n, min(2 * (0 if b is None else b.numel()), limit or 2 * n)), dt, device)
                for b, n, dt, limit in zip(old, sizes, _DTYPES, limits)]
        _pools[(device, stream)] = pool
        _generation += 1
    return tuple(b[:n].view(s) for b, n, s in zip(pool, sizes, shapes))


def clear() -> None:
    """Drop every pool (their memory back to torch's caching allocator)."""
    global _generation
    _pools.clear()
    _generation += 1
