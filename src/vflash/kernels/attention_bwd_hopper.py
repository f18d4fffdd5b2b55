"""The attention backward's dQ and dK / dV for Hopper (sm_90), written in Gluon
(docs/performance.md, "The sm_90 backward"). Not dispatched yet:
`benchmarks/experiments/bwd_hopper.py` and the GPU tests run them beside the
portable `attention_bwd_dq_kernel` / `attention_bwd_dkdv_kernel`, whose math
they repeat (read `attention_bwd.py`'s docstring first). Dense [B, H, N, D]
tensors only for now.

dQ, `attention_bwd_dq_hopper_kernel`. One CTA per work tile: BLOCK_M query rows of one (batch, q head), 64 per
consumer warpgroup. A producer warpgroup (one thread issues every TMA copy)
loads each consumer's Q and dO rows once, then the tile's K / V tiles through
a ring of STAGES buffers with ready / empty mbarriers. A consumer, per key
tile, issues S = Q K^T and dP = dO V^T as asynchronous warpgroup MMAs (both
operands in shared memory), then P = exp2(S * scale - lse) from the forward's
LSE, dS = P * (dP - delta), and dQ += dS K with dS from registers as the
product's A operand. dQ [64, HEAD_DIM] fp32 stays in registers; scaled once,
it leaves through the Q buffer by TMA. Every key tile runs the masked code
(kernels/mask.py's band, key_range's tiles): the first version's choice,
correctness before speed.

dK / dV, `attention_bwd_dkdv_hopper_kernel`. One CTA per (key block, KV head,
batch), 64 keys per consumer warpgroup, whose K and V rows the producer loads
once; then the query tiles that see the block (key_range with the roles of
queries and keys exchanged, as the portable kernel's), for each query head of
the group in order, stream through a ring of Q / dO buffers. A consumer, per
query tile, issues S^T = K Q^T and dP^T = V dO^T (its 64 keys in rows), so P^T
and dS^T = P^T * (dP^T - delta) come out in the accumulator layout the next
products take as their register A operand: dV += P^T dO and dK += dS^T Q, both
B operands straight from the ring. dK and dV [64, HEAD_DIM] fp32 stay in
registers across the group's heads (a fixed order: deterministic, no atomics)
and leave by TMA through the K / V buffers. Keys past n_k need no mask: their
rows are never stored.

Gluon does not run under the Triton interpreter: the CPU suite compiles this
kernel for sm_90 (ops/hopper_bwd.py:compile_dq_sm90) and the GPU tests check
its numbers.
"""

from vflash.kernels.mask import key_range, key_tiles, masked_logits

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.language.core import _aggregate as aggregate
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    # Triton 3.6 names the TMA copies async_copy_*; later releases async_load / async_store.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    HAVE_GLUON = True
except (ImportError, AttributeError):  # a Triton without Gluon: the portable backward serves everything
    HAVE_GLUON = False

