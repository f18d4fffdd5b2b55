"""Launcher of the attention forward: outputs, the chosen kernel's arguments,
the launch, and its plan.

`forward(call, choice)` runs one validated call (vflash.call.Call: vflash._validate
made it, vflash.dispatch chose its kernel and tiles) through the launcher of its
layout: dense, packed (varlen) or against a KV cache. A layout's metadata values
(cu_seqlens, cache_seqlens, block_table) are checked here, before the launch, and by
the recorded plan before each repeat (vflash.ops.metadata).
"""

from typing import Callable, Hashable, Optional, Sequence, Tuple, Union

import torch

from vflash import _backend
from vflash.kernels.attention_fwd import attention_fwd_kernel, attention_kvcache_kernel
from vflash.call import Band, Call, Packed, Score, v_in_k_cache
from vflash.ops import sm90 as sm90_launch
from vflash.ops import metadata, mla_sm90
from vflash.ops import launch as launches
from vflash.ops.launch import Alloc, KernelLaunch, Slot, given_slots
from vflash.ops.scales import descale_strides, score_scales
from vflash.ops.scratch import scratch_fetcher, split_scratch
from vflash.ops.tiles import Sm90Tiles, KVCacheTiles, MetadataTiles, MlaTiles, PortableTiles, head_dim_pad
from vflash.ops.tma import fp8_values, tma_ready

INPUTS = ("q", "k", "v")
VARLEN_INPUTS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")
KVCACHE_INPUTS = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "cu_seqlens_q")
RETURNS = ("out", "lse")
SCRATCH_NAMES = ("o_part", "lse_part", "arrivals")


