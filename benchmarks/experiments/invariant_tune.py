"""The batch-invariant decode mode's split rule on the GPU: one split for every K keys of a sequence, at most
S splits (tables.INVARIANT_SPLIT_KEYS / INVARIANT_MAX_SPLITS), for each --variants K:S, against the default
mode, on the decode sweep's rows (vflash.harness.serving.decode_rows: bf16, Hq 32 / Hkv 8, D 128, shuffled
pages of 16, CUDA-graph replays over rotating cache copies). --rounds R times every variant R times in turn
(one pass is not evidence for a few per cent). Prints a line a row and variant, each variant's geometric
mean over the rows of its GB/s over the default's, and writes a CSV.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.invariant_tune [--variants 512:65536 128:32 ...]
"""

import argparse
import math
from collections import defaultdict

import torch

from benchmarks.experiments.common import require_cuda, write_rows
from vflash.dispatch import tables
from vflash.harness import lab, serving


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="invariant_tune.csv")
    ap.add_argument("--variants", nargs="*", default=["512:65536", "512:32", "256:32", "128:32", "128:16", "64:32"],
                    help="keys a split:most splits")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    if not require_cuda("invariant_tune"):
        return 2
    dev = torch.device("cuda")
    rows, gbps = [], defaultdict(list)
    for rnd in range(args.rounds):
        for b, kv in serving.DECODE_ROWS:
            default = serving.decode_rows(b, kv, serving.DECODE_HEADS, torch.bfloat16, dev, ["vflash_paged16"])[0]
            gbps[(b, kv, "default")].append(float(default["gbps"]))
            for v in args.variants:
                keys, most = map(int, v.split(":"))
                tables.INVARIANT_SPLIT_KEYS, tables.INVARIANT_MAX_SPLITS = keys, most
                lab.clear_plans()  # plans recorded under another variant's splits
                r = serving.decode_rows(b, kv, serving.DECODE_HEADS, torch.bfloat16, dev,
                                        ["vflash_paged16_invariant"])[0]
                lab.clear_plans()
                if r["status"] != "ok":
                    print(f"B {b} KV {kv} {v}: {r['status']}", flush=True)
                    continue
                gbps[(b, kv, v)].append(float(r["gbps"]))
                rows.append(dict(B=b, KV=kv, variant=v, round=rnd, us=r["us_median"], gbps=r["gbps"],
                                 default_gbps=default["gbps"]))
                print(f"B {b} KV {kv} {v}: {r['gbps']} GB/s, default {default['gbps']} "
                      f"({float(r['gbps']) / float(default['gbps']):.2f})", flush=True)
    for v in args.variants:
        ratios = [sum(gbps[(b, kv, v)]) / sum(gbps[(b, kv, "default")]) for b, kv in serving.DECODE_ROWS
                  if gbps[(b, kv, v)]]
        if ratios:
            print(f"VARIANT {v}: geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} of the default, "
                  f"{min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} rows", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
