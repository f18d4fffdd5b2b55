"""Fused attention backward, deterministic: three Triton kernels that recompute the
probabilities from q, k and the forward's LSE, and never add into a shared output.

- `attention_bwd_delta_kernel`: delta = rowsum(dO * O) (minus dLSE when the LSE has a
  gradient), one fp32 per query row, and with attention sinks each program's part of its head's
  sink gradient;
- `attention_bwd_dkdv_kernel`: one program per (key tile, KV head, batch) owns its
  dK / dV tile and walks the query heads of its group, then their query tiles, in a
  fixed order (GQA/MQA sums without expanding K/V, and without atomics);
- `attention_bwd_dq_kernel`: one program per (query tile, query head, batch) owns
  its dQ tile and walks the key tiles its rows see;
- `sink_grad_kernel` (calls with attention sinks): one program per query head sums
  the head's parts in a fixed order.

With P = softmax(S), dP = dO V^T and delta = rowsum(dO * O), dS = P * (dP - delta);
the score is scale * q.k (or cap * tanh(scale * q.k / cap) with softcap, whose
derivative multiplies dS by 1 - tanh^2), so dQ = scale * dS K, dK = scale * dS^T Q,
dV = P^T dO (the scale is applied once, to the finished tile). The band is the
forward's (`kernels/mask.py`). Rows that saw no key (LSE = -inf) get P = 0: zero
gradients, never NaN.

The dK/dV kernel works on transposed tiles, keys in rows: S^T = K Q^T [BLOCK_N, BLOCK_M]
comes out of the product in the layout the next products take as their left operand
(P^T dO and dS^T Q), so no tile of P or dS is transposed in registers. Its band mask
and query ranges are mask.py's with the roles of queries and keys exchanged.
"""

import triton
import triton.language as tl

from vflash.kernels.mask import key_range, masked_logits
from vflash.kernels.seqlen import sequence
from vflash.kernels.tile import cast, dot, load_tile

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def softcap_grad(ds, qk, softcap_in, SOFTCAP: tl.constexpr):
    # dS times the cap's derivative 1 - tanh^2, tanh from the raw product (finite
    # everywhere, unlike the masked scores).
    if SOFTCAP:
        t = 1.0 - 2.0 / (tl.exp2(qk * softcap_in * (2.0 * LOG2E)) + 1.0)
        ds = ds * (1.0 - t * t)
    return ds


@triton.jit
def probs(s, lse2, qk_scale, ROWS_AXIS: tl.constexpr, SOFTCAP: tl.constexpr):
    # P from masked_logits' scores and the rows' log2-unit LSE; ROWS_AXIS is the
    # axis the query rows run along (0: [rows, keys], 1: transposed).
    if ROWS_AXIS == 0:
        lse2 = lse2[:, None]
    else:
        lse2 = lse2[None, :]
    if SOFTCAP:
        return tl.exp2(s - lse2)
    else:
        return tl.exp2(s * qk_scale - lse2)


@triton.jit
def row_stats(lse_base, delta_base, offs_m, n_q, MASKED: tl.constexpr):
    # lse in log2 units with -inf (no visible key) made +inf, so exp2(s - lse2) = 0;
    # delta. Unmasked tiles: rows inside the sequence that see every key of the tile.
    if MASKED:
        lse = tl.load(lse_base + offs_m, mask=offs_m < n_q, other=float("inf"))
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
        return lse2, tl.load(delta_base + offs_m, mask=offs_m < n_q, other=0.0)
    else:
        return tl.load(lse_base + offs_m) * LOG2E, tl.load(delta_base + offs_m)


