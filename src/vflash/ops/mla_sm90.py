"""Launcher of the sm_90 MLA decode kernel (kernels/mla_decode_sm90.py) and its split merge
(kernels/combine.py:merge_splits_kernel): a latent cache (v_cache a view of k_cache's first 512 of 576
columns, one KV head) read by two consumer warpgroups a CTA, each holding half of the output's columns.
ops/attention.py launches it where vflash.dispatch picks the sm90 kernel for a latent cache; the compile
helper builds it for sm_90 without a GPU."""

from typing import List, Optional

import torch

from vflash import _backend
from vflash.call import Band, Score
from vflash.kernels import mla_decode_sm90 as kernels
from vflash.kernels.combine import merge_splits_kernel
from vflash.ops.launch import KernelLaunch, Slot, compile_sm90_launch, given_slots
from vflash.ops.scales import score_scales
from vflash.ops.scratch import split_scratch
from vflash.ops.tiles import CONSUMER_REGS, CONSUMER_ROWS, MlaTiles
from vflash.ops.tma import cache_rows, describer

HAVE_GLUON = kernels.HAVE_GLUON
HALF, ROPE = 256, 64  # the latent's half (a consumer's V and output columns) and the rope columns past it
LATENT = 2 * HALF
SMEM_BYTES = 227 * 1024  # an sm_90 CTA's shared memory


def smem_bytes(tiles: MlaTiles, itemsize: int = 2) -> int:
    """The kernel's shared memory: Q's 576 columns of 64 rows, `stages` key tiles of 576 columns, P [64, block_n]
    (and a few hundred bytes of rows and barriers)."""
    return ((CONSUMER_ROWS + tiles.stages * tiles.block_n) * (LATENT + ROPE) + CONSUMER_ROWS * tiles.block_n) * itemsize


def _rows(t: torch.Tensor) -> torch.Tensor:
    # q [total_q, Hq, D] (or out) as the [1, 1, total_q * Hq, D] view of its (query, head) rows
    return t.reshape(1, 1, -1, t.shape[-1])


