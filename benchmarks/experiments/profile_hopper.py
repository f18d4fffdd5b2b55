"""Issue 4 experiment: run the launcher's attention call on one shape a few
times, for Nsight Compute to profile one launch of the Gluon Hopper kernel
(pipe use, warp stalls, per-instruction samples). The launcher picks the kernel
and tiles as it does for users.

GPU only, under ncu, e.g.:
  ncu --clock-control none --set full --import-source yes -k regex:hopper --launch-skip 3 --launch-count 1 \
      -o d64 python3 benchmarks/experiments/profile_hopper.py --d 64 --n 16384 [--causal] [--q-buffers 2] \
      [--tiles main|short]
"""

import argparse
import dataclasses
import sys

import torch

import vflash
from vflash.ops import attention as ops

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hopper_path import sweep_shape  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--q-buffers", type=int, choices=[1, 2], help="Hopper kernel Q buffers (default: the table's)")
    ap.add_argument("--tiles", choices=["main", "short"],
                    help="HOPPER_CONFIGS' tiles or HOPPER_FEW_TILES' (one consumer a CTA), whatever the length "
                         "and mask (default: the launcher's choice)")
    a = ap.parse_args()
    # The bench sweeps' shape of this head dim, length and masking.
    s = sweep_shape(a.d, a.n, a.causal)
    if s is None:
        ap.error(f"D = {a.d}, N = {a.n}: not a shape of the fa or d256 sweep")
    q, k, v = (torch.randn(s.B, s.Hq, s.Nq, s.D, device="cuda", dtype=torch.float16) for _ in range(3))
    causal = "bottom_right" if a.causal else None
    config = None
    if a.tiles or a.q_buffers:
        config = ops.hopper_config(a.d, a.causal, s.Nq if a.tiles is None else None, few_tiles=a.tiles == "short")
    if a.q_buffers:  # another Q buffer count (e.g. two under a right edge)
        config = dataclasses.replace(config, q_buffers=a.q_buffers)
    for _ in range(a.calls):
        if config is None:
            vflash.attention(q, k, v, causal=causal)
        else:
            ops.attention_forward(q, k, v, causal=causal, scale=a.d ** -0.5, window=(-1, -1), softcap=None,
                                  return_lse=False, config=config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
