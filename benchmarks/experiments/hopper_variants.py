"""Issue 4 experiment: schedule variants of the Gluon Hopper kernel, each checked
against the fp64 oracle on hopper_path.py's feature cases of its head dim, then
timed against the portable kernel and SDPA cuDNN / flash in the same run.

A variant sets the kernel's tiles and grid directly: block_m 128 / 192 (two or
three consumer warpgroups), block_n, ring stages, persist (a persistent grid
rather than one CTA per work tile) and ctas, the persistent grid's size (default:
the SM count; with causal work, a size that shares no factor with the row blocks
per head cycles each CTA through all of them instead of fixing its row block).
At commit 83097d5 this file also timed two schedule switches since settled and
removed from the kernel: EARLY_RESCALE (kept as the only order) and M_MAJOR
(dropped); results/2026-11-29-h200-s5-variants.

GPU only:  PYTHONPATH=src python3 benchmarks/experiments/hopper_variants.py [--dims 64,128] [--n 1024,4096]
"""

import argparse
import itertools
import sys
from typing import NamedTuple, Optional

import torch

from vflash.harness.bench import Shape, attention_flops, gemm_warmup
from vflash.harness.oracle import compare
from vflash.kernels import attention_fwd_hopper as hopper
from vflash.ops import attention as ops
from vflash.ops import hopper as hopper_launch
from vflash.reference import attention_explicit

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hopper_path import CASES, make, sdpa_calls, tflops  # noqa: E402


class Variant(NamedTuple):
    name: str
    block_m: int
    block_n: int
    stages: int
    persist: Optional[bool] = None  # None: the launcher's rule (hopper_launch.grid)
    ctas: Optional[int] = None  # persistent grid size; None: the SM count
    q_buffers: Optional[int] = None  # Q buffers per consumer; None: the launcher's (ops.hopper_config)
    pingpong: Optional[bool] = None  # consumers take turns to issue their products (PINGPONG); None: the launcher's
    p_fp32: Optional[bool] = None  # P carried in fp32 between iterations (P_FP32); None: the launcher's
    late: Optional[bool] = None  # the PV wait kept after the softmax (LATE_PV_WAIT); None: the launcher's
    lazy: Optional[bool] = None  # FA4's lazy reference max, O's rescale skipped where alpha == 1 (LAZY_RESCALE)
    dynamic: bool = False  # CTAs draw work tiles from a global counter (DYNAMIC)
    per_sm: Optional[int] = None  # CTAs an SM (None: two with one consumer, else one); CONSUMER_REGS must have it


