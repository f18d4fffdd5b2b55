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
    num_splits,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLIT_CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    # grid = (total_q, Hq): split-KV's fp32 partials O_PART [splits, total_q, Hq, D] and
    # LSE_PART [splits, Hq, total_q] (row stride 1) of one (query row, head) into OUT
    # [total_q, Hq, D] and LSE [Hq, total_q]. The splits go by in groups of CHUNKS x SPLIT_CHUNK,
    # each group's LSEs and partials loaded at once (one load round trip for a group: decode's
    # split counts fit in one), folded into a running max, weight sum and output: each chunk
    # ([SPLIT_CHUNK, HEAD_DIM_PAD]) reduced by a fixed tree, the chunks and groups in order. The
    # same bits from run to run; a split that saw no key (-inf) adds an exact zero and a group of
    # them rescales by exactly 1, so a sequence's result does not depend on how many empty splits
    # the grid has beyond its own.
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, SPLIT_CHUNK)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    lse_col = LSE_PART + head * stride_lh + row
    part = O_PART + row * stride_pm + head * stride_ph
    m_run = tl.full([1], float("-inf"), dtype=tl.float32)
    total = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    GROUP: tl.constexpr = SPLIT_CHUNK * CHUNKS
    for g0 in range(0, num_splits, GROUP):
        lses = ()
        parts = ()
        m = tl.full([SPLIT_CHUNK], float("-inf"), dtype=tl.float32)
        for c in tl.static_range(CHUNKS):
            s = g0 + c * SPLIT_CHUNK + offs_s
            ok = s < num_splits
            lse_c = tl.load(lse_col + s * stride_ls, mask=ok, other=float("-inf"))
            parts = parts + (tl.load(part + s[:, None] * stride_ps + offs_d[None, :] * stride_pd,
                                     mask=ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0),)
            lses = lses + (lse_c,)
            m = tl.maximum(m, lse_c)
        m_new = tl.maximum(m_run, tl.max(m, 0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # exp(-inf - 0) = 0 for empty splits, never NaN
        scale = tl.exp(m_run - m_ref)  # 1 when the group moved nothing, 0 before the first key
        total = total * scale
        acc = acc * scale
        for c in tl.static_range(CHUNKS):
            w = tl.exp(lses[c] - m_ref)
            total += tl.sum(w, 0)
            acc += tl.sum(tl.where(w[:, None] > 0, parts[c] * w[:, None], 0.0), 0)
        m_run = m_new
    empty = m_run == float("-inf")
    inv = 1.0 / tl.where(empty, 1.0, total)
    tl.store(OUT + row * stride_om + head * stride_oh + offs_d * stride_od, (acc * inv).to(OUT.dtype.element_ty),
             mask=offs_d < HEAD_DIM)
    if STORE_LSE:
        lse = tl.where(empty, float("-inf"), m_run + tl.log(tl.where(empty, 1.0, total)))
        tl.store(LSE + head * stride_lh + row + tl.arange(0, 1), lse)
