"""Issue 4 tool: same-run A/B of two source trees through the public API.

A kernel change that touches every variant (a shared helper, say) cannot be a
sm90_variants.py variant; this times `vflash.attention` from whichever tree is
on PYTHONPATH, with SDPA cuDNN in the same process as the yardstick, on the fa and d256
sweeps' shapes (16k tokens). Run it alternately from the two trees in
one device call, e.g. a copy of the old sources made with
`git archive HEAD src | tar -x -C .ab/old` (`.ab/` is ignored; carry it):

  for r in 1 2; do for t in .ab/old/src src; do
    PYTHONPATH=$t:. python3 -m benchmarks.experiments.ab_trees --label $t; done; done

(this script and `common` come from the current checkout, the library from $t; they use only
`vflash.attention` and `vflash.harness.bench` / `timing`, so any tree that has those works).

GPU only:  PYTHONPATH=src:. python3 -m benchmarks.experiments.ab_trees --label new [--shapes 128:512:c,64:4096]
"""

import argparse
import sys

import torch

from benchmarks.experiments.common import make, parse_sweep_shapes, require_cuda, sdpa_calls, tflops
from vflash import attention
from vflash.harness.bench import attention_flops
from vflash.harness.timing import gemm_warmup

DEFAULT_SHAPES = "128:512:c,128:1024:c,128:2048:c,64:1024:c,64:4096:c,64:16384:c,128:16384"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="D:N[:c] (c: causal), comma-separated")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    a = ap.parse_args()
    dtype = torch.float16 if a.dtype == "fp16" else torch.bfloat16
    try:
        shapes = parse_sweep_shapes(a.shapes)
    except ValueError as exc:
        ap.error(str(exc))
    if not require_cuda("ab_trees"):
        return 1
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
