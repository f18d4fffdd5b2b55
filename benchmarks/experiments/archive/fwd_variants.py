"""ARCHIVED (benchmarks/experiments/archive/README.md): answered, and written against the launcher API of
its day; it does not run against the current library.

Issue 4 experiment: candidate Hopper forward variants, checked then timed in one call.

Not part of the library. Each variant is checked against the fp64 oracle
(vflash's harness rule) before it is timed; a variant that fails to compile or
to match is reported, never timed. Prints one table: TFLOP/s of the library
kernel, of each variant, and of SDPA cuDNN / flash from the same run.

The variant kernel is the FlashAttention-2 loop with tensor-descriptor (TMA)
loads and stores, an unmasked off-diagonal loop and a masked diagonal stage,
optionally with Triton's warp specialization on the main loop. It covers only
what the measurement needs: contiguous [B, H, N, D], Nq == Nk, N % BLOCK_M == 0.

GPU:  PYTHONPATH=src python3 benchmarks/experiments/fwd_variants.py
CPU:  PYTHONPATH=src python3 benchmarks/experiments/fwd_variants.py --check-only
      (the interpreter runs the correctness half on small shapes)
"""

import argparse
import itertools
import sys

import torch

import vflash  # noqa: F401  (settles TRITON_INTERPRET before the kernels below are decorated)
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vflash._backend import interpreting
from vflash.harness.oracle import compare
from vflash.reference import attention_explicit


