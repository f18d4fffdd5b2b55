"""Prefill with a v head dim unlike q's and k's (issue 55's speed row: DeepSeek's 192 / 128), timed on the GPU
beside the run's own yardsticks.

Each row is one shape (B, H, N, D_qk, D_v, causal; bf16, no GQA) and one method:

  vflash          the dispatch's choice
  vflash-sm90     the sm90 forward forced (its v-head-dim build; the dispatch's choice on sm_90 since session 52's
                  run, the portable kernel's before)
  sdpa-<backend>  SDPA restricted to one backend (cudnn, flash, efficient), where it takes the shape
  vflash-d128     vflash on q / k / v of D 128 at the same B, H, N: the issue's other yardstick (0.9x its rate)

TFLOP/s counts 2 * (D_qk + D_v) flops a visible (query, key) pair (causal: bottom-right, about half). Timed with
triton.testing.do_bench (median of 100 ms after 25 ms of warm-up). The issue's bar: vflash's rate at least the
same run's cuDNN where cuDNN takes the shape, else at least 0.9x vflash-d128's. --smoke runs vflash and vflash-d128
once at a tiny shape on the CPU (no timing, rows with us 0; the sm90 and SDPA rows need the GPU): a test of this
script.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.vhead_prefill [--out vhead_prefill.csv] [--dims 192/128 ...]
"""

import argparse
from typing import Callable, Dict, List, Optional

import torch

import vflash
from benchmarks.experiments.common import write_rows
from vflash.dispatch import rules
from vflash.harness.bench import visible_pairs
from vflash.harness.lab import clear_plans

SHAPES = [(1, 16, 16384), (2, 16, 8192), (4, 16, 4096)]  # (B, H, N)
DIMS = ["192/128", "128/64", "256/128"]


def _sdpa(backend: str, q, k, v, causal: bool) -> Callable[[], torch.Tensor]:
    be = getattr(torch.nn.attention.SDPBackend, backend)

    def run():
        with torch.nn.attention.sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _time(fn: Callable[[], torch.Tensor], smoke: bool, forced: Optional[str] = None) -> Optional[float]:
    # median microseconds, 0.0 on --smoke (one call), None where the method refuses the shape. Launch plans are
    # cleared first (a plan keys on the call, not on the forced kernel: the previous method's would serve this
    # one), so the method's first call records its own and the timed calls replay it.
    clear_plans()
    rules.FORCED = forced
    try:
        if smoke:
            fn()
            return 0.0
        import triton
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    except Exception as exc:  # noqa: BLE001 - a method that refuses a shape is a missing row, not a crash
        print(f"    {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        return None
    finally:
        rules.FORCED = None


def _methods(b: int, h: int, n: int, d_qk: int, d_v: int, causal: bool, device: torch.device,
             smoke: bool) -> Dict[str, Callable[[], torch.Tensor]]:
    # each method's call on this shape's inputs (bf16; vflash-d128 on its own D 128 ones); the sm90 row needs the GPU
    g = torch.Generator(device=device).manual_seed(n)
    q, k = (torch.randn(b, h, n, d_qk, device=device, generator=g, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(b, h, n, d_v, device=device, generator=g, dtype=torch.bfloat16)
    q128, k128, v128 = (torch.randn(b, h, n, 128, device=device, generator=g, dtype=torch.bfloat16) for _ in range(3))
    methods = {"vflash": lambda: vflash.attention(q, k, v, causal=causal)}
    if not smoke:
        methods["vflash-sm90"] = lambda: vflash.attention(q, k, v, causal=causal)  # timed with sm90 forced
        backends = (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"))
        methods.update({f"sdpa-{name}": _sdpa(backend, q, k, v, causal) for name, backend in backends})
    methods["vflash-d128"] = lambda: vflash.attention(q128, k128, v128, causal=causal)
    return methods


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="vhead_prefill.csv")
    ap.add_argument("--dims", nargs="*", default=DIMS, help="D_qk/D_v pairs")
    ap.add_argument("--smoke", action="store_true", help="each method once at a tiny shape on the CPU")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    shapes = [(1, 2, 70)] if args.smoke else SHAPES
    rows: List[Dict[str, object]] = []
    for (b, h, n), dims, causal in [(s, d, c) for s in shapes for d in args.dims for c in (False, True)]:
        d_qk, d_v = (int(x) for x in dims.split("/"))
        pairs = b * h * visible_pairs(n, n, causal)
        for method, fn in _methods(b, h, n, d_qk, d_v, causal, device, args.smoke).items():
            us = _time(fn, args.smoke, "sm90" if method == "vflash-sm90" else None)
            if us is None:
                continue
            flops = pairs * 2 * ((d_qk + d_v) if method != "vflash-d128" else 256)
            row = dict(B=b, H=h, N=n, d_qk=d_qk, d_v=d_v, causal=int(causal), method=method, us=round(us, 2),
                       tflops=round(flops / us / 1e6, 1) if us else 0.0)
            rows.append(row)
            print(f"B {b} H {h} N {n:6d} {dims:8s} causal {int(causal)} {method:15s} {us:10.2f} us "
                  f"{row['tflops']:7.1f} TFLOP/s", flush=True)
    write_rows(args.out, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
