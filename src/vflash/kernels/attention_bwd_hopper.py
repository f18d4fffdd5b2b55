"""The attention backward's dQ for Hopper (sm_90), written in Gluon: the first
of the two sm_90 backward kernels (docs/performance.md, "The sm_90 backward").
Not dispatched yet: `benchmarks/experiments/bwd_hopper.py` and the GPU tests
run it beside the portable `attention_bwd_dq_kernel`, whose math it repeats
(read `attention_bwd.py`'s docstring first).

One CTA per work tile: BLOCK_M query rows of one (batch, q head), 64 per
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
