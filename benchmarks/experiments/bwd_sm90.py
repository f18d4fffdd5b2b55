"""The sm_90 backward kernels (kernels/attention_bwd_sm90.py) against the portable backward's, on the GPU.

For rows of the fa / d256 sweeps (bf16), on the same q, k, v, dO, the forward's LSE and delta: the dQ
kernels (TFLOP/s counting their three products, 1.5x the forward's FLOPs), the dK / dV kernels (four
products, 2x), each timed alone (`time_call`), and the whole backward (delta, dK / dV, dQ; 2.5x, the count
`vflash bench --mode bwd` uses) with the portable kernels and with the sm_90 ones. The sm_90 kernels'
gradients are compared with the portable ones' (a difference above 2 % of the largest value prints WRONG).
The whole sm_90 backward takes the first --tiles and --dkdv-tiles (--paired: each pair of them in turn).
--rounds R times the dQ and dK / dV tiles and the whole backward R times, the tiles in turn each round (one
pass is not evidence for a few per cent).
Prints one line a measurement and writes a CSV.

  PYTHONPATH=src python3 -m benchmarks.experiments.bwd_sm90 [--out bwd_sm90.csv] [--rows D:N:causal ...]
  D 256: --rows 256:4096:0 256:4096:1 --tiles 128:32 --dkdv-tiles 32:128 --apart
"""

import argparse

import torch

from benchmarks.experiments.common import backward_launches, backward_row, write_rows
from vflash import dispatch
from vflash.harness import lab
from vflash.harness.bench import attention_flops
from vflash.harness.timing import graphed, time_call
from vflash.harness.lab import Score

ROWS = ["128:1024:0", "128:4096:0", "128:16384:0", "128:1024:1", "128:4096:1", "128:16384:1", "64:4096:0",
        "64:4096:1"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bwd_sm90.csv")
    ap.add_argument("--rows", nargs="*", default=ROWS, help="D:N:causal (0/1), shapes of the fa / d256 sweeps")
    ap.add_argument("--tiles", nargs="*", default=["128:64", "128:128", "192:64"],
                    help="the sm_90 dQ kernel's block_m:block_n[:stages]")
    ap.add_argument("--dkdv-tiles", nargs="*", default=["64:128", "64:64"],
                    help="the sm_90 dK / dV kernel's block_m (query rows a tile):block_n (keys a CTA)[:stages]")
    ap.add_argument("--paired", action="store_true",
                    help="the whole backward for each (--tiles, --dkdv-tiles) pair, in turn, each round")
    ap.add_argument("--graphs", action="store_true",
                    help="time each call as a CUDA graph replay (the kernels alone, without the launch path)")
    ap.add_argument("--apart", action="store_true",
                    help="dK and dV from two launches of the dK / dV kernel (one accumulator each; D 256)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the dQ and dK / dV tiles and the whole backward R times, in turn")
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for row in args.rows:
        r = backward_row(row, dev)
        s, q, k, v, do, band, scale, problem = r.shape, r.q, r.k, r.v, r.do, r.band, r.scale, r.problem
        d, n, c = s.D, s.Nq, int(s.causal)
        lse = r.lse
        delta_launch, dkdv_launch, dq_launch = backward_launches(do, q, k, v, r.out, lse, band, scale, None,
                                                                 dispatch.backward_tiles(problem))
        lab.run_launch(delta_launch, dev)  # delta, which every kernel below reads
        delta, dq_portable = delta_launch.args[3], dq_launch.args[6]
        dk_portable, dv_portable = dkdv_launch.args[6], dkdv_launch.args[7]
        fwd = attention_flops(s)

        def record(what, kernel, tiles, call, flops, got=(), want=(), rnd=0):
            try:
                call()
                torch.cuda.synchronize()
                err = max((float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))
                           for a, b in zip(got, want)), default=0.0)
                ms = time_call(graphed(call) if args.graphs else call, dev, rep_ms=40, warmup_ms=20)[0]
            except Exception as e:  # noqa: BLE001 - out of resources and the like: report, go on
                print(f"D{d} N{n} causal={c} {what} {kernel} {tiles}: {type(e).__name__} {str(e)[:200]}", flush=True)
                return
            rows.append(dict(D=d, N=n, causal=c, what=what, kernel=kernel, tiles=tiles, round=rnd, ms=ms,
                             tflops=flops / ms / 1e9, rel_err=err))
            print(f"D{d} N{n} causal={c} {what} {kernel} {tiles}{f' round {rnd}' if rnd else ''}: "
                  f"{ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s"
                  + (f" rel_err {err:.1e}{'' if err < 2e-2 else ' WRONG'}" if got else ""), flush=True)

        table = dispatch.backward_tiles(problem)
        record("dq", "portable", tuple(table.dq), lambda: lab.run_launch(dq_launch, dev), 1.5 * fwd)
        record("dkdv", "portable", tuple(table.dkdv), lambda: lab.run_launch(dkdv_launch, dev), 2.0 * fwd)
        record("bwd", "portable", "table", lambda: [lab.run_launch(x, dev) for x in (delta_launch, dkdv_launch,
                                                                                     dq_launch)], 2.5 * fwd)
        want = (dq_portable.clone(), dk_portable.clone(), dv_portable.clone())
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def dq_launches(t):
            m, n, stages = ([int(x) for x in t.split(":")] + [lab.SM90_BWD_STAGES])[:3]
            return [lab.sm90_dq_launch(q, k, v, do, lse, delta, dq, band, Score(scale, None), m, n, stages)]
        outputs = ("dk", "dv") if args.apart else ("dk dv",)

        def dkdv_launches(t):
            m, n, stages = ([int(x) for x in t.split(":")] + [lab.SM90_BWD_STAGES])[:3]
            return [lab.sm90_dkdv_launch(q, k, v, do, lse, delta, dk, dv, band, Score(scale, None), m, n, stages,
                                           outputs=o) for o in outputs]

        def record_sm90(what, kernel, tiles, built, flops, got, want, rnd):
            # the launches `built()` gives, timed as one call; tiles the launcher refuses: say so, go on
            try:
                sm90 = built()
            except ValueError as e:
                print(f"D{d} N{n} {what} {tiles}: {e}")
                return
            record(what, kernel, tiles, lambda: [lab.run_launch(x, dev) for x in sm90], flops, got, want, rnd)
        pairs = list(zip(args.tiles, args.dkdv_tiles)) if args.paired else [(args.tiles[0], args.dkdv_tiles[0])]
        for rnd in range(args.rounds):
            for t in args.tiles:
                record_sm90("dq", "sm90", t, lambda: dq_launches(t), 1.5 * fwd, (dq,), want[:1], rnd)
            for t in args.dkdv_tiles:
                record_sm90("dkdv", "sm90" + (" apart" if args.apart else ""), t, lambda: dkdv_launches(t), 2.0 * fwd,
                            (dk, dv), want[1:], rnd)
            for tq, tkv in pairs:
                record_sm90("bwd", "sm90", f"{tq} / {tkv}",
                            lambda: [delta_launch, *dkdv_launches(tkv), *dq_launches(tq)], 2.5 * fwd, (dq, dk, dv),
                            want, rnd)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