@triton.jit
def _softmax_step(acc, l_i, m_i, qk, offs_m, start_n, qk_scale, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    # qk [BM, BN] raw scores -> p [BM, BN] fp32; acc rescaled; m/l updated (log2 domain).
    if MASKED:
        keep = offs_m[:, None] >= (start_n + tl.arange(0, BLOCK_N))[None, :]
        qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return acc, l_i, m_new, p


@triton.jit
def _tma_tiles(acc, l_i, m_i, q, desc_k, desc_v, row0, offs_m, start, stop, qk_scale,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    for start_n in tl.range(start, stop, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = desc_k.load([row0 + start_n, 0])  # [BLOCK_N, D]
        qk = tl.dot(q, k.T)  # [BLOCK_M, BLOCK_N]
        acc, l_i, m_i, p = _softmax_step(acc, l_i, m_i, qk, offs_m, start_n, qk_scale, BLOCK_N, MASKED)
        v = desc_v.load([row0 + start_n, 0])  # [BLOCK_N, D]
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def _tma_tiles_lookahead(acc, l_i, m_i, q, desc_k, desc_v, row0, offs_m, start, stop, qk_scale,
                         BLOCK_N: tl.constexpr):
    # Unmasked tiles only. QK of tile j+1 is issued before the softmax of tile j so
    # the tensor cores can run it while the exp2s of tile j execute (FA3's
    # intra-warpgroup overlap), if the compiler keeps the dot asynchronous.
    if stop > start:
        k = desc_k.load([row0 + start, 0])
        qk = tl.dot(q, k.T)
        for start_n in tl.range(start, stop - BLOCK_N, BLOCK_N):
            k_next = desc_k.load([row0 + start_n + BLOCK_N, 0])
            qk_next = tl.dot(q, k_next.T)
            acc, l_i, m_i, p = _softmax_step(acc, l_i, m_i, qk, offs_m, start_n, qk_scale, BLOCK_N, False)
            v = desc_v.load([row0 + start_n, 0])
            acc = tl.dot(p.to(v.dtype), v, acc)
            qk = qk_next
        acc, l_i, m_i, p = _softmax_step(acc, l_i, m_i, qk, offs_m, stop - BLOCK_N, qk_scale, BLOCK_N, False)
        v = desc_v.load([row0 + stop - BLOCK_N, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def _tma_tiles_split(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v, row0, offs_m0, offs_m1, start, stop,
                     qk_scale, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    # Two independent row halves share each K/V tile: both QK products are issued
    # before either softmax, so one half's exp2s can overlap the other's MMAs.
    for start_n in tl.range(start, stop, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = desc_k.load([row0 + start_n, 0])
        qk0 = tl.dot(q0, k.T)
        qk1 = tl.dot(q1, k.T)
        v = desc_v.load([row0 + start_n, 0])
        acc0, l0, m0, p0 = _softmax_step(acc0, l0, m0, qk0, offs_m0, start_n, qk_scale, BLOCK_N, MASKED)
        acc0 = tl.dot(p0.to(v.dtype), v, acc0)
        acc1, l1, m1, p1 = _softmax_step(acc1, l1, m1, qk1, offs_m1, start_n, qk_scale, BLOCK_N, MASKED)
        acc1 = tl.dot(p1.to(v.dtype), v, acc1)
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def tma_fwd_kernel(desc_q, desc_k, desc_v, desc_o, n_ctx, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, LOOKAHEAD: tl.constexpr):
    # grid = (n_ctx // BLOCK_M, B * H); descriptors view [B * H * n_ctx, HEAD_DIM].
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    row0 = tl.program_id(1) * n_ctx
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([row0 + start_m, 0])  # [BLOCK_M, HEAD_DIM]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # every causal row sees key 0: l > 0 at the end
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    main_stop = start_m if CAUSAL else n_ctx
    if LOOKAHEAD:
        acc, l_i, m_i = _tma_tiles_lookahead(acc, l_i, m_i, q, desc_k, desc_v, row0, offs_m, 0, main_stop,
                                             qk_scale, BLOCK_N)
    else:
        acc, l_i, m_i = _tma_tiles(acc, l_i, m_i, q, desc_k, desc_v, row0, offs_m, 0, main_stop, qk_scale,
                                   BLOCK_N, False, WARP_SPECIALIZE)
    if CAUSAL:
        acc, l_i, m_i = _tma_tiles(acc, l_i, m_i, q, desc_k, desc_v, row0, offs_m, start_m, start_m + BLOCK_M,
                                   qk_scale, BLOCK_N, True, False)
    out = acc / l_i[:, None]
    desc_o.store([row0 + start_m, 0], out.to(desc_o.dtype))


@triton.jit
def tma_split_fwd_kernel(desc_q, desc_k, desc_v, desc_o, n_ctx, qk_scale,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    # As tma_fwd_kernel with the BLOCK_M rows carried as two halves; desc_q/desc_o
    # blocks are [BLOCK_M // 2, HEAD_DIM].
    HALF: tl.constexpr = BLOCK_M // 2
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    row0 = tl.program_id(1) * n_ctx
    start_m = pid_m * BLOCK_M
    offs_m0 = start_m + tl.arange(0, HALF)
    offs_m1 = offs_m0 + HALF
    q0 = desc_q.load([row0 + start_m, 0])
    q1 = desc_q.load([row0 + start_m + HALF, 0])
    m0 = tl.full([HALF], float("-inf"), dtype=tl.float32)
    m1 = tl.full([HALF], float("-inf"), dtype=tl.float32)
    l0 = tl.zeros([HALF], dtype=tl.float32)
    l1 = tl.zeros([HALF], dtype=tl.float32)
    acc0 = tl.zeros([HALF, HEAD_DIM], dtype=tl.float32)
    acc1 = tl.zeros([HALF, HEAD_DIM], dtype=tl.float32)
    main_stop = start_m if CAUSAL else n_ctx
    acc0, l0, m0, acc1, l1, m1 = _tma_tiles_split(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v, row0,
                                                  offs_m0, offs_m1, 0, main_stop, qk_scale, BLOCK_N, False,
                                                  WARP_SPECIALIZE)
    if CAUSAL:
        acc0, l0, m0, acc1, l1, m1 = _tma_tiles_split(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v, row0,
                                                      offs_m0, offs_m1, start_m, start_m + BLOCK_M, qk_scale,
                                                      BLOCK_N, True, False)
    desc_o.store([row0 + start_m, 0], (acc0 / l0[:, None]).to(desc_o.dtype))
    desc_o.store([row0 + start_m + HALF, 0], (acc1 / l1[:, None]).to(desc_o.dtype))


def tma_forward(q, k, v, causal, kind, block_m, block_n, warps, stages, warp_specialize):
    B, H, N, D = q.shape
    if N % block_m or N % block_n or not q.is_contiguous():
        raise ValueError("variant needs contiguous inputs and N divisible by the tiles")
    out = torch.empty_like(q)
    rows = B * H * N

    def desc(t, block_rows):
        return TensorDescriptor(t.view(rows, D), shape=[rows, D], strides=[D, 1], block_shape=[block_rows, D])

    grid = (N // block_m, B * H)
    scale = D ** -0.5 * 1.4426950408889634
    common = dict(HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, WARP_SPECIALIZE=warp_specialize,
                  num_warps=warps, num_stages=stages)
    if kind == "split":
        tma_split_fwd_kernel[grid](desc(q, block_m // 2), desc(k, block_n), desc(v, block_n),
                                   desc(out, block_m // 2), N, scale, **common)
    else:
        tma_fwd_kernel[grid](desc(q, block_m), desc(k, block_n), desc(v, block_n), desc(out, block_m), N, scale,
                             LOOKAHEAD=kind == "lookahead", **common)
    return out


VARIANTS = {  # name: (kind, block_m, block_n, warps, stages, warp_specialize)
    "tma_128x128_w8_s3": ("plain", 128, 128, 8, 3, False),
    "tma_128x64_w8_s3": ("plain", 128, 64, 8, 3, False),
    "ws_128x128_w4_s3": ("plain", 128, 128, 4, 3, True),
    "ws_128x128_w8_s3": ("plain", 128, 128, 8, 3, True),
    "ws_128x64_w8_s3": ("plain", 128, 64, 8, 3, True),
    "look_128x128_w8_s3": ("lookahead", 128, 128, 8, 3, False),
    "look_128x64_w8_s3": ("lookahead", 128, 64, 8, 3, False),
    "split_256x64_w8_s3": ("split", 256, 64, 8, 3, False),
    "split_128x128_w8_s3": ("split", 128, 128, 8, 3, False),
    "split_128x64_w4_s3": ("split", 128, 64, 4, 3, False),
    "split_ws_256x64_w4_s2": ("split", 256, 64, 4, 2, True),
    "split_ws_256x128_w4_s2": ("split", 256, 128, 4, 2, True),
}


def check(variant, device, n, d, causal, dtype=torch.float16):
    g = torch.Generator().manual_seed(n * 7 + d)
    q, k, v = (torch.randn(2, 2, n, d, generator=g).to(device, dtype) for _ in range(3))
    out = tma_forward(q, k, v, causal, *VARIANTS[variant])
    ref, _ = attention_explicit(q, k, v, causal=causal, compute_dtype=torch.float64)
    same, _ = attention_explicit(q, k, v, causal=causal, compute_dtype=None)
    return compare("out", out.cpu(), ref.cpu(), same.cpu(), dtype)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-only", action="store_true")
    args = ap.parse_args()
    device = torch.device("cpu" if interpreting() else "cuda")
    ok = {}
    sizes = [(256, 64), (512, 128)] if device.type == "cpu" else [(1024, 64), (1024, 128), (2048, 128)]
    for name in VARIANTS:
        try:
            verdicts = [check(name, device, n, d, c) for (n, d), c in itertools.product(sizes, (False, True))]
            ok[name] = all(v.passed for v in verdicts)
            worst = max(v.max_err for v in verdicts)
            print(f"{'PASS' if ok[name] else 'FAIL'}  {name:<24} worst max err {worst:.3e}", flush=True)
        except Exception as exc:  # compile errors on this Triton / GPU are results too
            ok[name] = False
            print(f"ERROR {name:<24} {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
    if args.check_only or device.type == "cpu":
        return 0 if any(ok.values()) else 1

    from vflash.harness.bench import Shape, attention_flops, gemm_warmup, time_call
    from torch.nn.attention import SDPBackend, sdpa_kernel
    gemm_warmup()
    header = ["D", "causal", "N", "vflash", "sdpa_cudnn", "sdpa_flash"] + [n for n in VARIANTS if ok[n]]
    print("| " + " | ".join(header) + " |")
    for d, causal, n in itertools.product((64, 128), (False, True), (1024, 4096, 16384)):
        s = Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, causal)
        q, k, v = (torch.randn(s.B, s.Hq, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        fl = attention_flops(s)

        def tf(call):
            try:
                return f"{fl / (time_call(call, device)[0] * 1e-3) / 1e12:.0f}"
            except Exception as exc:
                return type(exc).__name__

        def sdpa(backend):
            def call():
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return call

        cells = [str(d), str(causal), str(n), tf(lambda: vflash.attention(q, k, v, causal=causal)),
                 tf(sdpa(SDPBackend.CUDNN_ATTENTION)), tf(sdpa(SDPBackend.FLASH_ATTENTION))]
        for name in VARIANTS:
            if ok[name]:
                cells.append(tf(lambda: tma_forward(q, k, v, causal, *VARIANTS[name])))
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
