"""Issue 4 experiment: run the launcher's attention call on one shape a few
times, for Nsight Compute to profile one launch of the Gluon sm90 kernel
(pipe use, warp stalls, per-instruction samples). The launcher picks the kernel
and tiles as it does for users, unless --tiles or --q-buffers force the Hopper
kernel's tiles. --backward: each call is a forward and a backward through
autograd (the dispatched backward kernels; ncu's -k picks dq or dkdv's). --fp8: e4m3 inputs, the sm90 FP8
build forced (its V copy, kernels/layout.py, runs before each call: -k regex:sm90 skips it).

GPU only, under ncu, e.g. (from the repository root, PYTHONPATH=src:.):
  ncu --clock-control none --set full --import-source yes -k regex:sm90 --launch-skip 3 --launch-count 1 \
      -o d64 python3 -m benchmarks.experiments.profile_sm90 --d 64 --n 16384 [--causal] [--q-buffers 2] \
      [--tiles main|short|few] [--fp8]
"""

import argparse
import sys
from typing import Optional

import torch

import vflash
from benchmarks.experiments.common import require_cuda, sweep_shape
from vflash import dispatch
from vflash.dispatch import tables
from vflash.harness.lab import Sm90Tiles, attention_forward, mask_band
from vflash.harness.lab import Call, Score

TILES = {
    "main": "tables.SM90's entry for the head dim and mask",
    "short": "SM90_SHORT_CAUSAL's first band (one consumer a CTA, several CTAs an SM)",
    "few": "SM90_FEW_TILES' entry for the head dim and mask (two CTAs of 64-row tiles an SM)",
}


def table_tiles(which: str, head_dim: int, right_edge: bool) -> Sm90Tiles:
    """The Hopper tiles --tiles names, whatever the call's length; ValueError
    where the head dim has no such entry."""
    if which == "main":
        found = tables.SM90.get((head_dim, right_edge))
    elif which == "short":
        bands = tables.SM90_SHORT_CAUSAL.get(head_dim)
        found = bands[0].tiles if bands else None
    else:
        found = tables.SM90_FEW_TILES.get((head_dim, right_edge))
    if found is None:
        raise ValueError(f"--tiles {which}: the tables have no such tiles for D = {head_dim}"
                         f"{' with a right edge' if right_edge and which != 'short' else ''}")
    return found


def forced_tiles(which: Optional[str], q_buffers: Optional[int], head_dim: int, right_edge: bool,
                 launcher: Sm90Tiles) -> Sm90Tiles:
    """The tiles --tiles and --q-buffers ask for; `launcher`: the launcher's own
    Hopper tiles for the call, the base when --tiles is not given."""
    tiles = launcher if which is None else table_tiles(which, head_dim, right_edge)
    return tiles if q_buffers is None else tiles._replace(q_buffers=q_buffers)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--backward", action="store_true", help="a backward after each forward (bf16 inputs)")
    ap.add_argument("--fp8", action="store_true", help="e4m3 q / k / v (0-d descales), the sm90 FP8 build forced")
    ap.add_argument("--q-buffers", type=int, choices=[1, 2], help="sm90 kernel Q buffers (default: the tiles')")
    ap.add_argument("--tiles", choices=sorted(TILES),
                    help="force these Hopper tiles whatever the length and mask: "
                         + "; ".join(f"{k}: {v}" for k, v in TILES.items()) + " (default: the launcher's choice)")
    a = ap.parse_args()
    # The bench sweeps' shape of this head dim, length and masking.
    s = sweep_shape(a.d, a.n, a.causal)
    if s is None:
        ap.error(f"D = {a.d}, N = {a.n}: not a shape of the fa or d256 sweep")
    if a.tiles:
        try:
            table_tiles(a.tiles, a.d, a.causal)
        except ValueError as exc:
            ap.error(str(exc))
    if a.fp8 and (a.backward or a.tiles or a.q_buffers):
        ap.error("--fp8 takes the FP8 table's tiles, forward only")
    if not require_cuda("profile_sm90"):
        return 1
    dtype = torch.bfloat16 if a.backward else torch.float16
    q, k, v = (torch.randn(s.B, s.Hq, s.Nq, s.D, device="cuda", dtype=dtype, requires_grad=a.backward)
               for _ in range(3))
    if a.fp8:  # the FP8 build is taken where forced only (tables.SM90_FORCED_ONLY); its V copy runs first each call
        q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
        one = torch.ones((), device="cuda")
        dispatch.rules.FORCED = "sm90"
        for _ in range(a.calls):
            vflash.attention(q, k, v, causal=a.causal, q_descale=one, k_descale=one, v_descale=one)
        torch.cuda.synchronize()
        return 0
    causal = "bottom_right" if a.causal else None
    band = mask_band(s.Nq, s.Nk, causal, (-1, -1))
    tiles = None
    if a.tiles or a.q_buffers:
        problem = dispatch.problem_of(Call(q, k, v, None, band, Score(1.0), False))
        launcher = None if a.tiles else dispatch.select(problem, kernel="sm90").tiles
        tiles = forced_tiles(a.tiles, a.q_buffers, a.d, a.causal, launcher)
        print(f"profile_sm90: {tiles}", flush=True)
    for _ in range(a.calls):
        if a.backward:
            out = vflash.attention(q, k, v, causal=causal or False)
            out.backward(torch.ones_like(out))
        elif tiles is None:
            vflash.attention(q, k, v, causal=causal or False)
        else:
            attention_forward(q, k, v, band=band, score=Score(a.d ** -0.5, None), return_lse=False, tiles=tiles)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
