"""Every tile table of the forward, one line of reason per entry.

Figures are TFLOP/s on an H200 (fp16, same run, vflash against the alternative
named); the measurements behind them are in the performance log
(`docs/performance.md`, `docs/perf/log.md`). `rules.py` reads these tables; nothing else
does.
"""

from typing import Dict, NamedTuple, Tuple

from vflash.ops.tiles import (BackwardLaunch, BackwardTiles, CacheWriteTiles, Sm90Tiles,
                              KVCacheTiles, MergeTiles, MetadataTiles, MlaTiles, PortableTiles)

# --- portable Triton kernel (kernels/attention_fwd.py), by padded head dim ---------------------

# Every mask, and the fallback of the variants below (benchmarks/tune.py on the H200).
PORTABLE: Dict[int, PortableTiles] = {
    16: PortableTiles(128, 64, 8, 3),  # as D = 64: the tile is bound by the softmax, not the head dim
    32: PortableTiles(128, 64, 8, 3),  # as D = 64
    64: PortableTiles(128, 64, 8, 3),  # tune.py's best at N 1k-16k
    128: PortableTiles(128, 128, 8, 3),  # tune.py's best at N 1k-16k
    256: PortableTiles(128, 64, 8, 2),  # two stages: three of 64 x 256 K and V tiles overflow shared memory
}

# No right edge (not causal), while the doubled rows still give every SM a program.
PORTABLE_SPLIT: Dict[int, PortableTiles] = {
    128: PortableTiles(256, 64, 8, 3, split=True),  # two halves' softmax and MMAs overlap: +8 % non-causal
}

# A right edge (causal) with n_q up to the given length, or fewer than SHORT_GRID_WAVES programs an SM:
# short or few programs balance better in small tiles.
PORTABLE_SHORT: Dict[int, Tuple[PortableTiles, int]] = {
    64: (PortableTiles(64, 64, 4, 3), 512),  # short causal rows: the last wave of 128-row tiles idles SMs
    128: (PortableTiles(64, 64, 4, 3), 2048),  # as D = 64, to N = 2048
}
SHORT_GRID_WAVES = 4

# fp32 inputs (fp32 products): twice the registers and shared memory of 16-bit tiles.
PORTABLE_FP32: Dict[int, PortableTiles] = {
    16: PortableTiles(64, 64, 4, 2),  # two stages of 64 x 128 fp32 K and V are already 128 KiB
    32: PortableTiles(64, 64, 4, 2),  # as above
    64: PortableTiles(64, 64, 4, 2),  # as above
    128: PortableTiles(64, 64, 4, 2),  # as above
    256: PortableTiles(32, 32, 4, 2),  # a 32 x 256 fp32 tile is the 64 x 128 one's size
}

# Under the interpreter a tile's size only changes how many numpy operations run.
INTERPRETER = PortableTiles(32, 32, 4, 1)

# --- Gluon sm_90 kernel (kernels/attention_fwd_sm90.py), by (head dim, right edge) ----------
# Shared memory: Q q_buffers * block_m * D, K and V stages * block_n * D each, 2 bytes an element.

SM90: Dict[Tuple[int, bool], Sm90Tiles] = {
    # D = 64: three consumers (half of D = 128's MMA work a score: a third softmax keeps the tensor
    # cores busy, +6-11 % over two); pingpong +2-3.5 %; lazy rescale +1-4 %; two Q buffers hide the
    # next tile's Q load and this tile's store.
    (64, False): Sm90Tiles(192, 128, 2, q_buffers=2, pingpong=True, lazy_rescale=True),
    # causal: P carried in fp32 +5.3 % (N 16k), one Q buffer, DYNAMIC +1-3 % at N 4k-16k
    (64, True): Sm90Tiles(192, 128, 2, q_buffers=1, pingpong=True, p_fp32=True, lazy_rescale=True,
                            dynamic=True),
    # D = 128: two consumers; two Q buffers +13.5 / +6 / +4 % at N 512 / 1k / 4k; lazy rescale 569 ->
    # 584 / 617 -> 640 at N 1k / 16k; pingpong lost 0-2 %.
    (128, False): Sm90Tiles(128, 128, 2, q_buffers=2, lazy_rescale=True),
    # causal: packed 16-bit P +1-2 % over fp32; lazy rescale -1-2 %; DYNAMIC 528 -> 570 at N 8k
    (128, True): Sm90Tiles(128, 128, 2, q_buffers=1, dynamic=True),
    # D = 256: no room for a second Q buffer; 64-key tiles; lazy rescale even to -2.7 %.
    (256, False): Sm90Tiles(128, 64, 2, q_buffers=1),
    # causal: DYNAMIC 447 -> 459 at N 1k, even at 16k
    (256, True): Sm90Tiles(128, 64, 2, q_buffers=1, dynamic=True),
    # D = 192 (beside a v of its own, DeepSeek's 128): Q and K in three 64-column parts; one Q buffer (Q 48 KiB,
    # K 96, V 64: 208 KiB of shared memory at D_v 128); untuned: D = 128's shapes
    (192, False): Sm90Tiles(128, 128, 2, q_buffers=1),
    (192, True): Sm90Tiles(128, 128, 2, q_buffers=1, dynamic=True),
}


