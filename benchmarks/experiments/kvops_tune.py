"""Tiles of merge_states (kernels/combine.py) and write_kvcache (kernels/cache.py) on the GPU.

For each shape of `vflash bench --sweep merge | write` (vflash.harness.serving's MERGE_ROWS and
WRITE_TOKENS), every candidate launch is timed as CUDA-graph replays over rotating copies of the inputs
(the sweep's protocol), --rounds times with the candidates in turn each round; each candidate's output is
checked against the table's (merge: bitwise; write: the cache's rows). Prints a line a timing, the best
candidate a shape, and writes a CSV (shape, candidate, round, us, GB/s of the bytes the op must move).

  PYTHONPATH=src python3 -m benchmarks.experiments.kvops_tune [--out kvops_tune.csv] [--rounds 2]
"""

import argparse
import statistics
from collections import defaultdict

import torch

from benchmarks.experiments.common import require_cuda, write_rows
from vflash import dispatch
from vflash.dispatch import tables
from vflash.harness import serving
from vflash.harness.lab import CacheWriteTiles, MergeTiles, merge_states_forward, write_kvcache_forward
from vflash.harness.timing import graph_runner, replay_times

MERGE_CANDIDATES = [MergeTiles(r, d, w) for r in (4, 8, 16, 32, 64, 128) for d in (32, 64, 128) for w in (1, 2, 4, 8)]
WRITE_CANDIDATES = [CacheWriteTiles(h, w) for h in (1, 2, 4, 8) for w in (1, 2, 4, 8)]


def merge_calls(B, H, N, D, dev):
    parts, moved = serving.merge_inputs(B, H, N, D, dev)

    def make(tiles):
        return [lambda p=p: merge_states_forward(*p, tiles) for p in parts], lambda: merge_states_forward(*parts[0],
                                                                                                         tiles)
    return make, moved


def write_calls(T, dev):
    Hkv, D = serving.WRITE_HEADS
    kc, vc, news, moved = serving.write_inputs(T, serving.WRITE_HEADS, serving.WRITE_PAGE, dev)

    def make(tiles):
        def check():
            kc.zero_()
            vc.zero_()
            k, v, s = news[0]
            write_kvcache_forward(kc, vc, k, v, s, tiles=tiles)
            return kc.view(-1, Hkv, D)[s].clone(), vc.view(-1, Hkv, D)[s].clone(), int((kc != 0).any(-1).any(-1).sum())
        return [lambda k=k, v=v, s=s: write_kvcache_forward(kc, vc, k, v, s, tiles=tiles) for k, v, s in news], check
    return make, moved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="kvops_tune.csv")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not require_cuda("kvops_tune"):
        return 2
    dev = torch.device("cuda")
    rows = []
    jobs = [(f"merge B{B} H{H} N{N} D{D}", merge_calls(B, H, N, D, dev), MERGE_CANDIDATES,
             dispatch.merge_tiles(D, dev)) for B, H, N, D in serving.MERGE_ROWS]
    jobs += [(f"write T{T}", write_calls(T, dev), WRITE_CANDIDATES, tables.CACHE_WRITE) for T in serving.WRITE_TOKENS]
    for name, (make, nbytes), candidates, table in jobs:
        _, ref_check = make(table)
        want = ref_check()
        times = defaultdict(list)
        runners, n_calls = {}, 1
        for c in candidates:
            calls, check = make(c)
            try:
                got = check()
                same = (all(torch.equal(a, b) for a, b in zip(got[:2], want[:2])) and got[2:] == want[2:]
                        if name.startswith("write") else all(torch.equal(a, b) for a, b in zip(got, want)))
                if not same:
                    print(f"{name} {tuple(c)}: WRONG (differs from the table's launch)", flush=True)
                    continue
                runners[c], n_calls = graph_runner(calls, dev), len(calls)
            except Exception as e:  # noqa: BLE001 - a launch that cannot build: report, go on
                print(f"{name} {tuple(c)}: {type(e).__name__} {str(e)[:160]}", flush=True)
        for rnd in range(args.rounds):
            for c, run in runners.items():
                us = statistics.median(replay_times(run, n_calls))
                times[c].append(us)
                rows.append(dict(shape=name, candidate=" ".join(map(str, c)), table=int(c == table), round=rnd,
                                 us=round(us, 3), gbps=round(nbytes / us / 1e3, 1)))
        med = {c: statistics.median(v) for c, v in times.items()}
        for c in sorted(med, key=med.get)[:5]:
            print(f"{name} {tuple(c)}{' (table)' if c == table else ''}: {med[c]:.2f} us "
                  f"{nbytes / med[c] / 1e3:.0f} GB/s", flush=True)
        best = min(med, key=med.get)
        print(f"BEST {name}: {tuple(best)} {med[best]:.2f} us; table {tuple(table)} "
              f"{med.get(table, float('nan')):.2f} us", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
