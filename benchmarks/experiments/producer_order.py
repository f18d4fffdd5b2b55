"""The sm90 forward's producer order (K_AHEAD): K issued a tile ahead of V (FlashAttention-3's order: a
consumer's step j needs K_j and V_{j-1} and releases K_j first) against K and V of a tile issued together,
K_{i+1} behind V_i's slot wait. Timed in turn (serving._prefill_rows: CUDA-graph replays, rounds in turn)
on the chunked sweep's rows (pages of 16 shuffled and in order, pages of 64, a contiguous cache, and dense on
the same work) and on dense rows of the fa and d256 sweeps. The two orders' outputs must be bitwise equal
(the order moves copies, not arithmetic); a row where they are not is marked wrong.

  PYTHONPATH=src python3 -m benchmarks.experiments.producer_order --out producer_order.csv [--dense-n 1024,4096,16384]
"""

import argparse
import csv
import itertools

import torch

import vflash
from vflash.harness import serving
from vflash.harness.bench import Shape, attention_flops
from vflash.ops import hopper as hopper_launch
from vflash.ops import plans

ORDERS = {"k_ahead": True, "kv_together": False}


def _with_order(call, k_ahead: bool):
    """call() with the sm90 kernel built for one producer order (plans cleared: a recorded plan
    would replay the other order's kernel)."""
    def run():
        build = hopper_launch._constexprs

        def constexprs(*a, **k):
            return dict(build(*a, **k), K_AHEAD=k_ahead)
        hopper_launch._constexprs = constexprs
        plans.clear()
        try:
            return call()
        finally:
            hopper_launch._constexprs = build
            plans.clear()
    return run


def _bitwise(rows, methods, base: dict) -> None:
    """Mark each row of a pair whose outputs differ between the two orders."""
    outs = {name: call() for name, call in methods.items()}
    for r in rows:
        name = r["method"]
        twin = name.replace("k_ahead", "kv_together") if "k_ahead" in name else name.replace("kv_together",
                                                                                               "k_ahead")
        if twin in outs and r["status"] == "ok":
            same = torch.equal(outs[name], outs[twin])
            r["bitwise_other_order"] = same
            if not same:
                r["status"] = "wrong: the two orders' outputs differ"
        r.update(base)


def chunked_rows(B: int, n_new: int, prefix: int, device) -> list:
    Hq, Hkv, D = serving.DECODE_HEADS
    n_k = prefix + n_new
    q = torch.randn(B, n_new, Hq, D, device=device, dtype=torch.bfloat16)
    k = torch.randn(B, n_k, Hkv, D, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqlens = torch.full((B,), n_k, dtype=torch.int32, device=device)
    qd, kd, vd = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    caches = {"paged16": serving.paged_cache(k, v, 16), "paged16_in_order": serving.paged_cache(k, v, 16, False),
              "paged64": serving.paged_cache(k, v, 64), "contig": (k, v, None)}
    methods = {}
    for (name, (kc, vc, table)), (order, flag) in itertools.product(caches.items(), ORDERS.items()):
        def call(kc=kc, vc=vc, table=table):
            return vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False)
        methods[f"{name}_{order}"] = _with_order(call, flag)
    for order, flag in ORDERS.items():
        methods[f"dense_{order}"] = _with_order(lambda: vflash.attention(qd, kd, vd, causal=True), flag)
    flops = 4.0 * D * Hq * B * serving.visible_pairs(n_new, n_k, True)
    rows = serving._prefill_rows(methods, dict(B=B, Nq=n_new, Nk=n_k, D=D, causal=True), flops, device)
    ref = methods["dense_kv_together"]().transpose(1, 2).float()
    dense_us = next(r for r in rows if r["method"] == "dense_kv_together").get("us_median")
    for r in rows:
        if r["status"] == "ok" and not r["method"].startswith("dense"):
            diff = (methods[r["method"]]().reshape(ref.shape).float() - ref).abs().max().item()
            r["max_diff_vs_dense"] = f"{diff:.2e}"
            if not diff <= serving.CHUNKED_MAX_DIFF:  # NaN included
                r["status"] = f"wrong: max diff {diff:.2e} from vflash.attention"
        if r.get("us_median") and dense_us:
            r["vs_dense"] = round(dense_us / r["us_median"], 3)
    _bitwise(rows, methods, dict(sweep="chunked"))
    return rows


def dense_rows(shape: Shape, device) -> list:
    q = torch.randn(shape.B, shape.Hq, shape.Nq, shape.D, device=device, dtype=torch.bfloat16)
    k = torch.randn(shape.B, shape.Hkv, shape.Nk, shape.D, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    methods = {order: _with_order(lambda: vflash.attention(q, k, v, causal=shape.causal), flag)
               for order, flag in ORDERS.items()}
    rows = serving._prefill_rows(methods, dict(B=shape.B, Nq=shape.Nq, Nk=shape.Nk, D=shape.D, causal=shape.causal),
                                 attention_flops(shape), device)
    _bitwise(rows, methods, dict(sweep="dense"))
    base = next(r for r in rows if r["method"] == "kv_together").get("us_median")
    for r in rows:
        if r.get("us_median") and base:
            r["vs_kv_together"] = round(base / r["us_median"], 3)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dense-n", default="1024,4096,16384")
    ap.add_argument("--no-chunked", action="store_true")
    args = ap.parse_args()
    device = torch.device("cuda")
    rows = []
    if not args.no_chunked:
        for B, n_new, prefix in serving.CHUNKED_ROWS:
            got = chunked_rows(B, n_new, prefix, device)
            print(f"chunked B {B} new {n_new} prefix {prefix}: " + "  ".join(
                f"{r['method']} {r.get('tflops', r['status'])} ({r.get('vs_dense', '-')})" for r in got), flush=True)
            rows += got
    ns = [int(n) for n in args.dense_n.split(",") if n]
    shapes = [Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, c)
              for d, c, n in itertools.product((64, 128), (False, True), ns)]
    shapes += [Shape(16384 // n, 8, 8, n, n, 256, c) for c, n in itertools.product((False, True), ns)]
    for s in shapes:
        got = dense_rows(s, device)
        print(f"dense D {s.D} causal {s.causal} N {s.Nq}: " + "  ".join(
            f"{r['method']} {r.get('tflops', r['status'])} ({r.get('vs_kv_together', '-')})" for r in got), flush=True)
        rows += got
    cols = ["sweep", "method", "B", "Nq", "Nk", "D", "causal", "status", "us_median", "us_p20", "us_p80", "reps",
            "tflops", "vs_dense", "vs_kv_together", "max_diff_vs_dense", "bitwise_other_order"]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
