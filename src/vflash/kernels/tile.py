"""Tile loads, products and conversions shared by the attention kernels (forward,
KV-cache, backward, merge): masked loads of [rows, HEAD_DIM_PAD] tiles, tl.dot, and
the fp32 -> input-dtype cast of P, dS and the outputs.

EMULATE_BF16 (the launchers set it for bf16 under Triton's interpreter only): numpy has
no bf16, and the interpreter gets it wrong both ways. A bf16 product is wrong unless both
tiles are fp32 first, and fp32 -> bf16 truncates where the GPU rounds to nearest even,
which shrinks every output toward zero (about 0.45 % on average: small CPU cases then
fail the accuracy rule). `dot` and `cast` do both by hand there; on a GPU the flag is off
and they compile to the plain tl.dot and .to(). FP8 (e4m3) inputs take the same flag where the
interpreter runs them or the GPU has no FP8 product (before sm_89): their tiles go to fp32
exactly, and `to_e4m3` rounds P on its bits."""

import triton
import triton.language as tl


@triton.jit
def load_at(ptrs, offs_n, offs_d, n, HEAD_DIM: tl.constexpr, CHECK_N: tl.constexpr, CHECK_D: tl.constexpr):
    # A tile at ptrs [len(offs_n), HEAD_DIM_PAD]; bounds checks only where it can run
    # past the sequence end (CHECK_N) or the padded head dim (CHECK_D).
    if CHECK_N:
        if CHECK_D:
            return tl.load(ptrs, mask=(offs_n[:, None] < n) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        else:
            return tl.load(ptrs, mask=offs_n[:, None] < n, other=0.0)
    else:
        if CHECK_D:
            return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            return tl.load(ptrs)


@triton.jit
def load_tile(base, offs_n, offs_d, stride_n, stride_d, n, HEAD_DIM: tl.constexpr,
              CHECK_N: tl.constexpr, CHECK_D: tl.constexpr):
    # [len(offs_n), HEAD_DIM_PAD] of rows base + offs_n * stride_n.
    return load_at(base + offs_n[:, None] * stride_n + offs_d[None, :] * stride_d, offs_n, offs_d, n, HEAD_DIM,
                   CHECK_N, CHECK_D)


@triton.jit
def load_rows(base, offs_m, offs_d, stride_m, stride_d, n_q, HEAD_DIM: tl.constexpr):
    # [rows, HEAD_DIM_PAD] tile of Q (or dO): zeros past n_q / HEAD_DIM.
    mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
    return tl.load(base + offs_m[:, None] * stride_m + offs_d[None, :] * stride_d, mask=mask, other=0.0)


@triton.jit
def cast(x, dtype: tl.constexpr, EMULATE_BF16: tl.constexpr):
    # fp32 x -> dtype, rounded to nearest even. EMULATE_BF16 and dtype bf16: the rounding done on the
    # bits, ties to even, a carry running into the exponent (to inf past bf16's largest), subnormals
    # exact; the top 16 bits are the bf16 value. NaN goes through the plain conversion.
    if EMULATE_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return tl.where(x != x, x.to(dtype), bits.to(tl.uint16).to(dtype, bitcast=True))
    else:
        return x.to(dtype)


E4M3_MAX = tl.constexpr(448.0)  # e4m3fn's largest finite value
# P [0, 1] times 2^P_E4M3_LOG2 (256) before its rounding to e4m3: the row max in e4m3's top binade, its other values
# in the normals down to 2^-14 (FlashAttention-3's choice). Both forward kernels fold it into exp2's operand
# (softmax_step's P_LOG2), l counts in the same units, and the finish takes m - P_E4M3_LOG2.
P_E4M3_LOG2 = tl.constexpr(8.0)
E4M3_LAZY_SLACK = tl.constexpr(0.75)  # the lazy reference max's slack for e4m3 P: 2^0.75 * 256 = 431 < 448


@triton.jit
def to_e4m3(x, EMULATE: tl.constexpr):
    # fp32 x -> the nearest e4m3fn value (ties to even, saturated at +-448, NaN kept): an e4m3 tile for
    # tl.dot; EMULATE (the interpreter, or a GPU without an FP8 product): the value in fp32, rounded on its
    # bits, since the interpreter's fp32 -> e4m3 conversion is wrong (ties away from zero, no saturation,
    # lost carries). Normals (>= 2^-6) keep 3 mantissa bits, a carry running into the exponent; subnormals
    # are multiples of 2^-9, rounded by an fp32 add of 2^14 (whose ulp is 2^-9: ties to even).
    if EMULATE:
        a = tl.minimum(tl.abs(x), E4M3_MAX)
        bits = a.to(tl.uint32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
        r = tl.where(a < 0.015625, (a + 16384.0) - 16384.0, normal)
        return tl.where(x != x, x, tl.where(x < 0, -r, r))
    else:
        return x.to(tl.float8e4nv)


@triton.jit
def descaled(qk_scale, softcap_in, out_scale, Q_DESCALE, K_DESCALE, V_DESCALE, off_b, off_hk, descale_strides):
    # FP8's descales (fp32; None: 1) of a (batch or sequence, KV head), read at descale_strides' (batch, head)
    # pairs, q's, k's and v's (0, 0: one a tensor): q's and k's multiply the score's scale and the softcap's
    # input, v's the output's factor out_scale. Returns the three.
    qd_b, qd_h, kd_b, kd_h, vd_b, vd_h = descale_strides
    qk_descale = 1.0
    if Q_DESCALE is not None:
        qk_descale = qk_descale * tl.load(Q_DESCALE + off_b * qd_b + off_hk * qd_h)
    if K_DESCALE is not None:
        qk_descale = qk_descale * tl.load(K_DESCALE + off_b * kd_b + off_hk * kd_h)
    qk_scale = qk_scale * qk_descale
    softcap_in = softcap_in * qk_descale
    if V_DESCALE is not None:
        out_scale = out_scale * tl.load(V_DESCALE + off_b * vd_b + off_hk * vd_h)
    return qk_scale, softcap_in, out_scale


@triton.jit
def f16_scale(amax):
    # The power of two s that puts amax (fp32, >= 0) in [2^14, 2^15): x * s is then exact in fp16 for every
    # bf16 x within 2^-28 of amax (fp16's normals keep bf16's 8 significant bits), and none overflows. From
    # amax's exponent bits, not log2 (approximate on a GPU); 0 gives 2^127, inf or NaN 2^-114.
    e = (amax.to(tl.uint32, bitcast=True) >> 23).to(tl.int32)
    return (tl.minimum(tl.maximum(268 - e, 1), 254).to(tl.uint32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def dot(a, b, acc, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # a [M, K] @ b [K, N] (+ acc [M, N] fp32, or None) in fp32.
    if EMULATE_BF16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=DOT_PRECISION)
    else:
        return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def scores(q, k, EMULATE_BF16: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # q [rows, HEAD_DIM_PAD], k [BLOCK_N, HEAD_DIM_PAD] -> q k^T [rows, BLOCK_N] fp32
    return dot(q, tl.trans(k), None, EMULATE_BF16, DOT_PRECISION)
