"""Ring attention's per-rank forward work on one GPU: a simulated world of R ranks, one
rank's R steps run in one process (vflash.distributed's schedule: each step's chunk pairs
with their bands, the merges), each step timed alone and with a copy of the next K/V shard
on a second stream (a stand-in for the link: the overlap, not its speed), against the
single-GPU vflash.attention on the whole sequence divided by R (what each of R GPUs should
take). bf16, Hq 32 / Hkv 8, D 128. Prints one line a (N, R, mask, layout, rank) and writes a CSV.

  PYTHONPATH=src python3 -m benchmarks.experiments.ring_single_gpu [--out ring_single_gpu.csv]
"""

import argparse

import torch

import vflash
from benchmarks.experiments.common import write_rows
from vflash import library
from vflash.distributed import _Ring, shard_sequence
from vflash.harness.bench import time_call

ROWS = [(32768, 2), (32768, 4), (131072, 4), (131072, 8)]


def _step(ring, step, qs, kv_shards, scale):
    # one step of the forward on the shard of rank (rank - step) mod R: pairs and merges
    src = (ring.rank - step) % ring.world_size
    ks, vs = (t.chunk(len(qs), dim=2) for t in kv_shards[src])
    acc = [None] * len(qs)
    for a, b, (off, left, right) in ring.pairs(step):
        out, lse = library.attention_fwd(qs[a], ks[b], vs[b], off, left, right, scale, None)
        acc[a] = (out.float(), lse) if acc[a] is None else vflash.merge_states(acc[a][0], acc[a][1], out.float(), lse)
    return acc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="ring_single_gpu.csv")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    Hq, Hkv, D = 32, 8, 128
    scale = D ** -0.5
    rows = []
    side = torch.cuda.Stream()
    for n, world in ROWS:
        q = torch.randn(1, Hq, n, D, device=dev, dtype=dt)
        k = torch.randn(1, Hkv, n, D, device=dev, dtype=dt)
        v = torch.randn_like(k)
        for causal, layout in ((True, "zigzag"), (True, "contiguous"), (False, "zigzag")):
            single = time_call(lambda: vflash.attention(q, k, v, causal=causal), dev)[0]
            shards = [(shard_sequence(k, r, world, layout=layout), shard_sequence(v, r, world, layout=layout))
                      for r in range(world)]
            for rank in sorted({0, world - 1}):
                ring = _Ring(rank, world, layout, n // world, n // world, 0, -1, 0 if causal else -1)
                qs = shard_sequence(q, rank, world, layout=layout).chunk(len(ring.q_ids), dim=2)
                steps = [time_call(lambda s=s: _step(ring, s, qs, shards, scale), dev)[0] for s in range(world)]
                buf = [torch.empty_like(t) for t in shards[0]]

                def overlapped(s):
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for dst, src in zip(buf, shards[(rank - s - 1) % world]):
                            dst.copy_(src, non_blocking=True)
                    acc = _step(ring, s, qs, shards, scale)
                    torch.cuda.current_stream().wait_stream(side)
                    return acc

                with_copy = [time_call(lambda s=s: overlapped(s), dev)[0] for s in range(world)]
                # the merges alone: one fp32 merge_states of a query chunk's partials, times the
                # merges the schedule makes (a chunk's pairs after its first)
                part = torch.randn(qs[0].shape, device=dev, dtype=torch.float32)
                part_lse = torch.randn(qs[0].shape[:3], device=dev, dtype=torch.float32)
                one_merge = time_call(lambda: vflash.merge_states(part, part_lse, part, part_lse), dev)[0]
                firsts = set()
                merges = 0
                for s in range(world):
                    for a, _, _ in ring.pairs(s):
                        merges += a in firsts
                        firsts.add(a)
                total, total_copy = sum(steps), sum(with_copy)
                kept = single / world / total
                row = dict(N=n, R=world, causal=causal, layout=layout, rank=rank, single_ms=single,
                           ideal_ms=single / world, steps_ms=total, steps_with_copy_ms=total_copy,
                           kept=kept, merges=merges, merge_ms=merges * one_merge,
                           per_step_ms=" ".join(f"{t:.3f}" for t in steps))
                rows.append(row)
                print(f"N {n} R {world} {'causal' if causal else 'full'} {layout} rank {rank}: single {single:.2f} ms, "
                      f"ideal {single / world:.2f}, ring steps {total:.2f} ({kept:.2f} of ideal), with copies "
                      f"{total_copy:.2f}, merges {merges * one_merge:.2f}; steps {row['per_step_ms']}", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
