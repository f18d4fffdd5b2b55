"""Refactor check on the CPU: a fingerprint of the sm_90 PTX the Gluon kernel compiles to,
for a set of tiles and masks that covers its switches (one, two and three consumers, two and
three CTAs an SM, PINGPONG, P_FP32, LATE_PV_WAIT, LAZY_RESCALE, DYNAMIC, a left edge, softcap,
no LSE, bf16). Debug sections and comments are left out, so two trees whose kernels differ only
in how the source is arranged print the same fingerprints: same instructions, same speed.

  PYTHONPATH=src python3 -m benchmarks.experiments.ptx_fingerprint [--out DIR]
  PYTHONPATH=<old tree>/src python3 -m benchmarks.experiments.ptx_fingerprint   # then compare

No GPU needed (triton.compile for sm_90; ptxas ships with Triton).
"""

import argparse
import hashlib
import os
import sys

import torch

VARIANTS = {
    "d64_causal_pp": dict(head_dim=64, tiles=dict(block_m=192, block_n=128, stages=2, pingpong=True, p_fp32=True,
                                                   lazy_rescale=True, dynamic=True), right_edge=True),
    "d64_nc": dict(head_dim=64, tiles=dict(block_m=192, block_n=128, stages=2, q_buffers=2, pingpong=True,
                                            lazy_rescale=True)),
    "d128_bf16_all": dict(head_dim=128, dtype=torch.bfloat16, left_edge=True, softcap=True, lse=False,
                          tiles=dict(block_m=128, block_n=128, stages=2, q_buffers=2, late_pv_wait=True,
                                     lazy_rescale=True)),
    "d128_causal": dict(head_dim=128, tiles=dict(block_m=128, block_n=128, stages=2, dynamic=True), right_edge=True),
    "d256": dict(head_dim=256, tiles=dict(block_m=128, block_n=64, stages=2)),
    "d128_short": dict(head_dim=128, tiles=dict(block_m=64, block_n=64, stages=2, q_buffers=2, ctas_per_sm=2),
                       right_edge=True),
    "d64_three": dict(head_dim=64, tiles=dict(block_m=64, block_n=64, stages=2, q_buffers=2, p_fp32=True,
                                               lazy_rescale=True, ctas_per_sm=3, dynamic=True), right_edge=True),
}


def instructions(ptx: str) -> str:
    """The PTX without its debug sections, .loc / .file lines and comments."""
    ptx = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    return "\n".join(line.split("//")[0].rstrip() for line in ptx.splitlines()
                     if not line.strip().startswith((".loc", ".file", "//")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write each variant's instructions to DIR/NAME.ptx")
    ap.add_argument("names", nargs="*", help=f"variants (default all: {', '.join(VARIANTS)})")
    a = ap.parse_args()
    from vflash.ops import hopper
    from vflash.ops.tiles import HopperTiles
    if not hopper.HAVE_GLUON:
        print("this Triton has no Gluon", file=sys.stderr)
        return 1
    import triton
    print(f"triton {triton.__version__}")
    for name in a.names or VARIANTS:
        kw = dict(VARIANTS[name])
        kw["tiles"] = HopperTiles(**kw["tiles"])
        body = instructions(hopper.compile_sm90(**kw).asm["ptx"])
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, f"{name}.ptx"), "w") as f:
                f.write(body)
        print(f"{name:16} {hashlib.sha1(body.encode()).hexdigest()[:12]} {len(body.splitlines())} lines", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
