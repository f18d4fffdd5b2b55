"""Issue 4 experiment: how a call's speed moves over the first seconds after the harness's GEMM warm-up.

`vflash bench` runs `gemm_warmup(0.1)` (8192^3 bf16 products, ~700 W) before each method and then times ~300 ms
of calls. nvidia-smi sampled during one bench (gpu_session.sh's `clocks` step) showed the SM clock at 1500-1680
MHz with the software power cap flagged for ~0.4 s after each such warm-up, then 1965-1980 MHz: the timed window
may fall in the capped stretch. This times back-to-back calls (L2 flushed between them, as `time_call` does) for
SECONDS after either the GEMM warm-up or two seconds idle, and prints TFLOP/s per 100 ms bucket of GPU time.

GPU only:  PYTHONPATH=src:. python3 -m benchmarks.experiments.clock_ramp [--seconds 1.5]
"""

import argparse
import sys
import time

import torch

from benchmarks.experiments.common import make, parse_sweep_shapes, require_cuda, sdpa_calls
from vflash import attention
from vflash.harness.bench import attention_flops
from vflash.harness.timing import gemm_warmup


def series(call, flops: float, seconds: float, bucket_ms: float = 100.0):
    """[(bucket start ms, median TFLOP/s in it)] over `seconds` of back-to-back flushed calls."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    t0 = torch.cuda.Event(enable_timing=True)
    t0.record()
    marks = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            call()
            e.record()
            marks.append((s, e))
        marks[-1][1].synchronize()
    torch.cuda.synchronize()
    buckets = {}
    for s, e in marks:
        buckets.setdefault(int(t0.elapsed_time(s) // bucket_ms), []).append(s.elapsed_time(e))
    out = []
    for b in sorted(buckets):
        ts = sorted(buckets[b])
        out.append((b * bucket_ms, flops / ts[len(ts) // 2] / 1e9, len(ts)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--shapes", default="128:8192,64:8192",
                    help="D:N[:c] (c: causal) of the fa or d256 sweep, comma-separated")
    a = ap.parse_args()
    try:
        shapes = parse_sweep_shapes(a.shapes)
    except ValueError as exc:
        ap.error(str(exc))
    if not require_cuda("clock_ramp"):
        return 1
    gemm_warmup()
    for s in shapes:
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = make(s.B, s.Hq, s.Hkv, s.Nq, s.Nk, s.D, dtype, "bhnd")
            calls = [("vflash", lambda: attention(q, k, v, causal=s.causal))] + \
                [(nm, fn) for nm, fn in sdpa_calls(q, k, v, s.causal) if nm == "cudnn"]
            for name, fn in calls:
                fn()
                for start in ("gemm", "idle"):
                    torch.cuda.synchronize()
                    if start == "gemm":
                        gemm_warmup(0.1)
                    else:
                        time.sleep(2.0)
                    stamp = time.strftime("%H:%M:%S")
                    res = series(fn, attention_flops(s), a.seconds)
                    print(f"{stamp} D{s.D} N{s.Nq} causal={int(s.causal)} {str(dtype)[6:]} {name} after {start}: "
                          + " ".join(f"{t:.0f}" for _, t, _ in res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
