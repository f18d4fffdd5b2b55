"""Which rows of the packed tensors one sequence holds, shared by the kernels that
take a batch either dense ([B, H, N, D], every sequence the call's lengths) or packed
(varlen: [total, H, D] with int32 cu_seqlens [B + 1], FlashAttention's layout)."""

import triton
import triton.language as tl


@triton.jit
def sequence(off_b, cu_seqlens_q, cu_seqlens_k, seqlens_k, n_q, n_k, off, IS_VARLEN: tl.constexpr,
             IS_PAGED: tl.constexpr, TOP_LEFT: tl.constexpr):
    # Sequence off_b -> (first query row, first key row (int64, for base offsets),
    # its query rows and keys (int32), its band offset). Dense: rows from 0, the
    # call's lengths and the launcher's offset. Varlen: from cu_seqlens, and the
    # offset of the band rule for this sequence's lengths (Nk - Nq, bottom-right
    # alignment, or 0 top-left). IS_PAGED: keys from a cache, seqlens_k[b] of them
    # (their rows come from the block table, so the first key row is 0).
    if IS_VARLEN:
        q_start = tl.load(cu_seqlens_q + off_b)
        n_q = tl.load(cu_seqlens_q + off_b + 1) - q_start
        if IS_PAGED:
            k_start = q_start * 0
            n_k = tl.load(seqlens_k + off_b)
        else:
            k_start = tl.load(cu_seqlens_k + off_b)
            n_k = tl.load(cu_seqlens_k + off_b + 1) - k_start
        if TOP_LEFT:
            off = 0
        else:
            off = n_k - n_q
        return q_start.to(tl.int64), k_start.to(tl.int64), n_q, n_k, off
    else:
        return 0, 0, n_q, n_k, off


@triton.jit
def tile_aligned_start(k_row, off_b, BLOCK_N: tl.constexpr):
    # Sequence off_b's first row in a packed tensor laid out with every sequence from a BLOCK_N multiple
    # (ops.tma.sm90_e4m3_values: FP8's V for the sm90 kernel), from its first row k_row in the packed one:
    # k_row rounded up to BLOCK_N, plus BLOCK_N a sequence before it, so that each one's rounded-up length fits.
    return (k_row + BLOCK_N - 1) // BLOCK_N * BLOCK_N + off_b * BLOCK_N