# FP8 (e4m3 q, k, v): shared memory at 1 byte an element; P the PV wgmma's register operand (p_shared: a
# [64, block_n] buffer a consumer). H100 figures (N 16k non-causal, benchmarks/experiments/fp8_sm90).
SM90_FP8: Dict[Tuple[int, bool], Sm90Tiles] = {
    (64, False): Sm90Tiles(128, 128, 2, q_buffers=2),  # untuned: the 16-bit shape
    (64, True): Sm90Tiles(128, 128, 2, q_buffers=1, dynamic=True),  # untuned
    # softmax-bound (an FP8 tile's exp2s take as long as its products): 256-key tiles halve the per-tile work
    # that is not per score (O's rescale, the row reductions); with P through shared memory and lazy rescale
    # (176 KB of shared memory, 44 / 80 B spilled) 905 / 863 against 128 x 128's 824 / 816 (two calls, H100)
    (128, False): Sm90Tiles(128, 256, 2, q_buffers=1, lazy_rescale=True, p_shared=True),
    (128, True): Sm90Tiles(128, 128, 2, q_buffers=1, dynamic=True),  # untuned
    # 128-key tiles (one Q buffer: 164 KB of shared memory) 1170 and with pingpong and lazy rescale 1272,
    # against 64-key tiles' 995 (970 with pingpong)
    (256, False): Sm90Tiles(128, 128, 2, q_buffers=1, pingpong=True, lazy_rescale=True),
    (256, True): Sm90Tiles(128, 64, 2, q_buffers=1, dynamic=True),  # untuned
}
# Calls the sm90 kernel takes that dispatch gives it only where forced (VFLASH_KERNEL=sm90, `vflash check
# --kernel sm90`), by feature ("fp8": e4m3 inputs, "v head dim": v's head dim unlike q's and k's, forward and
# backward, "mla": the latent cache's decode kernel), until `vflash check --kernel sm90` passes on them on an
# sm_90 GPU and their speed is measured. None today: on an H100 (benchmarks/results/2026-12-07-h100-s52) the
# forced FP8 cases (packed included) pass, and the sm90 builds lead the portable kernel: dense FP8 820 / 1198
# TFLOP/s at D 128 / 256 (N 16k) against 785 / 661; v head dims 192 / 128 at 573-692 against 333-415, 256 / 128
# at 527-658 against 431-456, 128 / 64 at 481-571 against 420-521 (N 4k-16k).
SM90_FORCED_ONLY: Tuple[str, ...] = ()


class ShortBand(NamedTuple):
    longest_n_q: int  # the band holds calls with n_q up to this
    tiles: Sm90Tiles


# A right edge (causal) and short rows: work tiles of 1-8 key tiles expose each tile's serial chain
# (first QK^T and softmax, last PV, output store); CTAs of one consumer warpgroup, several an SM,
# walk theirs apart. The first band that holds n_q serves; longer calls take SM90's tiles.
SM90_SHORT_CAUSAL: Dict[int, Tuple[ShortBand, ...]] = {
    # three CTAs of 64 x 64, two Q buffers: 337 / 370 against two CTAs' 321 / 342 at N 1k / 2k
    64: (ShortBand(2048, Sm90Tiles(64, 64, 2, q_buffers=2, p_fp32=True, lazy_rescale=True, ctas_per_sm=3,
                                     dynamic=True)),),
    128: (
        # two CTAs of 64 x 64, two Q buffers: 329 against 303 with one at N 512
        ShortBand(512, Sm90Tiles(64, 64, 2, q_buffers=2, ctas_per_sm=2)),
        # SM90's tiles with two Q buffers under DYNAMIC: 509 against 491 at N 2k
        ShortBand(2048, Sm90Tiles(128, 128, 2, q_buffers=2, dynamic=True)),
    ),
}

