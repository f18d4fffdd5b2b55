"""MLA decode on one latent cache for Hopper (sm_90), written in Gluon: FlashMLA's split of the
output's columns over two warpgroups, launched by ops/mla_sm90.py where vflash.dispatch picks it.

DeepSeek-V3's absorbed attention is MQA over one cache head of 576 values a token (512 latent + 64
rope): every query head's q [576] meets the same keys, and V is each key's first 512 values. The
portable KV-cache kernel's V_IN_K path serves it anywhere; on sm_90 its [rows, 512] fp32 output
outgrows one warpgroup's registers (256 a thread at 64 rows). Here:

- A CTA takes 64 rows of one sequence, a row a (query, head) pair (row r: query r // Hq, head
  r % Hq, as q [B, Nq, Hq, 576] lies in memory), and one split of its keys (grid: splits, row
  tiles, sequences). A producer warpgroup (one thread issues every TMA copy) loads Q once and the
  key tiles through a ring of STAGES slots, each key tile as three column parts: [BLOCK_N, 256]
  twice (the latent's halves, which are also V's) and [BLOCK_N, ROPE]. A paged cache's tile is one
  copy a page where pages are shorter than the tile.
- Consumer 0 (the softmax owner) computes S = Q K^T for the whole tile (three wgmma chains into one
  accumulator), the masks and the online softmax, hands P (16-bit) and the rows' rescale alpha to
  consumer 1 through shared memory, and accumulates O[:, :256] += P V[:, :256] with P from
  registers. Consumer 1 rescales and accumulates O[:, 256:] += P V[:, 256:] with P from shared
  memory, while consumer 0 computes the next tile's S. Each holds [64, 256] fp32 of O (128
  registers a thread); one P buffer, its reuse gated by consumer 1's release.
- The last tile's keys past the sequence's length are cache rows that may hold anything: S masks
  them and consumer 0 zeroes them in shared memory before either PV product reads them.
- The row's finish (softmax_finish, the sink's term included) is consumer 0's; it hands the
  normalizer to consumer 1. Unsplit: both store their halves of the output (and consumer 0 the
  LSE) through pointers, rows of the tile past the sequence's own alone. IS_SPLIT: both store fp32
  partials with the split's LSE (no sink: it enters once, at kernels/combine.py's merge), which
  a second launch merges.

Gluon does not run under the Triton interpreter: the CPU suite compiles this kernel for sm_90
(ops/mla_sm90.py) and the GPU tests check its numbers.
"""

from vflash.kernels.gluon_sm90 import HAVE_GLUON
from vflash.kernels.mask import masked_logits
from vflash.kernels.paging import key_row
from vflash.kernels.softmax import softmax_finish, softmax_step

