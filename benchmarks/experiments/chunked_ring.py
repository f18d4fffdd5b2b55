"""Chunked prefill on the sm90 kernel's KV_CACHE build: a paged cache's ring of K/V tiles at the table's
depth and deeper (pages of 16 cost eight TMA copies a 128-key tile, 64 two; a tile whose pages are
consecutive one: each page size also with every sequence's pages in order), beside a contiguous cache and
vflash.attention on the same work dense, all timed in turn (serving.prefill_rows) on the chunked sweep's
rows. A variant "block_n:stages[:q_buffers]" replaces the dense rule's tiles for the cache calls while their
call is captured (shared memory the launch cannot have: the row's status says so). Every output is
checked against dense's before its time counts.

  PYTHONPATH=src python3 -m benchmarks.experiments.chunked_ring --out chunked_ring.csv \
      [--pages 16,64] [--variants 128:3:1,64:4,64:3:1]
"""

import argparse
import csv
import dataclasses

import torch

import vflash
from vflash.dispatch import rules
from vflash.harness import serving
from vflash.harness.bench import visible_pairs


def _with_tiles(call, block_n: int, stages: int, q_buffers: int = 0):
    def run():
        select = rules.select

        def deeper(p, kernel=None):
            c = select(p, kernel)
            if c.kernel != "sm90":
                return c
            tiles = c.tiles._replace(block_n=block_n, stages=stages, q_buffers=q_buffers or c.tiles.q_buffers)
            return dataclasses.replace(c, tiles=tiles)
        rules.select = deeper
        try:
            return call()
        finally:
            rules.select = select
    return run


def rows_for(B: int, n_new: int, prefix: int, pages, variants, device) -> list:
    Hq, Hkv, D = serving.DECODE_HEADS
    n_k = prefix + n_new
    dtype = torch.bfloat16
    q = torch.randn(B, n_new, Hq, D, device=device, dtype=dtype)
    k = torch.randn(B, n_k, Hkv, D, device=device, dtype=dtype)
    v = torch.randn_like(k)
    seqlens = torch.full((B,), n_k, dtype=torch.int32, device=device)
    qd, kd, vd = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    methods = {}
    caches = {f"paged{page}": serving.paged_cache(k, v, page) for page in pages}
    caches.update({f"paged{page}_in_order": serving.paged_cache(k, v, page, shuffled=False) for page in pages})
    for name, (kc, vc, table) in caches.items():
        def call(kc=kc, vc=vc, table=table):
            return vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False)
        methods[name] = call
        for tiles in variants:
            methods[f"{name}_" + "_".join(map(str, tiles))] = _with_tiles(call, *tiles)

    def contig():
        return vflash.attention_with_kvcache(q, k, v, seqlens, check_metadata=False)
    methods["contig"] = contig
    for tiles in variants:
        methods["contig_" + "_".join(map(str, tiles))] = _with_tiles(contig, *tiles)
    methods["dense"] = lambda: vflash.attention(qd, kd, vd, causal=True)
    flops = 4.0 * D * Hq * B * visible_pairs(n_new, n_k, True)
    rows = serving.prefill_rows(methods, dict(B=B, Nq=n_new, Nk=n_k), flops, device)
    serving.against_dense(rows, methods, "dense", "vs_dense")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", default="16,64")
    ap.add_argument("--variants", default="128:3:1,64:4,64:3:1", help="block_n:stages[:q_buffers], comma-separated")
    args = ap.parse_args()
    device = torch.device("cuda")
    pages = [int(p) for p in args.pages.split(",")]
    variants = [tuple(int(x) for x in t.split(":")) for t in args.variants.split(",") if t]
    rows = []
    for B, n_new, prefix in serving.CHUNKED_ROWS:
        got = rows_for(B, n_new, prefix, pages, variants, device)
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
