"""FP8 V copied with its keys contiguous, as Hopper's e4m3 dot reads P.V's second operand (ops.tma.keys_contiguous
for the portable kernel; ops.tma.sm90_e4m3_values for the sm90 kernel's FP8 build, each 16-key group in the
score accumulator's column order, ops.tma.E4M3_KEY_ORDER, and packed sequences from key-tile multiples).
One pass: a program reads [COLS keys, BLOCK_D] tiles of V and writes them transposed; it writes every byte
of its columns, pads included, so the copy needs no memset. Bytes only (uint8 views): the interpreter and
every GPU move them alike."""

import triton
import triton.language as tl

from vflash.kernels.seqlen import tile_aligned_start


@triton.jit
def operand_key(col):
    # the key (within its sequence) at column `col` of the copy: within each 16-key group, column c holds key
    # E4M3_KEY_ORDER[c] = (c & 1) + ((c >> 1) & 1) * 8 + (c >> 2) * 2 (0, 1, 8, 9, 2, 3, 10, 11, ...)
    c = col % 16
    return col - c + (c & 1) + ((c >> 1) & 1) * 8 + (c >> 2) * 2


@triton.jit
def e4m3_values_kernel(
    V, OUT, CU_SEQLENS, v_strides, out_strides, n_keys, n_cols, batch, head_dim,
    COLS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PERMUTED: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    # grid = (cdiv(n_cols, COLS), H, B). V [B, H, N, D] (v_strides: b, h, key, d; a packed [total, H, D] as B 1:
    # 0, h, key, d), OUT [B, H, D, n_cols] (out_strides: b, h, d; columns contiguous), n_cols = N padded to 16,
    # n_keys = N. PERMUTED: each 16-key group in the operand order (operand_key). IS_VARLEN (B 1, PERMUTED):
    # sequence b of the packed keys from column tile_aligned_start(cu[b], b) (a BLOCK_N multiple, so a COLS
    # tile never straddles two sequences: COLS divides BLOCK_N), zeros up to the next sequence's start.
    stride_vb, stride_vh, stride_vn, stride_vd = v_strides
    stride_ob, stride_oh, stride_od = out_strides
    col0 = tl.program_id(0) * COLS
    h = tl.program_id(1).to(tl.int64)
    cols = col0 + tl.arange(0, COLS)
    if IS_VARLEN:
        tl.static_assert(PERMUTED, "packed sequences go to the sm90 build's layout only")
        # the last sequence whose region starts at or before col0 (starts grow with b: a binary search)
        lo = 0
        hi = batch - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tile_aligned_start(tl.load(CU_SEQLENS + mid), mid, BLOCK_N) <= col0:
                lo = mid
            else:
                hi = mid - 1
        first = tl.load(CU_SEQLENS + lo)
        start = tile_aligned_start(first, lo, BLOCK_N)
        key = operand_key(cols - start)  # PERMUTED
        valid = key < tl.load(CU_SEQLENS + lo + 1) - first
        src = V + h * stride_vh + (first + key).to(tl.int64) * stride_vn
        dst = OUT + h * stride_oh
    else:
        b = tl.program_id(2).to(tl.int64)
        if PERMUTED:
            key = operand_key(cols)
        else:
            key = cols
        valid = key < n_keys
        src = V + b * stride_vb + h * stride_vh + key.to(tl.int64) * stride_vn
        dst = OUT + b * stride_ob + h * stride_oh
    for d0 in range(0, head_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        d64 = d.to(tl.int64)  # d * n_cols passes 2^31 past 16M keys at D 128
        x = tl.load(src[:, None] + d64[None, :] * stride_vd, mask=valid[:, None] & (d < head_dim)[None, :], other=0)
        tl.store(dst + d64[:, None] * stride_od + cols[None, :], tl.trans(x),
                 mask=(d < head_dim)[:, None] & (cols < n_cols)[None, :])
