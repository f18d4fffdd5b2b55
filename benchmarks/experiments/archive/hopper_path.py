"""ARCHIVED (benchmarks/experiments/archive/README.md): answered, and written against the launcher API of
its day; it does not run against the current library.

Issue 4 experiment: the Gluon Hopper kernel (kernels/attention_fwd_hopper.py),
checked against the fp64 oracle on feature cases, then timed against the portable
Triton kernel and SDPA's cuDNN / flash backends in the same run.

GPU only:  PYTHONPATH=src python3 benchmarks/experiments/hopper_path.py [--check-only | --time-only]
"""

import argparse
import itertools
import sys
from typing import Optional

import torch

from vflash.harness.bench import Shape, attention_flops, gemm_warmup, sweep_shapes, time_call
from vflash.harness.oracle import compare
from vflash.ops import attention as ops
from vflash.reference import attention_explicit

# (B, Hq, Hkv, Nq, Nk, D, causal, window, softcap, lse, dtype, layout)
CASES = [
    (2, 4, 4, 256, 256, 128, None, None, None, True, torch.float16, "bhsd"),
    (2, 4, 4, 256, 256, 64, None, None, None, True, torch.float16, "bhsd"),
    (2, 4, 4, 256, 256, 128, "bottom_right", None, None, True, torch.float16, "bhsd"),
    (2, 4, 4, 256, 256, 64, "bottom_right", None, None, True, torch.bfloat16, "bhsd"),
    (1, 3, 3, 1, 1, 128, None, None, None, True, torch.float16, "bhsd"),
    (1, 3, 3, 129, 129, 128, "bottom_right", None, None, True, torch.float16, "bhsd"),
    (2, 2, 2, 77, 301, 64, "bottom_right", None, None, True, torch.float16, "bhsd"),
    (2, 2, 2, 301, 77, 64, "bottom_right", None, None, True, torch.float16, "bhsd"),
    (2, 2, 2, 301, 77, 128, "top_left", None, None, True, torch.bfloat16, "bhsd"),
    (2, 8, 2, 513, 513, 128, None, None, None, True, torch.bfloat16, "bshd"),
    (2, 8, 1, 200, 700, 64, None, (100, 50), None, True, torch.float16, "bshd"),
    (1, 4, 4, 640, 640, 128, "bottom_right", (256, -1), 30.0, True, torch.float16, "bhsd"),
    (1, 4, 4, 1000, 1000, 64, None, (0, 0), None, True, torch.float16, "bhsd"),
    (1, 2, 2, 64, 5, 128, "top_left", None, None, True, torch.float16, "bhsd"),
    (3, 4, 4, 1024, 1024, 128, "bottom_right", None, None, False, torch.float16, "bhsd"),
    (2, 4, 2, 300, 333, 256, None, None, None, True, torch.float16, "bhsd"),
    (2, 4, 2, 300, 333, 256, "bottom_right", (100, -1), 20.0, True, torch.bfloat16, "bshd"),
]


def sweep_shape(d: int, n: int, causal: bool) -> Optional[Shape]:
    """The fa or d256 bench sweep's shape of this head dim, length and masking;
    None where neither sweep has one."""
    return next((s for s in sweep_shapes("fa") + sweep_shapes("d256") if (s.D, s.Nq, s.causal) == (d, n, causal)),
                None)


def make(B, Hq, Hkv, Nq, Nk, D, dtype, layout, amp=1.0):
    def one(H, N):
        if layout == "bshd":
            return (torch.randn(B, N, H, D, device="cuda", dtype=dtype) * amp).transpose(1, 2)
        return torch.randn(B, H, N, D, device="cuda", dtype=dtype) * amp
    return one(Hq, Nq), one(Hkv, Nk), one(Hkv, Nk)


