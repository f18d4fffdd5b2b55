"""The sm_90 dQ kernel (kernels/attention_bwd_hopper.py) against the portable backward's dQ kernel, on the GPU.

For rows of the fa / d256 sweeps (bf16), both dQ kernels on the same q, k, v, dO, the forward's LSE and
delta: each timed alone (`time_call`), TFLOP/s counting the dQ kernel's three products (S, dP, dQ: 1.5x the
forward's FLOPs), and the sm_90 kernel's dQ compared with the portable one's (a difference above 2 % of
the largest value prints WRONG). Prints one line a row and writes a CSV.

  PYTHONPATH=src python3 -m benchmarks.experiments.bwd_hopper [--out bwd_hopper.csv] [--rows D:N:causal ...]
"""

import argparse

import torch

from benchmarks.experiments.common import write_rows
from vflash import dispatch
from vflash.harness.bench import attention_flops, sweep_shapes, time_call
from vflash.ops import attention_bwd as bwd
from vflash.ops import hopper_bwd
from vflash.ops import launch as launches
from vflash.ops.attention import attention_forward
from vflash.ops.band import mask_band

ROWS = ["128:1024:0", "128:4096:0", "128:16384:0", "128:1024:1", "128:4096:1", "128:16384:1", "64:4096:0",
        "64:4096:1"]


def portable_launches(do, q, k, v, out, lse, band, scale, tiles):
    """The portable backward's launches (delta, dK/dV, dQ) as it would run them, captured, not run."""
    captured = []
    real = bwd.launches.run
    bwd.launches.run = lambda launch, device: captured.append(launch)
    try:
        bwd.attention_backward(do, q, k, v, out, lse, band=band, scale=scale, softcap=None, tiles=tiles)
    finally:
        bwd.launches.run = real
    return captured


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bwd_hopper.csv")
    ap.add_argument("--rows", nargs="*", default=ROWS, help="D:N:causal (0/1), shapes of the fa / d256 sweeps")
    ap.add_argument("--tiles", nargs="*", default=["128:64"], help="the sm_90 kernel's block_m:block_n")
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = torch.bfloat16
    rows = []
    for row in args.rows:
        d, n, c = (int(x) for x in row.split(":"))
        s = next(s for s in sweep_shapes("fa") + sweep_shapes("d256") if (s.D, s.Nq, s.causal) == (d, n, bool(c)))
        torch.manual_seed(0)
        q = torch.randn(s.B, s.Hq, s.Nq, d, device=dev, dtype=dt)
        k = torch.randn(s.B, s.Hkv, s.Nk, d, device=dev, dtype=dt)
        v = torch.randn_like(k)
        do = torch.randn_like(q)
        band = mask_band(s.Nq, s.Nk, "bottom_right" if s.causal else None, (-1, -1))
        scale = d ** -0.5
        problem = dispatch.problem_of(q, k, v, None, band)
        out, lse = attention_forward(q, k, v, band=band, scale=scale, softcap=None, return_lse=True,
                                     tiles=dispatch.select(problem).tiles)
        delta_launch, _, dq_launch = portable_launches(do, q, k, v, out, lse, band, scale,
                                                       dispatch.backward_tiles(problem))
        launches.run(delta_launch, dev)  # delta, which both dQ kernels read
        delta, dq_portable = delta_launch.args[3], dq_launch.args[6]
        flops = attention_flops(s) * 1.5
        ms = time_call(lambda: launches.run(dq_launch, dev), dev, rep_ms=40, warmup_ms=20)[0]
        want = dq_portable.float()
        rows.append(dict(D=d, N=n, causal=c, kernel="portable", tiles=tuple(dispatch.backward_tiles(problem).dq),
                         ms=ms, tflops=flops / ms / 1e9, rel_err=0.0))
        print(f"D{d} N{n} causal={c} portable dq {rows[-1]['tiles']}: {ms:.3f} ms {rows[-1]['tflops']:.1f} TFLOP/s",
              flush=True)
        for t in args.tiles:
            bm, bn = (int(x) for x in t.split(":"))
            dq = torch.empty_like(q)
            try:
                launch = hopper_bwd.dq_launch(q, k, v, do, lse, delta, dq, band, scale, None, bm, bn)
                launches.run(launch, dev)
                torch.cuda.synchronize()
                err = float((dq.float() - want).abs().max() / want.abs().max().clamp_min(1e-6))
                ms = time_call(lambda: launches.run(launch, dev), dev, rep_ms=40, warmup_ms=20)[0]
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"D{d} N{n} causal={c} sm90 dq {bm}x{bn}: {type(e).__name__} {str(e)[:200]}", flush=True)
                continue
            rows.append(dict(D=d, N=n, causal=c, kernel="sm90", tiles=(bm, bn), ms=ms, tflops=flops / ms / 1e9,
                             rel_err=err))
            print(f"D{d} N{n} causal={c} sm90 dq {bm}x{bn}: {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s rel_err "
                  f"{err:.1e}{'' if err < 2e-2 else ' WRONG'}", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
