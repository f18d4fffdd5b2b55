"""Issue 4 tool: same-run A/B of two source trees through the public API.

A kernel change that touches every variant (a shared helper, say) cannot be a
hopper_variants.py variant; this times `vflash.attention` from whichever tree is
on PYTHONPATH, with SDPA cuDNN in the same process as the yardstick, on the fa and d256
sweeps' shapes (16k tokens). Run it alternately from the two trees in
one device call, e.g. a copy of the old sources made with
`git archive HEAD src | tar -x -C .ab/old` (`.ab/` is ignored; carry it):

  for r in 1 2; do for t in .ab/old/src src; do
    PYTHONPATH=$t python3 benchmarks/experiments/ab_trees.py --label $t; done; done

GPU only:  PYTHONPATH=src python3 benchmarks/experiments/ab_trees.py --label new [--shapes 128:512:c,64:4096]
"""

import argparse
import sys

import torch

from vflash import attention
from vflash.harness.bench import attention_flops, gemm_warmup

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hopper_path import make, sdpa_calls, sweep_shape, tflops  # noqa: E402

DEFAULT_SHAPES = "128:512:c,128:1024:c,128:2048:c,64:1024:c,64:4096:c,64:16384:c,128:16384"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="D:N[:c] (c: causal), comma-separated")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    a = ap.parse_args()
    dtype = torch.float16 if a.dtype == "fp16" else torch.bfloat16
    shapes = []
    for spec in a.shapes.split(","):
        d, n, *c = spec.split(":")
        shapes.append(sweep_shape(int(d), int(n), bool(c)))
        if shapes[-1] is None:
            ap.error(f"{spec}: not a shape of the fa or d256 sweep")
    gemm_warmup()
    for s in shapes:
        q, k, v = make(s.B, s.Hq, s.Hkv, s.Nq, s.Nk, s.D, dtype, "bhnd")
        res = tflops([("vflash", lambda: attention(q, k, v, causal=s.causal))] +
                     [(name, fn) for name, fn in sdpa_calls(q, k, v, s.causal) if "cudnn" in name], attention_flops(s))
        print(f"{a.label} D{s.D} N{s.Nq} causal={int(s.causal)}: " + "  ".join(f"{nm}:{t:.0f}" for nm, t in res),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
