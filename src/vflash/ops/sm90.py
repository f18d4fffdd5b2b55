"""Launcher of the Gluon sm90 kernel (kernels/attention_fwd_sm90.py): grid,
the kernel's arguments, TMA descriptors (ops/tma.py) and slots, and an ahead-of-time compile
for sm_90 that needs no GPU (the CPU test suite uses it to prove the kernel builds)."""

import math
from typing import Optional, Tuple

import torch

from vflash.kernels import attention_fwd_sm90 as sm90
from vflash.call import Band, Score
from vflash.ops.launch import KernelLaunch, Slot, compile_sm90_launch, given_slots
from vflash.ops.scales import descale_strides, score_scales
from vflash.ops.tiles import CONSUMER_REGS, CONSUMER_ROWS, Sm90Tiles
from vflash.ops.tma import (cache_ready, cache_rows, describers, heads_first, keys_last_describer,
                            page_rows, page_runs, pages_fit, sm90_e4m3_values)


def qk_columns(head_dim: int) -> int:
    """The columns of Q and K the kernel's buffers and descriptors hold (its QK_BLOCK): the head dim, or 64 where
    it is no power of two (Gluon's tensors are powers of two)."""
    return head_dim if head_dim & (head_dim - 1) == 0 else 64


def grid(B: int, Hq: int, Nq: int, block_m: int, sms: int, right_edge: bool,
         ctas_per_sm: int = 1, dynamic: bool = False) -> Tuple[int, int, int]:
    """CTAs walk work tiles t = pid, pid + grid, ... (row block t % n_m of head
    t // n_m, n_m row blocks per head).

    Without a right edge every tile costs the same: one CTA per SM (persistent),
    so each CTA's K/V ring runs on from one tile into the next.

    With one (right_edge: causal, or a window's near edge), a head's row blocks
    differ in cost. A stride that shares a factor with n_m pins each CTA to some
    row blocks (132 CTAs, n_m = 4: one row block each, work 1:2:3:4; measured at
    D = 128 N = 512, 204 TFLOP/s against 239 for one CTA per tile). The largest stride <= SMs that shares none cycles
    each CTA through every row block, balanced once each CTA walks n_m tiles or
    more (B * Hq >= stride; measured 246). Fewer heads than that: one CTA per
    work tile, handed out by the hardware as SMs free up (the static stride at
    D = 128 causal N = 16384 measured 419 against 551).

    One consumer warpgroup a CTA (block_m 64) puts two or three CTAs on an SM:
    "one per SM" above then reads ctas_per_sm.

    dynamic (the kernel's DYNAMIC: CTAs draw work tiles from a global counter):
    one CTA per SM slot whatever the mask, as without a right edge.

    Always three entries: a launch plan calls Triton's compiled launcher, which,
    unlike the JIT launch, does not pad a shorter grid."""
    n_m = (Nq + block_m - 1) // block_m
    work = B * Hq * n_m
    sms *= ctas_per_sm
    if not right_edge or dynamic:
        return (min(work, sms), 1, 1)
    stride = sms
    while math.gcd(stride, n_m) != 1:
        stride -= 1
    return (stride if B * Hq >= stride else work, 1, 1)