# Too few work tiles of SM90's height for SM90_USE's waves: two CTAs of 64-row tiles an SM
# (B = 1, H = 16, N 2k: 387 against 378 for cuDNN, where 192-row tiles left the last wave idle).
SM90_FEW_TILES: Dict[Tuple[int, bool], Sm90Tiles] = {
    (64, False): Sm90Tiles(64, 128, 2, q_buffers=2, lazy_rescale=True, ctas_per_sm=2),
    (64, True): Sm90Tiles(64, 128, 2, q_buffers=2, p_fp32=True, lazy_rescale=True, ctas_per_sm=2),
}


class Sm90Use(NamedTuple):
    min_n_q: int  # shortest n_q without a right edge for which the sm90 kernel is ahead
    min_n_q_right: int  # with one (causal)
    min_waves: int  # fewest work tiles of SM90's height per SM; below, SM90_FEW_TILES or portable


# Where the sm90 kernel is ahead of the portable one (same runs).
SM90_USE: Dict[int, Sm90Use] = {
    64: Sm90Use(512, 1024, 4),  # 368 against 345 at N 512; causal 337 against 300 at N 1k
    128: Sm90Use(1, 1, 0),  # ahead at every length since the causal grid went persistent (246 / 242 at 512)
    256: Sm90Use(1, 1, 0),  # ahead at every length (causal N 512: 315 against 226)
    192: Sm90Use(1, 1, 0),  # beside v's 128 (DeepSeek's prefill): 573-692 TFLOP/s at N 4k-16k, portable 333-415
}


# --- KV-cache attention (kernels/attention_fwd.py:attention_kvcache_kernel), by padded head dim --------
# Rows are GQA-packed (query, head) pairs; block_m here is the most a call gets: fewer rows wanted
# (group x the longest sequence's new queries) get the power of two that holds them, at least 16
# (the smallest tensor-core tile). Decode reads each cache byte once: the tile is sized for the loads.

# Up to 64 packed rows (decode, short chunks): memory-bound. D 128 measured (decode_tune --grid, bf16,
# Hq 32 / Hkv 8, page 16, H200, B 1-128 x KV 1k-32k at split counts 1-64): 64-key tiles in three stages
# with 4 warps were within 3.3 % of each row's best tile but at B 1 / KV 1k (11 %, where 128-key tiles with
# 8 warps led), split or not; the other head dims follow it (D 256 with 32-key tiles, for the same shared
# memory a program), unmeasured.
KVCACHE_DECODE: Dict[int, KVCacheTiles] = {
    16: KVCacheTiles(64, 64, 4, 3),
    32: KVCacheTiles(64, 64, 4, 3),
    64: KVCacheTiles(64, 64, 4, 3),
    128: KVCacheTiles(64, 64, 4, 3),
    256: KVCacheTiles(64, 32, 4, 3),  # 32 x 256 K and V tiles: three stages in 96 KiB
}
DECODE_ROWS = 64  # more packed rows than this take KVCACHE_PREFILL's tiles

# Unsplit decode on an e4m3 cache (half the bytes a key; split calls keep KVCACHE_DECODE's tile, whose split build
# holds three programs an SM at 168 registers): 128 keys a tile, the 16-bit tile's bytes a stage, in one masked loop,
# where the band's three loops took 240 registers at 64 keys (two programs an SM, a third of bf16's bytes in
# flight) and take 255 at 128; one loop: 168 at pages of 16, 255 at pages of 64 or contiguous (Triton 3.6, sm_90).
# decode_tune --fp8 on an H100 (benchmarks/results/2026-12-07-h100-s53, pages of 16): 2632-2768 GB/s of the FP8
# bytes at B 32-128 against 2466-2752 at 64 keys in one loop (1.77-1.82x bf16's tokens a second);
# split rows (B 1-8) lose 2-17 % at 128 keys. D 128 only measured.
KVCACHE_DECODE_FP8: Dict[int, KVCacheTiles] = {
    128: KVCacheTiles(16, 128, 4, 3, one_loop=True),
}

