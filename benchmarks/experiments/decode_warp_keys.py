"""Prototype: split-decode programs whose warps each own a slice of every key tile (issue 22's
small-batch bar). The library's decode tile is [16 rows, 64 keys] over 4 warps, which split the
keys of the QK product, so each tile's row max and sum cross the warps through shared memory
and P changes layout (shared memory again) for the PV product. Here the tile is 3-D, [W, 16,
64 / W]: warp w holds keys w * 16 .. w * 16 + 15 of each tile, its own running max, sum and
accumulator; the warps' states fold into one once, after the loop. Both builds (WARP_KEYS 0 / 1)
share everything else: contiguous cache, one new query, GQA rows packed, one masked loop, fp32
partials out (no merge), so their times compare the tile layout alone.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.decode_warp_keys [--rows B:KV:splits ...]
"""

import argparse

import torch
import triton
import triton.language as tl

from vflash.harness.lab import fold_splits
from vflash.harness.serving import DECODE_HEADS
from vflash.harness.timing import graph_time

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without programmatic dependent launch: the PDL variant cannot compile
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def decode_partials_kernel(
    Q, K, V, O_PART, LSE_PART, O, ARRIVALS, SEQLENS,
    stride_qb, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_ps, stride_pb, stride_ph, stride_ls, stride_lb, stride_ob, stride_oh,
    n_k, part, qk_scale,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    WARPS: tl.constexpr, WARP_KEYS: tl.constexpr, UPCAST_DOT: tl.constexpr, MERGE: tl.constexpr,
    MERGE_ROWS: tl.constexpr, SPLIT_CHUNK: tl.constexpr, PDL: tl.constexpr, LOAD_N_K: tl.constexpr,
):
    # grid (splits, Hkv, B); rows r < GROUP are query head hk * GROUP + r, the rest padding.
    if PDL:  # the combine grid may launch now; it waits for this grid's end before reading
        gdc_launch_dependents()
    split = tl.program_id(0)
    hk = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP
    heads = hk * GROUP + tl.minimum(rows, GROUP - 1)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :])
    if LOAD_N_K:  # the sequence's length read from memory and the split's keys from it, as the library's
        n_k = tl.load(SEQLENS + b)
        part = tl.cdiv(tl.cdiv(n_k, tl.num_programs(0)), BLOCK_N) * BLOCK_N
    lo = split * part
    hi = tl.minimum(lo + part, n_k)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    if WARP_KEYS:
        NW: tl.constexpr = BLOCK_N // WARPS
        keys = tl.arange(0, WARPS)[:, None] * NW + tl.arange(0, NW)[None, :]  # [WARPS, NW] in the tile
        q3 = tl.broadcast_to(q[None, :, :], [WARPS, BLOCK_M, HEAD_DIM])
        k_in = k_base + keys.to(tl.int64)[:, :, None] * stride_kn + offs_d[None, None, :]
        v_in = v_base + keys.to(tl.int64)[:, :, None] * stride_vn + offs_d[None, None, :]
        m3 = tl.full([WARPS, BLOCK_M], float("-inf"), tl.float32)
        l3 = tl.zeros([WARPS, BLOCK_M], tl.float32)
        acc3 = tl.zeros([WARPS, BLOCK_M, HEAD_DIM], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            ok = start + keys < hi  # [WARPS, NW]
            k = tl.load(k_in + tl.cast(start, tl.int64) * stride_kn, mask=ok[:, :, None], other=0.0)
            v = tl.load(v_in + tl.cast(start, tl.int64) * stride_vn, mask=ok[:, :, None], other=0.0)
            if UPCAST_DOT:
                s = tl.dot(q3.to(tl.float32), tl.trans(k.to(tl.float32), 0, 2, 1))
            else:
                s = tl.dot(q3, tl.trans(k, 0, 2, 1))  # [WARPS, BLOCK_M, NW]
            s = tl.where(ok[:, None, :], s, float("-inf"))
            m_new = tl.maximum(m3, tl.max(s, 2) * qk_scale)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s * qk_scale - m_ref[:, :, None])
            alpha = tl.exp2(m3 - m_ref)
            l3 = l3 * alpha + tl.sum(p, 2)
            if UPCAST_DOT:
                acc3 = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc3 * alpha[:, :, None])
            else:
                acc3 = tl.dot(p.to(v.dtype), v, acc3 * alpha[:, :, None])
            m3 = m_new
        m_i = tl.max(m3, 0)  # the warps' states folded: once a program
        m_ref = tl.where(m_i == float("-inf"), 0.0, m_i)
        w = tl.exp2(m3 - m_ref[None, :])
        l_i = tl.sum(l3 * w, 0)
        acc = tl.sum(acc3 * w[:, :, None], 0)
    else:
        keys = tl.arange(0, BLOCK_N)
        k_in = k_base + keys.to(tl.int64)[:, None] * stride_kn + offs_d[None, :]
        v_in = v_base + keys.to(tl.int64)[:, None] * stride_vn + offs_d[None, :]
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            ok = start + keys < hi
            k = tl.load(k_in + tl.cast(start, tl.int64) * stride_kn, mask=ok[:, None], other=0.0)
            v = tl.load(v_in + tl.cast(start, tl.int64) * stride_vn, mask=ok[:, None], other=0.0)
            if UPCAST_DOT:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s * qk_scale - m_ref[:, None])
            alpha = tl.exp2(m_i - m_ref)
            l_i = l_i * alpha + tl.sum(p, 1)
            if UPCAST_DOT:
                acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc * alpha[:, None])
            else:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    p_rows = split.to(tl.int64) * stride_ps + b * stride_pb + heads * stride_ph
    tl.store(O_PART + p_rows[:, None] + offs_d[None, :], out, mask=row_ok[:, None])
    tl.store(LSE_PART + split.to(tl.int64) * stride_ls + b * stride_lb + heads, lse, mask=row_ok)
    if MERGE:  # the library's scheme: the tile's last split to arrive merges
        num_splits = tl.num_programs(0)
        tl.debug_barrier()
        tile = b * tl.num_programs(1) + hk
        arrived = tl.atomic_add(ARRIVALS + tile, 1, sem="acq_rel", scope="gpu")
        if arrived % num_splits == num_splits - 1:
            tl.debug_barrier()
            tl.atomic_add(ARRIVALS + tile, -num_splits, sem="relaxed", scope="gpu")
            _merge_store(O_PART, LSE_PART, O, b, hk, stride_ps, stride_pb, stride_ph, stride_ls, stride_lb,
                         stride_ob, stride_oh, num_splits, GROUP, MERGE_ROWS, HEAD_DIM, SPLIT_CHUNK)


