"""The online-softmax step and the row's finish, shared by every attention kernel (portable and Gluon)."""

import triton
import triton.language as tl

# The lazy reference max's bound on how far a row's max may run ahead of its m
# for 16-bit P (log2 units, so p <= 2^8; FlashAttention-4's); e4m3 P's is tile.E4M3_LAZY_SLACK.
LAZY_SLACK = tl.constexpr(8.0)


@triton.jit
def softmax_step(s, s_max, m_i, l_i, qk_scale, MASKED: tl.constexpr, SOFTCAP: tl.constexpr, SLACK: tl.constexpr,
                 P_LOG2: tl.constexpr):
    # Online softmax on one tile of masked_logits' scores s [rows, BLOCK_N], whose
    # row max s_max [rows] the caller takes (tl.max(s, 1), or gl.max in Gluon):
    # returns p [rows, BLOCK_N] fp32, the accumulator's rescale alpha [rows], and
    # the new m, l [rows] (m in log2 units). Without softcap, s is raw q.k and
    # qk_scale (> 0, log2(e) folded in) commutes with the row max, so the scale is
    # applied to the max and fused into exp2's operand.
    # SLACK > 0 (FlashAttention-4's lazy reference max, LAZY_SLACK for 16-bit P):
    # a row's m moves only when the tile's max exceeds it by more than SLACK (log2
    # units, so p <= 2^SLACK), so alpha is exactly 1 on most tiles and the sm90
    # kernel can skip O's rescale there; 0: m is the running max. Exact either way
    # (O, l and the LSE share m); only the rounding differs.
    # P_LOG2: p comes out times 2^P_LOG2 (e4m3 P's scale, folded into exp2's
    # operand instead of a multiply); l then counts in units of 2^(m - P_LOG2),
    # the m that softmax_finish must be given.
    if SOFTCAP:
        m_tile = s_max
    else:
        m_tile = s_max * qk_scale
    if SLACK > 0:
        m_new = tl.where(m_tile > m_i + SLACK, m_tile, m_i)  # m_i = -inf takes any finite max
    else:
        m_new = tl.maximum(m_i, m_tile)
    if MASKED:
        # A row that has seen no visible key yet keeps m = -inf; subtracting 0
        # instead makes its p and alpha exactly 0 rather than NaN.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    if P_LOG2 != 0:
        m_p = m_ref - P_LOG2
    else:
        m_p = m_ref
    if SOFTCAP:
        p = tl.exp2(s - m_p[:, None])
    else:
        p = tl.exp2(s * qk_scale - m_p[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def softmax_finish(m_i, l_i, sink, HAS_SINK: tl.constexpr):
    # A row's result from its running max m (log2 units) and sum l [rows]: the output accumulator's
    # normalizer and the natural-log LSE. A row that saw no key has l = 0 and a zero accumulator: its
    # normalizer is 1 (out 0) and its LSE -inf. Every store of a whole row's result takes it (the portable
    # and KV-cache kernels, the sm90 consumer); a split's partial takes it without the sink, which enters
    # once, at the merge (fold_splits).
    # HAS_SINK: sink (natural log, [rows] or one value; -inf: none) is one more term of the denominator,
    # folded in at the larger of m and the sink (a sink far above the scores neither overflows nor loses
    # the keys' share): m' = max(m, sink), l' = l 2^(m - m') + 2^(sink - m'), the accumulator's
    # normalizer 2^(m - m') / l'. A row with no key then has out 0 and LSE = sink.
    LN2: tl.constexpr = 0.6931471805599453
    if HAS_SINK:
        sink2 = sink * 1.4426950408889634  # log2 units, as m
        m_new = tl.maximum(m_i, sink2)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key and no sink: exp2 of -inf, never NaN
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.exp2(sink2 - m_ref)
        m_i = m_new
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    if HAS_SINK:
        inv_l = alpha / l_safe
    else:
        inv_l = 1.0 / l_safe
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    if HAS_SINK:
        lse = tl.where(alpha == 0.0, sink, lse)  # no key (or none left in the sink's shadow): the sink itself
    return inv_l, lse
