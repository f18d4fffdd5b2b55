"""`vflash bench`: latency, TFLOP/s and incremental peak memory of vflash against
SDPA's FLASH_ATTENTION and CUDNN_ATTENTION backends, measured in the same run.

TFLOP/s counts useful FLOPs: 4 * D per visible (query, key) pair, with the exact
pair count for causal masks and Nq != Nk.
"""

import csv
import datetime
import itertools
import math
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch

import vflash
from vflash.harness.cases import DTYPES

CSV_COLUMNS = [
    "date", "gpu", "sweep", "method", "dtype", "B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "status",
    "ms_median", "ms_p20", "ms_p80", "tflops", "peak_mib", "out_lse_mib", "vs_sdpa_flash", "vs_sdpa_cudnn",
]


@dataclass(frozen=True)
class Shape:
    B: int
    Hq: int
    Hkv: int
    Nq: int
    Nk: int
    D: int
    causal: bool


def visible_pairs(n_q: int, n_k: int, causal: bool) -> int:
    """Exact count of (query, key) pairs a bottom-right causal mask keeps."""
    if not causal:
        return n_q * n_k
    # Row i sees keys 0 .. i + n_k - n_q (clamped to [0, n_k]).
    return sum(min(n_k, max(0, i + n_k - n_q + 1)) for i in range(n_q))


def attention_flops(s: Shape) -> float:
    return 4.0 * s.D * visible_pairs(s.Nq, s.Nk, s.causal) * s.B * s.Hq


def sweep_shapes(name: str) -> List[Shape]:
    if name == "fa":  # FlashAttention papers: 16k tokens, hidden 2048
        return [Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, c)
                for d, c, n in itertools.product((64, 128), (False, True), (512, 1024, 2048, 4096, 8192, 16384))]
    if name == "article":
        return [Shape(1, 16, 16, n, n, 64, c)
                for c, n in itertools.product((False, True), (128, 256, 512, 1024, 2048, 4096, 8192))]
    raise ValueError(f"unknown sweep {name!r}; choose 'fa' or 'article'")


def _sdpa(backend_name: str) -> Callable:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v, causal):
        # Restricted to one backend: an unsupported shape fails rather than falling back.
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return run


def methods() -> Dict[str, Callable]:
    return {
        "vflash": lambda q, k, v, causal: vflash.attention(q, k, v, causal=causal),
        "sdpa_flash": _sdpa("FLASH_ATTENTION"),
        "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    }


def gemm_warmup(seconds: float = 1.0) -> None:
    """Lift the GPU out of its idle clocks before the first timing."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    end = datetime.datetime.now() + datetime.timedelta(seconds=seconds)
    while datetime.datetime.now() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object]) -> Tuple[float, float, float]:
    import triton.testing
    med, p20, p80 = triton.testing.do_bench(fn, warmup=50, rep=200, quantiles=[0.5, 0.2, 0.8])
    return med, p20, p80


def peak_mib(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def environment() -> Dict[str, str]:
    import triton
    p = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": p.name, "compute_capability": f"{p.major}.{p.minor}", "sm_count": str(p.multi_processor_count),
        "driver": driver, "cuda": str(torch.version.cuda), "torch": torch.__version__,
        "triton": triton.__version__, "vflash": vflash.__version__, "python": sys.version.split()[0],
    }


def bench_shape(s: Shape, dtype: str, sweep: str, env: Dict[str, str], chosen: Iterable[str]) -> List[dict]:
    dt = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(s.B, s.Hq, s.Nq, s.D, device="cuda", dtype=dt, generator=g)
    k = torch.randn(s.B, s.Hkv, s.Nk, s.D, device="cuda", dtype=dt, generator=g)
    v = torch.randn(s.B, s.Hkv, s.Nk, s.D, device="cuda", dtype=dt, generator=g)
    flops = attention_flops(s)
    out_lse_mib = (q.numel() * q.element_size() + s.B * s.Hq * s.Nq * 4) / 2**20
    rows = []
    table = methods()
    for name in chosen:
        fn = table[name]
        row = dict(date=env["date"], gpu=env["gpu"], sweep=sweep, method=name, dtype=dtype, B=s.B, Hq=s.Hq,
                   Hkv=s.Hkv, Nq=s.Nq, Nk=s.Nk, D=s.D, causal=s.causal, out_lse_mib=round(out_lse_mib, 3))
        try:
            call = lambda: fn(q, k, v, s.causal)  # noqa: E731
            call()  # compile / warm this method at this shape
            med, p20, p80 = time_ms(call)
            row.update(status="ok", ms_median=med, ms_p20=p20, ms_p80=p80,
                       tflops=flops / (med * 1e-3) / 1e12, peak_mib=round(peak_mib(call), 3))
        except torch.cuda.OutOfMemoryError:
            row.update(status="oom")
        except RuntimeError as exc:
            row.update(status=f"error: {str(exc).splitlines()[0][:80]}")
        torch.cuda.empty_cache()
        rows.append(row)
    by = {r["method"]: r for r in rows}
    for r in rows:
        for base, col in (("sdpa_flash", "vs_sdpa_flash"), ("sdpa_cudnn", "vs_sdpa_cudnn")):
            if r.get("status") == "ok" and by.get(base, {}).get("status") == "ok":
                r[col] = round(by[base]["ms_median"] / r["ms_median"], 4)
    return rows


def run_bench(sweep: str, dtypes: List[str], out_csv: str, chosen: Optional[List[str]] = None) -> List[dict]:
    if not torch.cuda.is_available():
        raise RuntimeError("vflash bench needs a CUDA GPU")
    chosen = chosen or list(methods())
    env = environment()
    gemm_warmup()
    rows = []
    shapes = sweep_shapes(sweep)
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for i, (dtype, s) in enumerate(itertools.product(dtypes, shapes)):
            shape_rows = bench_shape(s, dtype, sweep, env, chosen)
            for r in shape_rows:
                w.writerow(r)
            f.flush()
            rows += shape_rows
            cols = "  ".join(f"{r['method']} {r.get('tflops', math.nan):6.1f}" for r in shape_rows)
            print(f"[{i + 1}/{len(shapes) * len(dtypes)}] {dtype} B{s.B} H{s.Hq} N{s.Nq} D{s.D} "
                  f"causal={s.causal}: {cols} TFLOP/s", flush=True)
    return rows
