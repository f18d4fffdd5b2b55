"""Merging partial attention results through their log-sum-exps: the step
that split-KV, cascade (prefix) attention and ring attention share.

For a row with partial outputs o_a, o_b over disjoint key sets and their
natural-log LSEs l_a, l_b, the attention over the union is

    l = log(exp(l_a) + exp(l_b)),   o = (exp(l_a - l) o_a + exp(l_b - l) o_b)

computed from m = max(l_a, l_b) so nothing overflows; a row that saw no key in
either part (l_a = l_b = -inf) gets o = 0 and l = -inf.
"""

import triton
import triton.language as tl


@triton.jit
def merge_states_kernel(
    OUT_A, LSE_A, OUT_B, LSE_B, OUT, LSE,
    stride_a_row, stride_a_d, stride_b_row, stride_b_d, stride_o_row, stride_o_d,
    n_rows, head_dim,
    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # grid = (cdiv(n_rows, BLOCK_ROWS), cdiv(head_dim, BLOCK_D)): [BLOCK_ROWS, BLOCK_D]
    # tiles of the outputs, viewed as [rows, head_dim]; the LSEs are contiguous [rows] fp32.
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [BLOCK_ROWS]
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    row_ok = rows < n_rows
    lse_a = tl.load(LSE_A + rows, mask=row_ok, other=float("-inf"))
    lse_b = tl.load(LSE_B + rows, mask=row_ok, other=float("-inf"))
    m = tl.maximum(lse_a, lse_b)
    empty = m == float("-inf")
    m_ref = tl.where(empty, 0.0, m)  # exp(-inf - 0) = 0 for an empty part, never NaN
    w_a = tl.exp(lse_a - m_ref)
    w_b = tl.exp(lse_b - m_ref)
    total = w_a + w_b
    inv = 1.0 / tl.where(empty, 1.0, total)
    mask = row_ok[:, None] & (cols[None, :] < head_dim)
    o_a = tl.load(OUT_A + rows[:, None].to(tl.int64) * stride_a_row + cols[None, :] * stride_a_d, mask=mask,
                  other=0.0).to(tl.float32)
    o_b = tl.load(OUT_B + rows[:, None].to(tl.int64) * stride_b_row + cols[None, :] * stride_b_d, mask=mask,
                  other=0.0).to(tl.float32)
    # A part that saw no key (weight 0) adds nothing, whatever its output holds.
    o = (tl.where(w_a[:, None] > 0, o_a * (w_a * inv)[:, None], 0.0)
         + tl.where(w_b[:, None] > 0, o_b * (w_b * inv)[:, None], 0.0))  # [BLOCK_ROWS, BLOCK_D] fp32
    tl.store(OUT + rows[:, None].to(tl.int64) * stride_o_row + cols[None, :] * stride_o_d,
             o.to(OUT.dtype.element_ty), mask=mask)
    if tl.program_id(1) == 0:
        lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, total)))
        tl.store(LSE + rows, lse, mask=row_ok)


@triton.jit
def combine_splits_kernel(
    O_PART, LSE_PART, OUT, LSE,
    stride_ps, stride_pm, stride_ph, stride_pd,
    stride_ls, stride_lh,
    stride_om, stride_oh, stride_od,
    num_splits, n_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_H: tl.constexpr, STORE_LSE: tl.constexpr,
):
    # grid = (total_q, cdiv(Hq, BLOCK_H)): split-KV's fp32 partials O_PART [splits, total_q,
    # Hq, D] and LSE_PART [splits, Hq, total_q] (row stride 1) of BLOCK_H heads of one query
    # row into OUT [total_q, Hq, D] and LSE [Hq, total_q]. The splits are folded one after
    # another in a fixed order, so the result is the same bits from run to run, and splits
    # that saw no key (-inf) add exact zeros: a sequence's result does not depend on how
    # many empty splits the grid has beyond its own.
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    head_ok = heads < n_heads
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    lse_rows = LSE_PART + heads * stride_lh + row
    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(lse_rows + s * stride_ls, mask=head_ok, other=float("-inf")))
    empty = m == float("-inf")
    m_ref = tl.where(empty, 0.0, m)
    total = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM_PAD], dtype=tl.float32)
    mask = head_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    part_rows = O_PART + row * stride_pm + heads[:, None] * stride_ph + offs_d[None, :] * stride_pd
    for s in range(num_splits):
        w = tl.exp(tl.load(lse_rows + s * stride_ls, mask=head_ok, other=float("-inf")) - m_ref)  # [BLOCK_H]
        o = tl.load(part_rows + s * stride_ps, mask=mask, other=0.0)
        total += w
        acc += tl.where(w[:, None] > 0, o * w[:, None], 0.0)
    inv = 1.0 / tl.where(empty, 1.0, total)
    tl.store(OUT + row * stride_om + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
             (acc * inv[:, None]).to(OUT.dtype.element_ty), mask=mask)
    if STORE_LSE:
        lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, total)))
        tl.store(LSE + heads * stride_lh + row, lse, mask=head_ok)