VARIANTS = {
    64: [Variant("3c", 192, 128, 2, pingpong=False), Variant("3c-q1", 192, 128, 2, q_buffers=1, pingpong=False),
         Variant("2c", 128, 128, 2, pingpong=False),
         Variant("3c-pp", 192, 128, 2, pingpong=True), Variant("2c-pp", 128, 128, 2, pingpong=True),
         Variant("3c-pp-q2", 192, 128, 2, q_buffers=2, pingpong=True),  # two Q buffers under a right edge too
         Variant("3c-pp-p16", 192, 128, 2, pingpong=True, p_fp32=False),
         Variant("3c-pp-p32", 192, 128, 2, pingpong=True, p_fp32=True),
         Variant("late", 192, 128, 2, p_fp32=False, late=True),
         Variant("3c-pp-nolazy", 192, 128, 2, pingpong=True, lazy=False),
         Variant("3c-pp-dyn", 192, 128, 2, pingpong=True, dynamic=True),
         # one consumer a CTA, two CTAs an SM (lead k: their serial chains overlap)
         Variant("c1", 64, 128, 2, q_buffers=1, pingpong=False),
         # two Q buffers: the next work tile's Q loads while this one computes (Nsight Compute, D = 64 causal
         # N = 1024: 9 % of the consumer's stall samples wait for Q; 80 KB each, two still fit an SM)
         Variant("c1-q2", 64, 128, 2, q_buffers=2, pingpong=False),
         Variant("c1-n64", 64, 64, 2, q_buffers=1, pingpong=False),
         # three CTAs an SM (41 KB each; registers 80 a thread, the consumer 136: 2 spill instructions in
         # Triton 3.6's SASS; 128-key tiles do not compile under 80)
         Variant("c1-n64-x3", 64, 64, 2, q_buffers=1, pingpong=False, per_sm=3),
         Variant("c1-n64-s3-x3", 64, 64, 3, q_buffers=1, pingpong=False, per_sm=3),
         Variant("c1-n64-x3-q2", 64, 64, 2, q_buffers=2, pingpong=False, per_sm=3),  # 49 KB
         Variant("c1-n64-s3-x3-q2", 64, 64, 3, q_buffers=2, pingpong=False, per_sm=3),  # 66 KB
         Variant("c1-n64-x3-q2-dyn", 64, 64, 2, q_buffers=2, pingpong=False, per_sm=3, dynamic=True),
         Variant("c1-q2-dyn", 64, 128, 2, q_buffers=2, pingpong=False, dynamic=True)],
    128: [Variant("base", 128, 128, 2), Variant("pp", 128, 128, 2, pingpong=True),
          Variant("p16", 128, 128, 2, p_fp32=False), Variant("p32", 128, 128, 2, p_fp32=True),
          Variant("late", 128, 128, 2, p_fp32=False, late=True),
          Variant("late-p32", 128, 128, 2, p_fp32=True, late=True),
          Variant("late-pp", 128, 128, 2, pingpong=True, p_fp32=False, late=True),
          Variant("q1", 128, 128, 2, q_buffers=1), Variant("q2", 128, 128, 2, q_buffers=2),
          Variant("q2-p16", 128, 128, 2, q_buffers=2, p_fp32=False),
          Variant("tile-per-cta", 128, 128, 2, False), Variant("q1-tile-per-cta", 128, 128, 2, False, q_buffers=1),
          Variant("persist-132", 128, 128, 2, True, 132),
          # short causal: a deeper ring, or narrower key tiles (less waste on the diagonal)
          Variant("s3", 128, 128, 3, q_buffers=1), Variant("n64-s4", 128, 64, 4, q_buffers=1),
          Variant("n64-s3", 128, 64, 3, q_buffers=1), Variant("lazy", 128, 128, 2, lazy=True),
          Variant("nolazy", 128, 128, 2, lazy=False), Variant("p16-lazy", 128, 128, 2, p_fp32=False, lazy=True),
          # one consumer a CTA, two CTAs an SM (82 KB of shared memory each with 64-key tiles; D = 256 cannot:
          # ptxas needs more than the 128 registers a thread of two CTAs an SM for its 64 x 256 wgmma)
          Variant("c1-n64", 64, 64, 2, q_buffers=1, pingpong=False),
          Variant("c1-n64-s3", 64, 64, 3, q_buffers=1, pingpong=False),  # 115 KB: two still fit an SM
          Variant("c1-n64-q2", 64, 64, 2, q_buffers=2, pingpong=False),  # 98 KB
          # the persistent grid with work tiles drawn from a global counter (FA3's dynamic scheduler)
          Variant("dyn", 128, 128, 2, dynamic=True), Variant("dyn-q2", 128, 128, 2, q_buffers=2, dynamic=True),
          Variant("c1-n64-q2-dyn", 64, 64, 2, q_buffers=2, pingpong=False, dynamic=True)],
    256: [Variant("base", 128, 64, 2), Variant("pp", 128, 64, 2, pingpong=True),
          Variant("p16", 128, 64, 2, p_fp32=False), Variant("p32", 128, 64, 2, p_fp32=True),
          Variant("late", 128, 64, 2, late=True),
          Variant("tile-per-cta", 128, 64, 2, False),
          Variant("n32-s4", 128, 32, 4), Variant("lazy", 128, 64, 2, lazy=True),
          Variant("dyn", 128, 64, 2, dynamic=True)],
}