@triton.jit
def _merge_store(O_PART, LSE_PART, O, b, hk, stride_ps, stride_pb, stride_ph, stride_ls, stride_lb, stride_ob,
                 stride_oh, num_splits, GROUP: tl.constexpr, MERGE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                 SPLIT_CHUNK: tl.constexpr):
    c = tl.arange(0, MERGE_ROWS)
    c_ok = c < GROUP
    c_heads = hk * GROUP + tl.minimum(c, GROUP - 1)
    merged, _ = fold_splits(O_PART + b * stride_pb + c_heads * stride_ph, LSE_PART + b * stride_lb + c_heads,
                            stride_ps, stride_ls, 1, num_splits, c_ok, 0.0, MERGE_ROWS, HEAD_DIM, HEAD_DIM,
                            SPLIT_CHUNK, False)
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(O + b * stride_ob + c_heads[:, None] * stride_oh + offs_d[None, :], merged.to(O.dtype.element_ty),
             mask=c_ok[:, None])


@triton.jit
def combine_kernel(O_PART, LSE_PART, O, stride_ps, stride_pb, stride_ph, stride_ls, stride_lb, stride_ob, stride_oh,
                   num_splits, GROUP: tl.constexpr, MERGE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                   SPLIT_CHUNK: tl.constexpr, PDL: tl.constexpr):
    # grid (Hkv, B): a KV head's query heads merged from the split kernel's partials
    if PDL:
        gdc_wait()  # the split grid has ended and its stores are visible
    _merge_store(O_PART, LSE_PART, O, tl.program_id(1).to(tl.int64), tl.program_id(0).to(tl.int64), stride_ps,
                 stride_pb, stride_ph, stride_ls, stride_lb, stride_ob, stride_oh, num_splits, GROUP, MERGE_ROWS,
                 HEAD_DIM, SPLIT_CHUNK)


MERGES = ("none", "arrive", "two", "pdl")  # no merge; last split merges; a combine launch; with PDL


def launch(q, kc, vc, splits, warp_keys, o_part, l_part, block_n=64, warps=4, stages=3, merge="none", out=None,
           arrivals=None, seqlens=None):
    """q [B, Hq, D], caches [B, L, Hkv, D]; partials [splits, B, Hq, D] / [splits, B, Hq]; merge one of
    MERGES into out [B, Hq, D] (arrivals: [B * Hkv] int32 zeros for "arrive")."""
    B, Hq, D = q.shape
    n_k, Hkv = kc.shape[1], kc.shape[2]
    group = Hq // Hkv
    part = triton.cdiv(triton.cdiv(n_k, splits), block_n) * block_n
    qk_scale = D ** -0.5 * 1.4426950408889634
    pdl = merge == "pdl"
    chunk = min(32, triton.next_power_of_2(splits))
    out_strides = (out.stride(0), out.stride(1)) if out is not None else (0, 0)
    decode_partials_kernel[(splits, Hkv, B)](
        q, kc, vc, o_part, l_part, out, arrivals, seqlens, q.stride(0), q.stride(1), kc.stride(0), kc.stride(1),
        kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2), o_part.stride(0), o_part.stride(1),
        o_part.stride(2), l_part.stride(0), l_part.stride(1), *out_strides, n_k, part, qk_scale,
        GROUP=group, BLOCK_M=16, BLOCK_N=block_n, HEAD_DIM=D, WARPS=warps, WARP_KEYS=warp_keys,
        UPCAST_DOT=not q.is_cuda, MERGE=merge == "arrive", MERGE_ROWS=group, SPLIT_CHUNK=chunk, PDL=pdl,
        LOAD_N_K=seqlens is not None, num_warps=warps, num_stages=stages, **({"launch_pdl": True} if pdl else {}))
    if merge in ("two", "pdl"):
        combine_kernel[(Hkv, B)](o_part, l_part, out, o_part.stride(0), o_part.stride(1), o_part.stride(2),
                                 l_part.stride(0), l_part.stride(1), *out_strides, splits, GROUP=group,
                                 MERGE_ROWS=group, HEAD_DIM=D, SPLIT_CHUNK=chunk, PDL=pdl, num_warps=4,
                                 **({"launch_pdl": True} if pdl else {}))


