"""Fused attention forward for Hopper (sm_90), written in Gluon.

The same math and masking as `attention_fwd.py` (read that file's docstring
first), with the schedule written out instead of left to the compiler, in the
shape of FlashAttention-3:

- Persistent (without a right mask edge): one CTA per SM walks work tiles
  t = pid, pid + grid, ... A work tile is BLOCK_M query rows of one (batch,
  q head); tiles of one head are consecutive, so CTAs running side by side share
  that head's K/V in L2. With a right edge (causal) tiles differ in cost: the
  launcher's grid either strides by a count coprime to the row blocks per head,
  so every CTA cycles through all of them, or gives each tile its own CTA and
  lets the hardware balance (`ops/sm90.py:grid`).
- Warp-specialized: a producer warpgroup (one thread issues every TMA copy)
  and one, two or three consumer warpgroups of 64 query rows each (one: two
  CTAs share an SM, for short causal rows). K and V go through a ring of
  STAGES buffers with ready / empty mbarriers; the ring and the Q buffers carry
  over from one work tile to the next, so the producer loads the next tile while
  the consumers finish this one (Q too, where there is room for two Q buffers).
  Out-of-range rows are zero-filled by TMA.
- In a consumer, both products are asynchronous warpgroup MMAs (wgmma).
  Iteration j issues S_j = Q K_j^T, rescales O for tile j - 1 meanwhile, issues
  O += P_{j-1} V_{j-1}, waits for S_j only, and runs the softmax of tile j while
  the tensor cores still work on P_{j-1} V_{j-1} (so the source orders it; ptxas
  moves that wait up unless LATE_PV_WAIT pins it). P stays in registers as the A
  operand of the second MMA.
- PINGPONG: the consumers take turns to issue
  their products, as FlashAttention-3 orders its warpgroups, so one warpgroup's
  softmax overlaps another's MMAs.
- P_FP32: P goes from one iteration to the next in fp32 and is
  packed into the PV product's operand where that product is issued; without
  it, P is rounded where it is computed and carried packed two halves to a
  32-bit register (see _carried_p).
- LATE_PV_WAIT: keeps the wait for P_{j-1} V_{j-1} after the
  softmax of tile j in the SASS too, where ptxas would otherwise move it up.
- LAZY_RESCALE: FlashAttention-4's
  lazy reference max (softmax_step's SLACK: LAZY_SLACK, or E4M3_LAZY_SLACK for
  FP8's P), and each warp branches over O's rescale when all its rows have
  alpha == 1 (_rescale).

- IS_VARLEN: packed sequences ([total, H, D] with cu_seqlens, as
  attention_fwd_kernel takes them). The descriptors then cover [1, H, total, D]
  views; a work tile is BLOCK_M rows of one (sequence, q head), its rows and
  keys offset by the sequence's first rows (seqlen.sequence), its band from the
  sequence's own lengths. Rows and keys past a sequence's end are loaded (they
  belong to the next one, or to a cache's unused rows) and masked as the ragged
  tail is; each consumer zeroes the V rows past the end in shared memory before
  its last PV product (a zero P times an inf or NaN there would be NaN); a slab of output rows that
  crosses the end is stored with a masked pointer store instead of TMA, which
  would write into the next sequence.
- KV_CACHE: keys from a KV cache (attention_with_kvcache's chunked prefill):
  cache_seqlens[b] of them, the queries packed as varlen's, bottom-right. The
  cache is viewed as rows [1, Hkv, pages * page_size, D]. Contiguous
  (PAGE_SIZE 0): sequence b's keys start at row b * max_len. Paged: each K/V
  tile is BLOCK_N / PAGE_ROWS TMA copies of PAGE_ROWS = min(PAGE_SIZE, BLOCK_N)
  rows, each from the page the block table names (a power-of-two page size, so
  no copy straddles a page), or one copy of the tile's rows (kt_desc / vt_desc,
  blocks of BLOCK_N rows) where its pages are consecutive in the cache (a run,
  as a block allocator hands a sequence's pages out). Cache rows past a sequence's length may hold
  anything (NaN included): K there is masked, and V's rows there are zeroed in
  shared memory as varlen's are.

Gluon does not run under the Triton interpreter: this kernel is the GPU fast
path, and `attention_fwd_kernel` stays the portable one. Which switches each head
dim and mask takes, and when this kernel is chosen, is `vflash.dispatch`'s.
"""

from vflash.kernels.mask import key_range, key_tiles, masked_logits, row_tiles
from vflash.kernels.seqlen import sequence, tile_aligned_start
from vflash.kernels.paging import key_row
from vflash.kernels.softmax import LAZY_SLACK, softmax_finish, softmax_step
from vflash.kernels.tile import E4M3_LAZY_SLACK, P_E4M3_LOG2, descaled
from vflash.kernels.gluon_sm90 import HAVE_GLUON


# _rescale's asm over 16 accumulator values: outputs $0-$15 tied to inputs $16-$31,
# alphas $32-$47.
_RESCALE_ASM_TEXT = ("{\n.reg .pred same;\nsetp.eq.f32 same, $32, 0f3F800000;\n"
                     "setp.eq.and.f32 same, $34, 0f3F800000, same;\nvote.sync.all.pred same, same, 0xffffffff;\n"
                     "@same bra.uni SKIP;\n" + "".join(f"mul.f32 ${i}, ${i}, ${32 + i};\n" for i in range(16))
                     + "SKIP:\n}")
_RESCALE_CONSTRAINTS_TEXT = ",".join(["=r"] * 16 + [str(i) for i in range(16)] + ["r"] * 16)