def launch_options(block_m: int, ctas_per_sm: int = 1) -> dict:
    """The kernel's launch (and compile) options: four producer warps, and with
    more than one CTA an SM a register cap of the CTA's share of the file, in
    multiples of 8 (two CTAs of one consumer: 128 a thread; setmaxnreg then gives
    the consumer CONSUMER_REGS[(1, 2)], the producer the rest)."""
    threads = (block_m // CONSUMER_ROWS + 1) * 128
    if ctas_per_sm == 1:
        return dict(num_warps=4)
    return dict(num_warps=4, maxnreg=65536 // (ctas_per_sm * threads) // 8 * 8)


def build(q, k, v, out, lse: Optional[torch.Tensor], counter: Optional[torch.Tensor], band: Band, score: Score,
          tiles: Sm90Tiles, sms: int, varlen: Optional[tuple] = None,
          cache: Optional[tuple] = None) -> KernelLaunch:
    """The launch of attention_fwd_sm90_kernel. `counter` (tiles.dynamic): the
    work-tile counter, one int32 zero, fresh each launch (a shared one would race
    between streams and across CUDA graph replays). `varlen` (cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, top_left) for packed [total, H, D] tensors, out
    [total_q, Hq, D] and lse [Hq, total_q]; None for dense [B, H, N, D] ones.
    `cache` (cache_seqlens, block_table or None) with varlen (cu_seqlens_k None):
    k and v are KV caches [pages, page_size, Hkv, D] (paged) or [B, max_len, Hkv, D]; pages shorter than
    a tile also get descriptors in blocks of the tile's rows (a run of consecutive pages' one copy).
    e4m3 q, k, v (FP8, not with a cache): v as ops.tma.sm90_e4m3_values lays it out (keys contiguous, each
    16-key group in the order the kernel's P takes; varlen: each sequence's keys from a block_n multiple), its
    descriptor over the [B, Hkv, D, N] view; out (16-bit) through the kernel's pointer store; score's descales. A v head dim of its
    own (not with a cache): v's and out's descriptors in its width, out through the pointer store. A q / k head
    dim that is no power of two (192): their descriptors in blocks of 64 columns (the kernel's QK_BLOCK), out
    through the pointer store."""
    D, Dv = q.shape[-1], v.shape[-1]
    fp8 = q.dtype == torch.float8_e4m3fn
    qk_block = qk_columns(D)
    # the kernel's POINTER_STORE: out [.., Dv] does not fit the Q buffer (FP8's, a v of its own, Q in parts)
    pointer_store = fp8 or Dv != D or qk_block != D
    rows, keys = describers(tiles.block_n, qk_block, q.dtype)
    out_rows = describers(tiles.block_n, Dv, out.dtype)[0] if pointer_store else rows
    values = describers(tiles.block_n, Dv, q.dtype)[1]
    if fp8:  # the [.., Dv, N] view of v, keys contiguous
        values = (lambda t, d=keys_last_describer(tiles.block_n, Dv, q.dtype): d(t.transpose(-1, -2)))
    seqlens = table = None
    cache_strides, page_size, runs = (0, 0), 0, False
    if cache is not None:
        seqlens, table = cache
        paged = table is not None
        page_size = k.shape[1] if paged else 0
        # what dispatch checked (select_kvcache): a copy never straddles a page, the rows merge in place
        if paged and not pages_fit(page_size, tiles.block_n):
            raise ValueError(f"the sm90 kernel takes power-of-two pages of 16 rows or more, not {page_size}")
        if not (cache_ready(k) and cache_ready(v)):
            raise ValueError("the sm90 kernel needs caches whose pages merge into rows TMA can address")
        _, cache_keys = describers(page_rows(page_size, tiles.block_n) if paged else tiles.block_n, D, q.dtype)
        cache_strides = (0 if paged else k.shape[1], table.stride(0) if paged else 0)
        runs = page_runs(page_size, tiles.block_n)
    if varlen is None:
        B, Hq, Nq, _ = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        cu_q = cu_k = None
        total_q, top_left = Nq, False
        packed_out, o_strides = ((out, (out.stride(2), out.stride(1), out.stride(0))) if pointer_store
                                 else (None, (0, 0)))
        descs = (rows(q), keys(k), values(v), out_rows(out))
    else:
        cu_q, cu_k, Nq, top_left = varlen
        total_q, Hq, _ = q.shape
        B = cu_q.numel() - 1
        packed_out, o_strides = out, (out.stride(0), out.stride(1)) + ((0,) if pointer_store else ())
        if cache is None:
            Nk, Hkv = k.shape[:2]
            descs = (rows(heads_first(q)), keys(heads_first(k)), values(heads_first(v)),
                     out_rows(heads_first(out)))
        else:
            Nk, Hkv = 0, k.shape[2]
            descs = (rows(heads_first(q)), cache_keys(cache_rows(k)), cache_keys(cache_rows(v)),
                     rows(heads_first(out)))
    run_descs = (keys(cache_rows(k)), keys(cache_rows(v))) if runs else (None, None)
    descales = (score.q_descale, score.k_descale, score.v_descale) if fp8 else (None, None, None)
    args = (
        *descs, lse if lse is not None else out, counter, cu_q, cu_k, packed_out, seqlens, table, *run_descs,
        score.sinks, *descales, B, Hq, Hq // Hkv, Nq, Nk, total_q, o_strides, *cache_strides,
        (band.off, band.left, band.right), score_scales(score), descale_strides(descales) if fp8 else None,
    )
    if varlen is None:
        slots = (Slot("q_desc", "q", rows), Slot("k_desc", "k", keys), Slot("v_desc", "v", values),
                 Slot("o_desc", "out", out_rows))
        slots += (Slot("Out", "out"),) if pointer_store else ()
    elif cache is None:
        slots = tuple(Slot(param, name, lambda t, d=d: d(heads_first(t)))
                      for param, name, d in (("q_desc", "q", rows), ("k_desc", "k", keys), ("v_desc", "v", values),
                                             ("o_desc", "out", out_rows)))
        slots += (Slot("cu_seqlens_q", "cu_seqlens_q"), Slot("cu_seqlens_k", "cu_seqlens_k"), Slot("Out", "out"))
    else:
        packed, cached = (lambda t: rows(heads_first(t))), (lambda t: cache_keys(cache_rows(t)))
        slots = (Slot("q_desc", "q", packed), Slot("k_desc", "k_cache", cached), Slot("v_desc", "v_cache", cached),
                 Slot("o_desc", "out", packed), Slot("cu_seqlens_q", "cu_seqlens_q"), Slot("Out", "out"),
                 Slot("cache_seqlens", "cache_seqlens"))
        slots += (Slot("block_table", "block_table"),) if table is not None else ()
        if runs:
            tile_rows = (lambda t: keys(cache_rows(t)))
            slots += (Slot("kt_desc", "k_cache", tile_rows), Slot("vt_desc", "v_cache", tile_rows))
    slots += (Slot("LSE", "out" if lse is None else "lse"),)
    if tiles.dynamic:
        slots += (Slot("tile_counter", "tile_counter"),)
    if score.sinks is not None:
        slots += (Slot("SINKS", "sinks"),)
    if fp8:
        slots += given_slots(q_descale=score.q_descale, k_descale=score.k_descale, v_descale=score.v_descale)
    constexprs = _constexprs(D, tiles, band.has_left, band.has_right, score.softcap is not None, lse is not None,
                             varlen is not None, top_left, cache is not None, page_size, score.sinks is not None, Dv,
                             pointer_store)
    return KernelLaunch(sm90.attention_fwd_sm90_kernel,
                        grid(B, Hq, Nq, tiles.block_m, sms, band.has_right, tiles.ctas_per_sm, tiles.dynamic),
                        args, constexprs, launch_options(tiles.block_m, tiles.ctas_per_sm), slots)


def _constexprs(head_dim: int, t: Sm90Tiles, has_left: bool, has_right: bool, softcap: bool,
                store_lse: bool, varlen: bool = False, top_left: bool = False, kv_cache: bool = False,
                page_size: int = 0, sinks: bool = False, head_dim_v: Optional[int] = None,
                pointer_store: bool = False) -> dict:
    """attention_fwd_sm90_kernel's constexpr arguments, for the launch and for
    compile_sm90 alike: tiles with a right edge run longest first (REVERSE_M),
    and the consumer count and CTAs an SM set the consumers' register budget."""
    return dict(HEAD_DIM=head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n, STAGES=t.stages, HAS_LEFT=has_left,
                HAS_RIGHT=has_right, SOFTCAP=softcap, STORE_LSE=store_lse, REVERSE_M=has_right,
                CONSUMER_REGS=CONSUMER_REGS[(t.block_m // CONSUMER_ROWS, t.ctas_per_sm)], Q_BUFFERS=t.q_buffers,
                PINGPONG=t.pingpong, P_FP32=t.p_fp32, LATE_PV_WAIT=t.late_pv_wait,
                LAZY_RESCALE=t.lazy_rescale, DYNAMIC=t.dynamic, IS_VARLEN=varlen, TOP_LEFT=top_left,
                KV_CACHE=kv_cache, PAGE_SIZE=page_size, HAS_SINK=sinks, P_SHARED=t.p_shared,
                HEAD_DIM_V=head_dim_v or head_dim, QK_BLOCK=qk_columns(head_dim), POINTER_STORE=pointer_store)


def compile_sm90(head_dim: int, dtype: torch.dtype = torch.float16, tiles: Sm90Tiles = Sm90Tiles(128, 128, 2), *,
                 right_edge: bool = False, left_edge: bool = False, softcap: bool = False, lse: bool = True,
                 varlen: bool = False, top_left: bool = False, kv_cache: bool = False, page_size: int = 0,
                 sinks: bool = False, head_dim_v: Optional[int] = None):
    """Compile the kernel for sm_90 without a GPU; returns Triton's CompiledKernel
    (its .asm holds the TTGIR, PTX and cubin). head_dim_v: v's own head dim (None: q's); varlen: the
    packed-sequence build;
    kv_cache (with varlen): keys from a cache, paged when page_size > 0. The launch is
    `build`'s for CPU tensors of such a call (2 sequences, 4 / 2 heads, lengths that are
    no multiple of 16), compiled from its own arguments as Triton's JIT would take them
    (ops.launch.compile_sm90_launch): no signature written by hand."""
    heads, kv_heads = 4, 2
    fp8 = dtype == torch.float8_e4m3fn

    def empty(*shape, dt=dtype):
        return torch.empty(shape, dtype=dt)

    dv = head_dim_v or head_dim

    def values(k):  # v of dv columns; FP8: laid out as the launcher's copy lays it out (nothing copied)
        v = empty(*k.shape[:-1], dv)
        if not fp8:
            return v
        return sm90_e4m3_values(v, cu, tiles.block_n, run=False) if varlen else sm90_e4m3_values(v, run=False)
    band = Band(0, 40 if left_edge else -1, 0 if right_edge else -1)
    descales = (torch.ones(2, kv_heads), torch.ones(()), None) if fp8 else (None, None, None)
    score = Score(head_dim ** -0.5, 30.0 if softcap else None, torch.zeros(heads) if sinks else None, *descales)
    counter = torch.zeros(1, dtype=torch.int32) if tiles.dynamic else None
    kv: dict = {}
    if not varlen:
        q, k = empty(2, heads, 300, head_dim), empty(2, kv_heads, 300, head_dim)
        stats = (2, heads, 300)
    else:
        q, cu = empty(600, heads, head_dim), torch.tensor([0, 250, 600], dtype=torch.int32)
        stats = (heads, 600)
        if kv_cache:
            rows = page_size or 1000
            k = empty(2 * (1024 // page_size) if page_size else 2, rows, kv_heads, head_dim)
            table = torch.arange(k.shape[0], dtype=torch.int32).view(2, -1) if page_size else None
            kv = dict(varlen=(cu, None, 350, False), cache=(torch.tensor([700, 900], dtype=torch.int32), table))
        else:
            k = empty(600, kv_heads, head_dim)
            kv = dict(varlen=(cu, cu, 350, top_left))
    lse_t = empty(*stats, dt=torch.float32) if lse else None
    out = empty(*q.shape[:-1], dv, dt=torch.bfloat16 if fp8 else dtype)
    launch = build(q, k, values(k), out, lse_t, counter, band, score, tiles, 132, **kv)
    return compile_sm90_launch(launch)
