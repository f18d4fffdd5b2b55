"""The attention backward's dQ and dK / dV for Hopper (sm_90), written in Gluon
(docs/performance.md, "The sm_90 backward"), launched by ops/sm90_bwd.py where
vflash.dispatch.select_backward picks them. They repeat the math of the portable
`attention_bwd_dq_kernel` / `attention_bwd_dkdv_kernel` (read `attention_bwd.py`'s
docstring first). Dense [B, H, N, D] tensors, or packed sequences (IS_VARLEN:
[total, H, D] with cu_seqlens, FlashAttention's layout; descriptors over [1, H,
total, D] views): a ring tile that reaches past its sequence's end has those rows
zeroed before any product reads them (they hold the next sequence's), and an
output slab that crosses the end is stored by pointer, its own rows alone.

Head dims: q's and k's tiles are HEAD_DIM columns, v's, dO's and dV's HEAD_DIM_V
(a v of its own: DeepSeek's 128 beside q's 192), each a power of two (Gluon's
tensors are). A dim of no power of two in memory (QK_COLS, V_COLS: 192, say) is
padded to the next one: TMA fills the box's columns past the tensor's with zeros,
which add nothing to any product, and clips them from every store (the pointer
store of a varlen slab masks them).

Both kernels have one shape: each consumer warpgroup owns 64 rows of two
tensors, loaded once, and two others stream past through a ring (`Buffers`);
the per-tile math is the portable kernels' helpers (probs, softcap_grad,
row_stats), called as they are.

dQ, `attention_bwd_dq_sm90_kernel`. One CTA per work tile: BLOCK_M query
rows of one (batch, q head), 64 per consumer warpgroup. A producer warpgroup (one thread issues every TMA copy)
loads each consumer's Q and dO rows once, then the tile's K / V tiles through
a ring of STAGES buffers with ready / empty mbarriers. A consumer, per key
tile, issues S = Q K^T and dP = dO V^T as asynchronous warpgroup MMAs (both
operands in shared memory), then P = exp2(S * scale - lse) from the forward's
LSE, dS = P * (dP - delta), and dQ += dS K with dS from registers as the
product's A operand. dQ [64, HEAD_DIM] fp32 stays in registers; scaled once,
it leaves through the Q buffer by TMA. Each consumer walks the tiles its own
rows see (kernels/mask.py's row_tiles): masked edges, an unmasked middle, the
work tile's other tiles released unread.

dK / dV, `attention_bwd_dkdv_sm90_kernel`. One CTA per (key block, KV head,
batch), 64 keys per consumer warpgroup, whose K and V rows the producer loads
once; then the query tiles that see the block (key_range with the roles of
queries and keys exchanged, as the portable kernel's), for each query head of
the group in order, stream through a ring of Q / dO buffers. A consumer, per
query tile, issues S^T = K Q^T and dP^T = V dO^T (its 64 keys in rows), so P^T
and dS^T = P^T * (dP^T - delta) come out in the accumulator layout the next
products take as their register A operand: dV += P^T dO and dK += dS^T Q, both
B operands straight from the ring. dK and dV [64, HEAD_DIM(_V)] fp32 stay in
registers across the group's heads (a fixed order: deterministic, no atomics)
and leave by TMA through the K / V buffers. Keys past n_k need no mask: their
rows are never stored. Each query tile's LSE and delta rows are staged in
shared memory by the producer beside the tile's dO (the dQ kernel's consumers
load their own rows' once, from global memory).

Gluon does not run under the Triton interpreter: the CPU suite compiles these
kernels for sm_90 (ops/sm90_bwd.py) and the GPU tests check their numbers.
"""

from vflash.kernels.attention_bwd import probs, row_stats, softcap_grad
from vflash.kernels.gluon_sm90 import HAVE_GLUON
from vflash.kernels.mask import key_range, key_tiles, masked_logits, row_tiles
from vflash.kernels.seqlen import sequence

