"""Merging partial attention results through their log-sum-exps: the step
that split-KV, cascade (prefix) attention and ring attention share.

For a row with partial outputs o_a, o_b over disjoint key sets and their
natural-log LSEs l_a, l_b, the attention over the union is

    l = log(exp(l_a) + exp(l_b)),   o = (exp(l_a - l) o_a + exp(l_b - l) o_b)

computed from m = max(l_a, l_b) so nothing overflows; a row that saw no key in
either part (l_a = l_b = -inf) gets o = 0 and l = -inf. A part whose l is +inf (its
scores overflowed fp32) outweighs any finite one: it takes all the weight (both +inf:
half each) and l = +inf, never NaN.
"""

import triton
import triton.language as tl

from vflash.kernels.tile import cast


@triton.jit
def merge_states_kernel(
    OUT_A, LSE_A, OUT_B, LSE_B, OUT, LSE, a_strides, b_strides, o_strides, n_rows, head_dim,
    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    # grid = (cdiv(n_rows, BLOCK_ROWS), cdiv(head_dim, BLOCK_D)): [BLOCK_ROWS, BLOCK_D]
    # tiles of the outputs, viewed as [rows, head_dim] ((row, dim) strides); the LSEs are
    # contiguous [rows] fp32.
    stride_a_row, stride_a_d = a_strides
    stride_b_row, stride_b_d = b_strides
    stride_o_row, stride_o_d = o_strides
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [BLOCK_ROWS]
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    row_ok = rows < n_rows
    lse_a = tl.load(LSE_A + rows, mask=row_ok, other=float("-inf"))
    lse_b = tl.load(LSE_B + rows, mask=row_ok, other=float("-inf"))
    m = tl.maximum(lse_a, lse_b)
    empty = m == float("-inf")
    overflow = m == float("inf")  # a part whose scores overflowed: exp(inf - inf) would be NaN
    m_ref = tl.where(empty | overflow, 0.0, m)  # exp(-inf - 0) = 0 for an empty part, never NaN
    w_a = tl.where(overflow, tl.where(lse_a == float("inf"), 1.0, 0.0), tl.exp(lse_a - m_ref))
    w_b = tl.where(overflow, tl.where(lse_b == float("inf"), 1.0, 0.0), tl.exp(lse_b - m_ref))
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
             cast(o, OUT.dtype.element_ty, EMULATE_BF16), mask=mask)
    if tl.program_id(1) == 0:
        lse = tl.where(empty | overflow, m, m + tl.log(tl.where(empty, 1.0, total)))
        tl.store(LSE + rows, lse, mask=row_ok)


