"""Time a few tile configurations of the portable Triton kernel per head dim and
mask, to choose its tables (vflash.dispatch.tables: PORTABLE, PORTABLE_SPLIT,
PORTABLE_SHORT): the launcher with its tiles forced (vflash.harness.lab), timed as
`vflash bench` times (vflash.harness.timing). GPU only; prints TFLOP/s. From the
repository root, PYTHONPATH=src:

  python3 benchmarks/tune.py            # the 16k-token sweep shapes (N 2048, 16384)
  python3 benchmarks/tune.py --article  # small grids: B=1, H=16, D=64, N 1024..4096
  python3 benchmarks/tune.py --d256     # D = 256, fp16, 16k tokens
  python3 benchmarks/tune.py --split    # split (two-half) tiles against the plain table, D 64/128
  python3 benchmarks/tune.py --short    # fa-sweep shapes at N 512 / 1024 (many short programs)

(`python3 -m benchmarks.tune ...` with the repository root on PYTHONPATH works too.)
"""

import argparse
import itertools
import sys

import torch

from vflash.harness.bench import Shape, attention_flops
from vflash.harness.lab import PortableTiles, attention_forward, mask_band
from vflash.harness.timing import gemm_warmup, time_call
from vflash.harness.lab import Score

# PortableTiles fields: (block_m, block_n, num_warps, num_stages[, split])
CANDIDATES = {
    64: [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 8, 4), (64, 64, 4, 3),
         (128, 128, 8, 2), (64, 128, 4, 3), (64, 32, 4, 3)],
    128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3),
          (128, 32, 8, 3), (128, 64, 8, 4)],
    256: [(64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 8, 2), (64, 128, 8, 2)],
}


# (block_m, block_n, warps, stages, split): the plain table's entry first.
SPLIT_CANDIDATES = {
    64: [(128, 64, 8, 3), (256, 64, 8, 3, True), (256, 128, 8, 2, True), (128, 64, 4, 3, True)],
    128: [(128, 128, 8, 3), (256, 64, 8, 3, True), (256, 64, 8, 2, True), (256, 128, 8, 2, True)],
}


SHORT_CANDIDATES = {
    64: [(128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3), (64, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 2)],
    128: [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 128, 4, 3), (64, 64, 4, 2), (128, 64, 4, 3)],
}


def shapes(which: str):
    if which == "short":
        return [Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, c)
                for d, c, n in itertools.product((64, 128), (False, True), (512, 1024))]
    if which == "article":
        return [Shape(1, 16, 16, n, n, 64, c) for c, n in itertools.product((False, True), (1024, 2048, 4096))]
    if which == "d256":
        return [Shape(16384 // n, 8, 8, n, n, 256, c) for c, n in itertools.product((False, True), (2048, 8192))]
    return [Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, c)
            for d, c, n in itertools.product((64, 128), (False, True), (2048, 16384))]


def main() -> None:
    ap = argparse.ArgumentParser()
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--article", action="store_const", dest="which", const="article")
    group.add_argument("--d256", action="store_const", dest="which", const="d256")
    group.add_argument("--split", action="store_const", dest="which", const="split")
    group.add_argument("--short", action="store_const", dest="which", const="short")
    which = ap.parse_args().which or "fa"
    if not torch.cuda.is_available():
        print("tune.py: needs a CUDA device (none here)", file=sys.stderr)
        sys.exit(1)
    gemm_warmup()
    for s in shapes(which):
        q = torch.randn(s.B, s.Hq, s.Nq, s.D, device="cuda", dtype=torch.float16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        res = []
        table = {"split": SPLIT_CANDIDATES, "short": SHORT_CANDIDATES}.get(which, CANDIDATES)
        band = mask_band(s.Nq, s.Nk, "bottom_right" if s.causal else None, (-1, -1))
        for cfg in table[s.D]:
            tiles = PortableTiles(*cfg)
            fn = lambda: attention_forward(q, k, v, band=band, score=Score(s.D ** -0.5, None),  # noqa: E731
                                           return_lse=False, tiles=tiles)
            try:
                fn()
                ms = time_call(fn, torch.device("cuda"), rep_ms=100, warmup_ms=25)[0]
                res.append((attention_flops(s) / ms / 1e9, cfg))
            except Exception as exc:  # out of resources, say
                res.append((0.0, f"{cfg} failed: {type(exc).__name__}"))
        res.sort(key=lambda r: -r[0])
        print(f"B{s.B} H{s.Hq} D{s.D} causal={s.causal} N{s.Nq}: "
              + "  ".join(f"{cfg}:{tf:.0f}" for tf, cfg in res), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
