"""Fused attention backward, deterministic: two Triton kernels that recompute the
probabilities from q, k and the forward's LSE, and never add into a shared output.

- `attention_bwd_dkdv_kernel`: one program per (key tile, KV head, batch) owns its
  dK / dV tile and walks the query heads of its group, then their query tiles, in a
  fixed order (GQA/MQA sums without expanding K/V, and without atomics);
- `attention_bwd_dq_kernel`: one program per (query tile, query head, batch) owns
  its dQ tile and walks the key tiles its rows see.

With P = softmax(S), dP = dO V^T and delta = rowsum(dO * O), dS = P * (dP - delta);
the score is scale * q.k (or cap * tanh(scale * q.k / cap) with softcap, whose
derivative multiplies dS by 1 - tanh^2), so dQ = dS' K, dK = dS'^T Q, dV = P^T dO,
dS' the gradient with respect to q.k. The band is the forward's (`kernels/mask.py`).
Rows that saw no key (LSE = -inf) get P = 0: zero gradients, never NaN.
"""

import triton
import triton.language as tl

from vflash.kernels.mask import key_range, masked_logits
from vflash.kernels.seqlen import sequence
from vflash.kernels.tile import dot, load_rows, load_tile, scores


@triton.jit
def _tile_grads(q, k, v, do, lse2, delta, offs_m, offs_n, n_k, off, left, right, qk_scale, sm_scale,
                softcap_in, softcap_out, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                SOFTCAP: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One (query tile, key tile) pair: q / do [rows, D], k / v [BLOCK_N, D], lse2 (log2
    # units, +inf for rows that saw no key) and delta [rows]. Returns P [rows, BLOCK_N] and
    # dS' [rows, BLOCK_N] (the loss's gradient with respect to q.k), both fp32.
    LOG2E: tl.constexpr = 1.4426950408889634
    qk = scores(q, k, UPCAST_DOT, DOT_PRECISION)
    s = masked_logits(qk, offs_m, offs_n, n_k, off, left, right, softcap_in, softcap_out,
                      MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP)
    if SOFTCAP:
        p = tl.exp2(s - lse2[:, None])
    else:
        p = tl.exp2(s * qk_scale - lse2[:, None])
    dp = dot(do, tl.trans(v), None, UPCAST_DOT, DOT_PRECISION)  # [rows, BLOCK_N]
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        # tanh from the raw product (finite everywhere, unlike the masked scores)
        t = 1.0 - 2.0 / (tl.exp2(qk * softcap_in * (2.0 * LOG2E)) + 1.0)
        ds = ds * (1.0 - t * t)
    return p, ds * sm_scale


@triton.jit
def _row_stats(LSE, DELTA, offs_m, n_q):
    # lse in log2 units with -inf (no visible key) made +inf, so exp2(s - lse2) = 0; delta.
    LOG2E: tl.constexpr = 1.4426950408889634
    lse = tl.load(LSE + offs_m, mask=offs_m < n_q, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    return lse2, tl.load(DELTA + offs_m, mask=offs_m < n_q, other=0.0)


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_SEQLENS_Q, CU_SEQLENS_K,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    n_heads_q, n_q, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, IS_VARLEN: tl.constexpr, TOP_LEFT: tl.constexpr,
):
    # grid = (cdiv(n_k, BLOCK_N), Hkv, B). LSE / DELTA contiguous [B, Hq, n_q] fp32; IS_VARLEN
    # (the forward's layout): packed rows from CU_SEQLENS_Q / _K, n_q / n_k the totals and the
    # grid's first dimension the longest sequence's keys, LSE / DELTA [Hq, total_q].
    # The query tiles that see keys [start_n, start_n + BLOCK_N): from the band's right
    # edge (row i sees key j only if j <= i + off + right) and its left edge
    # (j >= i + off - left); every tile is masked (the band and the ragged ends).
    start_n = tl.program_id(0) * BLOCK_N
    off_hk = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    q_start, k_start, n_q_seq, n_k_seq, off = sequence(off_b, CU_SEQLENS_Q, CU_SEQLENS_K, CU_SEQLENS_K, n_q, n_k,
                                                       off, IS_VARLEN, False, TOP_LEFT)
    if IS_VARLEN:
        if start_n >= n_k_seq:  # the grid covers the longest sequence
            return
        row0, row_stride_h = q_start, n_q  # LSE [Hq, total_q]
    else:
        row0, row_stride_h = off_b * n_heads_q * n_q, n_q
    n_q = n_q_seq
    n_k = n_k_seq
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    CHECK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    k_base = K + off_b * stride_kb + off_hk * stride_kh + k_start * stride_kn
    v_base = V + off_b * stride_vb + off_hk * stride_vh + k_start * stride_vn
    k = load_tile(k_base, offs_n, offs_d, stride_kn, stride_kd, n_k, HEAD_DIM, True, CHECK_D)
    v = load_tile(v_base, offs_n, offs_d, stride_vn, stride_vd, n_k, HEAD_DIM, True, CHECK_D)
    m_lo = 0
    m_hi = n_q
    if HAS_RIGHT:
        m_lo = (tl.maximum(start_n - off - right, 0) // BLOCK_M) * BLOCK_M
    if HAS_LEFT:
        m_hi = tl.minimum(m_hi, tl.maximum(start_n + BLOCK_N - 1 - off + left + 1, 0))
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    offs_m0 = tl.arange(0, BLOCK_M)
    for g in range(GROUP):  # the group's query heads, in order
        off_h = off_hk * GROUP + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh + q_start * stride_qm
        do_base = DO + off_b * stride_dob + off_h * stride_doh + q_start * stride_dom
        row_base = row0 + off_h * row_stride_h
        for start_m in range(m_lo, m_hi, BLOCK_M):
            offs_m = start_m + offs_m0
            q = load_rows(q_base, offs_m, offs_d, stride_qm, stride_qd, n_q, HEAD_DIM)
            do = load_rows(do_base, offs_m, offs_d, stride_dom, stride_dod, n_q, HEAD_DIM)
            lse2, delta = _row_stats(LSE + row_base, DELTA + row_base, offs_m, n_q)
            p, ds = _tile_grads(q, k, v, do, lse2, delta, offs_m, offs_n, n_k, off, left, right, qk_scale, sm_scale,
                                softcap_in, softcap_out, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, UPCAST_DOT,
                                DOT_PRECISION)
            # P and dS' rounded to the inputs' dtype for the products, as in the forward's PV
            dv = dot(tl.trans(p.to(do.dtype)), do, dv, UPCAST_DOT, DOT_PRECISION)
            dk = dot(tl.trans(ds.to(q.dtype)), q, dk, UPCAST_DOT, DOT_PRECISION)
    mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DK + off_b * stride_dkb + off_hk * stride_dkh + (k_start + offs_n[:, None]) * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + off_b * stride_dvb + off_hk * stride_dvh + (k_start + offs_n[:, None]) * stride_dvn
             + offs_d[None, :] * stride_dvd, dv.to(DV.dtype.element_ty), mask=mask)


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d,
              start, stop, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, MASKED: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST_DOT: tl.constexpr,
              DOT_PRECISION: tl.constexpr):
    # Key tiles [start, stop) folded into one query tile's dQ [BLOCK_M, HEAD_DIM_PAD] fp32.
    CHECK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_base, offs_n, offs_d, stride_kn, stride_kd, n_k, HEAD_DIM, MASKED, CHECK_D)
        v = load_tile(v_base, offs_n, offs_d, stride_vn, stride_vd, n_k, HEAD_DIM, MASKED, CHECK_D)
        p, ds = _tile_grads(q, k, v, do, lse2, delta, offs_m, offs_n, n_k, off, left, right, qk_scale, sm_scale,
                            softcap_in, softcap_out, MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP, UPCAST_DOT, DOT_PRECISION)
        dq = dot(ds.to(k.dtype), k, dq, UPCAST_DOT, DOT_PRECISION)
    return dq


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_SEQLENS_Q, CU_SEQLENS_K,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    n_heads_q, kv_group, n_q, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, IS_VARLEN: tl.constexpr, TOP_LEFT: tl.constexpr,
):
    # grid = (cdiv(n_q, BLOCK_M), Hq, B); the key tiles as the forward's (key_range's
    # masked edges and unmasked middle). IS_VARLEN as in the dK/dV kernel.
    start_m = tl.program_id(0) * BLOCK_M
    off_h = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    off_hk = off_h // kv_group
    q_start, k_start, n_q_seq, n_k_seq, off = sequence(off_b, CU_SEQLENS_Q, CU_SEQLENS_K, CU_SEQLENS_K, n_q, n_k,
                                                       off, IS_VARLEN, False, TOP_LEFT)
    if IS_VARLEN:
        if start_m >= n_q_seq:
            return
        row_base = off_h * n_q + q_start  # LSE [Hq, total_q]
    else:
        row_base = (off_b * n_heads_q + off_h) * n_q
    n_q = n_q_seq
    n_k = n_k_seq
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q = load_rows(Q + off_b * stride_qb + off_h * stride_qh + q_start * stride_qm, offs_m, offs_d, stride_qm,
                   stride_qd, n_q, HEAD_DIM)
    do = load_rows(DO + off_b * stride_dob + off_h * stride_doh + q_start * stride_dom, offs_m, offs_d, stride_dom,
                    stride_dod, n_q, HEAD_DIM)
    lse2, delta = _row_stats(LSE + row_base, DELTA + row_base, offs_m, n_q)
    k_base = K + off_b * stride_kb + off_hk * stride_kh + k_start * stride_kn
    v_base = V + off_b * stride_vb + off_hk * stride_vh + k_start * stride_vn
    lo, full_lo, full_hi, hi = key_range(start_m, n_k, off, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    if HAS_LEFT:
        dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                       offs_d, lo, full_lo, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
                       BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, UPCAST_DOT,
                       DOT_PRECISION)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                   offs_d, full_lo, full_hi, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
                   BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, HAS_LEFT, HAS_RIGHT, SOFTCAP, UPCAST_DOT, DOT_PRECISION)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                   offs_d, full_hi, hi, n_k, off, left, right, qk_scale, sm_scale, softcap_in, softcap_out,
                   BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, UPCAST_DOT, DOT_PRECISION)
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + (q_start + offs_m[:, None]) * stride_dqm
             + offs_d[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty),
             mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM))
