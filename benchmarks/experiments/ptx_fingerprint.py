"""Refactor check on the CPU: a fingerprint of the sm_90 PTX the Gluon kernel compiles to,
and of the portable Triton kernel's dense launches, for a set of tiles and masks that covers
the Gluon kernel's switches (one, two and three consumers, two and
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
import re
import sys

import torch

from vflash.harness import lab

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


# The portable kernel's dense launches: (head dim, tiles, HAS_LEFT, HAS_RIGHT, SOFTCAP, STORE_LSE, dtype).
PORTABLE = {
    "p_d128_causal_lse": (128, (128, 128, 8, 3, False), False, True, False, True, "fp16"),
    "p_d128_split": (128, (256, 64, 8, 3, True), False, False, False, False, "fp16"),
    "p_d64_window_softcap": (64, (64, 64, 4, 3, False), True, True, True, True, "bf16"),
    "p_d96_padded": (96, (128, 128, 8, 3, False), False, False, False, True, "fp16"),
}


def portable_ptx(head_dim, tiles, has_left, has_right, softcap, store_lse, dtype) -> str:
    """attention_fwd_kernel's dense launch compiled for sm_90 without a GPU, as the launcher builds it for these
    tiles and mask edges (lab.sm90_builds: the launch captured on CPU tensors, then compiled)."""
    q = torch.empty(1, 2, 256, head_dim, dtype={"fp16": torch.float16, "bf16": torch.bfloat16}[dtype])
    band = lab.Band(0, 32 if has_left else -1, 0 if has_right else -1)
    (build,) = lab.sm90_builds(lambda: lab.attention_forward(
        q, q, q, band=band, scale=head_dim ** -0.5, softcap=20.0 if softcap else None, return_lse=store_lse,
        tiles=lab.PortableTiles(*tiles)))
    return build.asm["ptx"]


def instructions(ptx: str) -> str:
    """The PTX without its debug sections, .loc / .file lines, comments, blank lines
    and the $L__tmp labels that mark inlined scopes for the debug info (one more jit
    helper layer adds one, with the same instructions)."""
    ptx = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    lines = (line.split("//")[0].rstrip() for line in ptx.splitlines()
             if not line.strip().startswith((".loc", ".file", "//")))
    return "\n".join(line for line in lines if line.strip() and not re.fullmatch(r"\$L__tmp\d+:", line.strip()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write each variant's instructions to DIR/NAME.ptx")
    ap.add_argument("names", nargs="*", help=f"variants (default all: {', '.join([*VARIANTS, *PORTABLE])})")
    a = ap.parse_args()
    if not lab.HAVE_GLUON:
        print("this Triton has no Gluon", file=sys.stderr)
        return 1
    import triton
    print(f"triton {triton.__version__}")
    for name in a.names or [*VARIANTS, *PORTABLE]:
        if name in PORTABLE:
            body = instructions(portable_ptx(*PORTABLE[name]))
        else:
            kw = dict(VARIANTS[name])
            kw["tiles"] = lab.HopperTiles(**kw["tiles"])
            body = instructions(lab.compile_hopper_sm90(**kw).asm["ptx"])
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, f"{name}.ptx"), "w") as f:
                f.write(body)
        print(f"{name:16} {hashlib.sha1(body.encode()).hexdigest()[:12]} {len(body.splitlines())} lines", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
