"""The tiles and schedule switches of one launch, one type per kernel. Which
tiles a call gets is `vflash.dispatch`'s; the launchers only read them."""

from typing import NamedTuple

# Query rows per consumer warpgroup (one wgmma M): the kernel's ROWS.
CONSUMER_ROWS = 64
# Registers per thread of each consumer warpgroup (setmaxnreg), by (consumer
# count, CTAs an SM); the producer warpgroup keeps what is left of the CTA's
# share of the 64 K register file (one CTA: 24 of 168 / 128 a thread; two of one
# consumer: 32 of 128; three: 24 of 80).
CONSUMER_REGS = {(1, 2): 224, (1, 3): 136, (2, 1): 240, (3, 1): 160}


def head_dim_pad(head_dim: int, fp8: bool = False) -> int:
    """The portable kernel's head dim: the next power of two, at least 16 (masks pad the rest); at least 32
    for e4m3 operands, whose tensor-core dot takes K >= 32."""
    return max(32 if fp8 else 16, 1 << (head_dim - 1).bit_length())


class PortableTiles(NamedTuple):
    """`kernels/attention_fwd.py:attention_fwd_kernel`'s launch."""
    block_m: int  # query rows a program
    block_n: int  # keys an inner step
    num_warps: int
    num_stages: int  # software pipelining depth of the K/V loads
    split: bool = False  # the program's rows carried as two independent halves (SPLIT)


class Sm90Tiles(NamedTuple):
    """`kernels/attention_fwd_sm90.py:attention_fwd_sm90_kernel`'s launch:
    block_m is one (64), two (128) or three (192) consumer warpgroups of 64 rows.
    The switches are the kernel's constexprs of the same names."""
    block_m: int
    block_n: int
    stages: int  # depth of the K/V ring (STAGES)
    q_buffers: int = 1  # Q buffers per consumer (Q_BUFFERS)
    pingpong: bool = False  # PINGPONG
    p_fp32: bool = False  # P_FP32
    late_pv_wait: bool = False  # LATE_PV_WAIT
    lazy_rescale: bool = False  # LAZY_RESCALE
    ctas_per_sm: int = 1  # CTAs resident on an SM: sets the register cap and the persistent grid
    dynamic: bool = False  # DYNAMIC: CTAs draw work tiles from a per-launch counter
    p_shared: bool = False  # P_SHARED (FP8 inputs): P reaches the PV wgmma through shared memory, not registers


class BackwardLaunch(NamedTuple):
    """One of the backward's two main launches (portable `kernels/attention_bwd.py`, or sm_90
    `kernels/attention_bwd_sm90.py`, whose num_warps is its producer warpgroup's and num_stages
    its ring's depth)."""
    block_m: int  # query rows: a step of the dK/dV kernel, a program of the dQ kernel
    block_n: int  # keys: a program of the dK/dV kernel, a step of the dQ kernel
    num_warps: int
    num_stages: int


class BackwardTiles(NamedTuple):
    """The backward's launches: the dK/dV kernel's key tiles walk query tiles, the dQ kernel's
    query tiles walk key tiles; the delta kernel takes dq.block_m's power of two rows. dkdv_apart (sm_90 only):
    dK and dV from two launches of the dK/dV kernel, one accumulator a consumer each (D 256)."""
    dkdv: BackwardLaunch
    dq: BackwardLaunch
    dkdv_apart: bool = False


class KVCacheTiles(NamedTuple):
    """`kernels/attention_fwd.py:attention_kvcache_kernel`'s launch (GQA-packed rows, split-KV)."""
    block_m: int  # rows a program: block_m // group queries times their group of query heads
    block_n: int  # keys an inner step
    num_warps: int
    num_stages: int
    num_splits: int = 1  # programs each sequence's keys are split across (split-KV), the grid's split count
    split_keys: int = 0  # > 0: a split's keys, fixed (batch-invariant); 0: each sequence's keys over num_splits
    # split-KV's merge in each row tile's last split: split_chunk splits a load, over merge_rows rows (a power of
    # two holding the tile's real (query, head) rows; 0: all block_m). Batch-invariant calls need both fixed.
    split_chunk: int = 1
    merge_rows: int = 0
    # every key tile in one loop, masked: one pipeline prologue a program, where the band's masked and
    # unmasked stretches are a loop each otherwise (each with its own prologue)
    one_loop: bool = False
    # programs a KV head's query heads are split across, each taking group // head_blocks of them (a group
    # wider than a tile's rows: MLA's 128 query heads on one latent head)
    head_blocks: int = 1


class MlaTiles(NamedTuple):
    """`kernels/mla_decode_sm90.py:mla_decode_sm90_kernel`'s launch (a latent cache on sm_90: 64 (query, head) rows
    a CTA over two consumer warpgroups), and its split merge's (`kernels/combine.py:merge_splits_kernel`)."""
    block_n: int  # keys a tile
    stages: int  # depth of the key ring (STAGES)
    num_splits: int = 1  # CTAs each sequence's keys are split across; > 1: fp32 partials, then the merge launch
    merge_rows: int = 4  # (query, head) rows a merge program
    split_chunk: int = 4  # splits a merge load


class MergeTiles(NamedTuple):
    """`kernels/combine.py:merge_states_kernel`'s launch: [block_rows, block_d] tiles."""
    block_rows: int
    block_d: int
    num_warps: int


class MetadataTiles(NamedTuple):
    """`kernels/metadata.py:sequence_metadata_kernel`'s launch: block_seq sequences a program, their
    block tables read block_pages entries at a time."""
    block_seq: int
    block_pages: int
    num_warps: int


class CacheWriteTiles(NamedTuple):
    """`kernels/cache.py:write_kvcache_kernel`'s launch: block_h heads of one token a program."""
    block_h: int
    num_warps: int
