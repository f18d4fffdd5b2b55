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


def compile_portable(head_dim, tiles, has_left, has_right, softcap, store_lse, dtype):
    """attention_fwd_kernel compiled for sm_90 without a GPU, as a dense launch takes it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vflash.kernels.attention_fwd import attention_fwd_kernel as fn
    from vflash.ops.tiles import PortableTiles, head_dim_pad
    t = PortableTiles(*tiles)
    constexprs = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad(head_dim), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                      SPLIT=t.split, HAS_LEFT=has_left, HAS_RIGHT=has_right, SOFTCAP=softcap, STORE_LSE=store_lse,
                      REVERSE_M=has_right, UPCAST_DOT=False, DOT_PRECISION="tf32")
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("Q", "K", "V", "O"):
            signature[name] = f"*{dtype}"
        elif name == "LSE":
            signature[name] = "*fp32"
        elif name in ("qk_scale", "softcap_in", "softcap_out"):
            signature[name] = "fp32"
        elif name.startswith("CU_") or name in ("BLOCK_TABLE", "SEQLENS_K", "stride_table", "page_size"):
            signature[name] = "constexpr"
            constexprs[name] = None
        elif name in ("IS_VARLEN", "TOP_LEFT", "IS_PAGED"):
            signature[name] = "constexpr"
            constexprs[name] = False
        else:
            signature[name] = "i32"
    return triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=t.num_warps, num_stages=t.num_stages))


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
    from vflash.ops import hopper
    from vflash.ops.tiles import HopperTiles
    if not hopper.HAVE_GLUON:
        print("this Triton has no Gluon", file=sys.stderr)
        return 1
    import triton
    print(f"triton {triton.__version__}")
    for name in a.names or [*VARIANTS, *PORTABLE]:
        if name in PORTABLE:
            body = instructions(compile_portable(*PORTABLE[name]).asm["ptx"])
        else:
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
