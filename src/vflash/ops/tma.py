"""TMA (the Hopper tensor memory accelerator) for the sm_90 kernels, forward and backward: which tensors
and caches a descriptor can address, the descriptors themselves (encoded per call from a tensor's pointer,
shape and strides, in blocks of a consumer warpgroup's rows or of a key tile), the views the descriptors
cover (packed [total, H, D] tensors and KV caches as [1, H, rows, D]; FP8's V with its keys contiguous), the
copies a paged cache's tiles take, and a descriptor's type in an ahead-of-time compile's signature. Dispatch reads the fit checks;
the launchers (ops/sm90.py, ops/sm90_bwd.py) build the descriptors."""

from functools import lru_cache
from typing import Tuple

import torch

from vflash.ops.tiles import CONSUMER_ROWS


def tma_ready(t: torch.Tensor) -> bool:
    """TMA can address t: 16-byte aligned base and strides, unit last stride."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s * size % 16 == 0 for s in t.stride()[:-1]))


def keys_ready(v: torch.Tensor, keys: int) -> bool:
    """FP8 v as the kernels take it: its dimension `keys` contiguous, the other strides 16-byte multiples and
    the base 16-byte aligned (the sm90 kernel's TMA descriptor covers v with the keys last)."""
    return v.stride(keys) == 1 and tma_ready(v.transpose(keys, -1))


def keys_contiguous(v: torch.Tensor, keys: int) -> torch.Tensor:
    """A copy of FP8 v whose dimension `keys` is contiguous (keys_ready: their count padded to 16 bytes' worth),
    for P.V: Hopper's e4m3 tensor-core dot reads both operands K-major from shared memory, and P.V's K is the
    keys. With d-contiguous rows the portable kernel's compiler moves each V tile through registers to
    transpose it, unpipelined (about half the speed), and the sm90 kernel's TMA cannot transpose; the copy is
    one pass over v. A caller who stores v this way pays none (and keeps the launch plan)."""
    order = [d for d in range(v.dim()) if d != keys] + [keys]
    shape = [v.shape[d] for d in order]
    n = shape[-1]
    shape[-1] = -(-n // 16) * 16
    copy = v.new_empty(shape)[..., :n]
    copy.copy_(v.permute(order))
    return copy.permute([order.index(d) for d in range(v.dim())])


def tile_aligned_keys(v: torch.Tensor, cu_seqlens_k: torch.Tensor, block_n: int) -> torch.Tensor:
    """Packed FP8 v [total, Hkv, D] as the sm90 kernel's FP8 varlen build takes it: a copy with the keys
    contiguous (keys_contiguous) in which sequence b's keys start at row
    ceil(cu_seqlens_k[b] / block_n) * block_n + b * block_n (the kernel's tile_aligned_start), zeros between.
    TMA takes the innermost coordinate (here a key) only at 16-byte multiples, which packed sequences' starts
    are not; from these starts every key tile's first key is a block_n multiple, and a tile reaching past its
    sequence's end reads zeros, not the next sequence's values. The [rows, Hkv, D] view of the copy, rows =
    ceil(total / block_n) * block_n + B * block_n; device work only (no host sync)."""
    total, heads, dim = v.shape
    batch = cu_seqlens_k.numel() - 1
    rows = -(-total // block_n) * block_n + batch * block_n
    copy = torch.zeros(heads, dim, rows, dtype=v.dtype, device=v.device)
    cu = cu_seqlens_k.to(torch.int64)
    key = torch.arange(total, device=v.device)
    seq = torch.searchsorted(cu[1:], key, right=True)
    start = (cu[:-1] + block_n - 1) // block_n * block_n + torch.arange(batch, device=v.device) * block_n
    bytes_of = (lambda t: t.view(torch.uint8)) if v.element_size() == 1 else (lambda t: t)
    bytes_of(copy)[:, :, start[seq] + key - cu[seq]] = bytes_of(v).permute(1, 2, 0)
    return copy.permute(2, 0, 1)


def block_shapes(block_n: int, head_dim: int):
    # Q and O move in one consumer warpgroup's rows; K and V in block_n keys (a
    # paged cache's in page_rows(...) keys).
    return [1, 1, CONSUMER_ROWS, head_dim], [1, 1, block_n, head_dim]


def page_rows(page_size: int, block_n: int) -> int:
    """Rows of one K/V copy from a paged cache: the tile's, or a page's when pages are
    shorter (the kernel's PAGE_ROWS)."""
    return min(page_size, block_n)


def page_runs(page_size: int, block_n: int) -> bool:
    """Pages shorter than a tile, so that a run of consecutive ones can go in one copy of the tile's
    rows: the kernel then takes descriptors in blocks of block_n rows beside the page-row ones."""
    return 0 < page_size < block_n


def pages_fit(page_size: int, block_n: int) -> bool:
    """The kernel's copies of a paged cache's tiles never straddle a page and keep the
    shared-memory swizzle's 8-row alignment: a power-of-two page of at least 16 rows."""
    return page_size >= 16 and page_size & (page_size - 1) == 0 and block_n & (block_n - 1) == 0


def cache_ready(cache: torch.Tensor) -> bool:
    """A KV cache the kernel's descriptors can cover: its first two dims merge into rows
    (pages laid end to end) and TMA can address it."""
    return cache.stride(0) == cache.shape[1] * cache.stride(1) and tma_ready(cache)


def cache_rows(cache: torch.Tensor) -> torch.Tensor:
    """A cache [pages or B, page_size or max_len, Hkv, D] as the [1, Hkv, rows, D] view
    its descriptors cover (no copy; the first two dims must merge)."""
    return heads_first(cache.flatten(0, 1))


@lru_cache(maxsize=None)
def shared_layout(block: Tuple[int, ...], dtype: torch.dtype):
    from triton.experimental.gluon import language as gl
    element = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float8_e4m3fn: gl.float8e4nv}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), element)