def merged(o_part, l_part):
    """The partials' log-sum-exp merge, [B, Hq, D]."""
    w = torch.softmax(l_part, dim=0)
    return (o_part * w[..., None]).sum(0)


def check(device, B=2, KV=300, splits=3):
    """Max error against SDPA in fp32 of each (layout, merge) the device runs."""
    Hq, Hkv, D = DECODE_HEADS if device.type == "cuda" else (8, 2, 64)
    dtype = torch.bfloat16
    q = torch.randn(B, Hq, D, device=device, dtype=dtype)
    kc, vc = (torch.randn(B, KV, Hkv, D, device=device, dtype=dtype) for _ in range(2))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float()[:, :, None], kc.float().transpose(1, 2).repeat_interleave(Hq // Hkv, 1),
        vc.float().transpose(1, 2).repeat_interleave(Hq // Hkv, 1))[:, :, 0]
    errs = {}
    for wk in (False, True):
        for merge in MERGES if device.type == "cuda" else MERGES[:3]:
            o_part = torch.empty(splits, B, Hq, D, device=device)
            l_part = torch.empty(splits, B, Hq, device=device)
            out = torch.zeros_like(q)
            arrivals = torch.zeros(B * Hkv, dtype=torch.int32, device=device)
            launch(q, kc, vc, splits, wk, o_part, l_part, merge=merge, out=out, arrivals=arrivals)
            got = merged(o_part, l_part) if merge == "none" else out.float()
            errs[f"{'wk' if wk else '2d'}/{merge}"] = round((got - ref).abs().max().item(), 5)
    return errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="*", default=["1:1024:8", "1:8192:32", "1:32768:32", "8:1024:4", "8:8192:4"],
                    help="B:KV:splits")
    ap.add_argument("--variants", default="64,4,3", help="block_n,warps,stages;...")
    ap.add_argument("--layouts", default="2d", help="2d,wk,2dmem (2d with the length read from memory)")
    ap.add_argument("--merges", default=",".join(MERGES))
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("check max err:", check(device), flush=True)
    if device.type != "cuda":
        return 0
    Hq, Hkv, D = DECODE_HEADS
    for row in args.rows:
        B, KV, splits = (int(x) for x in row.split(":"))
        q = torch.randn(B, Hq, D, device=device, dtype=torch.bfloat16)
        n = max(1, min(16, (256 << 20) // (2 * B * KV * Hkv * D * 2)))
        caches = [[torch.randn(B, KV, Hkv, D, device=device, dtype=torch.bfloat16) for _ in range(2)]
                  for _ in range(n)]
        o_part = torch.empty(splits, B, Hq, D, device=device)
        l_part = torch.empty(splits, B, Hq, device=device)
        out = torch.empty_like(q)
        arrivals = torch.zeros(B * Hkv, dtype=torch.int32, device=device)
        seqlens = torch.full((B,), KV, dtype=torch.int32, device=device)
        gb = 2 * B * KV * Hkv * D * 2 / 1e3
        line = []
        for v in args.variants.split(";"):
            bn, w, st = (int(x) for x in v.split(","))
            for layout in args.layouts.split(","):
                for merge in args.merges.split(","):
                    name = f"{bn}/{w}/{st}/{layout}/{merge}"
                    try:
                        calls = [lambda kc=kc, vc=vc: launch(q, kc, vc, splits, layout == "wk", o_part, l_part, bn, w,
                                                             st, merge, out, arrivals,
                                                             seqlens if layout == "2dmem" else None)
                                 for kc, vc in caches]
                        med = graph_time(calls, device)[0]
                        line.append(f"{name} {med:6.2f} us {gb / med:7.1f}")
                    except Exception as exc:  # a variant that does not compile, fit or capture
                        line.append(f"{name} {type(exc).__name__}: {str(exc)[:80]}")
        print(f"B {B} KV {KV} splits {splits}: " + " | ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