@triton.jit
def attention_bwd_delta_kernel(
    O, DO, DLSE, DELTA, LSE, SINKS, SINK_PART, o_strides, do_strides, n_heads, n_rows,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr,
    HAS_SINK: tl.constexpr,
):
    # grid = (cdiv(n_rows, BLOCK_M), H, B): DELTA[(b * H + h) * n_rows + m] = sum_d dO * O
    # (- DLSE, the same layout), fp32: LSE's layout, [B, H, N] dense or [H, total] packed
    # (B = 1, n_rows the total). Strides: (batch, head, row, dim) tuples (packed: batch 0).
    # HAS_SINK: the program's share of its head's sink gradient, sum over its rows of e^{SINKS[h] - LSE} *
    # DELTA (the sink's share of each row's softmax times the row's delta; a fixed tree), into
    # SINK_PART[(h * B + b) * programs + program] fp32: a head's parts contiguous, summed in order by
    # sink_grad_kernel.
    stride_ob, stride_oh, stride_om, stride_od = o_strides
    stride_dob, stride_doh, stride_dom, stride_dod = do_strides
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    off_h = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    o = load_tile(O + off_b * stride_ob + off_h * stride_oh, offs_m, offs_d, stride_om, stride_od, n_rows, HEAD_DIM,
                  True, HEAD_DIM != HEAD_DIM_PAD)
    do = load_tile(DO + off_b * stride_dob + off_h * stride_doh, offs_m, offs_d, stride_dom, stride_dod, n_rows,
                   HEAD_DIM, True, HEAD_DIM != HEAD_DIM_PAD)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    rows = (off_b * n_heads + off_h) * n_rows + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLSE + rows, mask=offs_m < n_rows, other=0.0)
    tl.store(DELTA + rows, delta, mask=offs_m < n_rows)
    if HAS_SINK:
        lse = tl.load(LSE + rows, mask=offs_m < n_rows, other=float("-inf"))
        share = tl.where(lse == float("-inf"), 0.0, tl.exp(tl.load(SINKS + off_h) - lse))  # no key, no sink: 0
        part = (off_h * tl.num_programs(2) + off_b) * tl.num_programs(0) + tl.program_id(0)
        tl.store(SINK_PART + part, tl.sum(share * delta, 0))


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_dom, stride_dod,
                offs_n, offs_d, offs_dv, start, stop, n_q, off, left, right, qk_scale, softcap_in, softcap_out,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                HEAD_DIM_V_PAD: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                SOFTCAP: tl.constexpr, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Query tiles [start, stop) of one head folded into a key tile's dK [BLOCK_N, HEAD_DIM_PAD] and dV
    # [BLOCK_N, HEAD_DIM_V_PAD] fp32 (k, v that tile). Keys past n_k need no mask: their rows of dK
    # and dV are never stored, and nothing else reads them.
    CHECK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    CHECK_DV: tl.constexpr = HEAD_DIM_V != HEAD_DIM_V_PAD
    for start_m in range(start, stop, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(q_base, offs_m, offs_d, stride_qm, stride_qd, n_q, HEAD_DIM, MASKED, CHECK_D)
        do = load_tile(do_base, offs_m, offs_dv, stride_dom, stride_dod, n_q, HEAD_DIM_V, MASKED, CHECK_DV)
        lse2, delta = row_stats(lse_base, delta_base, offs_m, n_q, MASKED)
        qk = dot(k, tl.trans(q), None, EMULATE_BF16, DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
        # Key j (row) sees query i (column) when i + off - left <= j <= i + off + right,
        # i.e. j - off - right <= i <= j - off + left: masked_logits' band with the
        # edges exchanged and the offset negated; its count bound (i < n_q) is harmless.
        s = masked_logits(qk, offs_n, offs_m, n_q, -off, right, left, softcap_in, softcap_out,
                          MASKED, HAS_RIGHT, HAS_LEFT, SOFTCAP)
        p = probs(s, lse2, qk_scale, 1, SOFTCAP)
        dp = dot(v, tl.trans(do), None, EMULATE_BF16, DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
        ds = softcap_grad(p * (dp - delta[None, :]), qk, softcap_in, SOFTCAP)
        # P and dS rounded to the inputs' dtype for the products, as in the forward's PV
        dv = dot(cast(p, do.dtype, EMULATE_BF16), do, dv, EMULATE_BF16, DOT_PRECISION)
        dk = dot(cast(ds, q.dtype, EMULATE_BF16), q, dk, EMULATE_BF16, DOT_PRECISION)
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_SEQLENS_Q, CU_SEQLENS_K,
    q_strides, k_strides, v_strides, do_strides, dk_strides, dv_strides, n_heads_q, n_q, n_k, band, scales,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr, IS_VARLEN: tl.constexpr, TOP_LEFT: tl.constexpr,
):
    # grid = (cdiv(n_k, BLOCK_N), Hkv, B). LSE / DELTA contiguous [B, Hq, n_q] fp32; IS_VARLEN
    # (the forward's layout): packed rows from CU_SEQLENS_Q / _K, n_q / n_k the totals and the
    # grid's first dimension the longest sequence's keys, LSE / DELTA [Hq, total_q].
    # The query rows that see keys [start_n, start_n + BLOCK_N) are key_range's with the
    # roles exchanged (as the mask in _dkdv_tiles): masked tiles at the band's edges and
    # the ragged n_q tail, unmasked ones between.
    # Tuples: each tensor's (batch, head, row, dim) strides (packed: batch 0), the band's
    # (off, left, right) and the scales (ops/scales.py's and the softmax scale for dK). HEAD_DIM_V: v's, dO's
    # and dV's head dim (q's and k's where they agree).
    stride_qb, stride_qh, stride_qm, stride_qd = q_strides
    stride_kb, stride_kh, stride_kn, stride_kd = k_strides
    stride_vb, stride_vh, stride_vn, stride_vd = v_strides
    stride_dob, stride_doh, stride_dom, stride_dod = do_strides
    stride_dkb, stride_dkh, stride_dkn, stride_dkd = dk_strides
    stride_dvb, stride_dvh, stride_dvn, stride_dvd = dv_strides
    off, left, right = band
    qk_scale, sm_scale, softcap_in, softcap_out = scales
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
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    k = load_tile(K + off_b * stride_kb + off_hk * stride_kh + k_start * stride_kn, offs_n, offs_d, stride_kn,
                  stride_kd, n_k, HEAD_DIM, True, HEAD_DIM != HEAD_DIM_PAD)
    v = load_tile(V + off_b * stride_vb + off_hk * stride_vh + k_start * stride_vn, offs_n, offs_dv, stride_vn,
                  stride_vd, n_k, HEAD_DIM_V, True, HEAD_DIM_V != HEAD_DIM_V_PAD)
    lo, full_lo, full_hi, hi = key_range(start_n, n_q, -off, right, left, BLOCK_N, BLOCK_M, HAS_RIGHT, HAS_LEFT)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V_PAD], dtype=tl.float32)
    for g in range(GROUP):  # the group's query heads, in order
        off_h = off_hk * GROUP + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh + q_start * stride_qm
        do_base = DO + off_b * stride_dob + off_h * stride_doh + q_start * stride_dom
        lse_base = LSE + row0 + off_h * row_stride_h
        delta_base = DELTA + row0 + off_h * row_stride_h
        if HAS_RIGHT:
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd,
                                 stride_dom, stride_dod, offs_n, offs_d, offs_dv, lo, full_lo, n_q, off, left, right,
                                 qk_scale, softcap_in, softcap_out, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V,
                                 HEAD_DIM_V_PAD, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16, DOT_PRECISION)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd,
                             stride_dom, stride_dod, offs_n, offs_d, offs_dv, full_lo, full_hi, n_q, off, left, right,
                             qk_scale, softcap_in, softcap_out, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V,
                             HEAD_DIM_V_PAD, False, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16, DOT_PRECISION)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd,
                             stride_dom, stride_dod, offs_n, offs_d, offs_dv, full_hi, hi, n_q, off, left, right,
                             qk_scale, softcap_in, softcap_out, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V,
                             HEAD_DIM_V_PAD, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, EMULATE_BF16, DOT_PRECISION)
    tl.store(DK + off_b * stride_dkb + off_hk * stride_dkh + (k_start + offs_n[:, None]) * stride_dkn
             + offs_d[None, :] * stride_dkd, cast(dk * sm_scale, DK.dtype.element_ty, EMULATE_BF16),
             mask=(offs_n[:, None] < n_k) & (offs_d[None, :] < HEAD_DIM))
    tl.store(DV + off_b * stride_dvb + off_hk * stride_dvh + (k_start + offs_n[:, None]) * stride_dvn
             + offs_dv[None, :] * stride_dvd, cast(dv, DV.dtype.element_ty, EMULATE_BF16),
             mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < HEAD_DIM_V))


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, offs_d,
              offs_dv, start, stop, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr,
              HEAD_DIM_V_PAD: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              SOFTCAP: tl.constexpr, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Key tiles [start, stop) folded into one query tile's dQ [BLOCK_M, HEAD_DIM_PAD] fp32.
    CHECK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    CHECK_DV: tl.constexpr = HEAD_DIM_V != HEAD_DIM_V_PAD
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_base, offs_n, offs_d, stride_kn, stride_kd, n_k, HEAD_DIM, MASKED, CHECK_D)
        v = load_tile(v_base, offs_n, offs_dv, stride_vn, stride_vd, n_k, HEAD_DIM_V, MASKED, CHECK_DV)
        qk = dot(q, tl.trans(k), None, EMULATE_BF16, DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        s = masked_logits(qk, offs_m, offs_n, n_k, off, left, right, softcap_in, softcap_out,
                          MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP)
        p = probs(s, lse2, qk_scale, 0, SOFTCAP)
        dp = dot(do, tl.trans(v), None, EMULATE_BF16, DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        ds = softcap_grad(p * (dp - delta[:, None]), qk, softcap_in, SOFTCAP)
        dq = dot(cast(ds, k.dtype, EMULATE_BF16), k, dq, EMULATE_BF16, DOT_PRECISION)
    return dq


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_SEQLENS_Q, CU_SEQLENS_K,
    q_strides, k_strides, v_strides, do_strides, dq_strides, n_heads_q, kv_group, n_q, n_k, band, scales,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr, IS_VARLEN: tl.constexpr,
    TOP_LEFT: tl.constexpr,
):
    # grid = (cdiv(n_q, BLOCK_M), Hq, B); the key tiles as the forward's (key_range's
    # masked edges and unmasked middle). IS_VARLEN, the tuples and HEAD_DIM_V as in the dK/dV kernel.
    stride_qb, stride_qh, stride_qm, stride_qd = q_strides
    stride_kb, stride_kh, stride_kn, stride_kd = k_strides
    stride_vb, stride_vh, stride_vn, stride_vd = v_strides
    stride_dob, stride_doh, stride_dom, stride_dod = do_strides
    stride_dqb, stride_dqh, stride_dqm, stride_dqd = dq_strides
    off, left, right = band
    qk_scale, sm_scale, softcap_in, softcap_out = scales
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
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    q = load_tile(Q + off_b * stride_qb + off_h * stride_qh + q_start * stride_qm, offs_m, offs_d, stride_qm,
                  stride_qd, n_q, HEAD_DIM, True, HEAD_DIM != HEAD_DIM_PAD)
    do = load_tile(DO + off_b * stride_dob + off_h * stride_doh + q_start * stride_dom, offs_m, offs_dv, stride_dom,
                   stride_dod, n_q, HEAD_DIM_V, True, HEAD_DIM_V != HEAD_DIM_V_PAD)
    lse2, delta = row_stats(LSE + row_base, DELTA + row_base, offs_m, n_q, True)
    k_base = K + off_b * stride_kb + off_hk * stride_kh + k_start * stride_kn
    v_base = V + off_b * stride_vb + off_hk * stride_vh + k_start * stride_vn
    lo, full_lo, full_hi, hi = key_range(start_m, n_k, off, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    if HAS_LEFT:
        dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                       offs_d, offs_dv, lo, full_lo, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
                       BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD, True, HAS_LEFT, HAS_RIGHT,
                       SOFTCAP, EMULATE_BF16, DOT_PRECISION)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                   offs_d, offs_dv, full_lo, full_hi, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
                   BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD, False, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                   EMULATE_BF16, DOT_PRECISION)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                   offs_d, offs_dv, full_hi, hi, n_k, off, left, right, qk_scale, softcap_in, softcap_out,
                   BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, HEAD_DIM_V, HEAD_DIM_V_PAD, True, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                   EMULATE_BF16, DOT_PRECISION)
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + (q_start + offs_m[:, None]) * stride_dqm
             + offs_d[None, :] * stride_dqd, cast(dq * sm_scale, DQ.dtype.element_ty, EMULATE_BF16),
             mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def sink_grad_kernel(SINK_PART, DSINKS, n_parts, BLOCK: tl.constexpr):
    # grid = (Hq,): DSINKS[h] = -sum of the head's n_parts contiguous parts (attention_bwd_delta_kernel's
    # SINK_PART, [Hq, n_parts] fp32), in order: the same bits every run.
    h = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r0 in range(0, n_parts, BLOCK):
        offs = r0 + tl.arange(0, BLOCK)
        acc += tl.load(SINK_PART + h * n_parts + offs, mask=offs < n_parts, other=0.0)
    tl.store(DSINKS + h, -tl.sum(acc, 0))