# A latent cache (v_cache a view of k_cache's first columns: MLA's 576 = 512 + 64): 32 keys a tile of 512 + 64
# columns, the 512 read once for both products; at most LATENT_ROWS (query, head) rows a program, a wider group
# split over programs (each reads the cache: L2 serves the others). Not tuned on a GPU: Triton 3.6's sm_90 build
# holds [32, 512] fp32 outputs at 255 registers with ~0.8 KB of spills (64 rows: 3.7 KB); the portable kernel's
# MLA path is the correct one, not yet the fast one (issue 55).
KVCACHE_LATENT = KVCacheTiles(32, 32, 8, 2)
LATENT_ROWS = 32
# On sm_90 the latent cache's own kernel (kernels/mla_decode_sm90.py): 64-key tiles of 576 columns, two in the
# ring (with Q and P, 225 KB of shared memory: one CTA an SM); a sequence's keys split over CTAs to fill one wave,
# each split at least SM90_MLA_MIN_SPLIT_TILES tiles. On an H100 (mla_decode, bf16, pages of 64): 16 heads at
# 0.77-1.02 of the HBM read bandwidth (the portable latent path 0.47-0.62), 128 heads 426-560 TFLOP/s (portable
# 78-90).
SM90_MLA = MlaTiles(64, 2)
SM90_MLA_MIN_SPLIT_TILES = 4
SM90_MLA_MAX_SPLITS = 64

# Chunked prefill: PORTABLE's tiles, whose row block is compute-bound like a dense prefill's.
KVCACHE_PREFILL: Dict[int, KVCacheTiles] = {d: KVCacheTiles(*t[:4]) for d, t in PORTABLE.items()}
KVCACHE_FP32: Dict[int, KVCacheTiles] = {d: KVCacheTiles(*t[:4]) for d, t in PORTABLE_FP32.items()}
KVCACHE_INTERPRETER = KVCacheTiles(32, 16, 4, 1)  # small key tiles: CPU tests cross many tile edges cheaply


class SplitRule(NamedTuple):
    smem_per_sm: int  # shared memory an SM shares among resident programs (sm_90: 228 KiB), bytes
    smem_reserved: int  # what each resident program holds beyond its K/V buffers (its build's other shared
    # memory and the CUDA-reserved KiB), bytes
    min_split_keys: int  # no split of fewer keys than this
    max_splits: int
    full_residency_tiles: int  # splits shorter than this many key tiles count one program an SM fewer


# Split-KV when (sequence, KV head, row tile) programs cannot fill the GPU: split until the grid is one
# wave of the programs the SMs hold at once, each SM as many as its shared memory holds: Triton's pipeline
# of S stages keeps S - 1 K/V buffers (block_n x D x 2 of the cache dtype each), and D 128's 64-key
# three-stage split build 6 KiB beside them, 70 KiB in all with 113-168 registers (decode_residency): three
# programs an SM, 396 places on 132 SMs. Never more, so no second wave of a few programs doubles the call's
# time. The SM's last program pays only for long splits: at D 128 (decode_tune --grid, page 16) one wave
# of 384 programs beat one of 256 by 1.5-5.6 % where a split streams 21-85 key tiles (B 8 at KV 8k-32k, B 16
# and 24 at KV 8k) and lost 4-11 % where it streams 3-5 (B 1-2 at KV 8k, B 8 at KV 1k; a split's fixed
# cost and the merge grow with the count); level at 11 (B 4). At most 32 splits: B 1's best count at KV
# 8k-32k (40 and 48 level or slower). Measurements in docs/performance.md (decode on a KV cache).
KVCACHE_SPLIT = SplitRule(smem_per_sm=228 * 1024, smem_reserved=7 * 1024, min_split_keys=128, max_splits=32,
                          full_residency_tiles=16)

# Where the split build's registers, not its shared memory, bound the programs an SM: by head dim, the merge
# chunk (splits a load) from which they do and the programs an SM then. Triton 3.6's D 64 split builds
# (decode_residency, 36 KiB shared, five an SM by it) take 80-96 registers a thread with chunks of 8-16 and
# 113-127 with 32: four an SM, and a grid counted at five runs a second wave. D 128's and D 256's shared
# memory binds first (D 128: 113-168 registers, three an SM either way). Measurements in docs/performance.md.
KVCACHE_SPLIT_MERGE_RESIDENT: Dict[int, Tuple[int, int]] = {64: (32, 4)}