def forward(call: Call, choice, check_tiles: Optional[MetadataTiles] = None, plan_key: Optional[Hashable] = None,
            plan_inputs: Optional[Sequence[str]] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Run `call` on dispatch's `choice` (its kernel and tiles): (out, lse or None) in the
    layout's shapes (see each launcher). A packed or cached call whose layout asks for it has
    its metadata's values checked first, with `check_tiles`, and so does each repeat of the
    plan recorded under `plan_key`, a plan called with the tensors and options named
    `plan_inputs` (an entry point's vflash.call.Spec names; default: the launcher's tensors)."""
    layout = call.layout
    common = dict(band=call.band, score=call.score, return_lse=call.return_lse, tiles=choice.tiles,
                  kernel=choice.kernel, plan_key=plan_key, plan_inputs=plan_inputs)
    if layout is None:
        return attention_forward(call.q, call.k, call.v, out_dtype=call.out_dtype, **common)
    admit = None
    if layout.check_metadata:
        check, names = metadata.checker(call, check_tiles)
        check(*(getattr(layout, name) for name in names))
        admit = _admit(check, plan_inputs, names)
    if isinstance(layout, Packed):
        return attention_varlen_forward(call.q, call.k, call.v, layout.cu_seqlens_q, layout.cu_seqlens_k,
                                        layout.max_seqlen_q, top_left=layout.top_left, plan_admit=admit,
                                        out_dtype=call.out_dtype, **common)
    if layout.out_guard is not None:
        admit = _guarded(admit, layout.out_guard, plan_inputs, KVCACHE_INPUTS)
    if call.v_in_k:
        admit = _latent_only(admit, plan_inputs)
    return attention_kvcache_forward(call.q, call.k, call.v, layout.cache_seqlens, layout.block_table,
                                     layout.cu_seqlens_q, layout.max_seqlen_q, out=call.out,
                                     plan_out_shape=(*layout.q_shape[:-1], call.head_dim_v), plan_admit=admit,
                                     **common)


def _admit(check: Callable, names: Optional[Sequence[str]], wanted: Sequence[str]) -> Optional[Callable]:
    # a plan's admit: the metadata check of the arguments `wanted` (the layout's field names, the entry
    # point's argument names too), found by name among a repeat's
    if names is None:
        return None  # a plan of the launcher's own tensors only (the custom ops'): unchecked, as they ask
    at = tuple(names.index(n) for n in wanted)

    def admit(*args) -> bool:
        check(*(args[i] for i in at))
        return True
    return admit


def _guarded(admit: Optional[Callable], guard: Callable, names: Optional[Sequence[str]],
             inputs: Sequence[str]) -> Optional[Callable]:
    # a plan's admit that also runs only where the caller's out (the last argument) overlaps no input
    if names is None:
        return admit
    at = tuple(names.index(n) for n in inputs)
    out_at = names.index("out")

    def admit_out(*args) -> bool:
        if not guard(args[out_at], tuple(args[i] for i in at)):
            return False
        return admit is None or admit(*args)
    return admit_out


def _latent_only(admit: Optional[Callable], names: Optional[Sequence[str]]) -> Optional[Callable]:
    # a latent-cache plan's admit (its kernel reads V from K's rows): only for caches where v is k's view
    if names is None:
        return admit
    k_at, v_at = names.index("k_cache"), names.index("v_cache")

    def admit_latent(*args) -> bool:
        return v_in_k_cache(args[k_at], args[v_at]) and (admit is None or admit(*args))
    return admit_latent


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    band: Band, score: Score, return_lse: bool,
    tiles: Union[PortableTiles, Sm90Tiles], kernel: str,
    out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
    plan_key: Optional[Hashable] = None, plan_inputs: Optional[Sequence[str]] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """out [B, Hq, Nq, D] in out_dtype (None: q's), lse [B, Hq, Nq] fp32 (or None).

    `kernel` (vflash.dispatch's Choice.kernel: "portable", the Triton kernel, or "sm90",
    the Gluon one) and its `tiles` are dispatch's choice. `out` (any strides) and `lse` (contiguous) may be passed
    preallocated, e.g. poisoned with NaN by tests that check every element is
    written. With a `plan_key` (vflash.ops.plans) the launch is recorded for
    later calls, called with the arguments `plan_inputs` names (q, k and v first).
    """
    fresh_out = out is None
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    out_dtype = out_dtype or q.dtype
    if out is None:
        out = torch.empty((B, Hq, Nq, v.shape[-1]), dtype=out_dtype, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if Nk == 0:
        out.zero_()
        if lse is not None:
            _no_key_lse(lse, score, 1)
        return out, lse

    allocs = [Alloc("out", tuple(out.shape), out_dtype)]
    if lse is not None:
        allocs.append(Alloc("lse", tuple(lse.shape), torch.float32))
    if kernel == "sm90" and tiles.dynamic:
        allocs.append(Alloc("tile_counter", (1,), torch.int32, zero=True))
    laid_out = fp8_values(v, kernel == "sm90") if q.dtype == torch.float8_e4m3fn else None
    if laid_out is not None:
        v, plan_key = laid_out, None  # a plan would launch on the caller's v
    launch = _FORWARD[kernel](q, k, v, out, lse, band, score, tiles)
    compiled = launches.run(launch, q.device)
    if plan_key is not None and fresh_out and q.device.index == torch.cuda.current_device():
        launches.record(plan_key, launch, compiled, plan_inputs or INPUTS, allocs, RETURNS, q.device.index)
    return out, lse


def _no_key_lse(lse: torch.Tensor, score: Score, heads: int) -> None:
    # The LSE of rows that see no key: -inf, or each head's sink (lse's head dimension `heads`)
    if score.sinks is None:
        lse.fill_(float("-inf"))
    else:
        shape = [1] * lse.dim()
        shape[heads] = -1
        lse.copy_(score.sinks.view(shape).expand_as(lse))


def attention_varlen_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, *, band: Band, top_left: bool, score: Score, return_lse: bool,
    tiles: Union[PortableTiles, Sm90Tiles], kernel: str, out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None, plan_key: Optional[Hashable] = None,
    plan_inputs: Optional[Sequence[str]] = None, plan_admit: Optional[Callable[..., bool]] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Packed sequences: out [total_q, Hq, D] in out_dtype (None: q's), lse [Hq, total_q] fp32
    (or None). `band` is `_validate.sequence_band`'s; each sequence's offset comes
    from its own lengths (Nk - Nq, or 0 with `top_left`). `kernel` and `tiles` as in
    attention_forward. `out` (any strides; unit last stride for sm90)
    and `lse` (contiguous) may be passed preallocated. With a `plan_key` the launch
    is recorded as attention_forward's is (plan_inputs default VARLEN_INPUTS), `plan_admit`
    run before each repeat (plans.LaunchPlan.admit)."""
    fresh_out = out is None
    total_q, Hq, D = q.shape
    out_dtype = out_dtype or q.dtype
    if out is None:
        out = torch.empty((total_q, Hq, v.shape[-1]), dtype=out_dtype, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty((Hq, total_q), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if k.shape[0] == 0:
        out.zero_()
        if lse is not None:
            _no_key_lse(lse, score, 0)
        return out, lse
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, top_left)
    allocs = [Alloc("out", tuple(out.shape), out_dtype)]
    if lse is not None:
        allocs.append(Alloc("lse", tuple(lse.shape), torch.float32))
    if kernel == "sm90" and tiles.dynamic:
        allocs.append(Alloc("tile_counter", (1,), torch.int32, zero=True))
    laid_out = (fp8_values(v, kernel == "sm90", cu_seqlens_k, tiles.block_n) if q.dtype == torch.float8_e4m3fn
                else None)
    if laid_out is not None:
        v, plan_key = laid_out, None  # a plan would launch on the caller's v
    launch = _FORWARD[kernel](q, k, v, out, lse, band, score, tiles, varlen=varlen)
    compiled = launches.run(launch, q.device)
    if plan_key is not None and fresh_out and q.device.index == torch.cuda.current_device():
        launches.record(plan_key, launch, compiled, plan_inputs or VARLEN_INPUTS, allocs, RETURNS, q.device.index,
                        admit=plan_admit)
    return out, lse


def attention_kvcache_forward(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
    block_table: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor], max_seqlen_q: int, *, band: Band,
    score: Score, return_lse: bool, tiles: Union[KVCacheTiles, Sm90Tiles, MlaTiles], kernel: str,
    out: Optional[torch.Tensor] = None, plan_key: Optional[Hashable] = None,
    plan_inputs: Optional[Sequence[str]] = None, plan_out_shape: Optional[Tuple[int, ...]] = None,
    plan_admit: Optional[Callable[..., bool]] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Queries q [total_q, Hq, D] against KV caches: sequence b's keys are the first
    cache_seqlens[b] rows of its cache (paged [pages, page_size, Hkv, D] with
    block_table [B, max_pages], or contiguous [B, max_len, Hkv, D] with block_table
    None), its queries the last of them (bottom-right alignment): rows from
    cu_seqlens_q, or with cu_seqlens_q None max_seqlen_q rows a sequence, in order.
    out [total_q, Hq, D], lse [Hq, total_q]. With tiles.num_splits > 1 the kernel
    writes fp32 partials of each split and each row tile's last split merges them, in
    the same launch, in the stream's split scratch (ops.scratch). With a `plan_key` the
    launch is recorded (vflash.ops.plans), its out allocated as `plan_out_shape` (the
    caller's layout of the same rows: dense q's [B, Nq, Hq, D]) where given; a given `out`
    (rows [total_q, Hq, D], unit stride in D) is written instead, and its plan takes the
    caller's out (of the key's metadata) as the input named "out" in `plan_inputs` (default
    KVCACHE_INPUTS and "out"), run where `plan_admit` passes (plans.LaunchPlan.admit). kernel "sm90"
    (chunked prefill on sm_90, Sm90Tiles): the Gluon
    kernel's KV_CACHE build, unsplit and unplanned; against a latent cache (MlaTiles) the Gluon MLA kernel
    and, split, its merge (ops.mla_sm90); "portable": attention_kvcache_kernel (KVCacheTiles)."""
    total_q, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    batch = cache_seqlens.numel()
    fresh_out = out is None
    if fresh_out:
        out = torch.empty((total_q, Hq, v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((Hq, total_q), dtype=torch.float32, device=q.device) if return_lse else None
    if out.numel() == 0:
        return out, lse
    if kernel == "sm90" and v_in_k_cache(k_cache, v_cache):  # a latent cache: the MLA kernel, then its merge
        rows = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        run = [(launch, launches.run(launch, q.device)) for launch in mla_sm90.mla_launches(
            q, k_cache, rows, lse, cache_seqlens, block_table, max_seqlen_q, band, score, tiles)]
        if rows is not out:
            out.copy_(rows)
        elif plan_key is not None and q.device.index == torch.cuda.current_device():
            _record_kvcache(plan_key, run, out, lse, fresh_out, tiles.num_splits, (total_q, Hq, v_cache.shape[-1],
                            batch, 1, 1), q.device, plan_inputs, plan_out_shape, plan_admit)
        return out, lse
    if kernel == "sm90":
        if cu_seqlens_q is None:  # max_seqlen_q rows a sequence
            cu_seqlens_q = torch.arange(0, (batch + 1) * max_seqlen_q, max_seqlen_q, dtype=torch.int32,
                                        device=q.device)
        launch = _sm90_launch(q, k_cache, v_cache, out, lse, band, score, tiles,
                                varlen=(cu_seqlens_q, None, max_seqlen_q, False), cache=(cache_seqlens, block_table))
        launches.run(launch, q.device)
        return out, lse
    # a KV head's query heads in tiles.head_blocks blocks of `group`, each block a program's (program_id(1))
    group, splits, heads_k = Hq // Hkv // tiles.head_blocks, tiles.num_splits, Hkv * tiles.head_blocks
    queries = tiles.block_m // group
    row_tiles = max(1, -(-max_seqlen_q // queries))
    # the merge's rows must hold a tile's real rows (merge_rows 0: the whole tile)
    merge_rows = tiles.merge_rows or tiles.block_m
    if merge_rows < min(queries, max_seqlen_q) * group or merge_rows & (merge_rows - 1):
        raise ValueError(f"merge_rows {tiles.merge_rows} cannot hold a tile's {min(queries, max_seqlen_q) * group} "
                         "rows (a power of two at least that many, or 0)")
    if splits > 1:  # the partials contiguous [splits, total_q, Hq, D], their LSEs [splits, Hq, total_q]
        o_part, lse_part, arrivals = split_scratch(splits, total_q, Hq, v_cache.shape[-1], batch, heads_k,
                                                   row_tiles, q.device)
        part_strides, lse_part_stride = o_part.stride()[:3], lse_part.stride(0)
    else:
        o_part = lse_part = arrivals = None
        part_strides, lse_part_stride = (0, 0, 0), 0
    descales = (score.k_descale, score.v_descale)  # an FP8 cache's (q is 16-bit)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    v_in_k = v_in_k_cache(k_cache, v_cache)
    args = (
        q, k_cache, v_cache, out, lse, cu_seqlens_q, block_table, cache_seqlens, o_part, lse_part, arrivals,
        score.sinks, *descales, q.stride(), k_cache.stride(), v_cache.stride(), out.stride(), part_strides,
        (lse_part_stride, total_q),
        (band.left, band.right), score_scales(score), descale_strides(descales) if fp8 else None,
        0 if block_table is None else block_table.stride(0), 0 if block_table is None else block_table.shape[1],
        splits, tiles.split_keys,
        0 if cu_seqlens_q is not None else max_seqlen_q,
    )
    constexprs = dict(
        **_head_dims(D, v_cache.shape[-1], v_in_k=v_in_k), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        GROUP=group,
        HAS_LEFT=band.has_left, HAS_RIGHT=band.has_right, SOFTCAP=score.softcap is not None,
        STORE_LSE=lse is not None, **_dot_flags(q),
        PACKED_Q=cu_seqlens_q is not None, IS_PAGED=block_table is not None,
        # one compile a page size; a contiguous cache's length is not one (it needs no division)
        PAGE_SIZE=k_cache.shape[1] if block_table is not None else 1,
        IS_SPLIT=splits > 1, MERGE_ROWS=merge_rows, SPLIT_CHUNK=tiles.split_chunk, ONE_LOOP=tiles.one_loop,
        HAS_SINK=score.sinks is not None, IS_FP8=fp8, V_IN_K=v_in_k, HEAD_BLOCKS=tiles.head_blocks,
    )
    grid = (row_tiles * splits, heads_k, batch)
    slots = (Slot("Q", "q"), Slot("K", "k_cache"), Slot("V", "v_cache"), Slot("O", "out"),
             Slot("SEQLENS_K", "cache_seqlens"))
    slots += given_slots(lse=lse, cu_seqlens_q=cu_seqlens_q, block_table=block_table, sinks=score.sinks,
                         k_descale=score.k_descale, v_descale=score.v_descale)
    # split scratch: slots too, a plan fetching this stream's pool (ops.scratch) each call
    if splits > 1:
        slots += (Slot("O_PART", "o_part"), Slot("LSE_PART", "lse_part"), Slot("ARRIVALS", "arrivals"))
    launch = KernelLaunch(attention_kvcache_kernel, grid, args, constexprs,
                          dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages), slots)
    compiled = launches.run(launch, q.device)
    if plan_key is not None and q.device.index == torch.cuda.current_device():
        _record_kvcache(plan_key, [(launch, compiled)], out, lse, fresh_out, splits,
                        (total_q, Hq, v_cache.shape[-1], batch, heads_k, row_tiles), q.device, plan_inputs,
                        plan_out_shape, plan_admit)
    return out, lse


def _record_kvcache(plan_key: Hashable, run: list, out: torch.Tensor, lse: Optional[torch.Tensor], fresh_out: bool,
                    splits: int, scratch_sizes: tuple, device: torch.device, plan_inputs: Optional[Sequence[str]],
                    plan_out_shape: Optional[Tuple[int, ...]], plan_admit: Optional[Callable[..., bool]]) -> None:
    # A KV-cache call's launches (`run`: (launch, compiled) in order) as the plan of plan_key: it allocates out
    # (where the call did) and lse, fetches split-KV's scratch of scratch_sizes (ops.scratch) where split
    allocs = [Alloc("out", plan_out_shape or tuple(out.shape), out.dtype)] if fresh_out else []
    allocs += [Alloc("lse", tuple(lse.shape), torch.float32)] if lse is not None else []
    scratch = None if splits == 1 else (SCRATCH_NAMES, scratch_fetcher(splits, *scratch_sizes, device))
    inputs = tuple(plan_inputs or KVCACHE_INPUTS + ("out",))
    if fresh_out:  # the plan allocates out: a caller's out argument (None) is not its source
        inputs = tuple("" if name == "out" else name for name in inputs)
    launches.record_sequence(plan_key, run, inputs, allocs, RETURNS, device.index, scratch, admit=plan_admit)


def _sm90_launch(q, k, v, out, lse, band: Band, score: Score, tiles: Sm90Tiles, **kv) -> KernelLaunch:
    """ops.sm90.build for this device's SMs, with a fresh work-tile counter under DYNAMIC;
    kv: build's varlen / cache."""
    counter = q.new_zeros(1, dtype=torch.int32) if tiles.dynamic else None
    return sm90_launch.build(q, k, v, out, lse, counter, band, score, tiles,
                               _backend.device_properties(q.device.index).multi_processor_count, **kv)


def _dot_flags(q: torch.Tensor) -> dict:
    # bf16 done by hand under the interpreter only (kernels/tile.py); fp32 inputs keep fp32 products.
    return dict(EMULATE_BF16=_backend.emulates_bf16(q), DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")


def _head_dims(d_qk: int, d_v: int, fp8: bool = False, v_in_k: bool = False) -> dict:
    # the portable kernels' head dims: q's and k's, v's and the output's, each with its power-of-two tile width
    # (q.k is an e4m3 dot over HEAD_DIM_PAD for FP8 inputs; with v in k, HEAD_DIM_PAD pads k's columns past v's)
    return dict(HEAD_DIM=d_qk, HEAD_DIM_PAD=head_dim_pad(d_qk - d_v if v_in_k else d_qk, fp8), HEAD_DIM_V=d_v,
                HEAD_DIM_V_PAD=head_dim_pad(d_v))


def packed_strides(t: torch.Tensor) -> Tuple[int, int, int, int]:
    # A packed [total, H, D] tensor's strides as the kernel's (batch, head, row,
    # dim): batch 0, each sequence's first row comes from cu_seqlens.
    s_row, s_head, s_dim = t.stride()
    return 0, s_head, s_row, s_dim


def _portable_launch(q, k, v, out, lse, band: Band, score: Score, tiles: PortableTiles,
                     varlen: Optional[tuple] = None) -> KernelLaunch:
    """The launch of attention_fwd_kernel: grid (row tiles, Hq, B). `varlen`
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, top_left) for packed [total, H, D]
    tensors; None for dense [B, H, N, D] ones."""
    if varlen is None:
        B, Hq, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        strides = (q.stride(), k.stride(), v.stride(), out.stride())
        rows, cu_seqlens, top_left = Nq, (None, None), False
    else:
        cu_q, cu_k, rows, top_left = varlen
        Nq, Hq, D = q.shape  # the packed totals: n_q is LSE's head stride
        Nk, Hkv = k.shape[:2]
        B = cu_q.numel() - 1
        cu_seqlens = (cu_q, cu_k)
        strides = (packed_strides(q), packed_strides(k), packed_strides(v), packed_strides(out))
    descales = (score.q_descale, score.k_descale, score.v_descale)
    fp8 = q.dtype == torch.float8_e4m3fn
    args = (
        q, k, v, out, lse if lse is not None else out, *cu_seqlens, score.sinks, *descales, *strides,
        descale_strides(descales) if fp8 else None, Hq, Hq // Hkv, Nq, Nk, (band.off, band.left, band.right),
        score_scales(score),
    )
    constexprs = dict(
        **_head_dims(D, v.shape[-1], fp8),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, SPLIT=tiles.split,
        HAS_LEFT=band.has_left, HAS_RIGHT=band.has_right, SOFTCAP=score.softcap is not None,
        STORE_LSE=lse is not None, REVERSE_M=band.has_right,
        **_dot_flags(q), IS_VARLEN=varlen is not None, TOP_LEFT=top_left, HAS_SINK=score.sinks is not None,
        IS_FP8=fp8,
    )
    slots = (Slot("Q", "q"), Slot("K", "k"), Slot("V", "v"), Slot("O", "out"),
             Slot("LSE", "out" if lse is None else "lse"))
    if varlen is not None:
        slots += (Slot("CU_SEQLENS_Q", "cu_seqlens_q"), Slot("CU_SEQLENS_K", "cu_seqlens_k"))
    slots += given_slots(sinks=score.sinks, q_descale=score.q_descale, k_descale=score.k_descale,
                         v_descale=score.v_descale)
    grid = (max(1, (rows + tiles.block_m - 1) // tiles.block_m), Hq, B)
    return KernelLaunch(attention_fwd_kernel, grid, args, constexprs,
                        dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages), slots)


# The forward's launch builders by vflash.dispatch's Choice.kernel (the names of its REGISTRY).
_FORWARD = {"portable": _portable_launch, "sm90": _sm90_launch}
