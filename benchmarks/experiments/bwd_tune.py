"""Tiles of the portable backward (kernels/attention_bwd.py), timed on the GPU.

For a few rows of the fa / d256 sweeps (bf16), the whole backward (delta, dK/dV, dQ)
timed with every dK/dV candidate at the table's dQ tiles, then every dQ candidate at the
best dK/dV tiles. Each candidate's gradients are compared with the table's (a broken
candidate prints "WRONG" and is not picked). Prints one line a candidate, the best pair
a row, and writes a CSV.

  PYTHONPATH=src python3 -m benchmarks.experiments.bwd_tune [--out bwd_tune.csv] [--rows D:N:causal ...]
"""

import argparse
import itertools

import torch

from benchmarks.experiments.common import backward_row, write_rows
from vflash import dispatch
from vflash.harness.bench import attention_flops
from vflash.harness.lab import BackwardLaunch, BackwardTiles, attention_backward
from vflash.harness.timing import time_call
from vflash.harness.lab import Score

ROWS = ["128:4096:1", "128:4096:0", "64:4096:1", "256:4096:1"]
DKDV = [(m, n, w, s) for (m, n, w), s in itertools.product(
    [(16, 64, 4), (32, 64, 4), (64, 64, 4), (64, 64, 8), (16, 128, 4), (32, 128, 4), (32, 128, 8), (64, 128, 8)],
    (2, 3))]
DQ = [(m, n, w, s) for (m, n, w), s in itertools.product(
    [(64, 32, 4), (64, 64, 4), (128, 32, 4), (128, 32, 8), (128, 64, 8), (64, 16, 4), (128, 16, 4), (64, 64, 8)],
    (2, 3))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bwd_tune.csv")
    ap.add_argument("--rows", nargs="*", default=ROWS, help="D:N:causal (0/1), shapes of the fa / d256 sweeps")
    ap.add_argument("--rep-ms", type=float, default=40.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    out_rows = []
    for row in args.rows:
        r = backward_row(row, dev)
        s, q, k, v, do, out, lse, band, scale = r.shape, r.q, r.k, r.v, r.do, r.out, r.lse, r.band, r.scale
        d, n, c = s.D, s.Nq, int(s.causal)
        problem = r.problem
        table = dispatch.backward_tiles(problem)
        flops = attention_flops(s) * 2.5

        def grads(t: BackwardTiles):
            return attention_backward(do, q, k, v, out, lse, band=band, score=Score(scale, None), tiles=t)

        want = grads(table)

        def trial(kind: str, t: BackwardTiles) -> float:
            try:
                got = grads(t)
                err = max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))
                          for a, b in zip(got, want))
                ms = time_call(lambda: grads(t), dev, rep_ms=args.rep_ms, warmup_ms=20)[0]
            except Exception as e:  # noqa: BLE001 - out of resources and the like: report, go on
                print(f"D{d} N{n} causal={c} {kind} {t}: {type(e).__name__}", flush=True)
                return float("inf")
            ok = err < 2e-2
            tf = flops / ms / 1e9
            print(f"D{d} N{n} causal={c} {kind} dkdv={tuple(t.dkdv)} dq={tuple(t.dq)}: {ms:.3f} ms "
                  f"{tf:.1f} TFLOP/s rel_err {err:.1e}{'' if ok else ' WRONG'}", flush=True)
            out_rows.append(dict(D=d, N=n, causal=c, kind=kind, dkdv=tuple(t.dkdv), dq=tuple(t.dq), ms=ms, tflops=tf,
                                 rel_err=err, ok=ok))
            return ms if ok else float("inf")

        base = trial("table", table)
        best_kv = min(DKDV, key=lambda x: trial("dkdv", table._replace(dkdv=BackwardLaunch(*x))))
        kv = BackwardLaunch(*best_kv)
        best_q = min(DQ, key=lambda x: trial("dq", BackwardTiles(kv, BackwardLaunch(*x))))
        best = BackwardTiles(kv, BackwardLaunch(*best_q))
        ms = trial("best", best)
        print(f"BEST D{d} N{n} causal={c}: {best} {flops / ms / 1e9:.1f} TFLOP/s (table {flops / base / 1e9:.1f})",
              flush=True)
    write_rows(args.out, out_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
