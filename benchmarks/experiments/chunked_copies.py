"""Chunked prefill on the sm90 kernel's KV_CACHE build: a paged cache's K/V tiles by TMA (one copy a
page) against row by row (cp.async, ROW_COPIES), page by page size, beside a contiguous cache and
vflash.attention on the same work dense, all timed in turn (serving._prefill_rows) on the chunked
sweep's rows. Each method forces its copies through dispatch.tables.SM90_TMA_PAGES_FROM while its
call is captured. Every output is checked against dense's before its time counts.

  PYTHONPATH=src python3 -m benchmarks.experiments.chunked_copies --out chunked_copies.csv [--pages 16,64]
"""

import argparse
import csv

import torch

import vflash
from vflash.dispatch import tables
from vflash.harness import serving
from vflash.ops import hopper


def _forced(call, tma_from: int):
    def run():
        saved = tables.SM90_TMA_PAGES_FROM
        tables.SM90_TMA_PAGES_FROM = tma_from
        try:
            return call()
        finally:
            tables.SM90_TMA_PAGES_FROM = saved
    return run


def rows_for(B: int, n_new: int, prefix: int, pages, device) -> list:
    Hq, Hkv, D = serving.DECODE_HEADS
    n_k = prefix + n_new
    dtype = torch.bfloat16
    q = torch.randn(B, n_new, Hq, D, device=device, dtype=dtype)
    k = torch.randn(B, n_k, Hkv, D, device=device, dtype=dtype)
    v = torch.randn_like(k)
    seqlens = torch.full((B,), n_k, dtype=torch.int32, device=device)
    qd, kd, vd = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    methods = {}
    for page in pages:
        kc, vc, table = serving.paged_cache(k, v, page)

        def call(kc=kc, vc=vc, table=table):
            return vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False)
        methods[f"paged{page}_rows"] = _forced(call, 1 << 30)
        if hopper.pages_fit(page, 128):
            methods[f"paged{page}_tma"] = _forced(call, 1)
    methods["contig"] = lambda: vflash.attention_with_kvcache(q, k, v, seqlens, check_metadata=False)
    methods["dense"] = lambda: vflash.attention(qd, kd, vd, causal=True)
    flops = 4.0 * D * Hq * B * serving.visible_pairs(n_new, n_k, True)
    rows = serving._prefill_rows(methods, dict(B=B, Nq=n_new, Nk=n_k), flops, device)
    ref = methods["dense"]().transpose(1, 2).float()
    dense_us = next(r for r in rows if r["method"] == "dense").get("us_median")
    for r in rows:
        if r["status"] == "ok" and r["method"] != "dense":
            diff = (methods[r["method"]]().reshape(ref.shape).float() - ref).abs().max().item()
            r["max_diff_vs_dense"] = f"{diff:.2e}"
            if not diff <= serving.CHUNKED_MAX_DIFF:
                r["status"] = f"wrong: max diff {diff:.2e}"
        if r.get("us_median") and dense_us:
            r["vs_dense"] = round(dense_us / r["us_median"], 3)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", default="16,64,17")
    args = ap.parse_args()
    device = torch.device("cuda")
    pages = [int(p) for p in args.pages.split(",")]
    rows = []
    for B, n_new, prefix in serving.CHUNKED_ROWS:
        got = rows_for(B, n_new, prefix, pages, device)
        print(f"B {B} new {n_new} prefix {prefix}: " + "  ".join(
            f"{r['method']} {r.get('tflops', r['status'])} ({r.get('vs_dense', '-')})" for r in got), flush=True)
        rows += got
    cols = ["method", "B", "Nq", "Nk", "status", "us_median", "us_p20", "us_p80", "reps", "tflops", "vs_dense",
            "max_diff_vs_dense"]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
