"""Ring attention's per-rank forward work on one GPU: a simulated world of R ranks, one
rank's R steps run in one process (vflash.distributed's schedule: each step's chunk pairs
with their bands, the merges), each step timed alone and with a copy of the next K/V shard
on a second stream (a stand-in for the link: the overlap, not its speed), against the
single-GPU vflash.attention on the whole sequence divided by R (what each of R GPUs should
take). The backward likewise for rank R-1 (the last to finish under a contiguous causal
split): each step's pairs' backward with the fp32 dK/dV adds, alone and with copies of the
next K/V shard and of the fp32 dK/dV on a second stream, against the single-GPU forward +
backward divided by R. bf16, Hq 32 / Hkv 8, D 128. Prints one line a (N, R, mask, layout,
rank, pass) and writes a CSV.

  PYTHONPATH=src python3 -m benchmarks.experiments.ring_single_gpu [--out ring_single_gpu.csv]
"""

import argparse
import contextlib

import torch

import vflash
from benchmarks.experiments.common import write_rows
from vflash.distributed import ring_schedule, shard_sequence
from vflash.harness.timing import time_call

ROWS = [(32768, 2), (32768, 4), (131072, 4), (131072, 8)]


def _ms(call, dev):
    # median milliseconds: time_call for short calls; a call over 50 ms (the 131k rows'
    # whole-sequence passes) once to warm up and three times timed, which is steady at
    # that length and keeps the script inside one device call
    if dev.type != "cuda":
        return time_call(call, dev)[0]
    call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    if start.elapsed_time(end) < 50:
        return time_call(call, dev)[0]
    times = []
    for _ in range(3):
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[1]


@contextlib.contextmanager
def _copies(side, dsts, srcs):
    # the copies dst <- src on the side stream (the link's stand-in) while the body runs on
    # the current one; the body's end waits for them. Without a side stream (CPU smoke
    # run) they run first.
    if side is None:
        for dst, src in zip(dsts, srcs):
            dst.copy_(src)
        yield
        return
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for dst, src in zip(dsts, srcs):
            dst.copy_(src, non_blocking=True)
    yield
    torch.cuda.current_stream().wait_stream(side)


def _step(schedule, rank, step, qs, kv_shards, scale):
    # one step of the forward on the shard of rank (rank - step) mod R (ring_schedule's pairs): pairs and merges
    src = (rank - step) % len(schedule)
    ks, vs = (t.chunk(len(qs), dim=2) for t in kv_shards[src])
    acc = [None] * len(qs)
    for a, b, (off, left, right) in schedule[step]:
        out, lse = torch.ops.vflash.attention_fwd(qs[a], ks[b], vs[b], off, left, right, scale, None, None)
        acc[a] = (out.float(), lse) if acc[a] is None else vflash.merge_states(acc[a][0], acc[a][1], out.float(), lse)
    return acc


def _step_bwd(schedule, rank, step, qs, outs, lses, douts, kv_shards, dq, dkv, scale):
    # one step of the backward on the shard of rank (rank - step) mod R: each pair's
    # gradients added into the fp32 dQ of the local queries and the travelling dK / dV
    # (into the pair's chunk along the sequence, as ring_attention adds them on dense shards)
    src = (rank - step) % len(schedule)
    n = len(qs)
    ks, vs = (t.chunk(n, dim=2) for t in kv_shards[src])
    for a, b, (off, left, right) in schedule[step]:
        gq, gk, gv, _ = torch.ops.vflash.attention_bwd(douts[a], None, qs[a], ks[b], vs[b], outs[a], lses[a], off,
                                                       left, right, scale, None, None)
        dq.chunk(n, dim=2)[a].add_(gq)
        dkv[0].chunk(n, dim=2)[b].add_(gk)
        dkv[1].chunk(n, dim=2)[b].add_(gv)