if HAVE_GLUON:
    from vflash.kernels.gluon_sm90 import (aggregate, fence_async_shared, gl, gluon, mbarrier, ring, tma_load,
                                           warpgroup_mma, warpgroup_mma_wait, zero_rows_from)

    @aggregate
    class Config:
        """The kernel's tiles and switches, and a consumer's register layouts (one warpgroup, 16 rows a warp)."""
        BLOCK_N: gl.constexpr  # keys a tile
        STAGES: gl.constexpr
        HALF: gl.constexpr  # V's columns a consumer (the latent's half: 256)
        ROPE: gl.constexpr  # q's and k's columns past the latent (64)
        PAGE_SIZE: gl.constexpr  # 0: a contiguous cache
        PAGE_ROWS: gl.constexpr  # rows a copy: BLOCK_N, or a page's where pages are shorter
        HAS_RIGHT: gl.constexpr  # causal (bottom-right): query i sees keys up to n_k - n_q + i
        STORE_LSE: gl.constexpr
        IS_SPLIT: gl.constexpr  # fp32 partials and their LSEs (a merge launch finishes them)
        HAS_SINK: gl.constexpr  # the sink's term in the finish (unsplit; a split's partials carry none)
        S_LAYOUT: gl.constexpr  # [64, BLOCK_N] scores, a wgmma accumulator
        O_LAYOUT: gl.constexpr  # [64, HALF] a consumer's output columns, a wgmma accumulator
        P_LAYOUT: gl.constexpr  # [64, BLOCK_N] P as consumer 0's register operand

        @gluon.constexpr_function
        def __init__(self, BLOCK_N, STAGES, HALF, ROPE, PAGE_SIZE, HAS_RIGHT, STORE_LSE, IS_SPLIT, HAS_SINK):
            for name, value in (("BLOCK_N", BLOCK_N), ("STAGES", STAGES), ("HALF", HALF), ("ROPE", ROPE),
                                ("PAGE_SIZE", PAGE_SIZE), ("HAS_RIGHT", HAS_RIGHT), ("STORE_LSE", STORE_LSE),
                                ("IS_SPLIT", IS_SPLIT), ("HAS_SINK", HAS_SINK)):
                setattr(self, name, gl.constexpr(value))
            block_n = self.BLOCK_N.value
            self.PAGE_ROWS = gl.constexpr(block_n if PAGE_SIZE == 0 else min(PAGE_SIZE, block_n))
            self.S_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                   instr_shape=[16, block_n, 16]))
            self.O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                   instr_shape=[16, self.HALF.value, 16]))
            self.P_LAYOUT = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=self.O_LAYOUT.value,
                                                             k_width=2))

    @aggregate
    class Call:
        """The runtime scalars as IR values (a partition's arguments must be)."""
        heads_q: gl.tensor
        n_q: gl.tensor  # new queries a sequence
        total_q: gl.tensor  # B * n_q: LSE's head stride
        kv_seq_rows: gl.tensor  # contiguous cache: its rows a sequence
        table_stride: gl.tensor  # paged: block_table's row stride
        qk_scale: gl.tensor  # the softmax scale times log2(e)
        num_splits: gl.tensor

        @gluon.constexpr_function
        def __init__(self, heads_q, n_q, total_q, kv_seq_rows, table_stride, qk_scale, num_splits):
            self.heads_q, self.n_q, self.total_q = heads_q, n_q, total_q
            self.kv_seq_rows, self.table_stride, self.qk_scale = kv_seq_rows, table_stride, qk_scale
            self.num_splits = num_splits

    @aggregate
    class Work:
        """This CTA's work: sequence b, its rows [row_start, + 64) of its n_q * Hq (row0: the first in the
        flattened [B * n_q * Hq] rows), its keys n_k, its split's key tiles [first, last) of which
        [first, masked_from) need no mask."""
        b: gl.tensor
        split: gl.tensor
        row_start: gl.tensor
        row0: gl.tensor
        seq_rows: gl.tensor
        n_k: gl.tensor
        first: gl.tensor
        masked_from: gl.tensor
        last: gl.tensor

        @gluon.constexpr_function
        def __init__(self, b, split, row_start, row0, seq_rows, n_k, first, masked_from, last):
            self.b, self.split, self.row_start, self.row0, self.seq_rows = b, split, row_start, row0, seq_rows
            self.n_k, self.first, self.masked_from, self.last = n_k, first, masked_from, last

    @aggregate
    class Smem:
        """Shared memory: Q's three column parts, the ring's (K's parts, its slots' ready / empty barriers),
        P and alpha (consumer 0 to 1, p_ready / p_empty), the rows' normalizer (fin, fin_ready)."""
        q_lo: gl.shared_memory_descriptor
        q_hi: gl.shared_memory_descriptor
        q_rope: gl.shared_memory_descriptor
        k_lo: gl.shared_memory_descriptor
        k_hi: gl.shared_memory_descriptor
        k_rope: gl.shared_memory_descriptor
        p: gl.shared_memory_descriptor
        alpha: gl.shared_memory_descriptor
        fin: gl.shared_memory_descriptor
        q_ready: gl.shared_memory_descriptor
        k_ready: gl.shared_memory_descriptor
        k_empty: gl.shared_memory_descriptor
        p_ready: gl.shared_memory_descriptor
        p_empty: gl.shared_memory_descriptor
        fin_ready: gl.shared_memory_descriptor

        @gluon.constexpr_function
        def __init__(self, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, p, alpha, fin, q_ready, k_ready, k_empty, p_ready,
                     p_empty, fin_ready):
            self.q_lo, self.q_hi, self.q_rope, self.k_lo, self.k_hi, self.k_rope = q_lo, q_hi, q_rope, k_lo, k_hi, k_rope
            self.p, self.alpha, self.fin = p, alpha, fin
            self.q_ready, self.k_ready, self.k_empty = q_ready, k_ready, k_empty
            self.p_ready, self.p_empty, self.fin_ready = p_ready, p_empty, fin_ready

    @gluon.jit
    def _work(call, cache_seqlens, cfg):
        # The CTA's Work. Rows [row_start, + 64) hold queries i_first .. i_last; causal, query i sees keys
        # [0, n_k - n_q + 1 + i): the tile's rows together see keys up to hi, all of them up to full_hi. Its
        # key tiles [0, cdiv(hi, BLOCK_N)) go to the splits in runs of cdiv(tiles, splits); a split's tiles
        # past full_hi // BLOCK_N are masked.
        ROWS: gl.constexpr = 64
        split = gl.program_id(0)
        row_start = gl.program_id(1) * ROWS
        b = gl.program_id(2)
        n_k = gl.load(cache_seqlens + b)
        seq_rows = call.n_q * call.heads_q
        row0 = b * seq_rows + row_start
        if cfg.HAS_RIGHT:
            i_first = row_start // call.heads_q
            i_last = gl.minimum(call.n_q - 1, (row_start + ROWS - 1) // call.heads_q)
            hi = gl.maximum(gl.minimum(n_k, n_k - call.n_q + 1 + i_last), 0)
            full_hi = gl.maximum(gl.minimum(n_k, n_k - call.n_q + 1 + i_first), 0)
        else:
            hi = n_k
            full_hi = n_k
        n_tiles = gl.cdiv(hi, cfg.BLOCK_N)
        per = gl.cdiv(n_tiles, call.num_splits)
        first = gl.minimum(split * per, n_tiles)
        last = gl.minimum(first + per, n_tiles)
        masked_from = gl.maximum(gl.minimum(full_hi // cfg.BLOCK_N, last), first)
        return Work(b, split, row_start, row0, seq_rows, n_k, first, masked_from, last)

    @gluon.jit
    def _load_partition(q_half_desc, q_rope_desc, k_half_desc, k_rope_desc, smem, call, cache_seqlens, block_table,
                        cfg):
        # Producer: Q's three parts once, then the split's key tiles, each slot refilled once both consumers
        # released its previous tile (a fresh barrier's parity-1 phase counts as complete).
        w = _work(call, cache_seqlens, cfg)
        mbarrier.expect(smem.q_ready.index(0), 2 * q_half_desc.block_type.nbytes + q_rope_desc.block_type.nbytes)
        tma_load(q_half_desc, [0, 0, w.row0, 0], smem.q_ready.index(0), smem.q_lo)
        tma_load(q_half_desc, [0, 0, w.row0, cfg.HALF], smem.q_ready.index(0), smem.q_hi)
        tma_load(q_rope_desc, [0, 0, w.row0, 2 * cfg.HALF], smem.q_ready.index(0), smem.q_rope)
        COPIES: gl.constexpr = cfg.BLOCK_N // cfg.PAGE_ROWS
        for i in range(w.first, w.last):
            slot, phase = ring(i - w.first, cfg.STAGES)
            key = i * cfg.BLOCK_N
            rows = ()
            for c in gl.static_range(COPIES):  # the page ids read before the slot's wait hides their latency
                rows = rows + (key_row(block_table, w.b, call.table_stride, w.n_k, key + c * cfg.PAGE_ROWS,
                                        w.b * call.kv_seq_rows, cfg.PAGE_SIZE),)
            ready = smem.k_ready.index(slot)
            mbarrier.wait(smem.k_empty.index(slot), phase ^ 1)
            mbarrier.expect(ready, COPIES * (2 * k_half_desc.block_type.nbytes + k_rope_desc.block_type.nbytes))
            for c in gl.static_range(COPIES):
                tma_load(k_half_desc, [0, 0, rows[c], 0], ready,
                         smem.k_lo.index(slot).slice(c * cfg.PAGE_ROWS, cfg.PAGE_ROWS, 2))
                tma_load(k_half_desc, [0, 0, rows[c], cfg.HALF], ready,
                         smem.k_hi.index(slot).slice(c * cfg.PAGE_ROWS, cfg.PAGE_ROWS, 2))
                tma_load(k_rope_desc, [0, 0, rows[c], 2 * cfg.HALF], ready,
                         smem.k_rope.index(slot).slice(c * cfg.PAGE_ROWS, cfg.PAGE_ROWS, 2))

    @gluon.jit
    def _owner_tiles(o, m_i, l_i, smem, w, start, stop, offs_i, call, MASKED: gl.constexpr, cfg):
        # Consumer 0 over key tiles [start, stop): S, the mask, the softmax step, P and alpha to consumer 1,
        # O[:, :HALF] += P V[:, :HALF]. Returns the carried state.
        ROWS: gl.constexpr = 64
        s_layout: gl.constexpr = cfg.S_LAYOUT
        o_rows: gl.constexpr = gl.SliceLayout(1, cfg.O_LAYOUT)
        dtype: gl.constexpr = smem.q_lo.dtype
        q_lo = smem.q_lo.reshape([ROWS, cfg.HALF])
        q_hi = smem.q_hi.reshape([ROWS, cfg.HALF])
        q_rope = smem.q_rope.reshape([ROWS, cfg.ROPE])
        cols = gl.arange(0, cfg.BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        for i in range(start, stop):
            j = i - w.first
            slot, phase = ring(j, cfg.STAGES)
            mbarrier.wait(smem.k_ready.index(slot), phase)
            k_lo = smem.k_lo.index(slot).reshape([cfg.BLOCK_N, cfg.HALF])
            k_hi = smem.k_hi.index(slot).reshape([cfg.BLOCK_N, cfg.HALF])
            k_rope = smem.k_rope.index(slot).reshape([cfg.BLOCK_N, cfg.ROPE])
            s = warpgroup_mma(q_lo, k_lo.permute((1, 0)), gl.zeros([ROWS, cfg.BLOCK_N], gl.float32, s_layout),
                              use_acc=False, is_async=True)
            s = warpgroup_mma(q_hi, k_hi.permute((1, 0)), s, is_async=True)
            s = warpgroup_mma(q_rope, k_rope.permute((1, 0)), s, is_async=True)
            s, k_lo, k_hi, k_rope = warpgroup_mma_wait(0, deps=(s, k_lo, k_hi, k_rope))
            key = i * cfg.BLOCK_N
            # keys relative to the tile (the shift in the row bounds); query i's last key n_k - n_q + i
            s = masked_logits(s, offs_i, cols, w.n_k - key, w.n_k - call.n_q - key, 0, 0, 0.0, 0.0, MASKED, False,
                              cfg.HAS_RIGHT, False)
            p, alpha, m_i, l_i = softmax_step(s, gl.max(s, 1), m_i, l_i, call.qk_scale, MASKED, False, 0.0, 0.0)
            if MASKED:
                if w.n_k - key < cfg.BLOCK_N:  # V's rows past the sequence's end: zero, which P's zeros cancel
                    zero_rows_from(k_lo, w.n_k - key, cfg.BLOCK_N, cfg.HALF)
                    zero_rows_from(k_hi, w.n_k - key, cfg.BLOCK_N, cfg.HALF)
            p16 = p.to(dtype)
            mbarrier.wait(smem.p_empty.index(0), (j & 1) ^ 1)  # consumer 1 is done with the previous P
            smem.p.store(p16)
            smem.alpha.store(alpha)
            fence_async_shared()
            mbarrier.arrive(smem.p_ready.index(0), count=1)
            o = o * gl.convert_layout(alpha, o_rows)[:, None]
            p_op = gl.convert_layout(p16, cfg.P_LAYOUT)
            o = warpgroup_mma(p_op, k_lo, o, is_async=True)
            o, p_op, k_lo = warpgroup_mma_wait(0, deps=(o, p_op, k_lo))
            mbarrier.arrive(smem.k_empty.index(slot), count=1)
        return o, m_i, l_i

    @gluon.jit
    def _store_rows(o, w, Out, O_PART, col0, call, cfg):
        # A consumer's [64, HALF] output columns from col0 (already normalized): rows of the sequence only,
        # into Out [B * n_q * Hq, 2 * HALF] or, IS_SPLIT, the split's fp32 partials (O_PART's split w.split)
        ROWS: gl.constexpr = 64
        o_layout: gl.constexpr = cfg.O_LAYOUT
        D_V: gl.constexpr = 2 * cfg.HALF
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        cols = col0 + gl.arange(0, cfg.HALF, layout=gl.SliceLayout(0, o_layout))
        ok = (w.row_start + rows < w.seq_rows)[:, None]
        offs = (w.row0 + rows).to(gl.int64)[:, None] * D_V + cols[None, :]
        if cfg.IS_SPLIT:
            total_rows = call.total_q.to(gl.int64) * call.heads_q
            gl.store(O_PART + w.split * (total_rows * D_V) + offs, o, mask=ok)
        else:
            gl.store(Out + offs, o.to(Out.dtype.element_ty), mask=ok)

    @gluon.jit
    def _owner_partition(Out, LSE, O_PART, LSE_PART, SINKS, cache_seqlens, smem, call, cfg):
        # Consumer 0: the softmax's owner and O's first HALF columns.
        ROWS: gl.constexpr = 64
        s_rows: gl.constexpr = gl.SliceLayout(1, cfg.S_LAYOUT)
        o_rows: gl.constexpr = gl.SliceLayout(1, cfg.O_LAYOUT)
        w = _work(call, cache_seqlens, cfg)
        r = w.row_start + gl.arange(0, ROWS, layout=s_rows)  # the rows in the sequence's
        offs_i = r // call.heads_q  # their queries
        heads = r % call.heads_q
        if cfg.HAS_SINK:
            sink = gl.load(SINKS + heads)
        else:
            sink = 0.0
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=s_rows)
        l_i = gl.zeros([ROWS], gl.float32, layout=s_rows)
        o = gl.zeros([ROWS, cfg.HALF], gl.float32, layout=cfg.O_LAYOUT)
        mbarrier.wait(smem.q_ready.index(0), 0)
        o, m_i, l_i = _owner_tiles(o, m_i, l_i, smem, w, w.first, w.masked_from, offs_i, call, False, cfg)
        o, m_i, l_i = _owner_tiles(o, m_i, l_i, smem, w, w.masked_from, w.last, offs_i, call, True, cfg)
        inv_l, lse = softmax_finish(m_i, l_i, sink, cfg.HAS_SINK)
        smem.fin.store(inv_l)
        mbarrier.arrive(smem.fin_ready.index(0), count=1)
        _store_rows(o * gl.convert_layout(inv_l, o_rows)[:, None], w, Out, O_PART, 0, call, cfg)
        # row r: query b * n_q + r // Hq of head r % Hq, at [head, query] of LSE [Hq, total_q]
        offs = heads.to(gl.int64) * call.total_q + w.b * call.n_q + offs_i
        if cfg.IS_SPLIT:
            gl.store(LSE_PART + w.split * (call.total_q.to(gl.int64) * call.heads_q) + offs, lse, mask=r < w.seq_rows)
        elif cfg.STORE_LSE:
            gl.store(LSE + offs, lse, mask=r < w.seq_rows)

    @gluon.jit
    def _helper_partition(Out, O_PART, cache_seqlens, smem, call, cfg):
        # Consumer 1: O's last HALF columns from consumer 0's P and alpha, V's second half.
        ROWS: gl.constexpr = 64
        o_rows: gl.constexpr = gl.SliceLayout(1, cfg.O_LAYOUT)
        w = _work(call, cache_seqlens, cfg)
        o = gl.zeros([ROWS, cfg.HALF], gl.float32, layout=cfg.O_LAYOUT)
        for i in range(w.first, w.last):
            j = i - w.first
            slot, phase = ring(j, cfg.STAGES)
            mbarrier.wait(smem.p_ready.index(0), j & 1)
            mbarrier.wait(smem.k_ready.index(slot), phase)  # landed (consumer 0 saw it): no wait in effect
            o = o * smem.alpha.load(o_rows)[:, None]
            v = smem.k_hi.index(slot).reshape([cfg.BLOCK_N, cfg.HALF])
            o = warpgroup_mma(smem.p, v, o, is_async=True)
            o, v = warpgroup_mma_wait(0, deps=(o, v))
            mbarrier.arrive(smem.p_empty.index(0), count=1)
            mbarrier.arrive(smem.k_empty.index(slot), count=1)
        mbarrier.wait(smem.fin_ready.index(0), 0)
        _store_rows(o * smem.fin.load(o_rows)[:, None], w, Out, O_PART, cfg.HALF, call, cfg)

    @gluon.jit
    def mla_decode_sm90_kernel(
        q_half_desc, q_rope_desc, k_half_desc, k_rope_desc, Out, LSE, O_PART, LSE_PART, SINKS, CACHE_SEQLENS,
        BLOCK_TABLE, heads_q, n_q, total_q, num_splits, kv_seq_rows, table_stride, qk_scale,
        BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HALF: gl.constexpr, ROPE: gl.constexpr, PAGE_SIZE: gl.constexpr,
        HAS_RIGHT: gl.constexpr, STORE_LSE: gl.constexpr, IS_SPLIT: gl.constexpr, HAS_SINK: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
    ):
        # grid = (num_splits, cdiv(n_q * Hq, 64), B), num_warps = 4 (the producer), two consumer warpgroups.
        # Descriptors are 4-D over [1, 1, rows, 576] views: q's [B * n_q * Hq] rows in blocks [1, 1, 64, HALF]
        # (two, the latent's halves) and [1, 1, 64, ROPE]; the cache's rows (pages * page_size, or B *
        # kv_seq_rows contiguous) in [1, 1, PAGE_ROWS, HALF] and [1, 1, PAGE_ROWS, ROPE]. Out [B * n_q * Hq,
        # 2 * HALF], LSE [Hq, total_q] fp32 (STORE_LSE), O_PART [splits, total_q * Hq, 2 * HALF] / LSE_PART
        # [splits, Hq, total_q] fp32 (IS_SPLIT), SINKS [Hq] fp32 (HAS_SINK, unsplit), CACHE_SEQLENS [B] int32,
        # BLOCK_TABLE [B, table_stride] int32 (PAGE_SIZE > 0). qk_scale: the scale times log2(e).
        cfg = Config(BLOCK_N, STAGES, HALF, ROPE, PAGE_SIZE, HAS_RIGHT, STORE_LSE, IS_SPLIT, HAS_SINK)
        call = Call(gl.to_tensor(heads_q), gl.to_tensor(n_q), gl.to_tensor(total_q), gl.to_tensor(kv_seq_rows),
                    gl.to_tensor(table_stride), gl.to_tensor(qk_scale), gl.to_tensor(num_splits))
        ROWS: gl.constexpr = 64
        dtype: gl.constexpr = q_half_desc.dtype
        q_lo = gl.allocate_shared_memory(dtype, [1, 1, ROWS, HALF], q_half_desc.layout)
        q_hi = gl.allocate_shared_memory(dtype, [1, 1, ROWS, HALF], q_half_desc.layout)
        q_rope = gl.allocate_shared_memory(dtype, [1, 1, ROWS, ROPE], q_rope_desc.layout)
        k_lo = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HALF], k_half_desc.layout)
        k_hi = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HALF], k_half_desc.layout)
        k_rope = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, ROPE], k_rope_desc.layout)
        p = gl.allocate_shared_memory(dtype, [ROWS, BLOCK_N], gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N],
                                                                                                 dtype))
        rows_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        alpha = gl.allocate_shared_memory(gl.float32, [ROWS], rows_layout)
        fin = gl.allocate_shared_memory(gl.float32, [ROWS], rows_layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        p_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        fin_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready.index(0), count=1)
        mbarrier.init(p_ready.index(0), count=1)
        mbarrier.init(p_empty.index(0), count=1)
        mbarrier.init(fin_ready.index(0), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(s), count=1)
            mbarrier.init(k_empty.index(s), count=2)  # one arrival a consumer
        fence_async_shared()
        smem = Smem(q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, p, alpha, fin, q_ready, k_ready, k_empty, p_ready,
                    p_empty, fin_ready)
        gl.warp_specialize([
            (_load_partition, (q_half_desc, q_rope_desc, k_half_desc, k_rope_desc, smem, call, CACHE_SEQLENS,
                               BLOCK_TABLE, cfg)),
            (_owner_partition, (Out, LSE, O_PART, LSE_PART, SINKS, CACHE_SEQLENS, smem, call, cfg)),
            (_helper_partition, (Out, O_PART, CACHE_SEQLENS, smem, call, cfg)),
        ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