def mla_launches(q: torch.Tensor, k_cache: torch.Tensor, out: torch.Tensor, lse: Optional[torch.Tensor],
                 cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor], n_q: int, band: Band,
                 score: Score, tiles: MlaTiles) -> List[KernelLaunch]:
    """The launches of one MLA decode call: q [total_q, Hq, 576] (B sequences of n_q new queries, rows
    (query, head) contiguous: q.reshape(-1, 576) a view), k_cache paged [pages, page_size, 1, 576] with
    block_table [B, max_pages], or contiguous [B, max_len, 1, 576] (block_table None), whose pages merge
    into rows (ops.tma.cache_ready); out [total_q, Hq, 512] contiguous, lse [Hq, total_q] fp32 or None.
    band: none, or causal bottom-right (right edge 0, no left one). The kernel, then with tiles.num_splits
    > 1 the merge of its fp32 partials (this stream's split scratch)."""
    total_q, heads_q, d_qk = q.shape
    batch = cache_seqlens.numel()
    if d_qk != LATENT + ROPE or k_cache.shape[-2:] != (1, d_qk) or out.shape[-1] != LATENT:
        raise ValueError(f"the sm90 MLA kernel takes q / k of {LATENT + ROPE} columns, one KV head and v of {LATENT}, "
                         f"not q {list(q.shape)}, k_cache {list(k_cache.shape)}, out {list(out.shape)}")
    if band.has_left or (band.has_right and band.right != 0):
        raise ValueError("the sm90 MLA kernel takes no mask or a causal one, no window")
    if not out.is_contiguous() or (lse is not None and not lse.is_contiguous()):
        raise ValueError("the sm90 MLA kernel writes a contiguous out and lse")
    splits = tiles.num_splits
    dtype = q.dtype
    row_q = describer((1, 1, CONSUMER_ROWS, HALF), dtype)
    rope_q = describer((1, 1, CONSUMER_ROWS, ROPE), dtype)
    page_size = k_cache.shape[1] if block_table is not None else 0
    page_rows = tiles.block_n if page_size == 0 else min(page_size, tiles.block_n)
    row_k = describer((1, 1, page_rows, HALF), dtype)
    rope_k = describer((1, 1, page_rows, ROPE), dtype)
    o_part, lse_part = (split_scratch(splits, total_q, heads_q, LATENT, batch, 1, 1, q.device)[:2] if splits > 1
                        else (None, None))
    sinks = score.sinks if splits == 1 else None  # split: the merge adds the sink
    args = (row_q(_rows(q)), rope_q(_rows(q)), row_k(cache_rows(k_cache)), rope_k(cache_rows(k_cache)), out, lse,
            o_part, lse_part, sinks, cache_seqlens, block_table, heads_q, n_q, total_q, splits,
            k_cache.shape[1] if block_table is None else 0, 0 if block_table is None else block_table.stride(0),
            score_scales(score)[0])
    constexprs = dict(BLOCK_N=tiles.block_n, STAGES=tiles.stages, HALF=HALF, ROPE=ROPE, PAGE_SIZE=page_size,
                      HAS_RIGHT=band.has_right, STORE_LSE=lse is not None, IS_SPLIT=splits > 1,
                      HAS_SINK=sinks is not None, CONSUMER_REGS=CONSUMER_REGS[(2, 1)])
    slots = (Slot("q_half_desc", "q", lambda t: row_q(_rows(t))), Slot("q_rope_desc", "q", lambda t: rope_q(_rows(t))),
             Slot("k_half_desc", "k_cache", lambda t: row_k(cache_rows(t))),
             Slot("k_rope_desc", "k_cache", lambda t: rope_k(cache_rows(t))), Slot("Out", "out"),
             Slot("CACHE_SEQLENS", "cache_seqlens"))
    slots += given_slots(lse=lse, o_part=o_part, lse_part=lse_part, sinks=sinks, block_table=block_table)
    row_tiles = -(-n_q * heads_q // CONSUMER_ROWS)
    launches = [KernelLaunch(kernels.mla_decode_sm90_kernel, (splits, row_tiles, batch), args, constexprs,
                             dict(num_warps=4), slots)]
    if splits > 1:
        rows = total_q * heads_q
        launches.append(KernelLaunch(
            merge_splits_kernel, (-(-rows // tiles.merge_rows), 1, 1),
            (o_part, lse_part, out, lse, score.sinks, rows, heads_q, total_q, o_part.stride(0), splits),
            dict(HEAD_DIM=LATENT, HEAD_DIM_PAD=LATENT, ROWS=tiles.merge_rows, SPLIT_CHUNK=tiles.split_chunk,
                 STORE_LSE=lse is not None, HAS_SINK=score.sinks is not None,
                 EMULATE_BF16=_backend.emulates_bf16(q)),
            dict(num_warps=4), (Slot("O_PART", "o_part"), Slot("LSE_PART", "lse_part"), Slot("O", "out"))
            + given_slots(lse=lse, sinks=score.sinks)))
    return launches


def compile_mla_sm90(page_size: int = 64, tiles: MlaTiles = MlaTiles(64, 2), *, causal: bool = True,
                     lse: bool = True, sinks: bool = False, n_q: int = 1, heads_q: int = 16,
                     dtype: torch.dtype = torch.bfloat16):
    """Compile the MLA decode kernel for sm_90 without a GPU (page_size 0: a contiguous cache; tiles.num_splits
    > 1: the split build, which writes partials); returns Triton's CompiledKernel."""
    batch, max_len = 2, 300
    q = torch.empty(batch * n_q, heads_q, LATENT + ROPE, dtype=dtype)
    if page_size:
        pages = -(-max_len // page_size)
        cache = torch.empty(batch * pages, page_size, 1, LATENT + ROPE, dtype=dtype)
        table = torch.zeros(batch, pages, dtype=torch.int32)
    else:
        cache, table = torch.empty(batch, max_len, 1, LATENT + ROPE, dtype=dtype), None
    out = torch.empty(batch * n_q, heads_q, LATENT, dtype=dtype)
    stats = torch.empty(heads_q, batch * n_q) if lse else None
    score = Score((LATENT + ROPE) ** -0.5, None, torch.zeros(heads_q) if sinks else None)
    launch = mla_launches(q, cache, out, stats, torch.full((batch,), max_len, dtype=torch.int32), table, n_q,
                          Band(0, -1, 0 if causal else -1), score, tiles)[0]
    return compile_sm90_launch(launch)