def _backward_rows(n, world, causal, layout, q, k, v, shards, side, scale, dev):
    # rank R-1's backward steps against the single-GPU forward + backward over R
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)

    def fwd_bwd():
        return torch.autograd.grad(vflash.attention(qg, kg, vg, causal=causal), (qg, kg, vg), do)
    single = _ms(fwd_bwd, dev)
    out, lse = vflash.attention(q, k, v, causal=causal, return_lse=True)
    rank = world - 1
    nq, schedule = ring_schedule(rank, world, n // world, n // world, causal=causal, layout=layout)
    mine = [shard_sequence(t, rank, world, layout=layout).chunk(nq, dim=2) for t in (q, out, do)]
    lses = [c.contiguous() for c in shard_sequence(lse, rank, world, layout=layout).chunk(nq, dim=2)]
    dq = torch.zeros(q.shape[:2] + (n // world, q.shape[-1]), device=dev)
    dkv = [torch.zeros(shards[0][0].shape, device=dev) for _ in range(2)]
    steps = [_ms(lambda s=s: _step_bwd(schedule, rank, s, mine[0], mine[1], lses, mine[2], shards, dq, dkv,
                                       scale), dev) for s in range(world)]
    buf = [torch.empty_like(t) for t in shards[0]] + [torch.empty_like(t) for t in dkv]

    def overlapped(s):
        with _copies(side, buf, list(shards[(rank - s - 1) % world]) + dkv):
            _step_bwd(schedule, rank, s, mine[0], mine[1], lses, mine[2], shards, dq, dkv, scale)

    with_copy = [_ms(lambda s=s: overlapped(s), dev) for s in range(world)]
    # the forward's steps for the same rank, so that the row is forward + backward
    qs = mine[0]
    fwd = sum(_ms(lambda s=s: _step(schedule, rank, s, qs, shards, scale), dev) for s in range(world))
    total, total_copy = sum(steps) + fwd, sum(with_copy) + fwd
    row = dict(N=n, R=world, causal=causal, layout=layout, rank=rank, mode="fwd_bwd", single_ms=single,
               ideal_ms=single / world, steps_ms=total, steps_with_copy_ms=total_copy, kept=single / world / total,
               merges="", merge_ms="", per_step_ms=" ".join(f"{t:.3f}" for t in steps))
    print(f"N {n} R {world} {'causal' if causal else 'full'} {layout} rank {rank} fwd+bwd: single {single:.2f} ms, "
          f"ideal {single / world:.2f}, ring steps {total:.2f} ({row['kept']:.2f} of ideal), with copies "
          f"{total_copy:.2f}; backward steps {row['per_step_ms']}", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="ring_single_gpu.csv")
    ap.add_argument("--no-backward", action="store_true", help="the forward rows only")
    ap.add_argument("--smoke", action="store_true", help="a tiny CPU run (interpreter) that checks the script")
    args = ap.parse_args()
    if args.smoke:
        dev, dt, (Hq, Hkv, D), rows_nr = torch.device("cpu"), torch.float32, (2, 1, 16), [(64, 2)]
    else:
        dev, dt, (Hq, Hkv, D), rows_nr = torch.device("cuda"), torch.bfloat16, (32, 8, 128), ROWS
    scale = D ** -0.5
    rows = []
    side = torch.cuda.Stream() if dev.type == "cuda" else None
    for n, world in rows_nr:
        q = torch.randn(1, Hq, n, D, device=dev, dtype=dt)
        k = torch.randn(1, Hkv, n, D, device=dev, dtype=dt)
        v = torch.randn_like(k)
        for causal, layout in ((True, "zigzag"), (True, "contiguous"), (False, "zigzag")):
            single = _ms(lambda: vflash.attention(q, k, v, causal=causal), dev)
            shards = [(shard_sequence(k, r, world, layout=layout), shard_sequence(v, r, world, layout=layout))
                      for r in range(world)]
            for rank in sorted({0, world - 1}):
                nq, schedule = ring_schedule(rank, world, n // world, n // world, causal=causal, layout=layout)
                qs = shard_sequence(q, rank, world, layout=layout).chunk(nq, dim=2)
                steps = [_ms(lambda s=s: _step(schedule, rank, s, qs, shards, scale), dev) for s in range(world)]
                buf = [torch.empty_like(t) for t in shards[0]]

                def overlapped(s):
                    with _copies(side, buf, shards[(rank - s - 1) % world]):
                        return _step(schedule, rank, s, qs, shards, scale)

                with_copy = [_ms(lambda s=s: overlapped(s), dev) for s in range(world)]
                # the merges alone: one fp32 merge_states of a query chunk's partials, times the
                # merges the schedule makes (a chunk's pairs after its first)
                part = torch.randn(qs[0].shape, device=dev, dtype=torch.float32)
                part_lse = torch.randn(qs[0].shape[:3], device=dev, dtype=torch.float32)
                one_merge = _ms(lambda: vflash.merge_states(part, part_lse, part, part_lse), dev)
                firsts = set()
                merges = 0
                for s in range(world):
                    for a, _, _ in schedule[s]:
                        merges += a in firsts
                        firsts.add(a)
                total, total_copy = sum(steps), sum(with_copy)
                kept = single / world / total
                row = dict(N=n, R=world, causal=causal, layout=layout, rank=rank, mode="fwd", single_ms=single,
                           ideal_ms=single / world, steps_ms=total, steps_with_copy_ms=total_copy,
                           kept=kept, merges=merges, merge_ms=merges * one_merge,
                           per_step_ms=" ".join(f"{t:.3f}" for t in steps))
                rows.append(row)
                print(f"N {n} R {world} {'causal' if causal else 'full'} {layout} rank {rank}: single {single:.2f} ms, "
                      f"ideal {single / world:.2f}, ring steps {total:.2f} ({kept:.2f} of ideal), with copies "
                      f"{total_copy:.2f}, merges {merges * one_merge:.2f}; steps {row['per_step_ms']}", flush=True)
            if not args.no_backward:
                rows.append(_backward_rows(n, world, causal, layout, q, k, v, shards, side, scale, dev))
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