@triton.jit
def fold_splits(o_rows, lse_rows, stride_ps, stride_ls, stride_d, num_splits, row_ok, sink,
                ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
                HAS_SINK: tl.constexpr):
    # Split-KV's merge of ROWS rows' fp32 partials: o_rows [ROWS] points at each row's split-0
    # output (split s at + s * stride_ps, column d at + d * stride_d), lse_rows [ROWS] at its split-0
    # natural-log LSE (+ s * stride_ls). Returns out [ROWS, HEAD_DIM_PAD] fp32 and lse [ROWS].
    # SPLIT_CHUNK splits a load ([ROWS, SPLIT_CHUNK, HEAD_DIM_PAD] at once, one load round trip),
    # folded into a running max, weight sum and output, each chunk reduced by a fixed tree and the
    # chunks in order: the same bits from run to run. Rows lead the tiles so that the compiler's
    # layout puts the rows across warps and a row's splits in one thread's registers: the
    # reductions over splits stay in registers (splits leading put them across warps, each
    # reduction a round trip through shared memory and barriers). A split that saw no key has LSE
    # -inf and a zero partial (the split kernel writes both for it): it adds an exact zero and a chunk
    # of them rescales by exactly 1, so a sequence's result does not depend on how many empty splits
    # the grid has beyond its own (batch invariance). The loads bypass L1 (.cg): other programs wrote
    # the partials during this kernel. HAS_SINK: sink [ROWS] (natural log; -inf: none) enters the merged
    # row's denominator once, as a first part of output 0 (the partials carry none): no step after the
    # loop, and a row with no key keeps m = sink, total 1, so its LSE is the sink exactly.
    offs_s = tl.arange(0, SPLIT_CHUNK)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    if HAS_SINK:  # the sink as a first part: weight e^sink, output 0 (-inf: no sink, weight 0)
        m_run = sink + tl.zeros([ROWS], dtype=tl.float32)
        total = tl.where(m_run == float("-inf"), 0.0, 1.0)
    else:
        m_run = tl.full([ROWS], float("-inf"), dtype=tl.float32)
        total = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_PAD], dtype=tl.float32)
    for s0 in range(0, num_splits, SPLIT_CHUNK):
        split = (s0 + offs_s).to(tl.int64)  # [SPLIT_CHUNK]
        ok = row_ok[:, None] & (split < num_splits)[None, :]  # [ROWS, SPLIT_CHUNK]
        lse_c = tl.load(lse_rows[:, None] + split[None, :] * stride_ls, mask=ok, other=float("-inf"),
                        cache_modifier=".cg")
        part = tl.load(o_rows[:, None, None] + split[None, :, None] * stride_ps + offs_d[None, None, :] * stride_d,
                       mask=ok[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m_run, tl.max(lse_c, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # exp(-inf - 0) = 0 for empty splits, never NaN
        scale = tl.exp(m_run - m_ref)  # 1 when the chunk moved nothing, 0 before the first key
        w = tl.exp(lse_c - m_ref[:, None])  # [ROWS, SPLIT_CHUNK]
        total = total * scale + tl.sum(w, 1)
        # a split that saw no key has weight 0 and a zero partial (every split of the tile writes its
        # own, an empty one zeros; splits past num_splits load zeros): it adds an exact zero, no select
        acc = acc * scale[:, None] + tl.sum(part * w[:, :, None], 1)
        m_run = m_new
    empty = m_run == float("-inf")
    out = acc * (1.0 / tl.where(empty, 1.0, total))[:, None]
    lse = tl.where(empty, float("-inf"), m_run + tl.log(tl.where(empty, 1.0, total)))
    return out, lse


@triton.jit
def merge_splits_kernel(
    O_PART, LSE_PART, O, LSE, SINKS, n_rows, heads_q, total_q, part_stride, num_splits,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, ROWS: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
    STORE_LSE: tl.constexpr, HAS_SINK: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    # A split launch's merge (fold_splits) as a launch of its own: rows r = query t * Hq + head h of the fp32
    # partials O_PART [splits, n_rows, HEAD_DIM] (split stride part_stride) and LSE_PART [splits, Hq, total_q]
    # into O [n_rows, HEAD_DIM] (its dtype) and LSE [Hq, total_q] (STORE_LSE); HAS_SINK: SINKS [Hq] fp32, each
    # head's sink logit, in the merged row's denominator (the partials carry none). grid = (cdiv(n_rows, ROWS),).
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    head = rows % heads_q
    lse_offs = head.to(tl.int64) * total_q + rows // heads_q
    if HAS_SINK:
        sink = tl.load(SINKS + head, mask=row_ok, other=float("-inf"))
    else:
        sink = 0.0
    out, lse = fold_splits(O_PART + rows.to(tl.int64) * HEAD_DIM, LSE_PART + lse_offs, part_stride,
                           heads_q.to(tl.int64) * total_q, 1, num_splits, row_ok, sink, ROWS, HEAD_DIM, HEAD_DIM_PAD,
                           SPLIT_CHUNK, HAS_SINK)
    cols = tl.arange(0, HEAD_DIM_PAD)
    tl.store(O + rows.to(tl.int64)[:, None] * HEAD_DIM + cols[None, :], cast(out, O.dtype.element_ty, EMULATE_BF16),
             mask=row_ok[:, None] & (cols < HEAD_DIM)[None, :])
    if STORE_LSE:
        tl.store(LSE + lse_offs, lse, mask=row_ok)