def _descriptor(t: torch.Tensor, block, layout):
    # The descriptor filled in directly rather than through the dataclass's
    # checks (26 us for four on a CPU core, per call): the dispatch has checked
    # what they check (tma_ready), and a launch plan only replays calls whose key
    # fixes the shapes, strides and 16-byte alignment.
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = t, t.shape, t.stride(), block, layout, "zero"
    return d


@lru_cache(maxsize=None)
def describer(block: Tuple[int, ...], dtype: torch.dtype):
    """tensor -> its TMA descriptor in blocks of `block` (its shared layout the default for the block)."""
    shape, layout = list(block), shared_layout(block, dtype)
    return lambda t: _descriptor(t, shape, layout)


@lru_cache(maxsize=None)
def describers(block_n: int, head_dim: int, dtype: torch.dtype):
    """(rows, keys): tensor -> its 4-D TMA descriptor over [B, H, N, D], in blocks
    of one consumer's rows (Q, O) or of block_n keys (K, V)."""
    rows, keys = block_shapes(block_n, head_dim)
    return describer(tuple(rows), dtype), describer(tuple(keys), dtype)


def keys_last_describer(block_n: int, head_dim: int, dtype: torch.dtype):
    """tensor -> its 4-D TMA descriptor over [B, H, D, N] (V with its keys contiguous, FP8's), in blocks of
    block_n keys."""
    return describer((1, 1, head_dim, block_n), dtype)


def heads_first(t: torch.Tensor) -> torch.Tensor:
    """A packed [total, H, D] tensor as the [1, H, total, D] view the descriptors
    of a varlen launch cover (no copy). The unit batch dim addresses nothing, but TMA takes
    only strides of 16-byte multiples: where unsqueeze's (total times the rows' stride) is
    none, as for FP8's V with its keys contiguous (rows of stride 1), the view's is the
    tensor's extent rounded up to 16 elements."""
    view = t.unsqueeze(0)
    if view.stride(0) * t.element_size() % 16:
        extent = max(stride * size for stride, size in zip(t.stride(), t.shape))
        view = t.as_strided((1, *t.shape), (-(-extent // 16) * 16, *t.stride()))
    return view.transpose(1, 2)