def check() -> bool:
    """Every case through the Hopper kernel with its head dim's table entry."""
    ok = True
    torch.manual_seed(0)
    for case in CASES:
        B, Hq, Hkv, Nq, Nk, D, causal, window, softcap, lse_on, dtype, layout = case
        cfg = ops.hopper_config(D)
        q, k, v = make(B, Hq, Hkv, Nq, Nk, D, dtype, layout, amp=3.0)
        out = torch.full((B, Hq, Nq, D), float("nan"), device="cuda", dtype=dtype)
        lse = torch.full((B, Hq, Nq), float("nan"), device="cuda") if lse_on else None
        win = window if window is not None else (-1, -1)
        try:
            ops.attention_forward(q, k, v, causal=causal, scale=D ** -0.5, window=win, softcap=softcap,
                                  return_lse=lse_on, config=cfg, out=out, lse=lse)
            torch.cuda.synchronize()
        except Exception as exc:  # compile errors: report and go on
            print(f"ERROR {case} {cfg}: {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
            ok = False
            continue
        kw = dict(causal=causal if causal else False, window=window, softcap=softcap)
        ref, ref_lse = attention_explicit(q, k, v, compute_dtype=torch.float64, **kw)
        same, same_lse = attention_explicit(q, k, v, compute_dtype=None, **kw)
        verdicts = [compare("out", out, ref, same, dtype)]
        if lse_on:
            verdicts.append(compare("lse", lse, ref_lse, ref_lse.float(), torch.float32))
        for vd in verdicts:
            ok &= vd.passed
            print(f"{'PASS' if vd.passed else 'FAIL'} {vd.what} {case[:8]} {dtype} {layout} "
                  f"cfg={cfg.block_m}x{cfg.block_n}/{cfg.num_stages} err={vd.max_err:.2e} tol={vd.tol:.2e} "
                  f"{vd.note}", flush=True)
    return ok


# (block_m, block_n, stages)
HOPPER_CANDIDATES = {
    64: [(128, 128, 2), (128, 128, 3), (128, 64, 3)],
    128: [(128, 128, 2), (128, 64, 3), (128, 128, 3)],
    256: [(128, 64, 2), (128, 32, 3)],
}


def timing(ns, dims) -> None:
    gemm_warmup()
    for d, causal, n in itertools.product(dims, (False, True), ns):
        s = Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, causal)
        q = torch.randn(s.B, s.Hq, s.Nq, s.D, device="cuda", dtype=torch.float16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        flops = attention_flops(s)
        mode = "bottom_right" if causal else None

        def run(cfg):
            return lambda: ops.attention_forward(q, k, v, causal=mode, scale=d ** -0.5, window=(-1, -1),
                                                 softcap=None, return_lse=False, config=cfg)
        triton_cfg = ops.choose_config(d, q.dtype, 0 if causal else -1, n, s.B * s.Hq, q.device)
        cands = [("triton", triton_cfg)] + [
            (f"gl{bm}x{bn}/{st}", ops.TileConfig(bm, bn, 4, st, hopper=True)) for bm, bn, st in HOPPER_CANDIDATES[d]]
        calls = [(name, run(cfg)) for name, cfg in cands] + sdpa_calls(q, k, v, causal)
        print(f"D{d} causal={causal:d} N{n}: " + "  ".join(f"{nm}:{tf:.0f}" for nm, tf in tflops(calls, flops)),
              flush=True)


def sdpa_calls(q, k, v, causal):
    """(name, call) for SDPA restricted to its cuDNN and to its flash backend: the same-run yardsticks."""
    calls = []
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        be = getattr(torch.nn.attention.SDPBackend, backend)

        def sdpa(be=be):
            with torch.nn.attention.sdpa_kernel([be]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        calls.append((backend.split("_")[0].lower(), sdpa))
    return calls


def _graphed(fn):
    """fn captured in a CUDA graph, as its replay: one launch's host cost (a few us)
    whatever fn does in Python, so that calls shorter than their Python launch path
    (Triton's JIT launch takes 40-100 us) time the kernel, not the host."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up on a side stream, as graph capture requires
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def tflops(calls, flops, graphs=False):
    """[(name, TFLOP/s)] per (name, call), timed after one warm call (with `graphs`,
    each call's CUDA graph replayed instead); a call that raises is reported as
    name!Error at 0 rather than ending the run."""
    res = []
    for name, fn in calls:
        try:
            fn()
            if graphs:
                fn = _graphed(fn)
            res.append((name, flops / time_call(fn, torch.device("cuda"))[0] / 1e9))
        except Exception as exc:
            res.append((name + f"!{type(exc).__name__}", 0.0))
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--dims", default="64,128")
    a = ap.parse_args()
    ok = True
    if not a.time_only:
        ok = check()
        print("CHECK", "PASS" if ok else "FAIL", flush=True)
    if not a.check_only and ok:
        timing([int(x) for x in a.n.split(",")], [int(x) for x in a.dims.split(",")])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