def launch(var: Variant, q, k, v, out, lse, causal, scale, window, softcap):
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    off, left, right = ops.mask_band(Nq, Nk, causal, window)
    descs = hopper_launch.tma_descriptors(var.block_n)(q, k, v, out)
    cfg = ops.hopper_config(D, right >= 0)  # the launcher's choices, where a variant leaves one open
    pingpong = cfg.pingpong if var.pingpong is None else var.pingpong
    p_fp32 = cfg.p_fp32 if var.p_fp32 is None else var.p_fp32
    late = cfg.late_pv_wait if var.late is None else var.late
    lazy = cfg.lazy_rescale if var.lazy is None else var.lazy
    per_sm = var.per_sm or (2 if var.block_m == hopper.CONSUMER_ROWS else 1)
    args, constexprs = hopper_launch.kernel_args(descs, lse, B, Hq, Hkv, Nq, Nk, D, off, left, right, scale, softcap,
                                                 var.block_m, var.block_n, var.stages,
                                                 var.q_buffers or cfg.q_buffers,
                                                 pingpong, p_fp32, late, lazy, per_sm, var.dynamic)
    sms = ops._sm_count(q.device.index)
    work = B * Hq * -(-Nq // var.block_m)
    options = hopper_launch.launch_options(var.block_m, per_sm)
    if var.persist is None:
        grid = hopper_launch.grid(B, Hq, Nq, var.block_m, sms, causal=right >= 0, ctas_per_sm=per_sm,
                                  dynamic=var.dynamic)
    else:
        grid = (min(work, var.ctas or sms * per_sm) if var.persist else work, 1, 1)
    hopper.attention_fwd_hopper_kernel[grid](*args, **constexprs, **options)
    return out


def check(dims, names) -> bool:
    ok = True
    torch.manual_seed(0)
    for case in CASES:
        B, Hq, Hkv, Nq, Nk, D, causal, window, softcap, lse_on, dtype, layout = case
        if D not in dims:
            continue
        q, k, v = make(B, Hq, Hkv, Nq, Nk, D, dtype, layout, amp=3.0)
        kw = dict(causal=causal if causal else False, window=window, softcap=softcap)
        ref, ref_lse = attention_explicit(q, k, v, compute_dtype=torch.float64, **kw)
        same, _ = attention_explicit(q, k, v, compute_dtype=None, **kw)
        for var in VARIANTS[D]:
            if names and var.name not in names:
                continue
            out = torch.full((B, Hq, Nq, D), float("nan"), device="cuda", dtype=dtype)
            lse = torch.full((B, Hq, Nq), float("nan"), device="cuda") if lse_on else None
            try:
                launch(var, q, k, v, out, lse, causal, D ** -0.5, window or (-1, -1), softcap)
                torch.cuda.synchronize()
            except Exception as exc:
                print(f"ERROR {var.name} {case}: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
                ok = False
                continue
            verdicts = [compare("out", out, ref, same, dtype)]
            if lse_on:
                verdicts.append(compare("lse", lse, ref_lse, ref_lse.float(), torch.float32))
            for vd in verdicts:
                ok &= vd.passed
                if not vd.passed:
                    print(f"FAIL {var.name} {vd.what} {case[:8]} err={vd.max_err:.2e} tol={vd.tol:.2e}", flush=True)
    return ok


def timing(ns, dims, causals, names, article=False, graphs=False, rounds=1) -> None:
    # Shapes of the fa / d256 sweeps (16k tokens, 2048 / D heads), or with `article`
    # the article sweep's (B = 1, H = 16: few work tiles). Each of `rounds` rounds
    # times every candidate once, odd rounds in reverse order: under the board's
    # power cap a candidate's figure depends on when it runs (NOTES session 15: a
    # 5-12 % dip about 0.8 s into sustained load), so one pass in a fixed order
    # is not evidence for a few per cent.
    gemm_warmup()
    sms = ops._sm_count(0)
    for d, causal, n in itertools.product(dims, causals, ns):
        s = Shape(1, 16, 16, n, n, d, causal) if article else Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, causal)
        q = torch.randn(s.B, s.Hq, s.Nq, s.D, device="cuda", dtype=torch.float16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        out = torch.empty_like(q)
        flops = attention_flops(s)
        mode = "bottom_right" if causal else None
        portable = ops.default_config(d, q.dtype)
        if not causal:
            split = ops.default_config(d, q.dtype, "split")
            if split.split and s.B * s.Hq * -(-n // split.block_m) >= sms:
                portable = split
        cands = [(name, lambda cfg=cfg: ops.attention_forward(q, k, v, causal=mode, scale=d ** -0.5, window=(-1, -1),
                                                               softcap=None, return_lse=False, config=cfg))
                 for name, cfg in (("launcher", None), ("portable", portable))]
        for var in VARIANTS[d]:
            if names and var.name not in names:
                continue
            cands.append((var.name, lambda var=var: launch(var, q, k, v, out, None, mode, d ** -0.5, (-1, -1), None)))
        cands += sdpa_calls(q, k, v, causal)
        label = f"D{d} causal={causal:d} N{n}{' B1 H16' if article else ''}"
        for r in range(rounds):
            res = sorted(tflops(cands[::-1] if r % 2 else cands, flops, graphs),
                         key=lambda x: [nm for nm, _ in cands].index(x[0].split("!")[0]))
            print(f"{label}{f' r{r + 1}' if rounds > 1 else ''}: " + "  ".join(f"{nm}:{tf:.0f}" for nm, tf in res),
                  flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--variants", default="", help="comma-separated variant names to time (default: all)")
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--article", action="store_true", help="time the article sweep's shapes (B = 1, H = 16)")
    ap.add_argument("--rounds", type=int, default=1, help="time every candidate this many times, alternating order")
    ap.add_argument("--graphs", action="store_true",
                    help="time each candidate's CUDA graph: short calls then time the kernel, not Python's launch")
    a = ap.parse_args()
    dims = [int(x) for x in a.dims.split(",")]
    names = set(a.variants.split(",")) - {""}
    ok = True
    if not a.time_only:
        ok = check(dims, names)
        print("CHECK", "PASS" if ok else "FAIL", flush=True)
    timing([int(x) for x in a.n.split(",")], dims, [bool(int(c)) for c in a.causal.split(",")], names, a.article,
           a.graphs, a.rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