# Unsplit decode grids of more programs than a wave: the ring one stage deeper where that fills the last wave.
# Each program streams its whole cache, so a grid that runs a wave and a few programs pays a second wave's
# time for them. Triton 3.6's D 128 decode builds at three stages hold 70 KiB of shared memory and 138-148
# registers (contiguous, pages smaller than a key tile: three programs an SM) or 194 (a tile within one page:
# two), at four 102 KiB (two). A wave's fill W / ceil(W) (W: programs over the places) is compared between the
# two, from one to `max_waves` waves of the three-stage places: the deeper ring where its fill is ahead by
# `gain`, or by `gain_long` for programs of at least `long_tiles` key tiles (their tail lasts longest). Where a
# tile lies within one page both depths hold two programs an SM, so nothing is filled. Other head dims
# unmeasured; measurements in docs/performance.md (decode on a KV cache).
class WaveRule(NamedTuple):
    num_stages: int  # the deeper ring's stages
    per_sm: int  # programs an SM holds at the table's stages (a contiguous cache, pages smaller than a tile)
    per_sm_tile_in_page: int  # and where a key tile lies within one page
    per_sm_deeper: int  # at num_stages
    gain: float
    gain_long: float
    long_tiles: int
    max_waves: float


KVCACHE_WAVES: Dict[int, WaveRule] = {128: WaveRule(4, 3, 2, 2, gain=0.25, gain_long=0.1, long_tiles=64, max_waves=3)}

# batch_invariant=True: a sequence has one split for every INVARIANT_SPLIT_KEYS of its keys, at most
# INVARIANT_MAX_SPLITS (its splits depend on its own length only), and every call runs KVCACHE_DECODE's tiles in
# INVARIANT_ROWS-row blocks (the group's power of two if larger), whatever the call's row count, so no other
# sequence of the batch changes a sequence's arithmetic. 16-row blocks are the default's for decode; 512 keys
# give small caches splits enough to fill the GPU; past 32 splits (KV 16k) a split's fixed costs outweigh the
# places it fills (benchmarks/experiments/invariant_tune.py on the H200: docs/performance.md, decode). The
# mode's cost against the default: BENCHMARKS.md, Serving.
INVARIANT_SPLIT_KEYS = 512
INVARIANT_MAX_SPLITS = 32
INVARIANT_ROWS = 16

# Split-KV's merge, done by each row tile's last split in the split kernel (no combine launch): it loads
# split_chunk splits' partials of the tile's rows at once, one load round trip a chunk, MERGE_VALUES fp32
# values a load (128 registers a thread at 4 warps, free after the main loop): decode's 4-8 packed rows at
# D 128 take 32 or 16 splits a load, B 1's 32 splits one round trip. Fixed on every device: batch-invariant
# results depend on the chunk.
MERGE_VALUES = 16384
MERGE_MAX_CHUNK = 64

# --- backward (kernels/attention_bwd.py), by padded head dim -------------------------------------
# dkdv: a program's block_n keys hold dK and dV [block_n, D] fp32 in registers while block_m-row
# query tiles stream past; dq: a program's block_m rows hold dQ while block_n-key tiles stream.
# Picked by benchmarks/experiments/bwd_tune.py on the H200 (bf16, N 4096, causal and not; the
# candidates and their figures: docs/performance.md, "Backward"); D 16 / 32 take D 64's.
_B = BackwardLaunch
BACKWARD: Dict[int, BackwardTiles] = {
    16: BackwardTiles(dkdv=_B(32, 64, 4, 3), dq=_B(64, 64, 4, 3)),
    32: BackwardTiles(dkdv=_B(32, 64, 4, 3), dq=_B(64, 64, 4, 3)),
    64: BackwardTiles(dkdv=_B(32, 64, 4, 3), dq=_B(64, 64, 4, 3)),
    128: BackwardTiles(dkdv=_B(64, 64, 4, 2), dq=_B(128, 32, 4, 3)),
    256: BackwardTiles(dkdv=_B(64, 64, 8, 2), dq=_B(128, 32, 8, 3)),
}
BACKWARD_FP32: Dict[int, BackwardTiles] = {d: BackwardTiles(_B(32, 32, 4, 1), _B(32, 32, 4, 1))
                                           for d in (16, 32, 64, 128, 256)}
BACKWARD_INTERPRETER = BackwardTiles(_B(16, 16, 4, 1), _B(16, 16, 4, 1))  # small tiles: CPU tests cross tile edges

