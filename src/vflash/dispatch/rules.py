"""Which kernel and tiles one call gets, and why: `select(problem)`, once per call."""

import math
import os
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Tuple, Union

import torch

from vflash import _backend
from vflash.dispatch import tables
from vflash.kernels.gluon_sm90 import HAVE_GLUON
from vflash.ops.tma import cache_ready, pages_fit, tma_ready
from vflash.call import Band, Cache, Call, Score
from vflash.ops.tiles import (CONSUMER_ROWS, BackwardTiles, CacheWriteTiles, Sm90Tiles, KVCacheTiles, MergeTiles,
                              MetadataTiles, MlaTiles, PortableTiles, head_dim_pad)


# VFLASH_KERNEL=portable|sm90 forces a kernel for every call of the process (read at import).
FORCED: Optional[str] = os.environ.get("VFLASH_KERNEL") or None


@dataclass(frozen=True)
class Problem:
    """What the choice depends on: one attention call's metadata."""
    dtype: torch.dtype
    head_dim: int
    batch: int
    heads_q: int
    n_q: int
    n_k: int
    band: Band
    device: torch.device
    tma_ok: bool  # q, k, v and out suit TMA: 16-byte aligned base and strides, unit last stride
    # "dense", "packed" (cu_seqlens) or "cache" (a KV cache; packed too): batch, n_q, n_k are then the
    # sequence count and the longest lengths (a cache's capacity)
    layout: str = "dense"
    options: Tuple[str, ...] = ()  # the score options set beside the scale (vflash.call.Score's fields)
    kv_dtype: Optional[torch.dtype] = None  # k's and v's dtype where it is not q's (an FP8 KV cache)
    head_dim_v: int = 0  # v's head dim where it is not q's and k's (0: the same)
    v_in_k: bool = False  # a KV cache whose v_cache is a view of k_cache's first columns (MLA's latent cache)

    @property
    def varlen(self) -> bool:
        """Sequences of their own lengths (packed queries, or a KV cache)."""
        return self.layout != "dense"

    @property
    def head_dim_pad(self) -> int:
        """The portable kernel's head dim that sizes its tiles (ops.tiles.head_dim_pad): q's and k's, or v's
        where it is wider; v's against a latent cache (the K columns past v's are a narrow tile of their own)."""
        return head_dim_pad(self.head_dim_v if self.v_in_k else max(self.head_dim, self.head_dim_v))

    def row_tiles(self, block_m: int) -> int:
        """Programs (work tiles) of block_m query rows over every (batch, q head)."""
        return self.batch * self.heads_q * -(-self.n_q // block_m)


@dataclass(frozen=True)
class Choice:
    kernel: str  # "portable" or "sm90"
    tiles: Union[PortableTiles, Sm90Tiles, KVCacheTiles, BackwardTiles, MlaTiles]
    why: str


def problem_of(call: Call) -> Problem:
    """The Problem of a validated call (vflash.call.Call). Its TMA fitness: q, k, v (and a given out)
    suit TMA (ops.tma.tma_ready; an out the launcher allocates is contiguous, which does); against a
    KV cache, q (and out) do and both caches merge into rows TMA can address (ops.tma.cache_ready)."""
    q, layout = call.q, call.layout
    given = (q,) if call.out is None else (q, call.out)
    if isinstance(layout, Cache):
        tma = all(map(tma_ready, given)) and cache_ready(call.k) and cache_ready(call.v)
    elif q.dtype == torch.float8_e4m3fn:  # v as the launcher gives it (ops.tma.keys_ready, or its copy)
        tma = all(map(tma_ready, given + (call.k,)))
    else:
        tma = all(map(tma_ready, given + (call.k, call.v)))
    options = tuple(name for name in Score._fields[1:] if getattr(call.score, name) is not None)
    return Problem(q.dtype, call.head_dim, call.batch, call.heads_q, call.n_q, call.n_k, call.band, q.device, tma,
                   "dense" if layout is None else "cache" if isinstance(layout, Cache) else "packed", options,
                   None if call.k.dtype == q.dtype else call.k.dtype,
                   0 if call.head_dim_v == call.head_dim else call.head_dim_v, call.v_in_k)


def choose(call: Call, kernel: Optional[str] = None) -> Choice:
    """The forward's kernel and tiles for `call`: `select` for dense and packed calls, `select_kvcache`
    against a KV cache."""
    layout = call.layout
    if isinstance(layout, Cache):
        return select_kvcache(problem_of(call), call.heads_kv, layout.num_splits, layout.batch_invariant,
                              call.page_size, kernel, layout.cu_seqlens_q is not None)
    return select(problem_of(call), kernel)


def _sm90(device_index: int) -> Tuple[bool, int]:
    """(the device is sm_90, its SM count)."""
    props = _backend.device_properties(device_index)
    return (props.major, props.minor) == (9, 0), props.multi_processor_count


def _sm_count(p: Problem) -> int:
    return _sm90(p.device.index)[1]


def _sm90_device_refusal(p: Problem) -> Optional[str]:
    # what every sm_90 kernel needs beside its registry data: Gluon, an sm_90 device, inputs TMA can address
    if _backend.interpreted(p.device):
        return "Gluon kernels do not run under the Triton interpreter (CPU tensors, or TRITON_INTERPRET set)"
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if not _sm90(p.device.index)[0]:
        return f"{torch.cuda.get_device_name(p.device)} is not sm_90"
    if not p.tma_ok:
        return "TMA needs every tensor's base and strides 16-byte aligned and a unit last stride"
    return None


def sm90_refusal(p: Problem) -> Optional[str]:
    """Why the sm_90 kernel cannot take this call, or None if it can (refusal("sm90", p): its registry
    data first)."""
    refusal = _sm90_device_refusal(p)
    if refusal is not None:
        return refusal
    table = tables.SM90_FP8 if p.dtype == torch.float8_e4m3fn else tables.SM90
    if (p.head_dim, p.band.has_right) not in table:
        return f"it has tiles for head dims {sorted({d for d, _ in table})}, not {p.head_dim}"
    refusal = _head_dims_refusal(p)
    if refusal is not None:
        return refusal
    if p.row_tiles(CONSUMER_ROWS) >= 2**31:
        return "more work tiles than its int32 tile index holds"
    return None


def _forced(kernel: Optional[str]) -> Optional[str]:
    kernel = kernel or FORCED
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel (or VFLASH_KERNEL) must be one of {', '.join(KERNELS)}, got {str(kernel)[:40]!r}")
    return kernel


def select(p: Problem, kernel: Optional[str] = None) -> Choice:
    """The kernel and tiles for `p`. `kernel` ("portable" or "sm90"; default
    VFLASH_KERNEL, else chosen here) forces one; a forced kernel that cannot
    take the call raises ValueError saying why."""
    kernel = _forced(kernel)
    refused = refusal("sm90", p) if kernel != "portable" else "forced portable"
    if kernel == "sm90":
        if refused is not None:
            raise ValueError(f"the sm90 kernel cannot take this call: {refused}")
        return _sm90_choice(p, forced=True)
    if refused is None:
        refused = _forced_only(p)
    if refused is None:
        use = tables.SM90_USE[p.head_dim]
        shortest = use.min_n_q_right if p.band.has_right else use.min_n_q
        few = p.row_tiles(tables.SM90[(p.head_dim, p.band.has_right)].block_m) < use.min_waves * _sm_count(p)
        if p.n_q >= shortest and (not few or (p.head_dim, p.band.has_right) in tables.SM90_FEW_TILES):
            return _sm90_choice(p, forced=False)
        refused = (f"n_q {p.n_q} < {shortest}, where the sm90 kernel is not ahead" if p.n_q < shortest else
                   f"under {use.min_waves} waves of work tiles and no few-tile tiles")
    return _portable(p, f"portable kernel ({refused})" if kernel is None else "portable kernel (forced)")


def _sm90_choice(p: Problem, forced: bool) -> Choice:
    key = (p.head_dim, p.band.has_right)
    if p.dtype == torch.float8_e4m3fn:
        return Choice("sm90", tables.SM90_FP8[key], f"sm90 kernel{' (forced)' if forced else ''}: SM90_FP8")
    use = tables.SM90_USE[p.head_dim]
    sms = _sm_count(p)
    tiles, why = tables.SM90[key], "SM90"
    if key in tables.SM90_FEW_TILES and p.row_tiles(tiles.block_m) < use.min_waves * sms:
        tiles, why = tables.SM90_FEW_TILES[key], "SM90_FEW_TILES (too few work tiles for SM90's)"
    elif p.band.has_right:
        for band in tables.SM90_SHORT_CAUSAL.get(p.head_dim, ()):
            if p.n_q <= band.longest_n_q:
                tiles, why = band.tiles, f"SM90_SHORT_CAUSAL (right edge, n_q <= {band.longest_n_q})"
                break
    if tiles.dynamic and p.row_tiles(tiles.block_m) <= tiles.ctas_per_sm * sms:
        # a CTA for each work tile either way: the static grid, without the counter's allocation
        tiles, why = tiles._replace(dynamic=False), why + ", static grid (a CTA for every work tile)"
    return Choice("sm90", tiles, f"sm90 kernel{' (forced)' if forced else ''}: {why}")


def _portable(p: Problem, why: str) -> Choice:
    d = p.head_dim_pad
    if _backend.interpreted(p.device):
        return Choice("portable", tables.INTERPRETER, why + ": INTERPRETER")
    if p.dtype == torch.float32:
        return Choice("portable", tables.PORTABLE_FP32[d], why + ": PORTABLE_FP32")
    plain = tables.PORTABLE[d]
    sms = _sm_count(p)
    if not p.band.has_right:
        split = tables.PORTABLE_SPLIT.get(d)
        if split is not None and p.row_tiles(split.block_m) >= sms:
            return Choice("portable", split, why + ": PORTABLE_SPLIT")
    elif d in tables.PORTABLE_SHORT:
        short, longest = tables.PORTABLE_SHORT[d]
        if p.n_q <= longest or p.row_tiles(plain.block_m) < tables.SHORT_GRID_WAVES * sms:
            return Choice("portable", short, why + ": PORTABLE_SHORT")
    return Choice("portable", plain, why + ": PORTABLE")


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def select_kvcache(p: Problem, heads_k: int, num_splits: Optional[int] = None, batch_invariant: bool = False,
                   page_size: int = 0, kernel: Optional[str] = None, packed_q: bool = False) -> Choice:
    """The kernel, tiles and split count of `attention_with_kvcache`: `p` from
    problem_of (its TMA check covers the caches), n_k the cache's
    capacity a sequence (the longest a sequence can be without a host sync);
    page_size 0 for a contiguous cache. num_splits forces the split count;
    batch_invariant fixes the tiles and a sequence's split count by its own length
    (one split for every tables.INVARIANT_SPLIT_KEYS keys, at most tables.INVARIANT_MAX_SPLITS).

    Chunked prefill (more packed rows than DECODE_ROWS, unsplit, not batch-invariant)
    takes the sm90 kernel's KV_CACHE build where `select` would take the sm90 kernel
    for the same rows dense and the page size suits its copies (ops.tma.pages_fit);
    a latent cache (MLA) the sm90 MLA kernel where it can take the call (mla_refusal) and
    SM90_FORCED_ONLY allows, or `kernel` (VFLASH_KERNEL) forces "sm90" (then a call it cannot take
    raises ValueError); decode and everything else attention_kvcache_kernel (portable).
    packed_q: the queries come with cu_seqlens_q (their counts differ by sequence)."""
    kernel = _forced(kernel)
    if p.v_in_k and kernel != "portable":
        refused = mla_refusal(p, heads_k, batch_invariant, page_size, packed_q)
        if kernel == "sm90" and refused is not None:
            raise ValueError(f"the sm90 kernel cannot take this call: {refused}")
        if refused is None and (kernel == "sm90" or _forced_only(p) is None):
            return _mla_choice(p, num_splits, kernel == "sm90")
    group = p.heads_q // heads_k
    d = p.head_dim_pad
    head_blocks = 1
    if p.v_in_k:  # a latent cache: a group wider than LATENT_ROWS is split over programs
        head_blocks = next(b for b in range(1, group + 1) if group % b == 0 and group // b <= tables.LATENT_ROWS)
        group, heads_k = group // head_blocks, heads_k * head_blocks
    rows = group * max(1, p.n_q)
    unsplit = not batch_invariant and num_splits in (None, 1)
    if rows > tables.DECODE_ROWS and unsplit and refusal("sm90", p) is None:
        dense = select(p)
        if dense.kernel == "sm90" and (page_size == 0 or pages_fit(page_size, dense.tiles.block_n)):
            cache = f"pages of {page_size}" if page_size else "contiguous"
            return Choice("sm90", dense.tiles, f"{dense.why}, KV cache ({cache})")
    if _backend.interpreted(p.device):
        base, why = tables.KVCACHE_INTERPRETER, "KVCACHE_INTERPRETER"
    elif p.v_in_k:
        base, why = tables.KVCACHE_LATENT, f"KVCACHE_LATENT, {head_blocks} head blocks"
    elif p.dtype == torch.float32:
        base, why = tables.KVCACHE_FP32[d], "KVCACHE_FP32"
    elif rows <= tables.DECODE_ROWS or batch_invariant:
        base, why = tables.KVCACHE_DECODE[d], "KVCACHE_DECODE"
    else:
        base, why = tables.KVCACHE_PREFILL[d], "KVCACHE_PREFILL"
    # The packed rows' power of two, at least 16 and the group, at most the table's (batch_invariant: fixed).
    def rows_of(t: KVCacheTiles) -> KVCacheTiles:
        block_m = max(_pow2(group), tables.INVARIANT_ROWS if batch_invariant else min(t.block_m, max(16, _pow2(rows))))
        # the merge's rows: the power of two holding a tile's real (query, head) rows (batch-invariant: the
        # whole tile, whatever the batch's new queries); as many splits a load as fit tables.MERGE_VALUES
        queries = block_m // group
        merge_rows = block_m if batch_invariant else _pow2(min(queries, max(1, p.n_q)) * group)
        chunk = 1 << max(0, (tables.MERGE_VALUES // (merge_rows * d)).bit_length() - 1)
        return t._replace(block_m=block_m, split_chunk=max(1, min(tables.MERGE_MAX_CHUNK, chunk)),
                          merge_rows=merge_rows)
    tiles = rows_of(base)._replace(head_blocks=head_blocks)
    if batch_invariant:
        keys = tables.INVARIANT_SPLIT_KEYS
        # the kernel gives each sequence min(splits, its own cdiv(length, keys)): at most the cap, whatever
        # the cache's capacity, so its splits still depend on its own length alone
        splits = max(1, min(tables.INVARIANT_MAX_SPLITS, -(-p.n_k // keys)))
        return Choice("portable", tiles._replace(num_splits=splits, split_keys=keys, one_loop=True),
                      f"portable kernel: {why}, batch-invariant: {keys} keys a split, {splits} splits")

    def merge_chunk(splits: int) -> int:  # the splits the merge loads at once for this count (below)
        return min(tiles.split_chunk, _pow2(splits))

    if num_splits is not None:
        splits, how = max(1, min(num_splits, -(-p.n_k // tiles.block_n))), "num_splits given"
    else:
        rule = tables.KVCACHE_SPLIT
        programs = p.batch * heads_k * -(-max(1, p.n_q) // (tiles.block_m // group))
        # K and V rings at q's bytes: an FP8 cache's split build (168 registers at D 128) holds as many programs an
        # SM as the 16-bit one, by its registers rather than its halved rings
        buffers = max(1, tiles.num_stages - 1) * tiles.block_n * d * 2 * p.dtype.itemsize
        resident = max(1, rule.smem_per_sm // (buffers + rule.smem_reserved))

        def count(per_sm: int) -> int:  # one wave of per_sm programs an SM
            # the interpreter runs programs one at a time: a split there buys nothing
            places = 1 if _backend.interpreted(p.device) else per_sm * _sm_count(p)
            return max(1, min(places // programs, p.n_k // rule.min_split_keys, rule.max_splits))
        splits = count(resident)
        if resident > 1 and p.n_k < splits * rule.full_residency_tiles * tiles.block_n:
            resident -= 1  # splits too short to gain from the SM's last program
            splits = count(resident)
        wide_chunk, held = tables.KVCACHE_SPLIT_MERGE_RESIDENT.get(d, (0, resident))
        if why == "KVCACHE_DECODE" and held < resident and merge_chunk(splits) >= wide_chunk:
            resident = held  # the wide merge's registers hold fewer programs an SM
            splits = count(resident)
        # the count that gives every split the same number of key tiles of a full cache (the kernel deals a
        # sequence's tiles out to its splits in turn): no split without a tile
        part = -(-(-(-p.n_k // splits)) // tiles.block_n) * tiles.block_n
        splits = -(-p.n_k // part)
        how = f"KVCACHE_SPLIT: {programs} programs unsplit, {resident} an SM"
    # A split's few key tiles (four at B 1 / KV 8k) in one masked loop: one pipeline prologue where the band's
    # three loops pay three. Unsplit programs (tens to hundreds of tiles) keep the three, whose unmasked
    # middle skips the masks (docs/performance.md, decode). The merge loads no more splits at once than
    # there are (batch-invariant calls keep theirs fixed, above).
    tiles = tiles._replace(num_splits=splits, one_loop=splits > 1, split_chunk=merge_chunk(splits))
    fp8_tiles = tables.KVCACHE_DECODE_FP8.get(d) if p.kv_dtype == torch.float8_e4m3fn else None
    if splits == 1 and why == "KVCACHE_DECODE" and fp8_tiles is not None and tiles.block_m <= fp8_tiles.block_m:
        # an unsplit call on an e4m3 cache, with no more rows a program than the table's tile was measured at
        tiles = tiles._replace(block_n=fp8_tiles.block_n, num_warps=fp8_tiles.num_warps,
                               num_stages=fp8_tiles.num_stages, one_loop=fp8_tiles.one_loop)
        why = f"{why}, KVCACHE_DECODE_FP8"
    elif splits == 1 and why == "KVCACHE_DECODE" and d in tables.KVCACHE_WAVES:
        programs = p.batch * heads_k * -(-max(1, p.n_q) // (tiles.block_m // group))
        rule = tables.KVCACHE_WAVES[d]
        per_sm = rule.per_sm_tile_in_page if page_size >= tiles.block_n else rule.per_sm
        if _deeper_ring(rule, per_sm, programs, _sm_count(p), -(-p.n_k // tiles.block_n)):
            stages = rule.num_stages
            tiles, why = tiles._replace(num_stages=stages), f"{why}, KVCACHE_WAVES: {stages} stages"
    return Choice("portable", tiles, f"portable kernel: {why}, {splits} splits ({how})")


def mla_refusal(p: Problem, heads_k: int, batch_invariant: bool = False, page_size: int = 0,
                packed_q: bool = False) -> Optional[str]:
    """Why the sm90 MLA kernel (kernels/mla_decode_sm90.py) cannot take a latent-cache call, or None if it can."""
    refusal = _sm90_device_refusal(p)
    if refusal is not None:
        return refusal
    if p.dtype not in (torch.float16, torch.bfloat16) or p.kv_dtype is not None:
        return f"its MLA kernel takes 16-bit queries and caches, not {p.dtype} / {p.kv_dtype or p.dtype}"
    if (p.head_dim, p.head_dim_v, heads_k) != (576, 512, 1):
        return (f"its MLA kernel takes DeepSeek's latent cache (q / k 576, v 512, one KV head), not "
                f"{p.head_dim} / {p.head_dim_v} over {heads_k} KV heads")
    if any(o != "sinks" for o in p.options) or p.band.has_left or (p.band.has_right and p.band.right != 0):
        return "its MLA kernel takes sinks, causal or no mask, and nothing else of the score's options"
    if batch_invariant or packed_q:
        return "its MLA kernel takes a fixed count of new queries a sequence and no batch-invariant mode"
    if page_size and not pages_fit(page_size, tables.SM90_MLA.block_n):
        return f"its MLA kernel's copies take pages of a power of two from 16, not {page_size}"
    return None


def _mla_choice(p: Problem, num_splits: Optional[int], forced: bool) -> Choice:
    # the MLA kernel's tiles and split count: num_splits (at most a split a key tile), else as many as fill one
    # wave of CTAs (one an SM), each of at least SM90_MLA_MIN_SPLIT_TILES key tiles
    tiles = tables.SM90_MLA
    key_tiles = max(1, -(-p.n_k // tiles.block_n))
    programs = p.batch * -(-max(1, p.n_q) * p.heads_q // CONSUMER_ROWS)
    if num_splits is not None:
        splits, how = max(1, min(num_splits, key_tiles)), "num_splits given"
    else:
        splits = max(1, min(_sm_count(p) // programs, key_tiles // tables.SM90_MLA_MIN_SPLIT_TILES,
                            tables.SM90_MLA_MAX_SPLITS))
        how = f"{programs} CTAs unsplit"
    return Choice("sm90", tiles._replace(num_splits=splits),
                  f"sm90 MLA kernel{' (forced)' if forced else ''}: SM90_MLA, {splits} splits ({how})")


def _deeper_ring(rule: tables.WaveRule, per_sm: int, programs: int, sms: int, key_tiles: int) -> bool:
    """Whether an unsplit decode grid takes tables.KVCACHE_WAVES' deeper ring (its comment): where
    its last wave is enough fuller than at the table's stages (per_sm programs an SM)."""
    def fill(places: int) -> float:
        waves = programs / places
        return 1.0 if waves <= 1 else waves / math.ceil(waves)
    waves = programs / (per_sm * sms)
    if not 1 < waves < rule.max_waves:
        return False
    ahead = fill(rule.per_sm_deeper * sms) - fill(per_sm * sms)
    return ahead >= (rule.gain_long if key_tiles >= rule.long_tiles else rule.gain)


def sm90_backward_refusal(p: Problem) -> Optional[str]:
    """Why the sm_90 backward kernels cannot take this call, or None if they can (refusal("sm90", p,
    backward=True): its registry data first)."""
    refusal = _sm90_device_refusal(p)
    if refusal is not None:
        return refusal
    if p.head_dim not in tables.SM90_BACKWARD:
        return f"it has tiles for head dims {sorted(tables.SM90_BACKWARD)}, not {p.head_dim}"
    return _head_dims_refusal(p)


def _head_dims_refusal(p: Problem) -> Optional[str]:
    # the head-dim rules the sm90 forward and backward share: v's of its own (_v_head_dim_refusal), and a q / k
    # head dim of no power of two only beside one
    if p.head_dim_v and _v_head_dim_refusal(p):
        return _v_head_dim_refusal(p)
    if p.head_dim & (p.head_dim - 1) and not p.head_dim_v:
        return (f"it takes a head dim of no power of two ({p.head_dim}) only beside a v of its own that is one "
                f"(DeepSeek's 192 / 128)")
    return None


def _v_head_dim_refusal(p: Problem) -> Optional[str]:
    # v's own head dim: a power of two no wider than q's (its tiles are q's head dim's; a wider V's ring would pass
    # shared memory), in dense and packed calls
    dv = p.head_dim_v
    if p.layout == "cache" or p.v_in_k:
        return f"it takes v's head dim equal to q's and k's ({p.head_dim}) against a KV cache, not {dv}"
    if dv & (dv - 1) or not 16 <= dv <= p.head_dim:
        return f"it takes v's head dim of its own as a power of two from 16 to q's ({p.head_dim}), not {dv}"
    return None


def _forced_only(p: Problem) -> Optional[str]:
    # why dispatch does not give p to the sm90 kernels unforced: the features of p that tables.SM90_FORCED_ONLY
    # names (their builds not yet checked on a GPU); None if none
    features = (("fp8", p.dtype == torch.float8_e4m3fn), ("v head dim", bool(p.head_dim_v) and not p.v_in_k),
                ("mla", p.v_in_k))
    unchecked = [f for f, on in features if on and f in tables.SM90_FORCED_ONLY]
    if unchecked:
        return f"its {' and '.join(unchecked)} build is taken where forced only (tables.SM90_FORCED_ONLY)"
    return None


class Kernel(NamedTuple):
    """A kernel family a call can run: its name (Choice.kernel, VFLASH_KERNEL's values) and what it takes, as
    data (its input dtypes, the layouts its forward and its backward take, the score options beside the scale)
    and, for what the data cannot say (the device, head-dim tiles, TMA), as why its forward or its backward
    cannot run a problem (None: it can). `refusal` reads both; vflash._validate accepts the dtypes some family
    takes. The launchers build a family's launch from Choice.kernel alone (vflash.ops.attention,
    vflash.ops.attention_bwd). A new option or dtype is an entry in the families that take it."""
    name: str
    dtypes: Tuple[torch.dtype, ...]
    layouts: Tuple[str, ...]  # the forward's: "dense", "packed", "cache"
    backward_layouts: Tuple[str, ...]  # the backward's ("cache": no backward)
    options: Tuple[str, ...]  # vflash.call.Score fields beside the scale it takes when set
    cache_dtypes: Tuple[torch.dtype, ...]  # KV caches of another dtype than q's it takes (FP8 caches)
    forward_refusal: Callable[[Problem], Optional[str]]
    backward_refusal: Callable[[Problem], Optional[str]]


def _takes_any(p: Problem) -> Optional[str]:
    return None


_16_BIT = (torch.float16, torch.bfloat16)
_DESCALES = ("q_descale", "k_descale", "v_descale")
# The portable Triton kernels take every call (any device Triton runs on, the interpreter included; FP8 inputs
# forward only, vflash._validate says so first); the sm_90 Gluon ones 16-bit inputs and where their refusals
# say. select() prefers sm90 where it can take a call and is ahead there.
REGISTRY = {"portable": Kernel("portable", _16_BIT + (torch.float32, torch.float8_e4m3fn), ("dense", "packed", "cache"),
                               ("dense", "packed"), ("softcap", "sinks") + _DESCALES, (torch.float8_e4m3fn,),
                               _takes_any, _takes_any),
            "sm90": Kernel("sm90", _16_BIT + (torch.float8_e4m3fn,), ("dense", "packed", "cache"), ("dense", "packed"),
                           ("softcap", "sinks") + _DESCALES, (), sm90_refusal, sm90_backward_refusal)}
KERNELS = tuple(REGISTRY)
DTYPES = tuple(dict.fromkeys(d for k in REGISTRY.values() for d in k.dtypes))  # every family's, in order


def refusal(kernel: str, p: Problem, backward: bool = False) -> Optional[str]:
    """Why family `kernel`'s forward (or backward) cannot run `p`, or None if it can: its registry data
    (dtype, layout, score options), then its refusal function."""
    k = REGISTRY[kernel]
    if p.dtype not in k.dtypes:
        return f"it takes {' / '.join(str(d).replace('torch.', '') for d in k.dtypes)}, not {p.dtype}"
    if p.kv_dtype is not None and p.kv_dtype not in k.cache_dtypes:
        return f"it takes no {str(p.kv_dtype).replace('torch.', '')} keys and values beside {p.dtype} queries"
    layouts = k.backward_layouts if backward else k.layouts
    if p.layout not in layouts:
        return f"its {'backward' if backward else 'forward'} takes {' / '.join(layouts)} calls, not {p.layout}"
    missing = [o for o in p.options if o not in k.options]
    if missing:
        return f"it does not take {', '.join(missing)}"
    return (k.backward_refusal if backward else k.forward_refusal)(p)


def select_backward(p: Problem, kernel: Optional[str] = None) -> Choice:
    """The backward's kernels and tiles for `p` (the forward's Problem), with `select`'s rules:
    the sm_90 kernels wherever they can take the call and are ahead (SM90_BACKWARD_MIN_N),
    `kernel` or VFLASH_KERNEL forcing one."""
    kernel = _forced(kernel)
    refused = refusal("sm90", p, backward=True) if kernel != "portable" else "forced portable"
    shortest = tables.SM90_BACKWARD_MIN_N.get(p.head_dim, 0)
    if refused is None and kernel is None:
        refused = _forced_only(p)
    if refused is None and kernel is None and min(p.n_q, p.n_k) < shortest:
        refused = f"length {min(p.n_q, p.n_k)} < {shortest}, where the sm90 backward is not ahead"
    if refused is None:
        return Choice("sm90", tables.SM90_BACKWARD[p.head_dim],
                      f"sm90 backward{' (forced)' if kernel else ''}: SM90_BACKWARD")
    if kernel == "sm90":
        raise ValueError(f"the sm90 backward cannot take this call: {refused}")
    return Choice("portable", backward_tiles(p), f"portable backward ({refused})")


def backward_tiles(p: Problem) -> BackwardTiles:
    """The portable backward kernels' tiles."""
    if _backend.interpreted(p.device):
        return tables.BACKWARD_INTERPRETER
    if p.dtype == torch.float32:
        return tables.BACKWARD_FP32[p.head_dim_pad]
    return tables.BACKWARD[p.head_dim_pad]


def merge_tiles(head_dim: int, device: torch.device) -> MergeTiles:
    """merge_states' tiles: the table's rows, the head dim's power of two (at least 16) up to
    the table's columns."""
    t = tables.MERGE_INTERPRETER if _backend.interpreted(device) else tables.MERGE
    return t._replace(block_d=min(t.block_d, max(16, 1 << (head_dim - 1).bit_length())))


def metadata_tiles(batch: int, device: torch.device) -> MetadataTiles:
    """The metadata check's tiles: the table's, the interpreter's sequences a program no more than the
    batch's power of two."""
    if _backend.interpreted(device):
        t = tables.METADATA_INTERPRETER
        return t._replace(block_seq=min(t.block_seq, 1 << max(0, batch - 1).bit_length()))
    return tables.METADATA


def cache_write_tiles() -> CacheWriteTiles:
    """write_kvcache's tiles (one table entry for every device for now)."""
    return tables.CACHE_WRITE