if HAVE_GLUON:
    from vflash.kernels.gluon_sm90 import (aggregate, fence_async_shared, gl, gluon, mbarrier, ring, tma, tma_load,
                                           tma_store, warpgroup_mma, warpgroup_mma_wait,
                                           zero_rows_from)

    _RESCALE_ASM = gl.constexpr(_RESCALE_ASM_TEXT)
    _RESCALE_CONSTRAINTS = gl.constexpr(_RESCALE_CONSTRAINTS_TEXT)
    # _carried_p's packing of (lo, hi) into one register, lo in the low half.
    _CVT_F16X2 = gl.constexpr("cvt.rn.f16x2.f32 $0, $2, $1;")
    _CVT_BF16X2 = gl.constexpr("cvt.rn.bf16x2.f32 $0, $2, $1;")
    _F16_PAIR = gl.constexpr((gl.float16, gl.float16))
    _BF16_PAIR = gl.constexpr((gl.bfloat16, gl.bfloat16))
    # A work tile's index in tile_ids, stored and loaded as a [1] tensor (DYNAMIC).
    _ID_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))

    @aggregate
    class Config:
        """The kernel's tiles and switches (its constexprs), and the register
        layouts of a consumer's S, O and P (one warpgroup, 16 rows a warp)."""
        BLOCK_M: gl.constexpr
        BLOCK_N: gl.constexpr
        HEAD_DIM: gl.constexpr
        HEAD_DIM_V: gl.constexpr  # V's and the output's columns (HEAD_DIM, or a power of two of its own)
        QK_BLOCK: gl.constexpr  # Q's and K's columns a shared buffer holds: HEAD_DIM, or 64 where it is no power of two
        QK_CHUNKS: gl.constexpr  # HEAD_DIM // QK_BLOCK: Q K^T as that many wgmma chains into one accumulator
        POINTER_STORE: gl.constexpr  # the output through pointers: it does not fit the Q buffer (FP8, HEAD_DIM_V,
        # Q in chunks)
        STAGES: gl.constexpr
        Q_BUFFERS: gl.constexpr
        NUM_CONSUMERS: gl.constexpr
        HAS_LEFT: gl.constexpr
        HAS_RIGHT: gl.constexpr
        SOFTCAP: gl.constexpr
        STORE_LSE: gl.constexpr
        REVERSE_M: gl.constexpr
        PINGPONG: gl.constexpr
        P_FP32: gl.constexpr
        LATE_PV_WAIT: gl.constexpr
        LAZY_RESCALE: gl.constexpr
        DYNAMIC: gl.constexpr
        IS_VARLEN: gl.constexpr
        TOP_LEFT: gl.constexpr
        KV_CACHE: gl.constexpr
        PAGE_SIZE: gl.constexpr  # 0: a contiguous cache (or no cache)
        HAS_SINK: gl.constexpr
        IS_FP8: gl.constexpr  # e4m3 Q, K, V (V's keys contiguous: its ring tiles [HEAD_DIM, BLOCK_N])
        P_SHARED: gl.constexpr  # IS_FP8: P to the PV wgmma through shared memory (else from registers)
        LAZY_SLACK: gl.constexpr  # softmax_step's SLACK: LAZY_RESCALE's, for 16-bit or e4m3 P; else 0
        P_LOG2: gl.constexpr  # softmax_step's P_LOG2: FP8's P scale for e4m3's range (kernels/tile.py); else 0
        PAGE_ROWS: gl.constexpr  # rows a K/V copy: BLOCK_N, or a page's when pages are shorter
        S_LAYOUT: gl.constexpr  # [64, BLOCK_N] scores, a wgmma accumulator
        O_LAYOUT: gl.constexpr  # [64, HEAD_DIM_V] output, a wgmma accumulator
        P_LAYOUT: gl.constexpr  # [64, BLOCK_N] P as the PV product's register operand

        @gluon.constexpr_function
        def __init__(self, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, Q_BUFFERS, HAS_LEFT, HAS_RIGHT, SOFTCAP, STORE_LSE,
                     REVERSE_M, PINGPONG, P_FP32, LATE_PV_WAIT, LAZY_RESCALE, DYNAMIC, IS_VARLEN, TOP_LEFT, KV_CACHE,
                     PAGE_SIZE, HAS_SINK, IS_FP8, P_SHARED, HEAD_DIM_V, QK_BLOCK, POINTER_STORE):
            for name, value in (("BLOCK_M", BLOCK_M), ("BLOCK_N", BLOCK_N), ("HEAD_DIM", HEAD_DIM),
                                ("STAGES", STAGES), ("Q_BUFFERS", Q_BUFFERS), ("HAS_LEFT", HAS_LEFT),
                                ("HAS_RIGHT", HAS_RIGHT), ("SOFTCAP", SOFTCAP), ("STORE_LSE", STORE_LSE),
                                ("REVERSE_M", REVERSE_M), ("PINGPONG", PINGPONG), ("P_FP32", P_FP32),
                                ("LATE_PV_WAIT", LATE_PV_WAIT), ("LAZY_RESCALE", LAZY_RESCALE), ("DYNAMIC", DYNAMIC),
                                ("IS_VARLEN", IS_VARLEN), ("TOP_LEFT", TOP_LEFT), ("KV_CACHE", KV_CACHE),
                                ("PAGE_SIZE", PAGE_SIZE), ("HAS_SINK", HAS_SINK), ("IS_FP8", IS_FP8),
                                ("P_SHARED", P_SHARED), ("HEAD_DIM_V", HEAD_DIM_V), ("QK_BLOCK", QK_BLOCK),
                                ("POINTER_STORE", POINTER_STORE)):
                setattr(self, name, gl.constexpr(value))
            # FP8: P carried in fp32 and rounded to e4m3 where its product is issued (no 16-bit packing)
            self.P_FP32 = gl.constexpr(P_FP32 or IS_FP8)
            slack = (E4M3_LAZY_SLACK if IS_FP8 else LAZY_SLACK).value if LAZY_RESCALE else 0.0
            self.LAZY_SLACK = gl.constexpr(slack)
            self.P_LOG2 = gl.constexpr(P_E4M3_LOG2.value if IS_FP8 else 0.0)
            self.QK_CHUNKS = gl.constexpr(self.HEAD_DIM.value // self.QK_BLOCK.value)
            rows = self.BLOCK_N.value if PAGE_SIZE == 0 else min(PAGE_SIZE, self.BLOCK_N.value)
            self.PAGE_ROWS = gl.constexpr(rows)
            self.NUM_CONSUMERS = gl.constexpr(self.BLOCK_M.value // 64)
            k = 32 if IS_FP8 else 16  # a wgmma's K: 32 bytes of its operands' rows
            self.S_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                   instr_shape=[16, self.BLOCK_N.value, k]))
            self.O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                   instr_shape=[16, self.HEAD_DIM_V.value, k]))
            self.P_LAYOUT = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=self.O_LAYOUT.value,
                                                             k_width=4 if IS_FP8 else 2))

    @aggregate
    class Call:
        """The call's runtime scalars: work-tile count, sizes, band and score scales.
        IS_VARLEN: n_q is the longest sequence's rows (the row blocks' count), n_k
        unused, total_q the packed rows (LSE's head stride), o_stride_* out's
        row and head strides (the masked store)."""
        n_work: gl.tensor
        n_m: gl.tensor  # row blocks per (batch, q head)
        n_heads_q: gl.tensor
        kv_group: gl.tensor  # q heads per kv head
        n_q: gl.tensor
        n_k: gl.tensor
        total_q: gl.tensor
        o_stride_row: gl.tensor
        o_stride_head: gl.tensor
        o_stride_batch: gl.tensor  # the pointer store's (0: varlen)
        kv_seq_rows: gl.tensor  # KV_CACHE, contiguous: rows a sequence in the cache
        table_stride: gl.tensor  # KV_CACHE, paged: block_table's row stride
        off: gl.tensor  # the band (kernels/mask.py)
        left: gl.tensor
        right: gl.tensor
        qk_scale: gl.tensor
        softcap_in: gl.tensor
        softcap_out: gl.tensor
        qd_b: gl.tensor  # IS_FP8: q's, k's and v's descales' (batch, KV head) strides (0, 0: one a tensor)
        qd_h: gl.tensor
        kd_b: gl.tensor
        kd_h: gl.tensor
        vd_b: gl.tensor
        vd_h: gl.tensor

        @gluon.constexpr_function
        def __init__(self, n_work, n_m, n_heads_q, kv_group, n_q, n_k, total_q, o_stride_row, o_stride_head,
                     o_stride_batch, kv_seq_rows, table_stride, off, left, right, qk_scale, softcap_in, softcap_out,
                     descale_strides):
            self.n_work, self.n_m, self.n_heads_q, self.kv_group = n_work, n_m, n_heads_q, kv_group
            self.n_q, self.n_k, self.off, self.left, self.right = n_q, n_k, off, left, right
            self.total_q, self.o_stride_row, self.o_stride_head = total_q, o_stride_row, o_stride_head
            self.o_stride_batch = o_stride_batch
            self.qd_b, self.qd_h, self.kd_b, self.kd_h, self.vd_b, self.vd_h = descale_strides
            self.kv_seq_rows, self.table_stride = kv_seq_rows, table_stride
            self.qk_scale, self.softcap_in, self.softcap_out = qk_scale, softcap_in, softcap_out

    @aggregate
    class Smem:
        """Shared memory: each consumer's Q buffers, the K/V ring, their ready /
        empty barriers, PINGPONG's turns, DYNAMIC's tile ids, LATE_PV_WAIT's anchor."""
        q_smem: gl.shared_memory_descriptor
        k_smem: gl.shared_memory_descriptor
        v_smem: gl.shared_memory_descriptor
        q_ready: gl.shared_memory_descriptor
        q_empty: gl.shared_memory_descriptor
        k_ready: gl.shared_memory_descriptor
        v_ready: gl.shared_memory_descriptor
        k_empty: gl.shared_memory_descriptor
        v_empty: gl.shared_memory_descriptor
        turns: gl.shared_memory_descriptor
        tile_ids: gl.shared_memory_descriptor
        anchor: gl.shared_memory_descriptor
        p_smem: gl.shared_memory_descriptor  # IS_FP8: each consumer's P (else unused)

        @gluon.constexpr_function
        def __init__(self, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
                     tile_ids, anchor, p_smem):
            self.q_smem, self.k_smem, self.v_smem = q_smem, k_smem, v_smem
            self.q_ready, self.q_empty, self.k_ready, self.v_ready = q_ready, q_empty, k_ready, v_ready
            self.k_empty, self.v_empty, self.turns = k_empty, v_empty, turns
            self.tile_ids, self.anchor, self.p_smem = tile_ids, anchor, p_smem

    @aggregate
    class Tile:
        """One work tile: where its rows and keys are, its sequence's lengths and
        band offset, and its key range in key tiles counted from `lo` (key_tiles:
        [0, n_left) masked, [n_left, n_mid) unmasked, [n_mid, n_tiles) masked)."""
        off_b: gl.tensor  # batch (dense) or sequence (varlen)
        off_h: gl.tensor
        off_hk: gl.tensor
        desc_b: gl.tensor  # the descriptors' batch coordinate: off_b, or 0 over varlen's [1, H, total, D]
        q_row: gl.tensor  # the sequence's first query row and key row in the descriptors (0 dense)
        k_row: gl.tensor
        start_m: gl.tensor  # the tile's first row in its sequence
        n_q: gl.tensor
        n_k: gl.tensor
        off: gl.tensor
        lo: gl.tensor
        n_left: gl.tensor
        n_mid: gl.tensor
        n_tiles: gl.tensor

        @gluon.constexpr_function
        def __init__(self, off_b, off_h, off_hk, desc_b, q_row, k_row, start_m, n_q, n_k, off, lo, n_left, n_mid,
                     n_tiles):
            self.off_b, self.off_h, self.off_hk, self.desc_b = off_b, off_h, off_hk, desc_b
            self.q_row, self.k_row, self.start_m = q_row, k_row, start_m
            self.n_q, self.n_k, self.off = n_q, n_k, off
            self.lo, self.n_left, self.n_mid, self.n_tiles = lo, n_left, n_mid, n_tiles

    @gluon.jit
    def _work_tile(t, call, cu_seqlens_q, cu_seqlens_k, cache_seqlens, cfg):
        # Work tile t -> its Tile: (batch or sequence, q head, first row), the
        # sequence's rows (seqlen.sequence, shared with attention_fwd_kernel) and
        # its key range (key_range, likewise). A varlen tile past its sequence's
        # rows has no key tiles.
        bh = t // call.n_m
        pid_m = t % call.n_m
        if cfg.REVERSE_M:
            # Causal tiles lower in the sequence do more work: start them first.
            pid_m = call.n_m - 1 - pid_m
        off_h = bh % call.n_heads_q
        off_b = bh // call.n_heads_q
        start_m = pid_m * cfg.BLOCK_M
        q_row, k_row, n_q, n_k, off = sequence(off_b, cu_seqlens_q, cu_seqlens_k, cache_seqlens, call.n_q, call.n_k,
                                               call.off, cfg.IS_VARLEN, cfg.KV_CACHE, cfg.TOP_LEFT)
        lo, full_lo, full_hi, hi = key_range(start_m, n_k, off, call.left, call.right, cfg.BLOCK_M,
                                             cfg.BLOCK_N, cfg.HAS_LEFT, cfg.HAS_RIGHT)
        n_left, n_mid, n_tiles = key_tiles(lo, full_lo, full_hi, hi, cfg.BLOCK_N)
        if cfg.IS_VARLEN:
            if start_m >= n_q:
                n_tiles = 0
                n_mid = 0
                n_left = 0
            desc_b = gl.to_tensor(0)
            q_row = q_row.to(gl.int32)
            if cfg.KV_CACHE:  # a contiguous cache's sequence starts kv_seq_rows rows on; a paged one's by page
                k_row = off_b * call.kv_seq_rows
            else:
                k_row = k_row.to(gl.int32)
        else:
            desc_b = off_b
            q_row = gl.to_tensor(0)
            k_row = gl.to_tensor(0)
        return Tile(off_b, off_h, off_h // call.kv_group, desc_b, q_row, k_row, start_m, gl.to_tensor(n_q),
                    gl.to_tensor(n_k), gl.to_tensor(off), lo, n_left, n_mid, n_tiles)

    @gluon.jit
    def _load_partition(q_desc, k_desc, v_desc, smem, call, tile_counter, cu_seqlens_q, cu_seqlens_k, cache_seqlens,
                        block_table, kt_desc, vt_desc, cfg):
        # Producer: one thread issues every TMA copy. Per work tile, each
        # consumer's Q rows into its buffer `done % Q_BUFFERS` once the consumer
        # released it (q_empty; with two, while the previous tile computes), then
        # K_i and V_i into ring slot kv % STAGES once both consumers released the
        # slot's previous tile. A fresh barrier counts its parity-1 phase as
        # complete, so the first waits on empty barriers pass at once.
        #
        # Work tiles: CTA pid takes pid, pid + grid, ... (static), or with DYNAMIC
        # pid first and then whichever tile the launch's counter (an int32 zero,
        # fresh each launch) hands out next: FA3's dynamic scheduler, so a CTA
        # that drew short causal tiles takes more, and one CTA an SM carries its
        # K/V ring and Q loads on from tile to tile. Each tile's index goes to the
        # consumers beside its Q (tile_ids), and n_work once there is none left.
        ROWS: gl.constexpr = 64
        kv = 0  # K/V tiles issued so far, over all work tiles
        done = 0  # work tiles issued so far
        t = gl.program_id(0)
        while t < call.n_work:
            kv = _load_work_tile(q_desc, k_desc, v_desc, smem, t, kv, done, call, cu_seqlens_q, cu_seqlens_k,
                                 cache_seqlens, block_table, kt_desc, vt_desc, cfg)
            done += 1
            if cfg.DYNAMIC:
                t = gl.atomic_add(tile_counter, 1) + gl.num_programs(0)
            else:
                t += gl.num_programs(0)
        if cfg.DYNAMIC:
            for c in gl.static_range(cfg.BLOCK_M // ROWS):
                qb = c * cfg.Q_BUFFERS + done % cfg.Q_BUFFERS
                mbarrier.wait(smem.q_empty.index(qb), ((done // cfg.Q_BUFFERS) & 1) ^ 1)
                smem.tile_ids.index(qb).store(gl.full([1], call.n_work, gl.int32, _ID_LAYOUT))
                mbarrier.arrive(smem.q_ready.index(qb), count=1)

    @gluon.jit
    def _load_work_tile(q_desc, k_desc, v_desc, smem, t, kv, done, call, cu_seqlens_q, cu_seqlens_k, cache_seqlens,
                        block_table, kt_desc, vt_desc, cfg):
        # Work tile t's Q rows and K/V tiles; returns the K/V tiles issued so far.
        ROWS: gl.constexpr = 64
        tile = _work_tile(t, call, cu_seqlens_q, cu_seqlens_k, cache_seqlens, cfg)
        n_tiles = tile.n_tiles
        for c in gl.static_range(cfg.BLOCK_M // ROWS):
            qb = c * cfg.Q_BUFFERS + done % cfg.Q_BUFFERS
            mbarrier.wait(smem.q_empty.index(qb), ((done // cfg.Q_BUFFERS) & 1) ^ 1)
            if cfg.DYNAMIC:  # before the arrival below, which publishes it (release)
                smem.tile_ids.index(qb).store(gl.full([1], t, gl.int32, _ID_LAYOUT))
            if n_tiles > 0:
                mbarrier.expect(smem.q_ready.index(qb), q_desc.block_type.nbytes * cfg.QK_CHUNKS)
                if cfg.QK_CHUNKS == 1:
                    tma_load(q_desc, [tile.desc_b, tile.off_h, tile.q_row + tile.start_m + c * ROWS, 0],
                              smem.q_ready.index(qb), smem.q_smem.index(qb))
                else:  # Q in column parts (_q_chunks)
                    for part in gl.static_range(cfg.QK_CHUNKS):
                        tma_load(q_desc, [tile.desc_b, tile.off_h, tile.q_row + tile.start_m + c * ROWS,
                                          part * cfg.QK_BLOCK],
                                 smem.q_ready.index(qb), smem.q_smem.index(qb * cfg.QK_CHUNKS + part))
            else:  # nothing to load: hand the buffer straight over for the zero output
                mbarrier.arrive(smem.q_ready.index(qb), count=1)
        COPIES: gl.constexpr = cfg.BLOCK_N // cfg.PAGE_ROWS  # TMA copies a K or V tile
        for i in range(n_tiles):
            slot, phase = ring(kv, cfg.STAGES)
            empty_phase = phase ^ 1
            key = tile.lo + i * cfg.BLOCK_N  # in the sequence
            # The copies' rows (a paged cache: their page ids) are read before the slot waits, whose
            # time hides the reads' latency, and once for both K and V; K's copies still go first.
            rows = ()
            for c in gl.static_range(COPIES):
                rows = rows + (key_row(block_table, tile.off_b, call.table_stride, tile.n_k, key + c * cfg.PAGE_ROWS,
                                       tile.k_row, cfg.PAGE_SIZE),)
            run = _page_run(rows, cfg)
            mbarrier.wait(smem.k_empty.index(slot), empty_phase)
            mbarrier.expect(smem.k_ready.index(slot), k_desc.block_type.nbytes * COPIES * cfg.QK_CHUNKS)
            if cfg.QK_CHUNKS == 1:
                _copy_tile(k_desc, kt_desc, smem.k_smem.index(slot), smem.k_ready.index(slot), rows, run, tile, cfg)
            else:  # K in column parts (_k_chunks; no KV cache)
                for part in gl.static_range(cfg.QK_CHUNKS):
                    tma_load(k_desc, [tile.desc_b, tile.off_hk, rows[0], part * cfg.QK_BLOCK],
                             smem.k_ready.index(slot), smem.k_smem.index(slot * cfg.QK_CHUNKS + part))
            mbarrier.wait(smem.v_empty.index(slot), empty_phase)
            mbarrier.expect(smem.v_ready.index(slot), v_desc.block_type.nbytes * COPIES)
            if cfg.IS_FP8:  # V's keys contiguous: the tile's keys are the descriptor's last coordinate
                v_key = rows[0]
                if cfg.IS_VARLEN:  # packed: each sequence's keys from a BLOCK_N multiple (TMA's innermost rule)
                    v_key = tile_aligned_start(tile.k_row, tile.off_b, cfg.BLOCK_N) + key
                tma_load(v_desc, [tile.desc_b, tile.off_hk, 0, v_key], smem.v_ready.index(slot),
                         smem.v_smem.index(slot))
            else:
                _copy_tile(v_desc, vt_desc, smem.v_smem.index(slot), smem.v_ready.index(slot), rows, run, tile, cfg)
            kv += 1
        return kv

    @gluon.jit
    def _page_run(rows, cfg):
        # Pages shorter than a tile: whether the tile's copies' rows run on in the cache (its pages
        # consecutive, as a block allocator hands a sequence's pages out), so that one copy of
        # BLOCK_N rows takes them. A tile crossing the sequence's end repeats its last page: no run.
        COPIES: gl.constexpr = cfg.BLOCK_N // cfg.PAGE_ROWS
        run = False
        if COPIES > 1:
            run = rows[1] == rows[0] + cfg.PAGE_ROWS
            for c in gl.static_range(2, COPIES):
                run = run & (rows[c] == rows[0] + c * cfg.PAGE_ROWS)
        return run

    @gluon.jit
    def _copy_tile(desc, tile_desc, buf, ready, rows, run, tile, cfg):
        # One K or V tile into ring buffer `buf`: a copy of BLOCK_N rows (a contiguous cache, pages of
        # a tile or more, or a run of shorter pages through tile_desc), else one copy a page.
        COPIES: gl.constexpr = cfg.BLOCK_N // cfg.PAGE_ROWS
        if COPIES > 1:
            if run:
                tma_load(tile_desc, [tile.desc_b, tile.off_hk, rows[0], 0], ready, buf)
            else:
                for c in gl.static_range(COPIES):
                    tma_load(desc, [tile.desc_b, tile.off_hk, rows[c], 0], ready,
                              buf.slice(c * cfg.PAGE_ROWS, cfg.PAGE_ROWS, 2))
        else:
            tma_load(desc, [tile.desc_b, tile.off_hk, rows[0], 0], ready, buf)

    @gluon.jit
    def _kv_tile(smem, ready, tile, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        # Wait for ring tile `tile` (counted over all work tiles) to land and
        # return its [BLOCK_N, HEAD_DIM] view.
        slot, phase = ring(tile, STAGES)
        mbarrier.wait(ready.index(slot), phase)
        return smem.index(slot).reshape([BLOCK_N, HEAD_DIM])

    @gluon.jit
    def _k_chunks(smem, tile, cfg):
        # K's ring tile `tile` once landed, as QK_CHUNKS [BLOCK_N, QK_BLOCK] column parts
        if cfg.QK_CHUNKS == 1:
            return (_kv_tile(smem.k_smem, smem.k_ready, tile, cfg.BLOCK_N, cfg.HEAD_DIM, cfg.STAGES),)
        else:
            slot, phase = ring(tile, cfg.STAGES)
            mbarrier.wait(smem.k_ready.index(slot), phase)
            chunks = ()
            for c in gl.static_range(cfg.QK_CHUNKS):
                chunks = chunks + (smem.k_smem.index(slot * cfg.QK_CHUNKS + c).reshape([cfg.BLOCK_N, cfg.QK_BLOCK]),)
            return chunks

    @gluon.jit
    def _q_chunks(smem, qb, cfg):
        # Q buffer qb as QK_CHUNKS [64, QK_BLOCK] column parts
        ROWS: gl.constexpr = 64
        if cfg.QK_CHUNKS == 1:
            return (smem.q_smem.index(qb).reshape([ROWS, cfg.HEAD_DIM]),)
        else:
            chunks = ()
            for c in gl.static_range(cfg.QK_CHUNKS):
                chunks = chunks + (smem.q_smem.index(qb * cfg.QK_CHUNKS + c).reshape([ROWS, cfg.QK_BLOCK]),)
            return chunks

    @gluon.jit
    def _qk(q_tiles, k_tiles, cfg):
        # S = Q K^T [64, BLOCK_N], issued asynchronously: one wgmma chain a column part, into one accumulator
        ROWS: gl.constexpr = 64
        s = warpgroup_mma(q_tiles[0], k_tiles[0].permute((1, 0)),
                          gl.zeros([ROWS, cfg.BLOCK_N], gl.float32, cfg.S_LAYOUT), use_acc=False, is_async=True)
        for c in gl.static_range(1, cfg.QK_CHUNKS):
            s = warpgroup_mma(q_tiles[c], k_tiles[c].permute((1, 0)), s, is_async=True)
        return s

    @gluon.jit
    def _v_tile(smem, tile, cfg):
        # V's ring tile `tile` once landed, as the PV product's [BLOCK_N, HEAD_DIM_V] B operand: FP8's ring holds
        # [HEAD_DIM_V, BLOCK_N] tiles (keys contiguous: an e4m3 wgmma reads its B operand K-major), transposed
        # as a view.
        if cfg.IS_FP8:
            slot, phase = ring(tile, cfg.STAGES)
            mbarrier.wait(smem.v_ready.index(slot), phase)
            return smem.v_smem.index(slot).reshape([cfg.HEAD_DIM_V, cfg.BLOCK_N]).permute((1, 0))
        else:
            return _kv_tile(smem.v_smem, smem.v_ready, tile, cfg.BLOCK_N, cfg.HEAD_DIM_V, cfg.STAGES)

    @gluon.jit
    def _carried_p(p_f32, dtype: gl.constexpr, P_FP32: gl.constexpr):
        # P [ROWS, BLOCK_N] as carried to the iteration that issues its PV
        # product: fp32 in the S layout with P_FP32, else rounded to 16 bits and
        # packed two to a 32-bit register, [ROWS, BLOCK_N // 2] int32. Carried as
        # separate 16-bit values, ptxas paired P's halves into registers in the
        # opposite order to the product's operand and swapped each pair back with
        # a PRMT before the product (32 per tile); a
        # 32-bit carry leaves it nothing to pair.
        if P_FP32:  # (FP8's P too: softmax_step scaled it for e4m3's range, P_LOG2)
            return p_f32
        else:
            ROWS: gl.constexpr = p_f32.shape[0]
            BLOCK_N: gl.constexpr = p_f32.shape[1]
            # Columns 2c and 2c + 1 are held by one thread (the wgmma accumulator
            # layout), so the split stays in registers.
            lo, hi = gl.split(gl.reshape(p_f32, [ROWS, BLOCK_N // 2, 2]))
            return gl.inline_asm_elementwise(_CVT_BF16X2 if dtype == gl.bfloat16 else _CVT_F16X2, "=r,r,r",
                                             [lo, hi], dtype=gl.int32, is_pure=True, pack=1)

    @gluon.jit
    def _p_operand(p, p_layout: gl.constexpr, dtype: gl.constexpr, P_FP32: gl.constexpr, p_smem, C: gl.constexpr,
                   P_SHARED: gl.constexpr):
        # The PV product's A operand from the carried P. With P_FP32 it is packed
        # here, in the iteration that issues the product; the empty non-pure asm
        # pins the packing before the S_j issue: left free, LLVM sinks it below,
        # where the fp32 P, S_j and O do not fit in a three-consumer register
        # budget (2.7 KB of spills at D = 64). FP8: P rounded to e4m3 and relabelled
        # as the operand (a thread holds S's columns 2t, 2t + 1, 2t + 8, 2t + 9 of each
        # 16-key group and the operand's keys 4t to 4t + 3: column 16j + 8h + 2t + e
        # becomes key 16j + 4t + 2h + e, no value moves; V's keys come in that order,
        # ops.tma.E4M3_KEY_ORDER), or with P_SHARED into consumer C's buffer of p_smem
        # (its previous PV product has completed), which the product reads.
        if dtype == gl.float8e4nv:
            ROWS: gl.constexpr = p.shape[0]
            N: gl.constexpr = p.shape[1]
            p8 = p.to(dtype).reshape([ROWS, N // 16, 2, 4, 2]).permute((0, 1, 3, 2, 4)).reshape([ROWS, N])
            if P_SHARED:
                p_buf = p_smem.index(C)
                p_buf.store(p8)
                fence_async_shared()
                return p_buf
            else:
                return gl.convert_layout(p8, p_layout)
        elif P_FP32:
            p = gl.convert_layout(p.to(dtype), p_layout)
            return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [p], dtype=p.dtype, is_pure=False, pack=2)
        else:
            ROWS: gl.constexpr = p.shape[0]
            HALF_N: gl.constexpr = p.shape[1]
            lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [p],
                                               dtype=_F16_PAIR if dtype == gl.float16 else _BF16_PAIR,
                                               is_pure=True, pack=1)
            return gl.convert_layout(gl.reshape(gl.join(lo, hi), [ROWS, 2 * HALF_N]), p_layout)

    @gluon.jit
    def _pv_wait(o, p_op, v_tile, cfg):
        # The PV product's completion. An e4m3 P in registers is kept live past it by a use after the wait
        # (its registers must hold until the product has read them), since Triton 3.6's wait takes no 8-bit
        # operands among its dependencies.
        if cfg.IS_FP8 and not cfg.P_SHARED:
            o, v_tile = warpgroup_mma_wait(0, deps=(o, v_tile))
            p_op = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [p_op], dtype=p_op.dtype, is_pure=False,
                                             pack=4)
        else:
            o, p_op, v_tile = warpgroup_mma_wait(0, deps=(o, p_op, v_tile))
        return o, p_op, v_tile

    @gluon.jit
    def _rescale(o, alpha, LAZY: gl.constexpr):
        # o [ROWS, HEAD_DIM] * alpha [ROWS] (o's row layout). LAZY: a warp whose
        # rows all have alpha == 1 branches over the multiply (a vote makes the
        # branch warp-uniform). The asm takes 16 of a thread's accumulator values
        # at a time, in the wgmma layout's order: per 8 columns (r, c), (r, c + 1),
        # (r + 8, c), (r + 8, c + 1), so values 0 and 2 carry both of its rows' alphas.
        if LAZY:
            a = gl.zeros_like(o) + alpha[:, None]
            return gl.inline_asm_elementwise(_RESCALE_ASM, _RESCALE_CONSTRAINTS, [o, a], dtype=gl.float32,
                                             is_pure=True, pack=16)
        else:
            return o * alpha[:, None]

    @gluon.jit
    def _wait_turn(turns, turn, C: gl.constexpr):
        # PINGPONG: wait for consumer C's turn number `turn`. A fresh barrier
        # counts its parity-1 phase as complete: consumer 0 goes first, each later
        # one waits for its predecessor's turn.
        if C == 0:
            mbarrier.wait(turns.index(C), (turn & 1) ^ 1)
        else:
            mbarrier.wait(turns.index(C), turn & 1)

    @gluon.jit
    def _pipelined_tiles(o, m_i, l_i, p, alpha, turn, q_tiles, smem, kv, first, last, lo, offs_m, n_k, off, call,
                         qk_scale, softcap_in, MASKED: gl.constexpr, C: gl.constexpr, cfg):
        # Key tiles [first, last) of the work tile whose first key tile is ring
        # tile kv; on entry p holds P of tile first - 1 (as _carried_p gives
        # it), whose PV product is still to be issued, and alpha the factor o
        # takes before that product.
        # Returns the same state one tile further on.
        #
        # PINGPONG (FlashAttention-3's warpgroup ordering): consumers take turns
        # to issue their two products, C = 0, 1, (2,) 0, ..., so that one
        # warpgroup's softmax runs while the tensor cores work on the other's
        # products, instead of all issuing together and then all computing
        # softmax together. `turn` counts this consumer's turns; consumers of a
        # CTA walk the same key tiles, so their counts stay in step.
        ROWS: gl.constexpr = 64
        s_layout: gl.constexpr = cfg.S_LAYOUT
        p_layout: gl.constexpr = cfg.P_LAYOUT
        o_rows: gl.constexpr = gl.SliceLayout(1, cfg.O_LAYOUT)
        cols = gl.arange(0, cfg.BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        for j in range(first, last):
            p_op = _p_operand(p, p_layout, q_tiles[0].dtype, cfg.P_FP32, smem.p_smem, C, cfg.P_SHARED)
            k_tiles = _k_chunks(smem, kv + j, cfg)
            if cfg.PINGPONG:
                _wait_turn(smem.turns, turn, C)
            s = _qk(q_tiles, k_tiles, cfg)
            # o's rescale for P_{j-1} runs on the CUDA cores while the tensor
            # cores compute S_j (FA3's order; +0.3-1.4 % over rescaling after the
            # PV wait).
            o = _rescale(o, gl.convert_layout(alpha, o_rows), cfg.LAZY_RESCALE)
            v_tile = _v_tile(smem, kv + j - 1, cfg)
            o = warpgroup_mma(p_op, v_tile, o, is_async=True)
            if cfg.PINGPONG:
                mbarrier.arrive(smem.turns.index((C + 1) % cfg.NUM_CONSUMERS), count=1)
                turn += 1
            s, k_tile = warpgroup_mma_wait(1, deps=(s, k_tiles[0]))  # S_j is done; P_{j-1} V_{j-1} may still run
            mbarrier.arrive(smem.k_empty.index(ring(kv + j, cfg.STAGES)[0]), count=1)
            # The key indices relative to the tile's first key: the columns stay
            # loop-invariant and the shift goes into the row bounds (two rows a
            # thread) instead of into every score's index; ptxas then compares
            # each score as it selects it rather than computing all compares
            # before the S wait and packing them into integer bitmasks (a masked
            # loop at D = 128 causal drops from 704 to 595 instructions).
            base = lo + j * cfg.BLOCK_N
            s = masked_logits(s, offs_m, cols, n_k - base, off - base, call.left, call.right, softcap_in,
                              call.softcap_out, MASKED, cfg.HAS_LEFT, cfg.HAS_RIGHT, cfg.SOFTCAP)
            p_f32, alpha, m_i, l_i = softmax_step(s, gl.max(s, 1), m_i, l_i, qk_scale, MASKED, cfg.SOFTCAP,
                                                  cfg.LAZY_SLACK, cfg.P_LOG2)
            if cfg.LATE_PV_WAIT:
                # ptxas otherwise hoists the PV_{j-1} wait below to the start of
                # this softmax (it fills a latency gap with it), so the softmax
                # would not overlap P_{j-1} V_{j-1}. It keeps the wait after a
                # shared-memory store: the row sums, the softmax's last result,
                # go to a scratch row that nothing reads.
                smem.anchor.slice(C * ROWS, ROWS).store(l_i)
            o, p_op, v_tile = _pv_wait(o, p_op, v_tile, cfg)
            mbarrier.arrive(smem.v_empty.index(ring(kv + j - 1, cfg.STAGES)[0]), count=1)
            p = _carried_p(p_f32, q_tiles[0].dtype, cfg.P_FP32)
        return o, m_i, l_i, p, alpha, turn

    @gluon.jit
    def _skip_tiles(smem, turn, kv, first, last, C: gl.constexpr, cfg):
        # Ring tiles [first, last) of the work tile starting at ring tile kv, none
        # of whose keys this consumer's rows see: release each once it has landed
        # (an arrival before that would count towards the release of the slot's
        # previous tile, which the other consumers may still be reading), and
        # with PINGPONG take the turn its iteration would have taken, so that
        # every consumer's turn count stays in step.
        for j in range(first, last):
            slot, phase = ring(kv + j, cfg.STAGES)
            mbarrier.wait(smem.k_ready.index(slot), phase)
            if cfg.PINGPONG:
                if j > 0:  # key tile 0 is issued outside the turns
                    _wait_turn(smem.turns, turn, C)
                    mbarrier.arrive(smem.turns.index((C + 1) % cfg.NUM_CONSUMERS), count=1)
                    turn += 1
            mbarrier.arrive(smem.k_empty.index(slot), count=1)
            mbarrier.wait(smem.v_ready.index(slot), phase)
            mbarrier.arrive(smem.v_empty.index(slot), count=1)
        return turn

    @gluon.jit
    def _release_previous_q(q_empty, C: gl.constexpr, done):
        # Two Q buffers: once this tile's first product is done, wait for the
        # previous tile's output store to have read its buffer, and hand that
        # buffer back for the next tile's Q.
        if done > 0:
            tma.store_wait(0)
            mbarrier.arrive(q_empty.index(C * 2 + (done - 1) % 2), count=1)

    @gluon.jit
    def _consumer_tile(o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE, K_DESCALE,
                       V_DESCALE, smem, t, kv, done, turn, call, C: gl.constexpr, cfg):
        # Consumer warpgroup C's rows of work tile t; returns the ring tiles
        # consumed and the PINGPONG turns taken so far.
        ROWS: gl.constexpr = 64
        s_layout: gl.constexpr = cfg.S_LAYOUT
        o_layout: gl.constexpr = cfg.O_LAYOUT
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        in_dtype: gl.constexpr = smem.q_smem.dtype  # the products' operands'
        cols = gl.arange(0, cfg.BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        tile = _work_tile(t, call, cu_seqlens_q, cu_seqlens_k, cache_seqlens, cfg)
        if cfg.HAS_SINK:  # the head's sink logit for the finish, loaded ahead of the key loop to hide its latency
            sink = gl.load(SINKS + tile.off_h)
        else:
            sink = 0.0
        qk_scale = call.qk_scale
        softcap_in = call.softcap_in
        out_scale = 1.0
        if cfg.IS_FP8:  # the descales of the tile's (sequence, KV head); P's e4m3 scale leaves with l's (P_LOG2)
            qk_scale, softcap_in, out_scale = descaled(
                qk_scale, softcap_in, out_scale, Q_DESCALE, K_DESCALE, V_DESCALE, tile.off_b, tile.off_hk,
                (call.qd_b, call.qd_h, call.kd_b, call.kd_h, call.vd_b, call.vd_h))
        lo, n_left, n_mid, n_tiles, n_q, n_k, off = (tile.lo, tile.n_left, tile.n_mid, tile.n_tiles, tile.n_q, tile.n_k,
                                                     tile.off)
        row0 = tile.start_m + C * ROWS
        c_left = n_left
        c_mid = n_mid
        c_end = n_tiles
        if cfg.HAS_RIGHT:
            # This consumer's own key tiles: under a right edge rows above the
            # tile's last ones see fewer keys (192-row tiles on 128-key tiles: up
            # to two tiles fewer), and rows all past n_q none. The ring tiles past
            # its own go by in _skip_tiles. (Without a right edge this only spares
            # rows past n_q, and it measured 14 % slower at D = 64 N = 512, not
            # diagnosed.)
            c_left, c_mid, c_end = row_tiles(row0, lo, n_tiles, n_q, n_k, off, call.left, call.right,
                                             ROWS, cfg.BLOCK_N, cfg.HAS_LEFT, cfg.HAS_RIGHT)
        offs_m = row0 + gl.arange(0, ROWS, layout=s_rows)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=s_rows)
        l_i = gl.zeros([ROWS], gl.float32, layout=s_rows)
        o = gl.zeros([ROWS, cfg.HEAD_DIM_V], gl.float32, layout=o_layout)
        qb = C * cfg.Q_BUFFERS + done % cfg.Q_BUFFERS
        q_buf = smem.q_smem.index(qb)
        q_tiles = _q_chunks(smem, qb, cfg)
        q_tile = q_tiles[0]
        mbarrier.wait(smem.q_ready.index(qb), (done // cfg.Q_BUFFERS) & 1)
        if c_end > 0:
            # Key tile 0 on its own (through the masked code, right for any
            # tile): it fills the pipeline with its P.
            k_tiles = _k_chunks(smem, kv, cfg)
            s = _qk(q_tiles, k_tiles, cfg)
            s, k_tile = warpgroup_mma_wait(0, deps=(s, k_tiles[0]))
            mbarrier.arrive(smem.k_empty.index(ring(kv, cfg.STAGES)[0]), count=1)
            if cfg.Q_BUFFERS == 2:
                _release_previous_q(smem.q_empty, C, done)
            s = masked_logits(s, offs_m, cols, n_k - lo, off - lo, call.left, call.right, softcap_in,
                              call.softcap_out, True, cfg.HAS_LEFT, cfg.HAS_RIGHT, cfg.SOFTCAP)
            p_f32, alpha, m_i, l_i = softmax_step(s, gl.max(s, 1), m_i, l_i, qk_scale, True, cfg.SOFTCAP, 0.0,
                                                  cfg.P_LOG2)
            p = _carried_p(p_f32, in_dtype, cfg.P_FP32)

            # Key tiles [1, c_left) masked, [c_left, c_mid) unmasked, [c_mid, c_end)
            # masked: three loops, each compiled for its mask (tile 0 went above).
            for segment in gl.static_range(3):
                if segment == 0:
                    first = 1
                    last = c_left
                elif segment == 1:
                    first = gl.maximum(c_left, 1)
                    last = c_mid
                else:
                    first = gl.maximum(c_mid, 1)
                    last = c_end
                o, m_i, l_i, p, alpha, turn = _pipelined_tiles(
                    o, m_i, l_i, p, alpha, turn, q_tiles, smem, kv, first, last, lo, offs_m, n_k, off, call,
                    qk_scale, softcap_in, segment != 1, C, cfg)

            # The last key tile's PV product.
            last = kv + c_end - 1
            v_tile = _v_tile(smem, last, cfg)
            if cfg.IS_VARLEN and not cfg.IS_FP8:
                # Only the work tile's last key tile can reach past the sequence's end (key_range):
                # its rows there are the next sequence's V (or a cache's unused rows), which P's
                # zeros would not cancel if they held inf or NaN. (FP8's packed V holds zeros there:
                # ops.tma.sm90_e4m3_values.)
                base = lo + (c_end - 1) * cfg.BLOCK_N
                if base + cfg.BLOCK_N > n_k:
                    zero_rows_from(v_tile, n_k - base, cfg.BLOCK_N, cfg.HEAD_DIM_V)
            o = _rescale(o, gl.convert_layout(alpha, o_rows), cfg.LAZY_RESCALE)
            p_op = _p_operand(p, cfg.P_LAYOUT, in_dtype, cfg.P_FP32, smem.p_smem, C, cfg.P_SHARED)
            o = warpgroup_mma(p_op, v_tile, o, is_async=True)
            o, p_op, v_tile = _pv_wait(o, p_op, v_tile, cfg)
            mbarrier.arrive(smem.v_empty.index(ring(last, cfg.STAGES)[0]), count=1)
        elif cfg.Q_BUFFERS == 2:
            _release_previous_q(smem.q_empty, C, done)
        if cfg.HAS_RIGHT:
            turn = _skip_tiles(smem, turn, kv, c_end, n_tiles, C, cfg)
        kv += n_tiles

        if cfg.IS_FP8:  # l counts P times 2^P_LOG2 (softmax_step): its reference is m - P_LOG2
            m_i = m_i - cfg.P_LOG2
        inv_l, lse = softmax_finish(m_i, l_i, sink, cfg.HAS_SINK)  # rows that saw no key: 0 and LSE -inf (or sink)
        if cfg.IS_FP8:
            inv_l = inv_l * out_scale
        o = o * gl.convert_layout(inv_l, o_rows)[:, None]
        # The output rows go out by TMA from this tile's Q buffer (no MMA
        # reads it any more); rows past n_q are clipped by the TMA unit. The
        # buffer returns to the producer once the store has read it: at once
        # with one Q buffer; with two, during the next tile (its Q is already
        # in the other buffer), so the store's latency is hidden too. An output
        # that does not fit the Q buffer (16-bit against FP8's e4m3, or V's own
        # head dim): a pointer store.
        if cfg.POINTER_STORE:
            _store_by_pointer(o, Out, tile, row0, call, cfg)
        elif cfg.IS_VARLEN:
            if row0 + ROWS <= n_q:
                _store_by_tma(o, q_tile, q_buf, o_desc, tile.desc_b, tile.off_h, tile.q_row + row0)
            else:  # the slab crosses the sequence's end: only its own rows
                _store_by_pointer(o, Out, tile, row0, call, cfg)
        else:
            _store_by_tma(o, q_tile, q_buf, o_desc, tile.desc_b, tile.off_h, row0)
        if cfg.STORE_LSE:
            if cfg.IS_VARLEN:  # LSE [Hq, total_q]
                lse_base = LSE + tile.off_h.to(gl.int64) * call.total_q + tile.q_row
            else:  # LSE [B, Hq, n_q]
                lse_base = LSE + (tile.off_b.to(gl.int64) * call.n_heads_q + tile.off_h) * call.n_q
            gl.store(lse_base + offs_m, lse, mask=offs_m < n_q)
        if cfg.Q_BUFFERS == 1:
            tma.store_wait(0)
            mbarrier.arrive(smem.q_empty.index(qb), count=1)
        return kv, turn

    @gluon.jit
    def _store_by_pointer(o, Out, tile, row0, call, cfg):
        # O's rows [row0, + 64) of the tile's (batch or sequence, head), those before n_q, through pointers
        ROWS: gl.constexpr = 64
        o_layout: gl.constexpr = cfg.O_LAYOUT
        o_cols = gl.arange(0, cfg.HEAD_DIM_V, layout=gl.SliceLayout(0, o_layout))
        o_offs = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        base = Out + tile.off_h.to(gl.int64) * call.o_stride_head
        if not cfg.IS_VARLEN:
            base += tile.off_b.to(gl.int64) * call.o_stride_batch
        o_ptrs = base + (tile.q_row + o_offs).to(gl.int64)[:, None] * call.o_stride_row + o_cols[None, :]
        gl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=(o_offs < tile.n_q)[:, None])

    @gluon.jit
    def _store_by_tma(o, q_tile, q_buf, o_desc, desc_b, off_h, row):
        # O's rows to the output from this tile's Q buffer (no MMA reads it any more)
        q_tile.store(o.to(o_desc.dtype))
        fence_async_shared()
        tma_store(o_desc, [desc_b, off_h, row, 0], q_buf)

    @gluon.jit
    def _consumer_partition(o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE, K_DESCALE,
                            V_DESCALE, smem, call, C: gl.constexpr, cfg):
        # Consumer warpgroup C: query rows [start_m + C * ROWS, + ROWS) of each work
        # tile against its K/V tiles. S is [ROWS, BLOCK_N], O [ROWS, HEAD_DIM],
        # both wgmma accumulators spread over the 4 warps (16 rows each).
        kv = 0  # ring tiles consumed so far, over all work tiles
        done = 0
        turn = 0  # PINGPONG turns taken so far
        t = gl.program_id(0)
        while t < call.n_work:
            kv, turn = _consumer_tile(o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE,
                                      K_DESCALE, V_DESCALE, smem, t, kv,
                                      done, turn, call, C, cfg)
            done += 1
            if cfg.DYNAMIC:  # the next tile's index arrives with its Q (_load_partition); n_work ends
                qb = C * cfg.Q_BUFFERS + done % cfg.Q_BUFFERS
                mbarrier.wait(smem.q_ready.index(qb), (done // cfg.Q_BUFFERS) & 1)
                t = gl.sum(smem.tile_ids.index(qb).load(_ID_LAYOUT), axis=0)
            else:
                t += gl.num_programs(0)
        tma.store_wait(0)

    @gluon.jit
    def attention_fwd_sm90_kernel(
        q_desc, k_desc, v_desc, o_desc, LSE, tile_counter, cu_seqlens_q, cu_seqlens_k, Out,
        cache_seqlens, block_table, kt_desc, vt_desc, SINKS, Q_DESCALE, K_DESCALE, V_DESCALE,
        batch, n_heads_q, kv_group, n_q, n_k, total_q, o_strides,
        kv_seq_rows, table_stride, band, scales, descale_strides,
        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
        STORE_LSE: gl.constexpr, REVERSE_M: gl.constexpr, CONSUMER_REGS: gl.constexpr, Q_BUFFERS: gl.constexpr,
        PINGPONG: gl.constexpr, P_FP32: gl.constexpr, LATE_PV_WAIT: gl.constexpr, LAZY_RESCALE: gl.constexpr,
        DYNAMIC: gl.constexpr, IS_VARLEN: gl.constexpr, TOP_LEFT: gl.constexpr, KV_CACHE: gl.constexpr,
        PAGE_SIZE: gl.constexpr, HAS_SINK: gl.constexpr, P_SHARED: gl.constexpr, HEAD_DIM_V: gl.constexpr,
        QK_BLOCK: gl.constexpr, POINTER_STORE: gl.constexpr,
    ):
        # grid = (work tiles or fewer, 1, 1), num_warps = 4: those warps are the
        # producer; BLOCK_M / 64 more warpgroups (1, 2 or 3) are the consumers.
        # Descriptors are 4-D over [B, H, N, D] with blocks [1, 1, 64 or BLOCK_N,
        # HEAD_DIM] (V's and the output's HEAD_DIM_V); LSE is [B, Hq, n_q] fp32. IS_VARLEN: batch sequences, the
        # descriptors over [1, H, total, D] views, n_q the longest sequence's rows,
        # LSE [Hq, total_q], Out (the output, for the masked store) [total_q, Hq, D].
        # KV_CACHE (with IS_VARLEN): k / v descriptors over the cache's rows
        # [1, Hkv, rows, D] in blocks of PAGE_ROWS rows, cache_seqlens [B] int32,
        # block_table [B, max_pages] int32 (PAGE_SIZE > 0); pages shorter than BLOCK_N:
        # kt_desc / vt_desc over the same rows in blocks of BLOCK_N (a run of pages' copy).
        # e4m3 Q, K, V (IS_FP8): v_desc over V with its keys contiguous ([B, Hkv, HEAD_DIM, N], blocks
        # [1, 1, HEAD_DIM, BLOCK_N]), Out the output (16-bit, stored through pointers), Q_DESCALE / K_DESCALE /
        # V_DESCALE fp32 (None: 1) read at (batch or sequence, KV head) with descale_strides' pairs.
        # QK_BLOCK: Q's and K's columns a shared buffer holds (HEAD_DIM, or a part of it: Config.QK_CHUNKS).
        # POINTER_STORE: the output through pointers (it does not fit the Q buffer). o_strides: Out's (row, head)
        # strides, and its batch stride with POINTER_STORE. band (off, left, right), scales (qk_scale, softcap_in,
        # softcap_out): ops/scales.py.
        off, left, right = band
        qk_scale, softcap_in, softcap_out = scales
        IS_FP8: gl.constexpr = q_desc.dtype == gl.float8e4nv
        QK_CHUNKS: gl.constexpr = HEAD_DIM // QK_BLOCK
        if POINTER_STORE:
            o_stride_row, o_stride_head, o_stride_batch = o_strides
        else:
            o_stride_row, o_stride_head = o_strides
            o_stride_batch = 0
        if IS_FP8:
            qd_b, qd_h, kd_b, kd_h, vd_b, vd_h = descale_strides
        else:
            qd_b, qd_h, kd_b, kd_h, vd_b, vd_h = 0, 0, 0, 0, 0, 0
        ROWS: gl.constexpr = 64
        NUM_CONSUMERS: gl.constexpr = BLOCK_M // ROWS
        gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128 or BLOCK_M == 192,
                         "one, two or three consumer warpgroups of 64 rows")
        gl.static_assert(Q_BUFFERS == 1 or Q_BUFFERS == 2, "one or two Q buffers per consumer")
        dtype: gl.constexpr = q_desc.dtype
        n_m = gl.cdiv(n_q, BLOCK_M)
        n_work = n_m * n_heads_q * batch

        q_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS * Q_BUFFERS * QK_CHUNKS, 1, 1, ROWS, QK_BLOCK],
                                           q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES * QK_CHUNKS, 1, 1, BLOCK_N, QK_BLOCK], k_desc.layout)
        if IS_FP8:  # keys contiguous
            v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, HEAD_DIM_V, BLOCK_N], v_desc.layout)
        else:
            v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM_V], v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS * Q_BUFFERS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS * Q_BUFFERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turns = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
        # DYNAMIC: each Q buffer's work tile index, for its consumer.
        tile_ids = gl.allocate_shared_memory(gl.int32, [NUM_CONSUMERS * Q_BUFFERS, 1],
                                             gl.SwizzledSharedLayout(1, 1, 1, [0]))
        # Written, never read: LATE_PV_WAIT's scratch rows, one per consumer (room
        # for four: Gluon's shapes are powers of two).
        anchor = gl.allocate_shared_memory(gl.float32, [4 * ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        for i in gl.static_range(NUM_CONSUMERS * Q_BUFFERS):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)
        for i in gl.static_range(NUM_CONSUMERS):
            mbarrier.init(turns.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NUM_CONSUMERS)  # one arrival per consumer
            mbarrier.init(v_empty.index(i), count=NUM_CONSUMERS)
        fence_async_shared()

        # Partition arguments must be IR values: Triton makes an integer argument
        # equal to 1 a constant, so scalars are wrapped.
        call = Call(gl.to_tensor(n_work), gl.to_tensor(n_m), gl.to_tensor(n_heads_q), gl.to_tensor(kv_group),
                    gl.to_tensor(n_q), gl.to_tensor(n_k), gl.to_tensor(total_q), gl.to_tensor(o_stride_row),
                    gl.to_tensor(o_stride_head), gl.to_tensor(o_stride_batch), gl.to_tensor(kv_seq_rows),
                    gl.to_tensor(table_stride), gl.to_tensor(off), gl.to_tensor(left), gl.to_tensor(right),
                    gl.to_tensor(qk_scale), gl.to_tensor(softcap_in), gl.to_tensor(softcap_out),
                    (gl.to_tensor(qd_b), gl.to_tensor(qd_h), gl.to_tensor(kd_b), gl.to_tensor(kd_h), gl.to_tensor(vd_b),
                     gl.to_tensor(vd_h)))
        if IS_FP8 and P_SHARED:  # each consumer's P for the PV product
            p_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, ROWS, BLOCK_N],
                                               gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], gl.float8e4nv))
        else:
            p_smem = anchor
        smem = Smem(q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns, tile_ids,
                    anchor, p_smem)
        cfg = Config(BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, Q_BUFFERS, HAS_LEFT, HAS_RIGHT, SOFTCAP, STORE_LSE, REVERSE_M,
                     PINGPONG, P_FP32, LATE_PV_WAIT, LAZY_RESCALE, DYNAMIC, IS_VARLEN, TOP_LEFT, KV_CACHE, PAGE_SIZE,
                     HAS_SINK, IS_FP8, P_SHARED, HEAD_DIM_V, QK_BLOCK, POINTER_STORE)
        # One warp_specialize per consumer count: the frontend takes the partition
        # list only as a literal in the call (a list built first, or grown in a
        # static loop, is turned into a tuple of tensors).
        if NUM_CONSUMERS == 1:
            gl.warp_specialize([
                (_load_partition, (q_desc, k_desc, v_desc, smem, call, tile_counter, cu_seqlens_q, cu_seqlens_k,
                                     cache_seqlens, block_table, kt_desc, vt_desc, cfg)),
                (_consumer_partition, (o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE, K_DESCALE, V_DESCALE, smem, call,
                                         gl.constexpr(0), cfg)),
            ], [4], [CONSUMER_REGS])
        elif NUM_CONSUMERS == 2:
            gl.warp_specialize([
                (_load_partition, (q_desc, k_desc, v_desc, smem, call, tile_counter, cu_seqlens_q, cu_seqlens_k,
                                     cache_seqlens, block_table, kt_desc, vt_desc, cfg)),
                (_consumer_partition, (o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE, K_DESCALE, V_DESCALE, smem, call,
                                         gl.constexpr(0), cfg)),
                (_consumer_partition, (o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE, K_DESCALE, V_DESCALE, smem, call,
                                         gl.constexpr(1), cfg)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_load_partition, (q_desc, k_desc, v_desc, smem, call, tile_counter, cu_seqlens_q, cu_seqlens_k,
                                     cache_seqlens, block_table, kt_desc, vt_desc, cfg)),
                (_consumer_partition, (o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE, K_DESCALE, V_DESCALE, smem, call,
                                         gl.constexpr(0), cfg)),
                (_consumer_partition, (o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE, K_DESCALE, V_DESCALE, smem, call,
                                         gl.constexpr(1), cfg)),
                (_consumer_partition, (o_desc, LSE, Out, cu_seqlens_q, cu_seqlens_k, cache_seqlens, SINKS, Q_DESCALE, K_DESCALE, V_DESCALE, smem, call,
                                         gl.constexpr(2), cfg)),
            ], [4, 4, 4], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])