if HAVE_GLUON:
    from vflash.kernels.gluon_sm90 import (aggregate, fence_async_shared, gl, gluon, mbarrier, tma, tma_load,
                                           tma_store, warpgroup_mma, warpgroup_mma_wait, zero_rows_from)

    @aggregate
    class Config:
        """The kernel's tiles and switches, as partition arguments (a plain tuple's constexprs would
        reach a partition as runtime values). dQ: BLOCK_M rows a CTA, BLOCK_N keys a streamed tile;
        dK / dV: BLOCK_N keys a CTA, BLOCK_M rows a streamed tile. IS_VARLEN: packed sequences
        (cu_seqlens), TOP_LEFT their causal alignment."""
        BLOCK_M: gl.constexpr
        BLOCK_N: gl.constexpr
        HEAD_DIM: gl.constexpr  # q's and k's tile columns
        HEAD_DIM_V: gl.constexpr  # v's and dO's
        QK_COLS: gl.constexpr  # q's and k's columns in memory (HEAD_DIM's tiles pad the rest with zeros)
        V_COLS: gl.constexpr
        STAGES: gl.constexpr
        HAS_LEFT: gl.constexpr
        HAS_RIGHT: gl.constexpr
        SOFTCAP: gl.constexpr
        IS_VARLEN: gl.constexpr
        TOP_LEFT: gl.constexpr
        WANT_DK: gl.constexpr  # dK / dV kernel: which gradients it computes (dQ kernel: both True, unread)
        WANT_DV: gl.constexpr

        @gluon.constexpr_function
        def __init__(self, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, QK_COLS, V_COLS, STAGES, HAS_LEFT, HAS_RIGHT,
                     SOFTCAP, IS_VARLEN, TOP_LEFT, WANT_DK=True, WANT_DV=True):
            for name, value in (("BLOCK_M", BLOCK_M), ("BLOCK_N", BLOCK_N), ("HEAD_DIM", HEAD_DIM),
                                ("HEAD_DIM_V", HEAD_DIM_V), ("QK_COLS", QK_COLS), ("V_COLS", V_COLS),
                                ("STAGES", STAGES), ("HAS_LEFT", HAS_LEFT), ("HAS_RIGHT", HAS_RIGHT),
                                ("SOFTCAP", SOFTCAP), ("IS_VARLEN", IS_VARLEN), ("TOP_LEFT", TOP_LEFT),
                                ("WANT_DK", WANT_DK), ("WANT_DV", WANT_DV)):
                setattr(self, name, gl.constexpr(value))

    @aggregate
    class Call:
        """The runtime scalars as IR values (partition arguments must be: Triton makes an integer
        argument equal to 1 a constant). n_blocks: a (batch, head)'s CTAs, n_heads: dQ's query
        heads, dK / dV's KV heads; n_q / n_k: the lengths (varlen: the longest), total_q: LSE's
        head stride under varlen, out_stride_row / out_stride_head: the packed outputs' strides
        for the stores of a slab that crosses its sequence's end (varlen)."""
        n_blocks: gl.tensor
        n_heads: gl.tensor
        kv_group: gl.tensor
        n_q: gl.tensor
        n_k: gl.tensor
        off: gl.tensor
        left: gl.tensor
        right: gl.tensor
        qk_scale: gl.tensor
        sm_scale: gl.tensor
        softcap_in: gl.tensor
        softcap_out: gl.tensor
        total_q: gl.tensor
        out_stride_row: gl.tensor
        out_stride_head: gl.tensor

        @gluon.constexpr_function
        def __init__(self, n_blocks, n_heads, kv_group, n_q, n_k, off, left, right, qk_scale, sm_scale, softcap_in,
                     softcap_out, total_q, out_stride_row, out_stride_head):
            self.n_blocks, self.n_heads, self.kv_group, self.n_q, self.n_k = n_blocks, n_heads, kv_group, n_q, n_k
            self.off, self.left, self.right = off, left, right
            self.qk_scale, self.sm_scale = qk_scale, sm_scale
            self.softcap_in, self.softcap_out = softcap_in, softcap_out
            self.total_q, self.out_stride_row, self.out_stride_head = total_q, out_stride_row, out_stride_head

    @aggregate
    class Work:
        """One CTA's work: its sequence (batch entry) and head (dQ: a query head; dK / dV: a KV
        head), the descriptors' batch coordinate and the sequence's first query and key rows in
        them (dense: the batch, 0, 0; varlen, over [1, H, total, D]: 0 and cu_seqlens' starts),
        the CTA's first own row in its sequence (dQ: query, dK / dV: key), and the sequence's
        lengths and band offset."""
        off_b: gl.tensor
        off_h: gl.tensor
        desc_b: gl.tensor
        q_row: gl.tensor
        k_row: gl.tensor
        start: gl.tensor
        n_q: gl.tensor
        n_k: gl.tensor
        off: gl.tensor

        @gluon.constexpr_function
        def __init__(self, off_b, off_h, desc_b, q_row, k_row, start, n_q, n_k, off):
            self.off_b, self.off_h, self.desc_b, self.q_row, self.k_row = off_b, off_h, desc_b, q_row, k_row
            self.start, self.n_q, self.n_k, self.off = start, n_q, n_k, off

    @aggregate
    class Buffers:
        """Shared memory: each consumer's own rows of two tensors (own_a, own_b: dQ's Q and dO,
        dK / dV's K and V) under one ready barrier, and STAGES tiles of the two it streams (ring_a,
        ring_b: dQ's K and V, dK / dV's Q and dO), each with ready / empty barriers. stats
        (dK / dV): each ring slot's LSE (log2 units) and delta rows [2 * STAGES, RING_ROWS] fp32 (slot s:
        rows 2 s and 2 s + 1), written by the producer under the slot's b_ready (dQ: one unused element)."""
        own_a: gl.shared_memory_descriptor
        own_b: gl.shared_memory_descriptor
        ring_a: gl.shared_memory_descriptor
        ring_b: gl.shared_memory_descriptor
        own_ready: gl.shared_memory_descriptor
        a_ready: gl.shared_memory_descriptor
        b_ready: gl.shared_memory_descriptor
        a_empty: gl.shared_memory_descriptor
        b_empty: gl.shared_memory_descriptor
        stats: gl.shared_memory_descriptor

        @gluon.constexpr_function
        def __init__(self, own_a, own_b, ring_a, ring_b, own_ready, a_ready, b_ready, a_empty, b_empty, stats):
            self.own_a, self.own_b, self.ring_a, self.ring_b = own_a, own_b, ring_a, ring_b
            self.own_ready, self.a_ready, self.b_ready, self.a_empty, self.b_empty = (own_ready, a_ready, b_ready,
                                                                                      a_empty, b_empty)
            self.stats = stats

    @gluon.jit
    def _buffers(own_a_desc, own_b_desc, ring_a_desc, ring_b_desc, NUM_CONSUMERS: gl.constexpr,
                 RING_ROWS: gl.constexpr, STATS: gl.constexpr, cfg):
        # Buffers and their barriers, initialised: own tiles of 64 rows, ring tiles of RING_ROWS, the a
        # tensors (Q, K) HEAD_DIM columns and the b ones (dO, V) HEAD_DIM_V; STATS: the ring tiles' LSE and
        # delta rows beside them (the dK / dV kernel).
        ROWS: gl.constexpr = 64
        HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
        HEAD_DIM_V: gl.constexpr = cfg.HEAD_DIM_V
        STAGES: gl.constexpr = cfg.STAGES
        dtype: gl.constexpr = own_a_desc.dtype
        own_a = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, 1, 1, ROWS, HEAD_DIM], own_a_desc.layout)
        own_b = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, 1, 1, ROWS, HEAD_DIM_V], own_b_desc.layout)
        ring_a = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, RING_ROWS, HEAD_DIM], ring_a_desc.layout)
        ring_b = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, RING_ROWS, HEAD_DIM_V], ring_b_desc.layout)
        own_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
        a_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        a_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_CONSUMERS):
            mbarrier.init(own_ready.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(a_ready.index(i), count=1)
            mbarrier.init(b_ready.index(i), count=2 if STATS else 1)  # STATS: dO's TMA, the stats' store
            mbarrier.init(a_empty.index(i), count=NUM_CONSUMERS)  # one arrival per consumer
            mbarrier.init(b_empty.index(i), count=NUM_CONSUMERS)
        fence_async_shared()
        stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        if STATS:
            stats = gl.allocate_shared_memory(gl.float32, [2 * STAGES, RING_ROWS], stats_layout)
        else:
            stats = gl.allocate_shared_memory(gl.float32, [1, 1], stats_layout)
        return Buffers(own_a, own_b, ring_a, ring_b, own_ready, a_ready, b_ready, a_empty, b_empty, stats)

    @gluon.constexpr_function
    def _acc_layout(cols):
        # a consumer warpgroup's wgmma accumulator [64, cols] over its 4 warps: S / dP (cols the
        # streamed tile's rows) or a gradient (cols = HEAD_DIM, dV's HEAD_DIM_V)
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cols, 16])

    @gluon.constexpr_function
    def _operand_layout(cols):
        # P^T, dS^T or dS in registers as the A operand of a product into a [64, cols] accumulator
        return gl.DotOperandLayout(operand_index=0, parent=_acc_layout(cols), k_width=2)

    @gluon.jit
    def _call(n_blocks, n_heads, kv_group, n_q, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
              total_q, out_stride_row, out_stride_head):
        return Call(gl.to_tensor(n_blocks), gl.to_tensor(n_heads), gl.to_tensor(kv_group), gl.to_tensor(n_q),
                    gl.to_tensor(n_k), gl.to_tensor(off), gl.to_tensor(left), gl.to_tensor(right),
                    gl.to_tensor(qk_scale), gl.to_tensor(sm_scale), gl.to_tensor(softcap_in),
                    gl.to_tensor(softcap_out), gl.to_tensor(total_q), gl.to_tensor(out_stride_row),
                    gl.to_tensor(out_stride_head))

    @gluon.jit
    def _work(call, cu_seqlens_q, cu_seqlens_k, OWN: gl.constexpr, cfg):
        # This CTA's Work: CTA t takes own-row block t % n_blocks of (sequence, head) t // n_blocks,
        # OWN rows a block; the
        # sequence's rows from seqlen.sequence (shared with the forward kernels). A varlen CTA
        # past its sequence's own rows has no work (start >= its length).
        t = gl.program_id(0)
        pid = t % call.n_blocks
        bh = t // call.n_blocks
        off_h = bh % call.n_heads
        off_b = bh // call.n_heads
        q_row, k_row, n_q, n_k, off = sequence(off_b, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k, call.n_q, call.n_k,
                                               call.off, cfg.IS_VARLEN, False, cfg.TOP_LEFT)
        if cfg.IS_VARLEN:
            desc_b = gl.to_tensor(0)
            q_row = q_row.to(gl.int32)
            k_row = k_row.to(gl.int32)
        else:
            desc_b = off_b
            q_row = gl.to_tensor(0)
            k_row = gl.to_tensor(0)
        return Work(off_b, off_h, desc_b, q_row, k_row, pid * OWN, gl.to_tensor(n_q), gl.to_tensor(n_k),
                    gl.to_tensor(off))

    @gluon.jit
    def _streamed_tiles(w, call, OWN: gl.constexpr, STREAMED: gl.constexpr, OWN_KEYS: gl.constexpr, cfg):
        # The work tile's streamed rows: the first that any of its OWN rows sees (lo, counted in
        # the sequence) and the number of STREAMED-row tiles from there. The dQ kernel owns queries
        # and streams keys (key_range as the forward's); the dK / dV kernel (OWN_KEYS) owns keys and
        # streams queries: the band with its edges exchanged and its offset negated.
        if OWN_KEYS:
            lo, full_lo, full_hi, hi = key_range(w.start, w.n_q, -w.off, call.right, call.left, OWN, STREAMED,
                                                 cfg.HAS_RIGHT, cfg.HAS_LEFT)
        else:
            lo, full_lo, full_hi, hi = key_range(w.start, w.n_k, w.off, call.left, call.right, OWN, STREAMED,
                                                 cfg.HAS_LEFT, cfg.HAS_RIGHT)
        return lo, key_tiles(lo, full_lo, full_hi, hi, STREAMED)[2]

    @gluon.jit
    def _consumer_tiles(w, call, row0, lo, n_tiles, STREAMED: gl.constexpr, OWN_KEYS: gl.constexpr, cfg):
        # A consumer's 64 own rows from row0 against the work tile's n_tiles streamed tiles, as
        # row_tiles splits them (masked left edge, unmasked middle, masked right edge; tiles from
        # the last one on unseen), the roles as _streamed_tiles'.
        ROWS: gl.constexpr = 64
        if OWN_KEYS:
            c_left, c_mid, c_end = row_tiles(row0, lo, n_tiles, w.n_k, w.n_q, -w.off, call.right, call.left, ROWS,
                                             STREAMED, cfg.HAS_RIGHT, cfg.HAS_LEFT)
        else:
            c_left, c_mid, c_end = row_tiles(row0, lo, n_tiles, w.n_q, w.n_k, w.off, call.left, call.right, ROWS,
                                             STREAMED, cfg.HAS_LEFT, cfg.HAS_RIGHT)
        return c_left, c_mid, c_end

    @gluon.jit
    def _has_work(start, rows, cfg):
        # Whether a CTA's first own row is inside its sequence: varlen's grid covers the longest
        # sequence; a dense grid has no CTA past the end (a constant, so no branch is compiled).
        if cfg.IS_VARLEN:
            return start < rows
        else:
            return True

    @gluon.jit
    def _stats_base(work, head, n_heads_q, call, cfg):
        # Offset of query head `head`'s first row of this sequence in LSE / DELTA: [B, Hq, n_q]
        # dense, [Hq, total_q] varlen.
        if cfg.IS_VARLEN:
            return head.to(gl.int64) * call.total_q + work.q_row
        else:
            return (work.off_b.to(gl.int64) * n_heads_q + head) * call.n_q

    @gluon.jit
    def _load_own(a_desc, b_desc, off_b, off_h, row, bufs, c):
        # Consumer c's own 64 rows of both tensors, under one barrier.
        ready = bufs.own_ready.index(c)
        mbarrier.expect(ready, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma_load(a_desc, [off_b, off_h, row, 0], ready, bufs.own_a.index(c))
        tma_load(b_desc, [off_b, off_h, row, 0], ready, bufs.own_b.index(c))

    @gluon.jit
    def _load_ring(desc, off_b, off_h, row, ring, ready, empty, j, STAGES: gl.constexpr):
        # Streamed tile j into ring slot j % STAGES once every consumer released the slot's
        # previous tile (a fresh barrier's parity-1 phase counts as complete, so the first
        # STAGES waits pass at once).
        slot = j % STAGES
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
        tma_load(desc, [off_b, off_h, row, 0], ready.index(slot), ring.index(slot))

    @gluon.jit
    def _dq_load_partition(q_desc, k_desc, v_desc, do_desc, bufs, call, cu_seqlens_q, cu_seqlens_k, cfg):
        # Producer: each consumer's Q and dO rows, then the work tile's K and V tiles.
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = cfg.BLOCK_M
        BLOCK_N: gl.constexpr = cfg.BLOCK_N
        w = _work(call, cu_seqlens_q, cu_seqlens_k, BLOCK_M, cfg)
        if _has_work(w.start, w.n_q, cfg):
            off_hk = w.off_h // call.kv_group
            for c in gl.static_range(BLOCK_M // ROWS):
                _load_own(q_desc, do_desc, w.desc_b, w.off_h, w.q_row + w.start + c * ROWS, bufs, c)
            lo, n_tiles = _streamed_tiles(w, call, BLOCK_M, BLOCK_N, False, cfg)
            for i in range(n_tiles):
                row = w.k_row + lo + i * BLOCK_N
                _load_ring(k_desc, w.desc_b, off_hk, row, bufs.ring_a, bufs.a_ready, bufs.a_empty, i, cfg.STAGES)
                _load_ring(v_desc, w.desc_b, off_hk, row, bufs.ring_b, bufs.b_ready, bufs.b_empty, i, cfg.STAGES)

    @gluon.jit
    def _skip_tiles(bufs, first, last, STAGES: gl.constexpr):
        # Ring tiles [first, last) that none of this consumer's rows see: each released once it
        # has landed (an earlier arrival would count towards the release of the slot's previous
        # tile, which the other consumer may still be reading).
        for j in range(first, last):
            slot = j % STAGES
            phase = (j // STAGES) & 1
            mbarrier.wait(bufs.a_ready.index(slot), phase)
            mbarrier.arrive(bufs.a_empty.index(slot), count=1)
            mbarrier.wait(bufs.b_ready.index(slot), phase)
            mbarrier.arrive(bufs.b_empty.index(slot), count=1)

    @gluon.jit
    def _score_products(own_a, own_b, bufs, slot, phase, valid, RING_ROWS: gl.constexpr, layout: gl.constexpr,
                        SECOND: gl.constexpr, TAIL: gl.constexpr, cfg):
        # The two products a tile pair starts with, own rows against the ring slot's tiles as they
        # land: own_a ring_a^T (dQ: S = Q K^T; dK / dV: S^T = K Q^T) and own_b ring_b^T (dP = dO V^T;
        # dP^T = V dO^T). Returns the first done and the second possibly still running (the caller
        # waits for it where it needs it), and the two ring tiles. Without SECOND (a dV-only dK / dV
        # kernel needs no dP^T) the second product is not issued and the first stands in for it.
        # TAIL (varlen, masked tiles): ring rows from `valid` on belong to the next sequence and are
        # zeroed before any product reads them (the products that weight them by zero would not
        # cancel an inf or NaN).
        ROWS: gl.constexpr = 64
        mbarrier.wait(bufs.a_ready.index(slot), phase)
        a_tile = bufs.ring_a.index(slot).reshape([RING_ROWS, cfg.HEAD_DIM])
        b_tile = bufs.ring_b.index(slot).reshape([RING_ROWS, cfg.HEAD_DIM_V])
        if TAIL:
            if valid < RING_ROWS:
                zero_rows_from(a_tile, valid, RING_ROWS, cfg.HEAD_DIM)
        first = warpgroup_mma(own_a, a_tile.permute((1, 0)), gl.zeros([ROWS, RING_ROWS], gl.float32, layout),
                              use_acc=False, is_async=True)
        mbarrier.wait(bufs.b_ready.index(slot), phase)
        if TAIL:
            if valid < RING_ROWS:
                zero_rows_from(b_tile, valid, RING_ROWS, cfg.HEAD_DIM_V)
        if SECOND:
            second = warpgroup_mma(own_b, b_tile.permute((1, 0)), gl.zeros([ROWS, RING_ROWS], gl.float32, layout),
                                   use_acc=False, is_async=True)
            first, a_tile = warpgroup_mma_wait(1, deps=(first, a_tile))
        else:
            first, a_tile = warpgroup_mma_wait(0, deps=(first, a_tile))
            second = first
        return first, second, a_tile, b_tile

    @gluon.jit
    def _store_rows(acc, buf, desc, work, head, row0, end, Out, strides, scale, acc_layout: gl.constexpr,
                    COLS: gl.constexpr, MEM_COLS: gl.constexpr, cfg):
        # One consumer's 64 output rows (dQ, dK or dV: acc * scale, COLS columns, MEM_COLS of them in
        # memory) from its own rows' buffer (no MMA reads it any more), rows [row0, row0 + 64) of the
        # descriptor's, its sequence's ending at `end`: by TMA, which clips rows past a dense tensor's
        # end and columns past MEM_COLS; a varlen slab that crosses its sequence's end by pointer, its
        # own rows and columns alone (TMA would overwrite the next sequence's first rows), Out's
        # strides (row, head).
        ROWS: gl.constexpr = 64
        tile = buf.reshape([ROWS, COLS])
        if cfg.IS_VARLEN:
            if row0 + ROWS <= end:
                tile.store((acc * scale).to(desc.dtype))
                fence_async_shared()
                tma_store(desc, [work.desc_b, head, row0, 0], buf)
            else:
                cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, acc_layout))
                rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_layout))
                stride_row, stride_head = strides
                ptrs = (Out + head.to(gl.int64) * stride_head + rows.to(gl.int64)[:, None] * stride_row
                        + cols[None, :])
                if MEM_COLS < COLS:
                    gl.store(ptrs, (acc * scale).to(desc.dtype), mask=(rows < end)[:, None] & (cols < MEM_COLS)[None, :])
                else:
                    gl.store(ptrs, (acc * scale).to(desc.dtype), mask=(rows < end)[:, None])
        else:
            tile.store((acc * scale).to(desc.dtype))
            fence_async_shared()
            tma_store(desc, [work.desc_b, head, row0, 0], buf)

    @gluon.jit
    def _dq_tiles(dq, q_tile, do_tile, lse2, delta, bufs, first, last, lo, offs_m, n_k, off, call,
                  s_layout: gl.constexpr, ds_layout: gl.constexpr, MASKED: gl.constexpr, cfg):
        # Key tiles [first, last) of the work tile (counted from its first key lo): S = Q K^T and
        # dP = dO V^T issued together, P computed while dP runs, then dQ += dS K. n_k, off: the
        # sequence's keys and band offset. S and dP [64, BLOCK_N], dQ [64, HEAD_DIM]: wgmma
        # accumulators over the 4 warps.
        BLOCK_N: gl.constexpr = cfg.BLOCK_N
        STAGES: gl.constexpr = cfg.STAGES
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        for i in range(first, last):
            slot = i % STAGES
            phase = (i // STAGES) & 1
            key = lo + i * BLOCK_N
            s, dp, k_tile, v_tile = _score_products(q_tile, do_tile, bufs, slot, phase, n_k - key, BLOCK_N, s_layout,
                                                    True, cfg.IS_VARLEN and MASKED, cfg)
            # Key indices relative to the tile, as the forward's (the shift goes into the bounds).
            logits = masked_logits(s, offs_m, cols, n_k - key, off - key, call.left, call.right,
                                   call.softcap_in, call.softcap_out, MASKED, cfg.HAS_LEFT, cfg.HAS_RIGHT,
                                   cfg.SOFTCAP)
            p = probs(logits, lse2, call.qk_scale, 0, cfg.SOFTCAP)
            dp, v_tile = warpgroup_mma_wait(0, deps=(dp, v_tile))
            mbarrier.arrive(bufs.b_empty.index(slot), count=1)
            ds = softcap_grad(p * (dp - delta[:, None]), s, call.softcap_in, cfg.SOFTCAP)
            ds_op = gl.convert_layout(ds.to(q_tile.dtype), ds_layout)
            dq = warpgroup_mma(ds_op, k_tile, dq, is_async=True)
            dq, ds_op, k_tile = warpgroup_mma_wait(0, deps=(dq, ds_op, k_tile))
            mbarrier.arrive(bufs.a_empty.index(slot), count=1)
        return dq

    @gluon.jit
    def _dq_consumer_partition(dq_desc, LSE, DELTA, DQ, bufs, call, cu_seqlens_q, cu_seqlens_k, C: gl.constexpr,
                               cfg):
        # Consumer C: rows [start + 64 C, + 64) of the work tile against the key tiles they see
        # (row_tiles: masked edges, unmasked middle; the work tile's tiles past them skipped).
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = cfg.BLOCK_M
        BLOCK_N: gl.constexpr = cfg.BLOCK_N
        HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
        s_layout: gl.constexpr = _acc_layout(BLOCK_N)
        dq_layout: gl.constexpr = _acc_layout(HEAD_DIM)
        ds_layout: gl.constexpr = _operand_layout(HEAD_DIM)
        w = _work(call, cu_seqlens_q, cu_seqlens_k, BLOCK_M, cfg)
        if _has_work(w.start, w.n_q, cfg):
            row0 = w.start + C * ROWS
            offs_m = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
            base = _stats_base(w, w.off_h, call.n_heads, call, cfg)
            lse2, delta = row_stats(LSE + base, DELTA + base, offs_m, w.n_q, True)
            lo, n_tiles = _streamed_tiles(w, call, BLOCK_M, BLOCK_N, False, cfg)
            c_left, c_mid, c_end = _consumer_tiles(w, call, row0, lo, n_tiles, BLOCK_N, False, cfg)
            q_tile = bufs.own_a.index(C).reshape([ROWS, HEAD_DIM])
            do_tile = bufs.own_b.index(C).reshape([ROWS, cfg.HEAD_DIM_V])
            mbarrier.wait(bufs.own_ready.index(C), 0)
            dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, dq_layout)
            dq = _dq_tiles(dq, q_tile, do_tile, lse2, delta, bufs, 0, c_left, lo, offs_m, w.n_k, w.off, call,
                           s_layout, ds_layout, True, cfg)
            dq = _dq_tiles(dq, q_tile, do_tile, lse2, delta, bufs, c_left, c_mid, lo, offs_m, w.n_k, w.off, call,
                           s_layout, ds_layout, False, cfg)
            dq = _dq_tiles(dq, q_tile, do_tile, lse2, delta, bufs, c_mid, c_end, lo, offs_m, w.n_k, w.off, call,
                           s_layout, ds_layout, True, cfg)
            _skip_tiles(bufs, c_end, n_tiles, cfg.STAGES)
            if row0 < w.n_q:
                _store_rows(dq, bufs.own_a.index(C), dq_desc, w, w.off_h, w.q_row + row0, w.q_row + w.n_q, DQ,
                            (call.out_stride_row, call.out_stride_head), call.sm_scale, dq_layout, HEAD_DIM,
                            cfg.QK_COLS, cfg)
            tma.store_wait(0)

    @gluon.jit
    def attention_bwd_dq_sm90_kernel(
        q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, DELTA, cu_seqlens_q, cu_seqlens_k, DQ,
        batch, n_heads_q, kv_group, n_q, n_k, total_q, out_stride_row, out_stride_head, band, scales,
        HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr, QK_COLS: gl.constexpr, V_COLS: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        IS_VARLEN: gl.constexpr, TOP_LEFT: gl.constexpr,
    ):
        # grid = (B * Hq * cdiv(n_q, BLOCK_M), 1, 1), num_warps = 4 (the producer); BLOCK_M / 64
        # consumer warpgroups (1-3). Descriptors are 4-D over [B, H, N, D] (varlen: [1, H, total,
        # D] views of the packed tensors): q, dq in blocks [1, 1, 64, HEAD_DIM], do in [1, 1, 64,
        # HEAD_DIM_V], k in [1, 1, BLOCK_N, HEAD_DIM], v in [1, 1, BLOCK_N, HEAD_DIM_V]. LSE and DELTA are [B, Hq, n_q] fp32 (varlen: [Hq, total_q]; the
        # forward's natural-log LSE; rowsum(dO * O)). Varlen: cu_seqlens_q / _k [B + 1] int32,
        # n_q / n_k the longest sequence's, DQ the packed dq [total_q, Hq, D] with its row and head
        # strides (a slab crossing its sequence's end is stored by pointer); dense: all None / 0.
        # band (off, left, right), scales (qk_scale, sm_scale, softcap_in, softcap_out).
        off, left, right = band
        qk_scale, sm_scale, softcap_in, softcap_out = scales
        NUM_CONSUMERS: gl.constexpr = BLOCK_M // 64
        gl.static_assert(NUM_CONSUMERS >= 1 and NUM_CONSUMERS <= 3, "one to three consumer warpgroups of 64 rows")
        cfg = Config(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, QK_COLS, V_COLS, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                     IS_VARLEN, TOP_LEFT)
        bufs = _buffers(q_desc, do_desc, k_desc, v_desc, NUM_CONSUMERS, BLOCK_N, False, cfg)
        call = _call(gl.cdiv(n_q, BLOCK_M), n_heads_q, kv_group, n_q, n_k, off, left, right, qk_scale, sm_scale,
                     softcap_in, softcap_out, total_q, out_stride_row, out_stride_head)
        load = (q_desc, k_desc, v_desc, do_desc, bufs, call, cu_seqlens_q, cu_seqlens_k, cfg)
        # One warp_specialize per consumer count: the frontend takes the partition list only as a literal.
        if NUM_CONSUMERS == 1:
            gl.warp_specialize([
                (_dq_load_partition, load),
                (_dq_consumer_partition, (dq_desc, LSE, DELTA, DQ, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                          gl.constexpr(0), cfg)),
            ], [4], [CONSUMER_REGS])
        elif NUM_CONSUMERS == 2:
            gl.warp_specialize([
                (_dq_load_partition, load),
                (_dq_consumer_partition, (dq_desc, LSE, DELTA, DQ, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                          gl.constexpr(0), cfg)),
                (_dq_consumer_partition, (dq_desc, LSE, DELTA, DQ, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                          gl.constexpr(1), cfg)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_dq_load_partition, load),
                (_dq_consumer_partition, (dq_desc, LSE, DELTA, DQ, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                          gl.constexpr(0), cfg)),
                (_dq_consumer_partition, (dq_desc, LSE, DELTA, DQ, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                          gl.constexpr(1), cfg)),
                (_dq_consumer_partition, (dq_desc, LSE, DELTA, DQ, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                          gl.constexpr(2), cfg)),
            ], [4, 4, 4], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])

    @gluon.jit
    def _dkdv_load_partition(q_desc, k_desc, v_desc, do_desc, bufs, call, cu_seqlens_q, cu_seqlens_k, LSE, DELTA,
                             cfg):
        # Producer: each consumer's K and V rows, then for each query head of the group and each
        # query tile that sees the block, Q and dO, and the tile's LSE and delta rows (row_stats'
        # masked values, stored to the slot's stats before the second b_ready arrival: the consumers
        # read them with dO, and a row past n_q holds finite values).
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = cfg.BLOCK_M  # query rows a ring tile
        BLOCK_N: gl.constexpr = cfg.BLOCK_N  # keys a CTA
        w = _work(call, cu_seqlens_q, cu_seqlens_k, BLOCK_N, cfg)
        if _has_work(w.start, w.n_k, cfg):
            for c in gl.static_range(BLOCK_N // ROWS):
                _load_own(k_desc, v_desc, w.desc_b, w.off_h, w.k_row + w.start + c * ROWS, bufs, c)
            lo, n_tiles = _streamed_tiles(w, call, BLOCK_N, BLOCK_M, True, cfg)
            # the stats rows over the producer's 4 warps
            rows_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            j = 0
            for g in range(call.kv_group):
                off_h = w.off_h * call.kv_group + g
                base = _stats_base(w, off_h, call.n_heads * call.kv_group, call, cfg)
                for i in range(n_tiles):
                    row = w.q_row + lo + i * BLOCK_M
                    _load_ring(q_desc, w.desc_b, off_h, row, bufs.ring_a, bufs.a_ready, bufs.a_empty, j, cfg.STAGES)
                    _load_ring(do_desc, w.desc_b, off_h, row, bufs.ring_b, bufs.b_ready, bufs.b_empty, j,
                               cfg.STAGES)
                    offs = lo + i * BLOCK_M + gl.arange(0, BLOCK_M, layout=rows_layout)
                    lse2, delta = row_stats(LSE + base, DELTA + base, offs, w.n_q, True)
                    bufs.stats.index(2 * (j % cfg.STAGES)).store(lse2)
                    bufs.stats.index(2 * (j % cfg.STAGES) + 1).store(delta)
                    mbarrier.arrive(bufs.b_ready.index(j % cfg.STAGES), count=1)
                    j += 1

    @gluon.jit
    def _dkdv_tiles(dk, dv, k_tile, v_tile, bufs, ring, first, last, lo, offs_n, n_q, off, call,
                    st_layout: gl.constexpr, op_layout: gl.constexpr, pt_layout: gl.constexpr, MASKED: gl.constexpr,
                    cfg):
        # Query tiles [first, last) of the key block (counted from its first query lo), ring tile
        # ring + i: S^T = K Q^T and dP^T = V dO^T issued together; P^T computed while dP^T runs and
        # dV += P^T dO issued before dS^T is, so it runs while dS^T is computed; then dK += dS^T Q.
        # n_q, off: the sequence's query rows and band offset. S^T and dP^T [64, BLOCK_M], dK [64,
        # HEAD_DIM] and dV [64, HEAD_DIM_V]: wgmma accumulators over the 4 warps (dS^T in op_layout, P^T
        # in pt_layout: their products' A operands). cfg.WANT_DK / WANT_DV: only one of
        # the gradients (and only the products it needs), when both accumulators do not fit in
        # registers (D 256).
        BLOCK_M: gl.constexpr = cfg.BLOCK_M
        STAGES: gl.constexpr = cfg.STAGES
        dtype: gl.constexpr = k_tile.dtype
        cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        for i in range(first, last):
            j = ring + i
            slot = j % STAGES
            phase = (j // STAGES) & 1
            row = lo + i * BLOCK_M
            st, dpt, q_tile, do_tile = _score_products(k_tile, v_tile, bufs, slot, phase, n_q - row, BLOCK_M,
                                                       st_layout, cfg.WANT_DK, cfg.IS_VARLEN and MASKED, cfg)
            # the tile's LSE and delta rows: landed with dO (b_ready), released with it (b_empty)
            lse2 = bufs.stats.index(2 * slot).load(gl.SliceLayout(0, st_layout))
            delta = bufs.stats.index(2 * slot + 1).load(gl.SliceLayout(0, st_layout))
            # Key j (row) sees query i (column) when j - off - right <= i <= j - off + left:
            # masked_logits' band with the edges exchanged and the offset negated, the query
            # indices relative to the tile (the shift goes into the bounds).
            logits = masked_logits(st, offs_n, cols, n_q - row, -off - row, call.right, call.left,
                                   call.softcap_in, call.softcap_out, MASKED, cfg.HAS_RIGHT, cfg.HAS_LEFT,
                                   cfg.SOFTCAP)
            pt = probs(logits, lse2, call.qk_scale, 1, cfg.SOFTCAP)
            # P^T and dS^T rounded to the inputs' dtype for the products, as the portable kernel's
            if cfg.WANT_DV:
                pt_op = gl.convert_layout(pt.to(dtype), pt_layout)
                dv = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
            if cfg.WANT_DK:
                if cfg.WANT_DV:
                    dpt, do_tile = warpgroup_mma_wait(1, deps=(dpt, do_tile))  # dP^T is done; dV may still run
                else:
                    dpt, do_tile = warpgroup_mma_wait(0, deps=(dpt, do_tile))
                dst = softcap_grad(pt * (dpt - delta[None, :]), st, call.softcap_in, cfg.SOFTCAP)
                dst_op = gl.convert_layout(dst.to(dtype), op_layout)
                dk = warpgroup_mma(dst_op, q_tile, dk, is_async=True)
                if cfg.WANT_DV:
                    dv, dk, pt_op, dst_op, q_tile, do_tile = warpgroup_mma_wait(
                        0, deps=(dv, dk, pt_op, dst_op, q_tile, do_tile))
                else:
                    dk, dst_op, q_tile, do_tile = warpgroup_mma_wait(0, deps=(dk, dst_op, q_tile, do_tile))
            else:
                dv, pt_op, do_tile = warpgroup_mma_wait(0, deps=(dv, pt_op, do_tile))
            mbarrier.arrive(bufs.a_empty.index(slot), count=1)
            mbarrier.arrive(bufs.b_empty.index(slot), count=1)
        return dk, dv

    @gluon.jit
    def _dkdv_consumer_partition(dk_desc, dv_desc, DK, DV, bufs, call, cu_seqlens_q, cu_seqlens_k, C: gl.constexpr,
                                 cfg):
        # Consumer C: keys [start + 64 C, + 64) against the query tiles they see, for each query
        # head of the group in order (row_tiles with the roles exchanged: masked edges, unmasked
        # middle; the block's tiles past them skipped).
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = cfg.BLOCK_M
        BLOCK_N: gl.constexpr = cfg.BLOCK_N
        HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
        st_layout: gl.constexpr = _acc_layout(BLOCK_M)
        HEAD_DIM_V: gl.constexpr = cfg.HEAD_DIM_V
        acc_layout: gl.constexpr = _acc_layout(HEAD_DIM)
        op_layout: gl.constexpr = _operand_layout(HEAD_DIM)
        dv_layout: gl.constexpr = _acc_layout(HEAD_DIM_V)
        pt_layout: gl.constexpr = _operand_layout(HEAD_DIM_V)
        w = _work(call, cu_seqlens_q, cu_seqlens_k, BLOCK_N, cfg)
        if _has_work(w.start, w.n_k, cfg):
            row0 = w.start + C * ROWS
            offs_n = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, st_layout))
            lo, n_tiles = _streamed_tiles(w, call, BLOCK_N, BLOCK_M, True, cfg)
            c_left, c_mid, c_end = _consumer_tiles(w, call, row0, lo, n_tiles, BLOCK_M, True, cfg)
            k_tile = bufs.own_a.index(C).reshape([ROWS, HEAD_DIM])
            v_tile = bufs.own_b.index(C).reshape([ROWS, HEAD_DIM_V])
            mbarrier.wait(bufs.own_ready.index(C), 0)
            dk = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
            dv = gl.zeros([ROWS, HEAD_DIM_V], gl.float32, dv_layout)
            for g in range(call.kv_group):
                ring = g * n_tiles
                dk, dv = _dkdv_tiles(dk, dv, k_tile, v_tile, bufs, ring, 0, c_left, lo, offs_n, w.n_q, w.off, call,
                                     st_layout, op_layout, pt_layout, True, cfg)
                dk, dv = _dkdv_tiles(dk, dv, k_tile, v_tile, bufs, ring, c_left, c_mid, lo, offs_n, w.n_q, w.off,
                                     call, st_layout, op_layout, pt_layout, False, cfg)
                dk, dv = _dkdv_tiles(dk, dv, k_tile, v_tile, bufs, ring, c_mid, c_end, lo, offs_n, w.n_q, w.off,
                                     call, st_layout, op_layout, pt_layout, True, cfg)
                _skip_tiles(bufs, ring + c_end, ring + n_tiles, cfg.STAGES)
            # dK and dV out through this consumer's K and V buffers; TMA clips rows past a dense n_k.
            if row0 < w.n_k:
                if cfg.WANT_DK:
                    _store_rows(dk, bufs.own_a.index(C), dk_desc, w, w.off_h, w.k_row + row0, w.k_row + w.n_k, DK,
                                (call.out_stride_row, call.out_stride_head), call.sm_scale, acc_layout, HEAD_DIM,
                                cfg.QK_COLS, cfg)
                if cfg.WANT_DV:
                    if cfg.V_COLS == cfg.QK_COLS:
                        dv_strides = (call.out_stride_row, call.out_stride_head)
                    else:  # packed dk and dv contiguous (the launcher's check): rows of n_heads heads each
                        dv_strides = (call.n_heads * cfg.V_COLS, cfg.V_COLS)
                    _store_rows(dv, bufs.own_b.index(C), dv_desc, w, w.off_h, w.k_row + row0, w.k_row + w.n_k, DV,
                                dv_strides, 1.0, dv_layout, HEAD_DIM_V, cfg.V_COLS, cfg)
            tma.store_wait(0)

    @gluon.jit
    def attention_bwd_dkdv_sm90_kernel(
        q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA, cu_seqlens_q, cu_seqlens_k, DK, DV,
        batch, n_heads_kv, kv_group, n_q, n_k, total_q, out_stride_row, out_stride_head, band, scales,
        HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr, QK_COLS: gl.constexpr, V_COLS: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        IS_VARLEN: gl.constexpr, TOP_LEFT: gl.constexpr, WANT_DK: gl.constexpr, WANT_DV: gl.constexpr,
    ):
        # grid = (B * Hkv * cdiv(n_k, BLOCK_N), 1, 1), num_warps = 4 (the producer); BLOCK_N / 64
        # consumer warpgroups (1-3), BLOCK_M query rows a ring tile. Descriptors are 4-D over
        # [B, H, N, D] (varlen: [1, H, total, D] views): k, dk in blocks [1, 1, 64, HEAD_DIM], v, dv
        # in [1, 1, 64, HEAD_DIM_V], q in [1, 1, BLOCK_M, HEAD_DIM], do in [1, 1, BLOCK_M, HEAD_DIM_V].
        # LSE and DELTA are [B, Hq, n_q] fp32 (varlen: [Hq, total_q]). Varlen: as the dQ kernel's, DK /
        # DV the packed dk / dv [total_k, Hkv, D] / [.., D_v] (dk's strides given; dv's the same where
        # D_v is D, else both contiguous). WANT_DK / WANT_DV: the gradients it writes (at least one).
        # band and scales as the dQ kernel's.
        off, left, right = band
        qk_scale, sm_scale, softcap_in, softcap_out = scales
        NUM_CONSUMERS: gl.constexpr = BLOCK_N // 64
        gl.static_assert(NUM_CONSUMERS >= 1 and NUM_CONSUMERS <= 3, "one to three consumer warpgroups of 64 keys")
        gl.static_assert(WANT_DK or WANT_DV, "dK, dV or both")
        cfg = Config(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, QK_COLS, V_COLS, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                     IS_VARLEN, TOP_LEFT, WANT_DK, WANT_DV)
        bufs = _buffers(k_desc, v_desc, q_desc, do_desc, NUM_CONSUMERS, BLOCK_M, True, cfg)
        call = _call(gl.cdiv(n_k, BLOCK_N), n_heads_kv, kv_group, n_q, n_k, off, left, right, qk_scale, sm_scale,
                     softcap_in, softcap_out, total_q, out_stride_row, out_stride_head)
        load = (q_desc, k_desc, v_desc, do_desc, bufs, call, cu_seqlens_q, cu_seqlens_k, LSE, DELTA, cfg)
        if NUM_CONSUMERS == 1:
            gl.warp_specialize([
                (_dkdv_load_partition, load),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, DK, DV, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                            gl.constexpr(0), cfg)),
            ], [4], [CONSUMER_REGS])
        elif NUM_CONSUMERS == 2:
            gl.warp_specialize([
                (_dkdv_load_partition, load),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, DK, DV, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                            gl.constexpr(0), cfg)),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, DK, DV, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                            gl.constexpr(1), cfg)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_dkdv_load_partition, load),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, DK, DV, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                            gl.constexpr(0), cfg)),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, DK, DV, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                            gl.constexpr(1), cfg)),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, DK, DV, bufs, call, cu_seqlens_q, cu_seqlens_k,
                                            gl.constexpr(2), cfg)),
            ], [4, 4, 4], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])
