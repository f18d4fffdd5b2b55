"""The band mask and the key ranges it leaves, shared by every attention kernel.

Query row i sees key j when

    i + off - left <= j <= i + off + right        (left/right < 0: unbounded)

The launcher folds causal mode, window and Nq != Nk into (off, left, right)
(`vflash.call`); the kernels never see "causal". For a tile of rows the key
range splits into three stretches:

    [lo, full_lo)       masked: tiles crossing the left edge of the band
    [full_lo, full_hi)  no mask: every (row, key) pair visible, no bounds checks
    [full_hi, hi)       masked: the right edge (the diagonal) and the ragged n_k tail

Tiles outside [lo, hi) are never loaded or computed. The helpers are plain
`triton.language` code, so Gluon kernels call them as they are.
"""

import triton
import triton.language as tl


@triton.jit
def masked_logits(qk, offs_m, offs_n, n_k, off, left, right, softcap_in, softcap_out,
                  MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                  SOFTCAP: tl.constexpr):
    # qk [rows, BLOCK_N] raw q.k in fp32 -> scores, -inf where the key is not
    # visible. With softcap they come out capped and in log2 units; without, they
    # stay raw q.k, and softmax_step applies the scale inside the exp2's operand
    # (one FMA per score instead of a multiply and a subtract).
    LOG2E: tl.constexpr = 1.4426950408889634
    if SOFTCAP:
        # cap * tanh(scale * qk / cap), tanh through exp2 so it saturates to +-1
        # instead of overflowing; softcap_out carries cap * log2(e).
        x = qk * softcap_in
        qk = (1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)) * softcap_out
    if MASKED:
        # With a right edge the key count folds into each row's last visible key,
        # so a score costs one compare per edge, not one more for the count (the
        # row bounds are a few ops per row, two rows a thread in the Hopper
        # kernel). offs_n may be relative to the tile's first key, with n_k and
        # off shifted by it: the kernels pass loop-invariant columns that way, and
        # the shift goes into the row bounds instead of into every score's index.
        # Bounds are not clamped to the tile's columns: that changes the schedule
        # of the sm90 kernel's unmasked loops for the worse (docs/perf).
        if HAS_RIGHT:
            visible = offs_n[None, :] <= tl.minimum(offs_m + off + right, n_k - 1)[:, None]
        else:
            visible = offs_n[None, :] < n_k
        if HAS_LEFT:
            visible = visible & (offs_n[None, :] >= (offs_m + off - left)[:, None])
        qk = tl.where(visible, qk, float("-inf"))
    return qk


@triton.jit
def key_range(start_m, n_k, off, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    # Key range [lo, hi) seen by any row of the tile starting at start_m, and the
    # tile-aligned part [full_lo, full_hi) in which every (row, key) pair is
    # visible. Rows past n_q only widen the range.
    last_m = start_m + BLOCK_M - 1
    lo = 0
    full_lo = 0
    hi = n_k
    full_hi = (n_k // BLOCK_N) * BLOCK_N
    if HAS_LEFT:
        lo = (tl.maximum(start_m + off - left, 0) // BLOCK_N) * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(last_m + off - left, 0), BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(hi, tl.maximum(last_m + off + right + 1, 0))
        full_hi = tl.minimum(full_hi, (tl.maximum(start_m + off + right + 1, 0) // BLOCK_N) * BLOCK_N)
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def key_tiles(lo, full_lo, full_hi, hi, BLOCK_N: tl.constexpr):
    # key_range's ranges in BLOCK_N-key tiles counted from lo: [0, n_left) masked,
    # [n_left, n_mid) every pair visible, [n_mid, n_tiles) masked.
    n_left = tl.cdiv(full_lo - lo, BLOCK_N)
    n_mid = n_left + (full_hi - full_lo) // BLOCK_N
    return n_left, n_mid, n_mid + tl.cdiv(hi - full_hi, BLOCK_N)


@triton.jit
def row_tiles(row0, lo, n_tiles, n_q, n_k, off, left, right, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    # Of a work tile's key tiles [0, n_tiles), counted from its lo (key_range's),
    # those that rows [row0, row0 + ROWS) see, split as key_tiles splits a tile's:
    # [0, c_left) masked, [c_left, c_mid) every pair visible, [c_mid, c_end) masked;
    # c_end = 0 for rows all past n_q. A left edge can put these rows' first key
    # past the tile's last: clamped. The sm90 kernel's consumers (64-row slices
    # of a work tile) stop at their own c_end.
    c_lo, c_full_lo, c_full_hi, c_hi = key_range(row0, n_k, off, left, right, ROWS, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    c_left, c_mid, c_end = key_tiles(lo, c_full_lo, c_full_hi, c_hi, BLOCK_N)
    c_end = tl.minimum(c_end, n_tiles)
    if row0 >= n_q:
        c_end = 0
    c_mid = tl.minimum(c_mid, c_end)
    c_left = tl.minimum(c_left, c_mid)
    return c_left, c_mid, c_end