if HAVE_GLUON:
    LOG2E = gl.constexpr(1.4426950408889634)

    @aggregate
    class Config:
        """The kernel's tiles and switches, as partition arguments (a plain tuple's constexprs would
        reach a partition as runtime values)."""
        BLOCK_M: gl.constexpr
        BLOCK_N: gl.constexpr
        HEAD_DIM: gl.constexpr
        STAGES: gl.constexpr
        HAS_LEFT: gl.constexpr
        HAS_RIGHT: gl.constexpr
        SOFTCAP: gl.constexpr

        @gluon.constexpr_function
        def __init__(self, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP):
            for name, value in (("BLOCK_M", BLOCK_M), ("BLOCK_N", BLOCK_N), ("HEAD_DIM", HEAD_DIM),
                                ("STAGES", STAGES), ("HAS_LEFT", HAS_LEFT), ("HAS_RIGHT", HAS_RIGHT),
                                ("SOFTCAP", SOFTCAP)):
                setattr(self, name, gl.constexpr(value))

    @gluon.jit
    def _dq_load_partition(q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready,
                           v_ready, k_empty, v_empty, n_m, n_heads_q, kv_group, n_k, off, left, right, cfg):
        # Producer: each consumer's Q and dO rows (one barrier for the pair), then
        # K_i and V_i into ring slot i % STAGES once every consumer released the
        # slot's previous tile (a fresh barrier's parity-1 phase counts as
        # complete, so the first STAGES waits pass at once).
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = cfg.BLOCK_M
        BLOCK_N: gl.constexpr = cfg.BLOCK_N
        STAGES: gl.constexpr = cfg.STAGES
        t = gl.program_id(0)
        bh = t // n_m
        start_m = (t % n_m) * BLOCK_M
        off_h = bh % n_heads_q
        off_b = bh // n_heads_q
        off_hk = off_h // kv_group
        for c in gl.static_range(BLOCK_M // ROWS):
            mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            _tma_load(q_desc, [off_b, off_h, start_m + c * ROWS, 0], q_ready.index(c), q_smem.index(c))
            _tma_load(do_desc, [off_b, off_h, start_m + c * ROWS, 0], q_ready.index(c), do_smem.index(c))
        lo, full_lo, full_hi, hi = key_range(start_m, n_k, off, left, right, BLOCK_M, BLOCK_N, cfg.HAS_LEFT,
                                             cfg.HAS_RIGHT)
        n_tiles = key_tiles(lo, full_lo, full_hi, hi, BLOCK_N)[2]
        for i in range(n_tiles):
            slot = i % STAGES
            empty_phase = ((i // STAGES) & 1) ^ 1
            key = lo + i * BLOCK_N
            mbarrier.wait(k_empty.index(slot), empty_phase)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [off_b, off_hk, key, 0], k_ready.index(slot), k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), empty_phase)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [off_b, off_hk, key, 0], v_ready.index(slot), v_smem.index(slot))

    @gluon.jit
    def _dq_consumer_partition(dq_desc, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty,
                               v_empty, LSE, DELTA, n_m, n_heads_q, n_q, n_k, off, left, right, qk_scale, sm_scale,
                               softcap_in, softcap_out, C: gl.constexpr, cfg):
        # Consumer C: rows [start_m + 64 C, + 64) of the work tile against its key tiles.
        # S and dP [64, BLOCK_N] and dQ [64, HEAD_DIM] are wgmma accumulators over the 4 warps.
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = cfg.BLOCK_M
        BLOCK_N: gl.constexpr = cfg.BLOCK_N
        HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
        STAGES: gl.constexpr = cfg.STAGES
        HAS_LEFT: gl.constexpr = cfg.HAS_LEFT
        HAS_RIGHT: gl.constexpr = cfg.HAS_RIGHT
        SOFTCAP: gl.constexpr = cfg.SOFTCAP
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])
        ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        t = gl.program_id(0)
        bh = t // n_m
        start_m = (t % n_m) * BLOCK_M
        row0 = start_m + C * ROWS
        offs_m = row0 + gl.arange(0, ROWS, layout=s_rows)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        # lse in log2 units, -inf (a row that saw no key) made +inf so P = 0; delta = rowsum(dO * O)
        row_ok = offs_m < n_q
        lse = gl.load(LSE + bh.to(gl.int64) * n_q + offs_m, mask=row_ok, other=float("inf"))
        lse2 = gl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
        delta = gl.load(DELTA + bh.to(gl.int64) * n_q + offs_m, mask=row_ok, other=0.0)
        lo, full_lo, full_hi, hi = key_range(start_m, n_k, off, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
        n_tiles = key_tiles(lo, full_lo, full_hi, hi, BLOCK_N)[2]
        q_tile = q_smem.index(C).reshape([ROWS, HEAD_DIM])
        do_tile = do_smem.index(C).reshape([ROWS, HEAD_DIM])
        mbarrier.wait(q_ready.index(C), 0)
        dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, dq_layout)
        for i in range(n_tiles):
            slot = i % STAGES
            phase = (i // STAGES) & 1
            key = lo + i * BLOCK_N
            mbarrier.wait(k_ready.index(slot), phase)
            k_tile = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
            s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
                              use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(slot), phase)
            v_tile = v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
            dp = warpgroup_mma(do_tile, v_tile.permute((1, 0)), gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
                               use_acc=False, is_async=True)
            s, dp, k_tile, v_tile = warpgroup_mma_wait(0, deps=(s, dp, k_tile, v_tile))
            mbarrier.arrive(v_empty.index(slot), count=1)
            # Key indices relative to the tile, as the forward's (the shift goes into the bounds).
            logits = masked_logits(s, offs_m, cols, n_k - key, off - key, left, right, softcap_in, softcap_out,
                                   True, HAS_LEFT, HAS_RIGHT, SOFTCAP)
            if SOFTCAP:
                p = gl.exp2(logits - lse2[:, None])
            else:
                p = gl.exp2(logits * qk_scale - lse2[:, None])
            ds = p * (dp - delta[:, None])
            if SOFTCAP:  # the cap's derivative 1 - tanh^2, tanh from the raw product
                th = 1.0 - 2.0 / (gl.exp2(s * softcap_in * (2.0 * LOG2E)) + 1.0)
                ds = ds * (1.0 - th * th)
            ds_op = gl.convert_layout(ds.to(dtype), ds_layout)
            dq = warpgroup_mma(ds_op, k_tile, dq, is_async=True)
            dq, ds_op, k_tile = warpgroup_mma_wait(0, deps=(dq, ds_op, k_tile))
            mbarrier.arrive(k_empty.index(slot), count=1)
        # dQ out through this consumer's Q buffer (no MMA reads it any more); TMA clips rows past n_q.
        q_tile.store((dq * sm_scale).to(dtype))
        fence_async_shared()
        off_h = bh % n_heads_q
        _tma_store(dq_desc, [bh // n_heads_q, off_h, row0, 0], q_smem.index(C))
        tma.store_wait(0)

    @gluon.jit
    def attention_bwd_dq_hopper_kernel(
        q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, DELTA,
        batch, n_heads_q, kv_group, n_q, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    ):
        # grid = (B * Hq * cdiv(n_q, BLOCK_M), 1, 1), num_warps = 4 (the producer); BLOCK_M / 64
        # consumer warpgroups (1 or 2). Descriptors are 4-D over [B, H, N, D]: q, do, dq in
        # blocks [1, 1, 64, HEAD_DIM], k, v in [1, 1, BLOCK_N, HEAD_DIM]. LSE and DELTA are
        # [B, Hq, n_q] fp32 (the forward's natural-log LSE; rowsum(dO * O)).
        ROWS: gl.constexpr = 64
        NUM_CONSUMERS: gl.constexpr = BLOCK_M // ROWS
        gl.static_assert(NUM_CONSUMERS == 1 or NUM_CONSUMERS == 2, "one or two consumer warpgroups of 64 rows")
        dtype: gl.constexpr = q_desc.dtype
        n_m = gl.cdiv(n_q, BLOCK_M)
        q_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, 1, 1, ROWS, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, 1, 1, ROWS, HEAD_DIM], do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_CONSUMERS):
            mbarrier.init(q_ready.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NUM_CONSUMERS)  # one arrival per consumer
            mbarrier.init(v_empty.index(i), count=NUM_CONSUMERS)
        fence_async_shared()
        # Partition arguments must be IR values (Triton makes an integer argument equal to 1 a constant).
        n_m = gl.to_tensor(n_m)
        n_heads_q = gl.to_tensor(n_heads_q)
        kv_group = gl.to_tensor(kv_group)
        n_q = gl.to_tensor(n_q)
        n_k = gl.to_tensor(n_k)
        off = gl.to_tensor(off)
        left = gl.to_tensor(left)
        right = gl.to_tensor(right)
        qk_scale = gl.to_tensor(qk_scale)
        sm_scale = gl.to_tensor(sm_scale)
        softcap_in = gl.to_tensor(softcap_in)
        softcap_out = gl.to_tensor(softcap_out)
        cfg = Config(BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP)
        # One warp_specialize per consumer count: the frontend takes the partition list only as a literal.
        if NUM_CONSUMERS == 1:
            gl.warp_specialize([
                (_dq_load_partition, (q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, q_ready,
                                      k_ready, v_ready, k_empty, v_empty, n_m, n_heads_q, kv_group, n_k, off, left,
                                      right, cfg)),
                (_dq_consumer_partition, (dq_desc, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready,
                                          k_empty, v_empty, LSE, DELTA, n_m, n_heads_q, n_q, n_k, off, left, right,
                                          qk_scale, sm_scale, softcap_in, softcap_out, gl.constexpr(0), cfg)),
            ], [4], [CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_dq_load_partition, (q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, q_ready,
                                      k_ready, v_ready, k_empty, v_empty, n_m, n_heads_q, kv_group, n_k, off, left,
                                      right, cfg)),
                (_dq_consumer_partition, (dq_desc, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready,
                                          k_empty, v_empty, LSE, DELTA, n_m, n_heads_q, n_q, n_k, off, left, right,
                                          qk_scale, sm_scale, softcap_in, softcap_out, gl.constexpr(0), cfg)),
                (_dq_consumer_partition, (dq_desc, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready,
                                          k_empty, v_empty, LSE, DELTA, n_m, n_heads_q, n_q, n_k, off, left, right,
                                          qk_scale, sm_scale, softcap_in, softcap_out, gl.constexpr(1), cfg)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])

    @gluon.jit
    def _dkdv_load_partition(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_ready, q_ready,
                             do_ready, q_empty, do_empty, n_kb, n_heads_kv, kv_group, n_q, off, left, right, cfg):
        # Producer: each consumer's K and V rows once (one barrier for the pair), then for
        # each query head of the group and each query tile that sees the block, Q and dO
        # into ring slot j % STAGES once every consumer released the slot's previous tile.
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = cfg.BLOCK_M  # query rows a ring tile
        BLOCK_N: gl.constexpr = cfg.BLOCK_N  # keys a CTA
        STAGES: gl.constexpr = cfg.STAGES
        t = gl.program_id(0)
        bh = t // n_kb
        start_n = (t % n_kb) * BLOCK_N
        off_hk = bh % n_heads_kv
        off_b = bh // n_heads_kv
        for c in gl.static_range(BLOCK_N // ROWS):
            mbarrier.expect(kv_ready.index(c), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            _tma_load(k_desc, [off_b, off_hk, start_n + c * ROWS, 0], kv_ready.index(c), k_smem.index(c))
            _tma_load(v_desc, [off_b, off_hk, start_n + c * ROWS, 0], kv_ready.index(c), v_smem.index(c))
        lo, full_lo, full_hi, hi = key_range(start_n, n_q, -off, right, left, BLOCK_N, BLOCK_M, cfg.HAS_RIGHT,
                                             cfg.HAS_LEFT)
        n_tiles = key_tiles(lo, full_lo, full_hi, hi, BLOCK_M)[2]
        j = 0
        for g in range(kv_group):
            off_h = off_hk * kv_group + g
            for i in range(n_tiles):
                slot = j % STAGES
                empty_phase = ((j // STAGES) & 1) ^ 1
                row = lo + i * BLOCK_M
                mbarrier.wait(q_empty.index(slot), empty_phase)
                mbarrier.expect(q_ready.index(slot), q_desc.block_type.nbytes)
                _tma_load(q_desc, [off_b, off_h, row, 0], q_ready.index(slot), q_smem.index(slot))
                mbarrier.wait(do_empty.index(slot), empty_phase)
                mbarrier.expect(do_ready.index(slot), do_desc.block_type.nbytes)
                _tma_load(do_desc, [off_b, off_h, row, 0], do_ready.index(slot), do_smem.index(slot))
                j += 1

    @gluon.jit
    def _dkdv_consumer_partition(dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, kv_ready, q_ready, do_ready,
                                 q_empty, do_empty, LSE, DELTA, n_kb, n_heads_kv, kv_group, n_q, off, left, right,
                                 qk_scale, sm_scale, softcap_in, softcap_out, C: gl.constexpr, cfg):
        # Consumer C: keys [start_n + 64 C, + 64) against the block's query tiles. S^T and dP^T
        # [64, BLOCK_M], dK and dV [64, HEAD_DIM] are wgmma accumulators over the 4 warps.
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = cfg.BLOCK_M
        BLOCK_N: gl.constexpr = cfg.BLOCK_N
        HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
        STAGES: gl.constexpr = cfg.STAGES
        HAS_LEFT: gl.constexpr = cfg.HAS_LEFT
        HAS_RIGHT: gl.constexpr = cfg.HAS_RIGHT
        SOFTCAP: gl.constexpr = cfg.SOFTCAP
        dtype: gl.constexpr = k_smem.dtype
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, HEAD_DIM, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        cols_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
        t = gl.program_id(0)
        bh = t // n_kb
        start_n = (t % n_kb) * BLOCK_N
        off_hk = bh % n_heads_kv
        off_b = bh // n_heads_kv
        offs_n = start_n + C * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, st_layout))
        cols = gl.arange(0, BLOCK_M, layout=cols_layout)
        lo, full_lo, full_hi, hi = key_range(start_n, n_q, -off, right, left, BLOCK_N, BLOCK_M, HAS_RIGHT, HAS_LEFT)
        n_tiles = key_tiles(lo, full_lo, full_hi, hi, BLOCK_M)[2]
        k_tile = k_smem.index(C).reshape([ROWS, HEAD_DIM])
        v_tile = v_smem.index(C).reshape([ROWS, HEAD_DIM])
        mbarrier.wait(kv_ready.index(C), 0)
        dk = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
        j = 0
        n_heads_q = n_heads_kv * kv_group
        for g in range(kv_group):
            row_base = (off_b * n_heads_q + off_hk * kv_group + g).to(gl.int64) * n_q  # LSE / DELTA [B, Hq, n_q]
            for i in range(n_tiles):
                slot = j % STAGES
                phase = (j // STAGES) & 1
                offs_m = lo + i * BLOCK_M + cols
                m_ok = offs_m < n_q
                # lse in log2 units, -inf (a query that saw no key) and rows past n_q made +inf: P = 0
                lse = gl.load(LSE + row_base + offs_m, mask=m_ok, other=float("inf"))
                lse2 = gl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
                delta = gl.load(DELTA + row_base + offs_m, mask=m_ok, other=0.0)
                mbarrier.wait(q_ready.index(slot), phase)
                q_tile = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
                st = warpgroup_mma(k_tile, q_tile.permute((1, 0)), gl.zeros([ROWS, BLOCK_M], gl.float32, st_layout),
                                   use_acc=False, is_async=True)
                mbarrier.wait(do_ready.index(slot), phase)
                do_tile = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
                dpt = warpgroup_mma(v_tile, do_tile.permute((1, 0)), gl.zeros([ROWS, BLOCK_M], gl.float32,
                                                                              st_layout),
                                    use_acc=False, is_async=True)
                st, dpt, q_tile, do_tile = warpgroup_mma_wait(0, deps=(st, dpt, q_tile, do_tile))
                # Key j (row) sees query i (column) when j - off - right <= i <= j - off + left:
                # masked_logits' band with the edges exchanged and the offset negated.
                logits = masked_logits(st, offs_n, offs_m, n_q, -off, right, left, softcap_in, softcap_out,
                                       True, HAS_RIGHT, HAS_LEFT, SOFTCAP)
                if SOFTCAP:
                    pt = gl.exp2(logits - lse2[None, :])
                else:
                    pt = gl.exp2(logits * qk_scale - lse2[None, :])
                dst = pt * (dpt - delta[None, :])
                if SOFTCAP:  # the cap's derivative 1 - tanh^2, tanh from the raw product
                    th = 1.0 - 2.0 / (gl.exp2(st * softcap_in * (2.0 * LOG2E)) + 1.0)
                    dst = dst * (1.0 - th * th)
                # P^T and dS^T rounded to the inputs' dtype for the products, as the portable kernel's
                pt_op = gl.convert_layout(pt.to(dtype), op_layout)
                dst_op = gl.convert_layout(dst.to(dtype), op_layout)
                dv = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
                dk = warpgroup_mma(dst_op, q_tile, dk, is_async=True)
                dv, dk, pt_op, dst_op, q_tile, do_tile = warpgroup_mma_wait(
                    0, deps=(dv, dk, pt_op, dst_op, q_tile, do_tile))
                mbarrier.arrive(q_empty.index(slot), count=1)
                mbarrier.arrive(do_empty.index(slot), count=1)
                j += 1
        # dK and dV out through this consumer's K and V buffers (no MMA reads them any more);
        # TMA clips rows past n_k.
        k_tile.store((dk * sm_scale).to(dtype))
        v_tile.store(dv.to(dtype))
        fence_async_shared()
        _tma_store(dk_desc, [off_b, off_hk, start_n + C * ROWS, 0], k_smem.index(C))
        _tma_store(dv_desc, [off_b, off_hk, start_n + C * ROWS, 0], v_smem.index(C))
        tma.store_wait(0)

    @gluon.jit
    def attention_bwd_dkdv_hopper_kernel(
        q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA,
        batch, n_heads_kv, kv_group, n_q, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    ):
        # grid = (B * Hkv * cdiv(n_k, BLOCK_N), 1, 1), num_warps = 4 (the producer); BLOCK_N / 64
        # consumer warpgroups (1 or 2), BLOCK_M query rows a ring tile. Descriptors are 4-D over
        # [B, H, N, D]: k, v, dk, dv in blocks [1, 1, 64, HEAD_DIM], q, do in [1, 1, BLOCK_M,
        # HEAD_DIM]. LSE and DELTA are [B, Hq, n_q] fp32.
        ROWS: gl.constexpr = 64
        NUM_CONSUMERS: gl.constexpr = BLOCK_N // ROWS
        gl.static_assert(NUM_CONSUMERS == 1 or NUM_CONSUMERS == 2, "one or two consumer warpgroups of 64 keys")
        dtype: gl.constexpr = k_desc.dtype
        n_kb = gl.cdiv(n_k, BLOCK_N)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, 1, 1, ROWS, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, 1, 1, ROWS, HEAD_DIM], v_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
        kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_CONSUMERS):
            mbarrier.init(kv_ready.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=NUM_CONSUMERS)  # one arrival per consumer
            mbarrier.init(do_empty.index(i), count=NUM_CONSUMERS)
        fence_async_shared()
        n_kb = gl.to_tensor(n_kb)
        n_heads_kv = gl.to_tensor(n_heads_kv)
        kv_group = gl.to_tensor(kv_group)
        n_q = gl.to_tensor(n_q)
        off = gl.to_tensor(off)
        left = gl.to_tensor(left)
        right = gl.to_tensor(right)
        qk_scale = gl.to_tensor(qk_scale)
        sm_scale = gl.to_tensor(sm_scale)
        softcap_in = gl.to_tensor(softcap_in)
        softcap_out = gl.to_tensor(softcap_out)
        cfg = Config(BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP)
        if NUM_CONSUMERS == 1:
            gl.warp_specialize([
                (_dkdv_load_partition, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_ready,
                                        q_ready, do_ready, q_empty, do_empty, n_kb, n_heads_kv, kv_group, n_q, off,
                                        left, right, cfg)),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, kv_ready, q_ready,
                                            do_ready, q_empty, do_empty, LSE, DELTA, n_kb, n_heads_kv, kv_group, n_q,
                                            off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
                                            gl.constexpr(0), cfg)),
            ], [4], [CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_dkdv_load_partition, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_ready,
                                        q_ready, do_ready, q_empty, do_empty, n_kb, n_heads_kv, kv_group, n_q, off,
                                        left, right, cfg)),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, kv_ready, q_ready,
                                            do_ready, q_empty, do_empty, LSE, DELTA, n_kb, n_heads_kv, kv_group, n_q,
                                            off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
                                            gl.constexpr(0), cfg)),
                (_dkdv_consumer_partition, (dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, kv_ready, q_ready,
                                            do_ready, q_empty, do_empty, LSE, DELTA, n_kb, n_heads_kv, kv_group, n_q,
                                            off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
                                            gl.constexpr(1), cfg)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