# --- sm_90 backward (kernels/attention_bwd_sm90.py), by head dim ------------------------------
# dkdv: block_n keys a CTA (64 a consumer warpgroup), block_m-row Q / dO tiles through a ring of
# num_stages; dq: block_m rows a CTA (64 a consumer), block_n-key K / V tiles. num_warps is the
# producer's warpgroup. Picked by benchmarks/experiments/bwd_sm90.py on the H200 (bf16, N 1k-16k,
# causal and not; docs/performance.md, "The sm_90 backward"). dQ: three consumers of 64 rows (192);
# dK / dV: 64-row query tiles (a third faster than 64 x 64). D 256: dK and dV from two launches, one
# fp32 accumulator a consumer (both spill 2-8 KB), 32-row query tiles and 32-key dQ tiles for the
# registers. D 16 / 32 are untimed: the portable backward serves them. D 192 (beside a v of its own, DeepSeek's
# 192 / 128; the kernels pad q's and k's tiles to 256 columns) takes D 256's tiles, untimed: no spill at 192 / 128
# (ptxas, Triton 3.6), where dK and dV in one launch spill 0.8 KB; checked on an H100 (vflash check --kernel sm90
# --match D192/128: benchmarks/results/2026-12-07-h100-s50), its speed untimed.
SM90_BACKWARD: Dict[int, BackwardTiles] = {
    64: BackwardTiles(dkdv=_B(64, 128, 4, 2), dq=_B(192, 64, 4, 2)),
    128: BackwardTiles(dkdv=_B(64, 128, 4, 2), dq=_B(192, 64, 4, 2)),
    192: BackwardTiles(dkdv=_B(32, 128, 4, 2), dq=_B(128, 32, 4, 2), dkdv_apart=True),
    256: BackwardTiles(dkdv=_B(32, 128, 4, 2), dq=_B(128, 32, 4, 2), dkdv_apart=True),
}
# Shorter sequences (the smaller of n_q and n_k) take the portable kernels. Timed in one run as CUDA graphs
# (bwd_sm90.py, bf16), the sm_90 kernels take 0.94-0.95x the portable time at D 64 N 1024 and N 512
# non-causal (1.01x at N 512 causal), 0.77-0.86x at D 128 from N 512, 0.71-0.77x at D 256 from N 512;
# shorter rows are untimed.
SM90_BACKWARD_MIN_N: Dict[int, int] = {64: 512, 128: 512, 192: 512, 256: 512}

# --- merge_states (kernels/combine.py): memory-bound elementwise work -----------------------------
# 16 rows of up to 64 columns a program: picked by benchmarks/experiments/kvops_tune.py on the H200 (bf16,
# the merge sweep's five shapes, 72 candidates of 4-128 rows, 32-128 columns, 1-8 warps): within 5 % of each
# shape's best, where no other candidate is within 5 % of all five; decode's small merges (32-4096 rows) want
# many small programs, the large ones are bound by HBM whatever the tile.
MERGE = MergeTiles(block_rows=16, block_d=64, num_warps=4)
MERGE_INTERPRETER = MergeTiles(block_rows=16, block_d=256, num_warps=4)  # fewer numpy ops a program

# --- write_kvcache (kernels/cache.py): a scatter of T tokens' [Hkv, D] rows ------------------------
# Eight heads of one token a program (8 x 128 bf16 = 2 KiB each of K and V): within 3 % of the best of 16
# candidates (1-8 heads, 1-8 warps) at 1-32768 tokens in kvops_tune.py on the H200.
CACHE_WRITE = CacheWriteTiles(block_h=8, num_warps=4)

# --- the metadata check (kernels/metadata.py): a few int32 loads a sequence, then a host sync ----------
# Compiled: one sequence a program, one warp, its table 128 entries a step (a 32k-key sequence in pages of
# 16 is 16 steps): every sequence's row read at once, so the check costs about its launch and sync (measured
# in docs/performance.md, "Decode on a KV cache"). The interpreter's cost is per program, not per element:
# up to 1024 sequences a program (never compiled: a [1024, 128] tile in one warp compiles for minutes).
METADATA = MetadataTiles(block_seq=1, block_pages=128, num_warps=1)
METADATA_INTERPRETER = MetadataTiles(block_seq=1024, block_pages=128, num_warps=1)
