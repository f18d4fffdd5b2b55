"""Fused attention forward: one Triton kernel family for every feature of
`vflash.attention`.

One program computes one [BLOCK_M, D] tile of the output for one (batch, query
head). It streams the K/V tiles that the tile's rows can see, keeps the running
max `m`, sum `l` and accumulator `acc` in fp32 registers (online softmax, in the
log2 domain: `log2(e)` is folded into the scale so the inner loop uses exp2), and
writes the output tile and, on request, its natural-log LSE once.

Masking is the band of `kernels/mask.py`; each tile's key range splits into a
masked stretch at each edge and an unmasked middle, each a loop compiled for its mask
(the KV-cache kernel's ONE_LOOP: one masked loop over the whole range, one pipeline
prologue for a split's few tiles instead of three).
"""

import triton
import triton.language as tl

from vflash.kernels.combine import fold_splits
from vflash.kernels.mask import key_range, masked_logits
from vflash.kernels.seqlen import sequence
from vflash.kernels.paging import page_ids, table_row
from vflash.kernels.softmax import softmax_finish, softmax_step
from vflash.kernels.tile import (P_E4M3_LOG2, cast, descaled, dot, f16_scale, load_at, load_rows, load_tile, scores,
                                 to_e4m3)


@triton.jit
def _online_update(
    acc, l_i, m_i, qk, v, offs_m, offs_n,
    n_k, off, left, right, qk_scale, softcap_in, softcap_out,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # One K/V tile folded into one row block: qk [rows, BLOCK_N] raw scores,
    # v [BLOCK_N, HEAD_DIM_PAD]; acc [rows, HEAD_DIM_PAD], l_i/m_i [rows] fp32.
    qk = masked_logits(qk, offs_m, offs_n, n_k, off, left, right, softcap_in, softcap_out,
                       MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP)
    # P is rounded to the input dtype for the PV product, as in FlashAttention; e4m3 (FP8 V) times
    # 2^P_E4M3_LOG2 (row max 256: the normals' top binade), folded into exp2's operand (softmax_step's
    # P_LOG2; l counts in the same units, and _store_rows finishes with m - P_E4M3_LOG2)
    p, alpha, m_new, l_i = softmax_step(qk, tl.max(qk, 1), m_i, l_i, qk_scale, MASKED, SOFTCAP, 0.0,
                                        P_E4M3_LOG2 if v.dtype == tl.float8e4nv else 0.0)
    acc = acc * alpha[:, None]
    if v.dtype == tl.float8e4nv:
        p = to_e4m3(p, EMULATE_BF16)
    else:
        p = cast(p, v.dtype, EMULATE_BF16)
    acc = dot(p, v, acc, EMULATE_BF16, DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _attend_tiles(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, offs_dv, start, stop,
    n_k, off, left, right, qk_scale, softcap_in, softcap_out,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Key tiles [start, stop) for one block of rows (q [BLOCK_M, HEAD_DIM_PAD]).
    CHECK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    CHECK_DV: tl.constexpr = HEAD_DIM_V != HEAD_DIM_V_PAD
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + offs_n0  # [BLOCK_N]
        k = load_tile(k_base, offs_n, offs_d, stride_kn, stride_kd, n_k, HEAD_DIM, MASKED, CHECK_D)
        qk = scores(q, k, EMULATE_BF16, DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        v = load_tile(v_base, offs_n, offs_dv, stride_vn, stride_vd, n_k, HEAD_DIM_V, MASKED, CHECK_DV)
        # Key indices relative to the tile (the shift goes into the row bounds): see the sm90 kernel.
        acc, l_i, m_i = _online_update(acc, l_i, m_i, qk, v, offs_m, offs_n0, n_k - start_n, off - start_n, left,
                                       right, qk_scale, softcap_in, softcap_out, MASKED, HAS_LEFT, HAS_RIGHT,
                                       SOFTCAP, EMULATE_BF16, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attend_cache_tiles(
    acc, l_i, m_i, q, q_v,
    k_base, v_base, stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd, table, page,
    offs_m, offs_d, offs_dv, start, stop, step,
    n_k, off, left, right, qk_scale, softcap_in, softcap_out,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr, IS_PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, V_IN_K: tl.constexpr,
):
    # _attend_tiles over a KV cache, key tiles start, start + step, ... below stop (step a
    # multiple of BLOCK_N: a split's tiles interleave with its sibling splits'). IS_PAGED: key
    # j of the sequence is row j % PAGE_SIZE of page table[j // PAGE_SIZE] (its block-table
    # row); `page` holds the first tile's page ids (_page_ids, loaded by the caller: as early
    # as its start is known) and each later tile's are loaded one tile ahead, so its K / V
    # addresses never wait on a table load of the same step (which left the pipeliner one
    # K / V buffer and a full load round trip a tile). Keys past n_k read no table entry
    # past the first tile's and load zeros. Else the bases point at the sequence's
    # rows of a contiguous cache. `start` is a multiple of BLOCK_N (key_range's stretches
    # are tile-aligned), so where pages and tiles nest (one divides the other) a tile row's
    # place in its page is the tile's offset plus a loop-invariant part: the row and column
    # offsets are added to the bases once, and a tile adds a page's base a row (or the
    # tile's rows of a contiguous cache), not a 64-bit sum a row per address.
    # V_IN_K (v a view of each K row's first HEAD_DIM_V columns: MLA's latent cache): the V tile is those
    # columns of K, loaded once for both products; offs_d then holds K's other columns (HEAD_DIM_V on), q
    # those of q, and q_v q's first HEAD_DIM_V: q.k = q_v.v + q.k_rest. Else q_v is unused.
    K_FROM: tl.constexpr = HEAD_DIM_V if V_IN_K else 0
    CHECK_D: tl.constexpr = HEAD_DIM - K_FROM != HEAD_DIM_PAD
    CHECK_DV: tl.constexpr = HEAD_DIM_V != HEAD_DIM_V_PAD
    NESTED: tl.constexpr = (BLOCK_N % PAGE_SIZE == 0) or (PAGE_SIZE % BLOCK_N == 0)
    offs_n0 = tl.arange(0, BLOCK_N)
    if IS_PAGED:
        if NESTED:
            rows0 = offs_n0 % PAGE_SIZE
            table_in = table + offs_n0 // PAGE_SIZE  # a tile's page ids at + its first key's page
        else:
            rows0 = offs_n0 * 0
    else:
        rows0 = offs_n0
    rows0 = rows0.to(tl.int64)  # once, outside the loop: a row stride times BLOCK_N may pass 2^31
    k_in = k_base + rows0[:, None] * stride_kn + offs_d[None, :] * stride_kd  # [BLOCK_N, HEAD_DIM_PAD]
    v_in = v_base + rows0[:, None] * stride_vn + offs_dv[None, :] * stride_vd  # [BLOCK_N, HEAD_DIM_V_PAD]
    for start_n in range(start, stop, step):
        offs_n = start_n + offs_n0  # [BLOCK_N]
        if IS_PAGED:
            if NESTED:  # the tile's first row in its (first) page, and the next tile's page ids: one scalar
                # division a tile, not a signed one a row
                slot = tl.cast(start_n % PAGE_SIZE, tl.int64)
                next_ids = table_in + (start_n + step) // PAGE_SIZE
            else:
                slot = (offs_n % PAGE_SIZE).to(tl.int64)
                next_ids = table + (offs_n + step) // PAGE_SIZE
            k_rows = page.to(tl.int64) * stride_kp + slot * stride_kn  # [BLOCK_N]
            v_rows = page.to(tl.int64) * stride_vp + slot * stride_vn
            k = load_at(k_in + k_rows[:, None], offs_n, offs_d, n_k, HEAD_DIM, MASKED, CHECK_D)
            v = load_at(v_in + v_rows[:, None], offs_n, offs_dv, n_k, HEAD_DIM_V, MASKED, CHECK_DV)
            page = tl.load(next_ids, mask=offs_n + step < n_k, other=0)
        else:
            k = load_at(k_in + tl.cast(start_n, tl.int64) * stride_kn, offs_n, offs_d, n_k, HEAD_DIM, MASKED, CHECK_D)
            v = load_at(v_in + tl.cast(start_n, tl.int64) * stride_vn, offs_n, offs_dv, n_k, HEAD_DIM_V, MASKED,
                        CHECK_DV)
        if k.dtype != q.dtype:  # an FP8 cache: widened to fp16 (exact), its descales applied by the caller
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        qk = scores(q, k, EMULATE_BF16, DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        if V_IN_K:
            qk += scores(q_v, v, EMULATE_BF16, DOT_PRECISION)
        acc, l_i, m_i = _online_update(acc, l_i, m_i, qk, v, offs_m, offs_n0, n_k - start_n, off - start_n, left,
                                       right, qk_scale, softcap_in, softcap_out, MASKED, HAS_LEFT, HAS_RIGHT,
                                       SOFTCAP, EMULATE_BF16, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _page_ids(table, table_cols, start, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, IS_PAGED: tl.constexpr):
    # The page ids [BLOCK_N] of the key tile at `start` (a block-table row of table_cols
    # entries), bounded by the table's width and not by the sequence's length, so that the
    # load waits on nothing but `start`; ids past the length are never used (their K / V
    # rows are masked). A contiguous cache has none (zeros).
    offs = start + tl.arange(0, BLOCK_N)
    if IS_PAGED:
        return page_ids(table, offs, table_cols, PAGE_SIZE)
    else:
        return offs * 0


@triton.jit
def _attend_tiles_split(
    acc0, l0, m0, q0, acc1, l1, m1, q1,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m0, offs_m1, offs_d, offs_dv, start, stop,
    n_k, off, left, right, qk_scale, softcap_in, softcap_out,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_V_PAD: tl.constexpr,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # As _attend_tiles for two independent halves of the rows sharing each K/V
    # tile. Both QK products are issued before either softmax, so the exp2s of one
    # half can run while the tensor cores work on the other (measured +8 % at
    # D = 128 non-causal on an H200, docs/performance.md).
    CHECK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    CHECK_DV: tl.constexpr = HEAD_DIM_V != HEAD_DIM_V_PAD
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + offs_n0  # [BLOCK_N]
        k = load_tile(k_base, offs_n, offs_d, stride_kn, stride_kd, n_k, HEAD_DIM, MASKED, CHECK_D)
        qk0 = scores(q0, k, EMULATE_BF16, DOT_PRECISION)  # [BLOCK_M // 2, BLOCK_N]
        qk1 = scores(q1, k, EMULATE_BF16, DOT_PRECISION)
        v = load_tile(v_base, offs_n, offs_dv, stride_vn, stride_vd, n_k, HEAD_DIM_V, MASKED, CHECK_DV)
        acc0, l0, m0 = _online_update(acc0, l0, m0, qk0, v, offs_m0, offs_n0, n_k - start_n, off - start_n,
                                      left, right, qk_scale,
                                      softcap_in, softcap_out, MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                      EMULATE_BF16, DOT_PRECISION)
        acc1, l1, m1 = _online_update(acc1, l1, m1, qk1, v, offs_m1, offs_n0, n_k - start_n, off - start_n,
                                      left, right, qk_scale,
                                      softcap_in, softcap_out, MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                      EMULATE_BF16, DOT_PRECISION)
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def _store_rows(acc, l_i, m_i, o_base, lse_base, offs_m, offs_d, stride_om, stride_od, n_q, SINKS, off_h, out_scale,
                HEAD_DIM: tl.constexpr, STORE_LSE: tl.constexpr, EMULATE_BF16: tl.constexpr, HAS_SINK: tl.constexpr,
                IS_FP8: tl.constexpr):
    # The head's sink is loaded here, after the key loops, not ahead of them: a value held across the loops
    # takes registers from them (64 x 64 tiles at D 64: 128 -> 132, one CTA fewer an SM), and a CTA's
    # finish overlaps the other CTAs' loops.
    if HAS_SINK:
        sink = tl.load(SINKS + off_h)
    else:
        sink = 0.0
    if IS_FP8:  # l counts P times 2^P_E4M3_LOG2 (_attend_tile): its reference is m - P_E4M3_LOG2
        m_i = m_i - P_E4M3_LOG2
    inv_l, lse = softmax_finish(m_i, l_i, sink, HAS_SINK)  # rows that saw no key: 0 and LSE -inf (or the sink)
    if IS_FP8:  # v's descale (the kernel's out_scale)
        inv_l = inv_l * out_scale
    out = acc * inv_l[:, None]
    mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             cast(out, o_base.dtype.element_ty, EMULATE_BF16), mask=mask)
    if STORE_LSE:
        tl.store(lse_base + offs_m, lse, mask=offs_m < n_q)


@triton.jit
def attention_fwd_kernel(
    Q, K, V, O, LSE, CU_SEQLENS_Q, CU_SEQLENS_K, SINKS, Q_DESCALE, K_DESCALE, V_DESCALE,
    q_strides, k_strides, v_strides, o_strides, descale_strides,
    n_heads_q, kv_group, n_q, n_k, band, scales,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    STORE_LSE: tl.constexpr, REVERSE_M: tl.constexpr,
    EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, TOP_LEFT: tl.constexpr, HAS_SINK: tl.constexpr, IS_FP8: tl.constexpr,
):
    # grid = (cdiv(n_q, BLOCK_M), Hq, B): tiles vary fastest, then heads, then batch. HAS_SINK: SINKS
    # [Hq] fp32, each head's sink logit (softmax_finish). IS_FP8: Q, K, V e4m3 and the descales (fp32, each
    # None for 1, else read at (batch, KV head) with descale_strides' pair for it: 0, 0 for one a tensor):
    # q's and k's scale the raw scores (the softmax's scale and the softcap's input), v's the output, which
    # P.V's e4m3 P (2^P_E4M3_LOG2 times the probabilities) counts in l's units, so nothing divides it out.
    # LSE is contiguous [B, Hq, n_q] fp32. IS_VARLEN: sequence b's rows are
    # [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of packed Q / O (likewise K / V), the
    # grid's first dimension covers the longest, LSE is [Hq, total_q]. SPLIT: the
    # program's BLOCK_M rows are carried as two independent halves.
    # Tuples: each tensor's (batch, head, row, dim) strides (packed: batch 0), the band's
    # (off, left, right) and the score's scales (ops/scales.py).
    stride_qb, stride_qh, stride_qm, stride_qd = q_strides
    stride_kb, stride_kh, stride_kn, stride_kd = k_strides
    stride_vb, stride_vh, stride_vn, stride_vd = v_strides
    stride_ob, stride_oh, stride_om, stride_od = o_strides
    off, left, right = band
    qk_scale, softcap_in, softcap_out = scales
    pid_m = tl.program_id(0)
    if REVERSE_M:
        # Causal tiles lower in the sequence do more work: start them first so the
        # last wave is made of short tiles.
        pid_m = tl.num_programs(0) - 1 - pid_m
    off_h = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    off_hk = off_h // kv_group
    out_scale = 1.0
    if IS_FP8:
        qk_scale, softcap_in, out_scale = descaled(qk_scale, softcap_in, 1.0, Q_DESCALE, K_DESCALE, V_DESCALE,
                                                   off_b, off_hk, descale_strides)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    o_base = O + off_b * stride_ob + off_h * stride_oh
    start_m = pid_m * BLOCK_M
    if IS_VARLEN:
        # Packed rows: n_q / n_k are the totals, LSE is [Hq, total_q]; this sequence's
        # rows start at its cu_seqlens entries (the batch strides are 0).
        q_start, k_start, n_q_seq, n_k_seq, off = sequence(off_b, CU_SEQLENS_Q, CU_SEQLENS_K, CU_SEQLENS_K, n_q,
                                                           n_k, off, IS_VARLEN, False, TOP_LEFT)
        if start_m >= n_q_seq:  # the grid covers the longest sequence
            return
        q_base += q_start * stride_qm
        o_base += q_start * stride_om
        k_base += k_start * stride_kn
        v_base += k_start * stride_vn
        lse_base = LSE + off_h * n_q + q_start
        n_q = n_q_seq
        n_k = n_k_seq
    else:
        lse_base = LSE + (off_b * n_heads_q + off_h) * n_q
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # [HEAD_DIM_PAD]
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)  # [HEAD_DIM_V_PAD]: v's and the output's columns
    lo, full_lo, full_hi, hi = key_range(start_m, n_k, off, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)

    if SPLIT:
        HALF: tl.constexpr = BLOCK_M // 2
        offs_m0 = start_m + tl.arange(0, HALF)  # [HALF]
        offs_m1 = offs_m0 + HALF
        q0 = load_rows(q_base, offs_m0, offs_d, stride_qm, stride_qd, n_q, HEAD_DIM)
        q1 = load_rows(q_base, offs_m1, offs_d, stride_qm, stride_qd, n_q, HEAD_DIM)
        m0 = tl.full([HALF], float("-inf"), dtype=tl.float32)
        m1 = tl.full([HALF], float("-inf"), dtype=tl.float32)
        l0 = tl.zeros([HALF], dtype=tl.float32)
        l1 = tl.zeros([HALF], dtype=tl.float32)
        acc0 = tl.zeros([HALF, HEAD_DIM_V_PAD], dtype=tl.float32)
        acc1 = tl.zeros([HALF, HEAD_DIM_V_PAD], dtype=tl.float32)
        if HAS_LEFT:
            acc0, l0, m0, acc1, l1, m1 = _attend_tiles_split(
                acc0, l0, m0, q0, acc1, l1, m1, q1, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                offs_m0, offs_m1, offs_d, offs_dv,
                lo, full_lo, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
                BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD, True, HAS_LEFT, HAS_RIGHT,
                SOFTCAP, EMULATE_BF16, DOT_PRECISION)
        acc0, l0, m0, acc1, l1, m1 = _attend_tiles_split(
            acc0, l0, m0, q0, acc1, l1, m1, q1, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m0, offs_m1, offs_d, offs_dv,
            full_lo, full_hi, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD,
            False, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16, DOT_PRECISION)
        acc0, l0, m0, acc1, l1, m1 = _attend_tiles_split(
            acc0, l0, m0, q0, acc1, l1, m1, q1, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m0, offs_m1, offs_d, offs_dv, full_hi, hi, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD,
            True, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16, DOT_PRECISION)
        _store_rows(acc0, l0, m0, o_base, lse_base, offs_m0, offs_dv, stride_om, stride_od, n_q, SINKS, off_h,
                    out_scale, HEAD_DIM_V, STORE_LSE, EMULATE_BF16, HAS_SINK, IS_FP8)
        _store_rows(acc1, l1, m1, o_base, lse_base, offs_m1, offs_dv, stride_om, stride_od, n_q, SINKS, off_h,
                    out_scale, HEAD_DIM_V, STORE_LSE, EMULATE_BF16, HAS_SINK, IS_FP8)
    else:
        offs_m = start_m + tl.arange(0, BLOCK_M)  # [BLOCK_M]
        q = load_rows(q_base, offs_m, offs_d, stride_qm, stride_qd, n_q, HEAD_DIM)  # [BLOCK_M, HEAD_DIM_PAD]
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_V_PAD], dtype=tl.float32)
        if HAS_LEFT:
            acc, l_i, m_i = _attend_tiles(
                acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                offs_m, offs_d, offs_dv, lo, full_lo, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
                BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD, True, HAS_LEFT, HAS_RIGHT,
                SOFTCAP, EMULATE_BF16, DOT_PRECISION)
        acc, l_i, m_i = _attend_tiles(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_d, offs_dv, full_lo, full_hi, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD,
            False, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16, DOT_PRECISION)
        acc, l_i, m_i = _attend_tiles(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_d, offs_dv, full_hi, hi, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD,
            True, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16, DOT_PRECISION)
        _store_rows(acc, l_i, m_i, o_base, lse_base, offs_m, offs_dv, stride_om, stride_od, n_q, SINKS, off_h,
                    out_scale, HEAD_DIM_V, STORE_LSE, EMULATE_BF16, HAS_SINK, IS_FP8)


@triton.jit
def attention_kvcache_kernel(
    Q, K, V, O, LSE, CU_SEQLENS_Q, BLOCK_TABLE, SEQLENS_K, O_PART, LSE_PART, ARRIVALS, SINKS, K_DESCALE, V_DESCALE,
    q_strides, k_strides, v_strides, o_strides, part_strides, lse_part_strides, band, scales, descale_strides,
    stride_table, table_cols, num_splits, split_keys, n_q_fixed,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    STORE_LSE: tl.constexpr, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PACKED_Q: tl.constexpr, IS_PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    IS_SPLIT: tl.constexpr, MERGE_ROWS: tl.constexpr, SPLIT_CHUNK: tl.constexpr, ONE_LOOP: tl.constexpr,
    HAS_SINK: tl.constexpr, IS_FP8: tl.constexpr, V_IN_K: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
):
    # New queries against a KV cache, sequence b's keys the first SEQLENS_K[b] of its cache
    # rows, its queries the last of them (bottom-right). Q [total_q, Hq, D]: PACKED_Q,
    # sequence b's rows from CU_SEQLENS_Q; else n_q_fixed rows a sequence, rows b * n_q_fixed
    # on. Caches [pages, PAGE_SIZE, Hkv, D]: IS_PAGED, read through BLOCK_TABLE (a constexpr
    # page size: its divisions become shifts or multiplies); else
    # contiguous [B, max_len, Hkv, D] (stride_kp the batch stride).
    # grid = (row tiles * num_splits, Hkv, B). GQA packing: a tile's BLOCK_M rows are
    # BLOCK_M // GROUP queries times the GROUP query heads of KV head program_id(1),
    # row r = (query r // GROUP, head r % GROUP), so each K/V tile is read once for
    # the group and decode's few queries still fill a tensor-core tile.
    # Split-KV: of a sequence's S splits, split s takes its key tiles s, s + S, s + 2S, ...
    # (from the band's first tile), in one masked loop; S = num_splits, or with split_keys > 0
    # (batch-invariant) the sequence's own cdiv(length, split_keys), so that its splits depend
    # only on its own length (splits past S see no key). Interleaved, a split's first tile is
    # known before the length is read, and so are its page ids.
    # O / LSE: the output [total_q, Hq, D] / [Hq, total_q]. IS_SPLIT (num_splits > 1): each
    # program writes its split's fp32 partials to O_PART [splits, total_q, Hq, D] (strides
    # stride_ps / pm / ph, unit in D) / LSE_PART [splits, Hq, total_q] (LSE's within a split)
    # and arrives on its tile's counter in ARRIVALS [B, Hkv, row tiles] int32 (zero at launch);
    # the tile's last split to arrive merges them all (fold_splits, in split order: who merges
    # does not change the bits), writes O / LSE and takes the launch's num_splits arrivals back
    # off the counter, leaving it at zero for the next launch on the stream (whose scratch this
    # is: ops/scratch.py). One launch, no combine kernel. HAS_SINK: SINKS [Hq] fp32, each query head's
    # sink logit, in the unsplit row's finish or the merged row's (fold_splits), never a partial's.
    # IS_FP8: e4m3 caches, widened to fp16 as they are loaded (exact; a bf16 q goes to fp16, scaled);
    # K_DESCALE / V_DESCALE fp32 (None: 1) read at (batch, KV head) with descale_strides' (k's, v's) pairs
    # (0 where a descale is shared): k's scales the raw scores, v's the output (each split's partial, so the merge
    # is unchanged).
    # V_IN_K: V is the first HEAD_DIM_V columns of each K row (a view of the same memory: MLA's latent
    # cache), read once for both products (_attend_cache_tiles); HEAD_DIM_PAD then pads K's other columns.
    # HEAD_BLOCKS: program_id(1) runs GROUP of its KV head's HEAD_BLOCKS * GROUP query heads (a group too
    # wide for one tile's rows: MLA's 128 heads on one latent head).
    # Tuples: q's and out's (row, head, dim) strides, the caches' (page or batch, row, head,
    # dim), the partials' (split, row, head) and their LSEs' (split, head), the band's
    # (left, right) and the score's scales (ops/scales.py).
    stride_qm, stride_qh, stride_qd = q_strides
    stride_kp, stride_kn, stride_kh, stride_kd = k_strides
    stride_vp, stride_vn, stride_vh, stride_vd = v_strides
    stride_om, stride_oh, stride_od = o_strides
    stride_ps, stride_pm, stride_ph = part_strides
    stride_ls, stride_lh = lse_part_strides
    left, right = band
    qk_scale, softcap_in, softcap_out = scales
    QUERIES: tl.constexpr = BLOCK_M // GROUP  # queries a tile
    pid = tl.program_id(0)
    split = pid % num_splits  # int32: the key bounds stay 32-bit (the partials' offsets are 64-bit)
    start_q = (pid // num_splits) * QUERIES
    off_hk = tl.program_id(1).to(tl.int64)  # the block of query heads (their KV head's, HEAD_BLOCKS 1)
    kv_head = off_hk // HEAD_BLOCKS
    off_b = tl.program_id(2).to(tl.int64)
    if PACKED_Q:
        q_start, _, n_q, n_k, off = sequence(off_b, CU_SEQLENS_Q, CU_SEQLENS_Q, SEQLENS_K, 0, 0, 0, True, True,
                                             False)
    else:
        q_start = off_b * n_q_fixed
        n_q = n_q_fixed
        n_k = tl.load(SEQLENS_K + off_b)
        off = n_k - n_q
    if IS_PAGED:
        table = table_row(BLOCK_TABLE, off_b, stride_table)
    else:
        table = BLOCK_TABLE
    if not HAS_LEFT:  # the split's first tile (the middle loop's unsplit) is known before the length: its page
        # ids go out beside the length's load, not after it
        first = split * BLOCK_N
        page0 = _page_ids(table, table_cols, first, BLOCK_N, PAGE_SIZE, IS_PAGED)
    if start_q >= n_q:  # the grid covers the most queries of any sequence
        return
    rows = tl.arange(0, BLOCK_M)
    # Rows past QUERIES * GROUP (GROUP not dividing BLOCK_M) repeat the tile's last query
    # and are never stored.
    offs_q = start_q + tl.minimum(rows // GROUP, QUERIES - 1)  # [BLOCK_M] query index in the sequence
    heads = off_hk * GROUP + rows % GROUP  # [BLOCK_M] query head
    # the sinks, loaded ahead of the key loop, which hides their latency: the rows' own for the unsplit
    # finish, the merge rows' (below) for a split's merge
    if HAS_SINK and IS_SPLIT:
        sink = tl.load(SINKS + off_hk * GROUP + tl.arange(0, MERGE_ROWS) % GROUP)
    elif HAS_SINK:
        sink = tl.load(SINKS + heads)
    else:
        sink = 0.0
    out_scale = 1.0
    if IS_FP8:  # an FP8 cache's k and v descales (q is 16-bit: none)
        kd_b, kd_h, vd_b, vd_h = descale_strides
        qk_scale, softcap_in, out_scale = descaled(qk_scale, softcap_in, out_scale, None, K_DESCALE, V_DESCALE, off_b,
                                                   kv_head, (0, 0, kd_b, kd_h, vd_b, vd_h))
    row_ok = (rows < QUERIES * GROUP) & (offs_q < n_q)
    offs_d = (HEAD_DIM_V if V_IN_K else 0) + tl.arange(0, HEAD_DIM_PAD)  # K's columns read as K (V_IN_K: past V's)
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)  # v's and the output's columns
    q_rows = Q + (q_start + offs_q) * stride_qm + heads * stride_qh  # [BLOCK_M] pointers
    q = tl.load(q_rows[:, None] + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
                other=0.0)
    if V_IN_K:  # q's columns that meet V's
        q_v = tl.load(q_rows[:, None] + offs_dv[None, :] * stride_qd,
                      mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    else:
        q_v = q
    if IS_FP8 and Q.dtype.element_ty == tl.bfloat16:
        # An FP8 cache under a bf16 q: both products run in fp16, where widening e4m3 is one conversion a pair
        # of values and bf16 takes three (e4m3 -> fp16 -> bf16, on the SM's 16-a-clock conversion unit: the cap
        # on decode's rate, docs/perf). q goes to fp16 once, times a power of two that fits it (exact), taken
        # back off the scores; P in fp16 keeps more bits than in bf16.
        amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
        if V_IN_K:
            amax = tl.maximum(amax, tl.max(tl.max(tl.abs(q_v.to(tl.float32)), 1), 0))
        q_scale = f16_scale(amax)
        q = (q.to(tl.float32) * q_scale).to(tl.float16)
        if V_IN_K:
            q_v = (q_v.to(tl.float32) * q_scale).to(tl.float16)
        else:
            q_v = q
        qk_scale = qk_scale / q_scale
        softcap_in = softcap_in / q_scale

    lo, full_lo, full_hi, hi = key_range(start_q, n_k, off, left, right, QUERIES, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    ONE_MASKED_LOOP: tl.constexpr = ONE_LOOP or IS_SPLIT
    if ONE_MASKED_LOOP:
        if split_keys > 0:
            seq_splits = tl.minimum(num_splits, tl.cdiv(n_k, split_keys))
        else:
            seq_splits = num_splits
        if HAS_LEFT:  # the band's first tile t0: split s starts at its first tile t0 + r, r = s - t0 mod S
            t0 = lo // BLOCK_N
            first = (t0 + (split + seq_splits - t0 % tl.maximum(seq_splits, 1)) % tl.maximum(seq_splits, 1)) * BLOCK_N
            page0 = _page_ids(table, table_cols, first, BLOCK_N, PAGE_SIZE, IS_PAGED)
        stop = tl.where(split < seq_splits, hi, first)  # splits past the sequence's own see no key
        step = tl.maximum(seq_splits, 1) * BLOCK_N  # a sequence with no key has no split: no tile either

    k_base = K + kv_head * stride_kh
    v_base = V + kv_head * stride_vh
    if not IS_PAGED:
        k_base += off_b * stride_kp
        v_base += off_b * stride_vp
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V_PAD], dtype=tl.float32)
    # ONE_MASKED_LOOP (split or ONE_LOOP): every tile masked in one loop (one pipeline prologue), the
    # split's tiles of [lo, hi); else the band's masked left edge, unmasked middle and masked right edge,
    # a loop each
    if ONE_MASKED_LOOP:
        acc, l_i, m_i = _attend_cache_tiles(
            acc, l_i, m_i, q, q_v, k_base, v_base, stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
            table, page0, offs_q, offs_d, offs_dv, first, stop, step, n_k, off, left, right, qk_scale, softcap_in,
            softcap_out, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD,
            True, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16,
            DOT_PRECISION, IS_PAGED, PAGE_SIZE, V_IN_K)
    else:
        if HAS_LEFT:
            acc, l_i, m_i = _attend_cache_tiles(
                acc, l_i, m_i, q, q_v, k_base, v_base, stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
                table, _page_ids(table, table_cols, lo, BLOCK_N, PAGE_SIZE, IS_PAGED), offs_q, offs_d, offs_dv,
                lo, full_lo, BLOCK_N, n_k, off, left, right, qk_scale, softcap_in, softcap_out, BLOCK_N, HEAD_DIM,
                HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16,
                DOT_PRECISION, IS_PAGED, PAGE_SIZE, V_IN_K)
            page0 = _page_ids(table, table_cols, full_lo, BLOCK_N, PAGE_SIZE, IS_PAGED)
        acc, l_i, m_i = _attend_cache_tiles(  # without a left edge full_lo = 0 = first: page0 from the start
            acc, l_i, m_i, q, q_v, k_base, v_base, stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
            table, page0, offs_q, offs_d, offs_dv,
            full_lo, full_hi, BLOCK_N, n_k, off, left, right, qk_scale, softcap_in,
            softcap_out, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD,
            False, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16,
            DOT_PRECISION, IS_PAGED, PAGE_SIZE, V_IN_K)
        acc, l_i, m_i = _attend_cache_tiles(
            acc, l_i, m_i, q, q_v, k_base, v_base, stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
            table, _page_ids(table, table_cols, full_hi, BLOCK_N, PAGE_SIZE, IS_PAGED), offs_q, offs_d, offs_dv,
            full_hi, hi,
            BLOCK_N, n_k, off, left, right, qk_scale, softcap_in,
            softcap_out, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD,
            True, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16,
            DOT_PRECISION, IS_PAGED, PAGE_SIZE, V_IN_K)

    # a split's partial carries no sink (no visible key in it: out 0, LSE -inf, merge weight 0)
    inv_l, lse = softmax_finish(m_i, l_i, sink, HAS_SINK and not IS_SPLIT)
    if IS_FP8:
        inv_l = inv_l * out_scale
    out = acc * inv_l[:, None]
    d_ok = offs_dv < HEAD_DIM_V
    if IS_SPLIT:
        p_rows = split.to(tl.int64) * stride_ps + (q_start + offs_q) * stride_pm + heads * stride_ph  # [BLOCK_M]
        tl.store(O_PART + p_rows[:, None] + offs_dv[None, :], out, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE_PART + split.to(tl.int64) * stride_ls + heads * stride_lh + q_start + offs_q, lse, mask=row_ok)
        tl.debug_barrier()  # every thread's partial stores before the arrival releases them
        tile = (off_b * tl.num_programs(1) + off_hk) * (tl.num_programs(0) // num_splits) + pid // num_splits
        arrived = tl.atomic_add(ARRIVALS + tile, 1, sem="acq_rel", scope="gpu")
        if arrived % num_splits == num_splits - 1:  # the tile's last split: every partial has landed
            tl.debug_barrier()  # the acquire before any thread's loads
            tl.atomic_add(ARRIVALS + tile, -num_splits, sem="relaxed", scope="gpu")
            # the tile's real rows only: MERGE_ROWS, a power of two holding its (query, head) rows
            c = tl.arange(0, MERGE_ROWS)
            c_q = start_q + tl.minimum(c // GROUP, QUERIES - 1)
            c_heads = off_hk * GROUP + c % GROUP
            c_ok = (c < QUERIES * GROUP) & (c_q < n_q)
            c_lse = c_heads * stride_lh + q_start + c_q
            merged, merged_lse = fold_splits(O_PART + (q_start + c_q) * stride_pm + c_heads * stride_ph,
                                             LSE_PART + c_lse, stride_ps, stride_ls, 1, num_splits, c_ok, sink,
                                             MERGE_ROWS, HEAD_DIM_V, HEAD_DIM_V_PAD, SPLIT_CHUNK, HAS_SINK)
            c_rows = (q_start + c_q) * stride_om + c_heads * stride_oh
            tl.store(O + c_rows[:, None] + offs_dv[None, :] * stride_od, cast(merged, O.dtype.element_ty, EMULATE_BF16),
                     mask=c_ok[:, None] & d_ok[None, :])
            if STORE_LSE:
                tl.store(LSE + c_lse, merged_lse, mask=c_ok)
    else:
        o_rows = (q_start + offs_q) * stride_om + heads * stride_oh  # [BLOCK_M] row offsets
        tl.store(O + o_rows[:, None] + offs_dv[None, :] * stride_od, cast(out, O.dtype.element_ty, EMULATE_BF16),
                 mask=row_ok[:, None] & d_ok[None, :])
        if STORE_LSE:
            tl.store(LSE + heads * stride_lh + q_start + offs_q, lse, mask=row_ok)
