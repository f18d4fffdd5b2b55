"""Decode GB/s of the vflash on PYTHONPATH (its own `vflash.harness.serving.decode_rows`), a few rows and
methods, one line a row: run once per tree, alternating, for a same-run A/B of two trees' decode kernels
(gpu_session.sh's decode_trees step). Appends to a CSV with the tree's label.

  PYTHONPATH=.ab/old/src:. python3 -m benchmarks.experiments.decode_trees --label old [--rows B:KV ...]
"""

import argparse
import csv
import os

import torch

from vflash.harness.serving import DECODE_HEADS, decode_rows

ROWS = ["1:1024", "1:8192", "1:32768", "8:1024", "8:8192", "128:1024"]
METHODS = ["vflash_paged16", "vflash_contig", "sdpa_cudnn"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--rows", nargs="*", default=ROWS, help="B:KV")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default="decode_trees.csv")
    args = ap.parse_args()
    device = torch.device("cuda")
    fields = ["label", "B", "KV", "method", "gbps", "us_median", "status"]
    new = not os.path.exists(args.out)
    with open(args.out, "a", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        if new:
            w.writeheader()
        for row in args.rows:
            b, kv = (int(x) for x in row.split(":"))
            got = decode_rows(b, kv, DECODE_HEADS, torch.bfloat16, device, args.methods.split(","))
            for r in got:
                w.writerow(dict(r, label=args.label, KV=kv))
            print(f"{args.label} B {b:4d} KV {kv:6d}: " + "  ".join(
                f"{r['method']} {r.get('gbps', r['status'])}" for r in got), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
