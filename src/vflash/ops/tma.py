"""TMA (the Hopper tensor memory accelerator) for the sm_90 kernels, forward and backward: which tensors
and caches a descriptor can address, the descriptors themselves (encoded per call from a tensor's pointer,
shape and strides, in blocks of a consumer warpgroup's rows or of a key tile), the views the descriptors
cover (packed [total, H, D] tensors and KV caches as [1, H, rows, D]; FP8's V with its keys contiguous), the
copies a paged cache's tiles take, and a descriptor's type in an ahead-of-time compile's signature. Dispatch reads the fit checks;
the launchers (ops/sm90.py, ops/sm90_bwd.py) build the descriptors."""

from functools import lru_cache
from typing import Optional, Tuple

import torch
import triton

from vflash.kernels.layout import e4m3_values_kernel
from vflash.ops import launch as launches
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
    """A copy of FP8 v ([B, H, N, D] with keys 2, or packed [total, H, D] with keys 0) whose keys are contiguous
    (keys_ready: their count padded to 16 bytes' worth, zeros there), for P.V: Hopper's e4m3 tensor-core dot
    reads both operands K-major from shared memory, and P.V's K is the keys. With d-contiguous rows the portable
    kernel's compiler moves each V tile through registers to transpose it, unpipelined (about half the speed),
    and the sm90 kernel's TMA cannot transpose; the copy is one pass over v (kernels/layout.py). A caller who
    stores v this way pays none (and keeps the launch plan)."""
    if (v.dim(), keys) not in ((4, 2), (3, 0)):
        raise ValueError(f"keys_contiguous takes v [B, H, N, D] with keys 2 or [total, H, D] with keys 0, not "
                         f"{v.dim()}-d with keys {keys}")
    copy = _keys_last(v, permuted=False)
    return copy[..., :v.shape[keys], :] if v.dim() == 4 else copy[:v.shape[0]]


# The sm90 FP8 build's P.V takes P in the score accumulator's register order, relabelled without moving a
# value (kernels/attention_fwd_sm90.py:_p_operand): within each 16-key group the e4m3 A operand's key k is the
# accumulator's column E4M3_KEY_ORDER[k] (a thread holds columns 2t, 2t + 1, 2t + 8, 2t + 9 there, and keys
# 4t to 4t + 3 in the operand). V goes in with its keys in the same order (sm90_e4m3_values).
E4M3_KEY_ORDER = (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)


def sm90_e4m3_values(v: torch.Tensor, cu_seqlens_k: Optional[torch.Tensor] = None, block_n: int = 16,
                     run: bool = True) -> torch.Tensor:
    """FP8 v as the sm90 kernel's FP8 build takes it: a copy with the keys contiguous (the e4m3 wgmma reads
    V K-major), each 16-key group in E4M3_KEY_ORDER, zeros in the padding. Dense v [B, H, N, D]: the
    [B, H, N padded to 16, D] view of the copy. Packed v [total, H, D] with cu_seqlens_k: sequence b's keys
    from row ceil(cu_seqlens_k[b] / block_n) * block_n + b * block_n (the kernel's tile_aligned_start), as
    TMA takes the innermost coordinate (here a key) only at 16-byte multiples, which packed sequences' starts
    are not; a tile reaching past its sequence's end reads zeros. The [rows, H, D] view of the copy, rows =
    ceil(total / block_n) * block_n + B * block_n. One launch (kernels/layout.py), no host sync; run False: the
    copy's layout alone, uninitialized, nothing launched (an ahead-of-time compile's V)."""
    return _keys_last(v, permuted=True, cu_seqlens_k=cu_seqlens_k, block_n=block_n, run=run)


def fp8_values(v: torch.Tensor, sm90: bool, cu_seqlens_k: Optional[torch.Tensor] = None,
               block_n: int = 16) -> Optional[torch.Tensor]:
    """FP8 v ([B, H, N, D], or packed [total, H, D] with cu_seqlens_k) as the forward kernel takes it: the sm90
    build's copy every call (sm90_e4m3_values: its key order is the kernel's own), the portable kernel's
    keys-contiguous copy where v is not stored so (keys_contiguous); None where v serves as it is."""
    if sm90:
        return sm90_e4m3_values(v, cu_seqlens_k, block_n)
    keys = 2 if v.dim() == 4 else 0
    return None if keys_ready(v, keys) else keys_contiguous(v, keys)


def _keys_last(v: torch.Tensor, permuted: bool, cu_seqlens_k: Optional[torch.Tensor] = None, block_n: int = 16,
               run: bool = True) -> torch.Tensor:
    # kernels/layout.py's copy of v [B, H, N, D] (or packed [total, H, D], as B 1) into [B, H, D, keys padded to
    # 16] (packed with cu_seqlens_k: each sequence from a block_n multiple), returned as a view in v's dims; the
    # launch goes through ops.launch.run like every other (a capture records it). run False: the view alone,
    # uninitialized (what an ahead-of-time compile takes)
    if block_n % 16:
        raise ValueError(f"a key tile of {block_n} keys: the copy places sequences at multiples of 16 keys")
    if v.dim() == 4:
        batch, heads, n, dim = v.shape
        v_strides = tuple(v.stride())
    else:
        n, heads, dim = v.shape
        batch, v_strides = 1, (0, v.stride(1), v.stride(0), v.stride(2))  # (batch, head, key, dim)
    if cu_seqlens_k is None:
        n_cols, seqs = -(-n // 16) * 16, batch
    else:
        seqs = cu_seqlens_k.numel() - 1
        n_cols = -(-n // block_n) * block_n + seqs * block_n
    copy = torch.empty(batch, heads, dim, n_cols, dtype=v.dtype, device=v.device)
    view = copy.transpose(-1, -2) if v.dim() == 4 else copy[0].permute(2, 0, 1)
    if not run:
        return view
    # a copy tile's keys (16-byte accesses at 64; packed, a divisor of block_n, so a tile holds one sequence)
    cols = 64 if cu_seqlens_k is None or block_n % 64 == 0 else 16
    launches.run(launches.KernelLaunch(
        e4m3_values_kernel, (-(-n_cols // cols), heads, batch),
        (v.view(torch.uint8), copy.view(torch.uint8), cu_seqlens_k, v_strides, tuple(copy.stride()[:3]), n, n_cols,
         seqs, dim),
        dict(COLS=cols, BLOCK_D=min(64, max(16, triton.next_power_of_2(dim))), BLOCK_N=block_n,
             PERMUTED=permuted, IS_VARLEN=cu_seqlens_k is not None),
        dict(num_warps=4), ()), v.device)
    return view


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
