"""Time a few tile configurations of the forward kernel per head dim and mask, to
choose GPU_CONFIGS (kernels/attention_fwd.py). GPU only; prints TFLOP/s."""

import itertools
import sys

import torch
import triton.testing

from vflash.harness.bench import Shape, attention_flops, gemm_warmup
from vflash.ops.attention import TileConfig, attention_forward

CANDIDATES = {
    64: [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 8, 4), (64, 64, 4, 3),
         (128, 128, 8, 2)],
    128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3),
          (128, 32, 8, 3), (128, 64, 8, 4)],
}


def main() -> None:
    gemm_warmup()
    dtype = torch.float16
    for d, causal, n in itertools.product((64, 128), (False, True), (2048, 16384)):
        s = Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, causal)
        q = torch.randn(s.B, s.Hq, n, d, device="cuda", dtype=dtype)
        k, v = torch.randn_like(q), torch.randn_like(q)
        res = []
        for cfg in CANDIDATES[d]:
            c = TileConfig(*cfg)
            fn = lambda: attention_forward(q, k, v, causal="bottom_right" if causal else None,  # noqa: E731
                                           scale=d ** -0.5, window=(-1, -1), softcap=None,
                                           return_lse=False, config=c)
            try:
                fn()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                res.append((attention_flops(s) / ms / 1e9, cfg))
            except Exception as exc:  # out of resources, say
                res.append((0.0, f"{cfg} failed: {type(exc).__name__}"))
        res.sort(key=lambda r: -r[0])
        print(f"D{d} causal={causal} N{n}: " + "  ".join(f"{cfg}:{tf:.0f}" for tf, cfg in res), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
