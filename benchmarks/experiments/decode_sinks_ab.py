"""Paged decode with and without sinks on the same inputs, over several input draws (issue 53's 3 % rule at the
latency floor): for each row (B:KV), page size and draw (its own sink values, block-table shuffle and a pad
allocation ahead of the caches, so the caches land at other addresses), the call without sinks and the call
with them are timed in turn (timing.graph_time, rotating cache copies), ROUNDS times each, alternating which
goes first. One CSV line a (row, page, draw, round, method); a summary line a (row, page): the median over
draws of the with / without ratio, and each method's spread over draws.

  python3 -m benchmarks.experiments.decode_sinks_ab [--rows 1:1024 8:1024] [--draws 8] --out decode_sinks_ab.csv
"""

import argparse
import csv
import statistics

import torch

import vflash
from vflash.harness.serving import DECODE_HEADS, shuffled_table
from vflash.harness.timing import graph_time, rotating_copies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="*", default=["1:1024", "8:1024", "1:8192"])
    ap.add_argument("--pages", default="16,64")
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="decode_sinks_ab.csv")
    args = ap.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    Hq, Hkv, D = DECODE_HEADS
    fields = ["B", "KV", "page", "draw", "round", "method", "us_median", "us_p20", "us_p80"]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        for row in args.rows:
            B, KV = (int(x) for x in row.split(":"))
            for page in (int(p) for p in args.pages.split(",")):
                pages = -(-KV // page)
                n = rotating_copies(2 * B * KV * Hkv * D * 2)
                us = {"plain": [], "sinks": []}
                ratios = []
                for draw in range(args.draws):
                    g = torch.Generator(device="cpu").manual_seed(1000 + draw)
                    pad = torch.empty(int(torch.randint(1, 1 << 22, (1,), generator=g)), dtype=torch.uint8,
                                      device=device)
                    q = torch.randn(B, 1, Hq, D, generator=g).to(device, dtype)
                    sinks = torch.randn(Hq, generator=g).to(device)
                    gd = torch.Generator(device=device).manual_seed(1000 + draw)
                    caches = [tuple(torch.randn(B * pages, page, Hkv, D, generator=gd, device=device, dtype=dtype)
                                    for _ in range(2)) for _ in range(n)]
                    seqlens = torch.full((B,), KV, dtype=torch.int32, device=device)
                    table = shuffled_table(B, pages, device, seed=draw)
                    calls = {m: [lambda kc=kc, vc=vc, s=s: vflash.attention_with_kvcache(
                        q, kc, vc, seqlens, block_table=table, sinks=s, check_metadata=False) for kc, vc in caches]
                        for m, s in (("plain", None), ("sinks", sinks))}
                    got = {"plain": [], "sinks": []}
                    for r in range(args.rounds):
                        for m in (("plain", "sinks") if (draw + r) % 2 == 0 else ("sinks", "plain")):
                            med, p20, p80, _ = graph_time(calls[m], device)
                            got[m].append(med)
                            w.writerow(dict(B=B, KV=KV, page=page, draw=draw, round=r, method=m,
                                            us_median=round(med, 3), us_p20=round(p20, 3), us_p80=round(p80, 3)))
                    for m in got:
                        us[m].append(statistics.median(got[m]))
                    ratios.append(us["plain"][-1] / us["sinks"][-1])
                    del pad, caches, calls
                print(f"B {B:3d} KV {KV:6d} page {page:3d}: with/without speed median {statistics.median(ratios):.3f}"
                      f" (draws {min(ratios):.3f}-{max(ratios):.3f}); us without {min(us['plain']):.2f}-"
                      f"{max(us['plain']):.2f}, with {min(us['sinks']):.2f}-{max(us['sinks']):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
