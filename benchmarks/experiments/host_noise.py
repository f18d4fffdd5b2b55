"""Is the decode call's bimodal host time the library's or the machine's? (issue 22's 20 us goal.)
Interleaves, round by round, the host time of three things: a
planned paged decode call (bf16, B 1 / KV 8k, Hq 32 / Hkv 8, D 128, pages of 16, `check_metadata=False`),
a bare torch launch (`torch.add` of two small tensors: an allocation and one kernel through PyTorch's
dispatcher), and pure Python work that touches neither the driver nor the GPU (the CPU probe the serving
sweeps time beside each host row, `vflash.harness.timing.cpu_probe_us`).
Each round times each of them (queued behind a sleep kernel where they launch), then sleeps `--gap` ms,
so the rounds span seconds: if the three move together from round to round, the host is what changes.
`--pin CPU` runs the process on one CPU; `--sampler` runs nvidia-smi sampling every 200 ms beside it (the
sweeps' `sampled` wrapper). Prints each round, the rounds' quartiles and the correlations; writes a CSV.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.host_noise [--rounds 40] [--gap 50] [--pin 3]
      [--sampler] [--label NAME] [--out host_noise.csv]
"""

import argparse
import os
import statistics
import subprocess
import time

import torch

import vflash
from benchmarks.experiments.common import decode_inputs, require_cuda, write_rows
from vflash.harness.serving import DECODE_HEADS
from vflash.harness.timing import cpu_probe_us


def _queued_us(fn, n: int) -> float:
    """Mean host us of n calls queued behind a sleep kernel longer than them."""
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return us


def _cpu() -> int:
    """The CPU this process last ran on (/proc/self/stat's 39th field)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return f"min {min(xs):.2f}  q1 {q[0]:.2f}  median {q[1]:.2f}  q3 {q[2]:.2f}  max {max(xs):.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=300, help="calls a round")
    ap.add_argument("--gap", type=float, default=50.0, help="ms between rounds")
    ap.add_argument("--pin", type=int, default=None, help="run on this CPU only")
    ap.add_argument("--sampler", action="store_true", help="nvidia-smi sampling every 200 ms beside it")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="host_noise.csv")
    args = ap.parse_args()
    if not require_cuda("host_noise"):
        return 0
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    cpus = sorted(os.sched_getaffinity(0))
    print(f"cpus {cpus[:4]}{'...' if len(cpus) > 4 else ''} ({len(cpus)}), sampler {args.sampler}", flush=True)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    q, kc, vc, table, seqlens = decode_inputs(1, 8192, 16, DECODE_HEADS, dev, dtype)
    x = torch.randn(256, device=dev)

    def decode():
        return vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False)

    def add():
        return torch.add(x, x)

    for _ in range(20):
        decode(), add()
    smi = None
    if args.sampler:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv",
                                "-lms", "200"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        for r in range(args.rounds):
            row = dict(label=args.label, round=r, pin=args.pin if args.pin is not None else "",
                       sampler=int(args.sampler), decode_us=round(_queued_us(decode, args.calls), 3),
                       add_us=round(_queued_us(add, args.calls), 3), python_us=round(cpu_probe_us(args.calls), 3),
                       cpu=_cpu())
            rows.append(row)
            print(f"round {r:3d} cpu {row['cpu']}: decode {row['decode_us']:7.2f}  add {row['add_us']:6.2f}  "
                  f"python {row['python_us']:6.2f} us", flush=True)
            time.sleep(args.gap / 1e3)
    finally:
        if smi is not None:
            smi.terminate()
            smi.wait()
    for key in ("decode_us", "add_us", "python_us"):
        print(f"{args.label} {key:10s} {_quartiles([r[key] for r in rows])}")
    dec = [r["decode_us"] for r in rows]
    for key in ("add_us", "python_us"):
        print(f"{args.label} corr(decode, {key}) {statistics.correlation(dec, [r[key] for r in rows]):.2f}")
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
