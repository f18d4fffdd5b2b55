"""Issue 4 experiment: run the launcher's attention call on one shape a few
times, for Nsight Compute to profile one launch of the Gluon Hopper kernel
(pipe use, warp stalls, per-instruction samples). The launcher picks the kernel
and tiles as it does for users.

GPU only, under ncu, e.g.:
  ncu --clock-control none --set full --import-source yes -k regex:hopper --launch-skip 3 --launch-count 1 \
      -o d64 python3 benchmarks/experiments/profile_hopper.py --d 64 --n 16384
"""

import argparse

import torch

import vflash


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=5)
    a = ap.parse_args()
    # The fa sweep's shapes: 16k tokens, 2048 model width.
    b, h = 16384 // a.n, 2048 // a.d
    q, k, v = (torch.randn(b, h, a.n, a.d, device="cuda", dtype=torch.float16) for _ in range(3))
    for _ in range(a.calls):
        vflash.attention(q, k, v, causal="bottom_right" if a.causal else False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
