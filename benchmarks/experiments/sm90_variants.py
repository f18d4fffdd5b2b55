"""Issue 4 experiment: schedule variants of the Gluon sm90 kernel, each checked
against the fp64 oracle on common.CASES of its head dim (with the launcher's own
Hopper tiles, "launcher"), then timed against the launcher's choice, the portable
kernel and SDPA cuDNN / flash in the same run.

A variant sets the kernel's tiles and grid directly: block_m 64 / 128 / 192 (one,
two or three consumer warpgroups), block_n, ring stages, persist (a persistent
grid rather than one CTA per work tile) and ctas, the persistent grid's size
(default: the SM count; with causal work, a size that shares no factor with the
row blocks per head cycles each CTA through all of them instead of fixing its row
block). A switch a variant leaves open (None) takes the launcher's table entry
for the head dim and mask (vflash.dispatch.tables.SM90).

`--variants launcher` checks and times the launcher's choice alone (with the
portable kernel and SDPA): the Hopper path as users get it.

GPU only:  PYTHONPATH=src:. python3 -m benchmarks.experiments.sm90_variants [--dims 64,128] [--n 1024,4096]
"""

import argparse
import dataclasses
import itertools
import sys
from typing import NamedTuple, Optional

import torch

from benchmarks.experiments.common import CASES, make, require_cuda, sdpa_calls, sm_count, tflops
from vflash import dispatch
from vflash.dispatch import tables
from vflash.harness import lab
from vflash.harness.bench import Shape, attention_flops
from vflash.harness.lab import Band, Sm90Tiles, attention_forward, mask_band
from vflash.harness.oracle import compare
from vflash.harness.timing import gemm_warmup
from vflash.reference import attention_explicit
from vflash.harness.lab import Call, Score


class Variant(NamedTuple):
    name: str
    block_m: int
    block_n: int
    stages: int
    persist: Optional[bool] = None  # None: the launcher's rule (lab.sm90_grid)
    ctas: Optional[int] = None  # persistent grid size; None: the SM count
    q_buffers: Optional[int] = None  # Q buffers per consumer; None: the launcher's (tables.SM90)
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


def variant_tiles(var: Variant, head_dim: int, right_edge: bool) -> Sm90Tiles:
    """The variant's Sm90Tiles: its own fields over the launcher's table entry
    for the head dim and mask (tables.SM90)."""
    base = tables.SM90[(head_dim, right_edge)]

    def pick(value, default):
        return default if value is None else value
    return Sm90Tiles(var.block_m, var.block_n, var.stages, q_buffers=pick(var.q_buffers, base.q_buffers),
                       pingpong=pick(var.pingpong, base.pingpong), p_fp32=pick(var.p_fp32, base.p_fp32),
                       late_pv_wait=pick(var.late, base.late_pv_wait), lazy_rescale=pick(var.lazy, base.lazy_rescale),
                       ctas_per_sm=var.per_sm or (2 if var.block_m == lab.CONSUMER_ROWS else 1),
                       dynamic=var.dynamic)


def variant_launch(var: Variant, q, k, v, out, lse, band: Band, scale, softcap, sms: int) -> lab.KernelLaunch:
    """The kernel launch of a variant: the launcher's build with the variant's
    tiles, and its grid where the variant sets one (persist)."""
    B, Hq, Nq, D = q.shape
    tiles = variant_tiles(var, D, band.has_right)
    counter = q.new_zeros(1, dtype=torch.int32) if tiles.dynamic else None
    launch = lab.sm90_launch(q, k, v, out, lse, counter, band, Score(scale, softcap), tiles, sms)
    if var.persist is not None:
        work = B * Hq * -(-Nq // var.block_m)
        grid = (min(work, var.ctas or sms * tiles.ctas_per_sm) if var.persist else work, 1, 1)
        launch = dataclasses.replace(launch, grid=grid)
    return launch


def launch(var: Variant, q, k, v, out, lse, causal, scale, window, softcap):
    band = mask_band(q.shape[2], k.shape[2], causal, window)
    lab.run_launch(variant_launch(var, q, k, v, out, lse, band, scale, softcap, sm_count(q.device)), q.device)
    return out


def launcher_tiles(q, k, v, causal, window):
    """The launcher's choice of the sm90 kernel's tiles for this call (raises
    where the sm90 kernel cannot take it)."""
    band = mask_band(q.shape[2], k.shape[2], causal, window)
    return band, dispatch.select(dispatch.problem_of(Call(q, k, v, None, band, Score(1.0), False)), kernel="sm90").tiles


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
        win = window or (-1, -1)
        runs = [(var.name, lambda o, lse, var=var: launch(var, q, k, v, o, lse, causal, D ** -0.5, win, softcap))
                for var in VARIANTS[D] if not names or var.name in names]
        if not names or "launcher" in names:
            def run_launcher(o, lse):
                band, tiles = launcher_tiles(q, k, v, causal, win)
                attention_forward(q, k, v, band=band, score=Score(D ** -0.5, softcap), return_lse=lse is not None,
                                  tiles=tiles, out=o, lse=lse)
            runs.insert(0, ("launcher", run_launcher))
        for name, run in runs:
            out = torch.full((B, Hq, Nq, D), float("nan"), device="cuda", dtype=dtype)
            lse = torch.full((B, Hq, Nq), float("nan"), device="cuda") if lse_on else None
            try:
                run(out, lse)
                torch.cuda.synchronize()
            except Exception as exc:
                print(f"ERROR {name} {case}: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
                ok = False
                continue
            verdicts = [compare("out", out, ref, same, dtype)]
            if lse_on:
                verdicts.append(compare("lse", lse, ref_lse, ref_lse.float(), torch.float32))
            for vd in verdicts:
                ok &= vd.passed
                if not vd.passed:
                    print(f"FAIL {name} {vd.what} {case[:8]} err={vd.max_err:.2e} tol={vd.tol:.2e}", flush=True)
    return ok


def timing(ns, dims, causals, names, article=False, graphs=False, rounds=1) -> None:
    # Shapes of the fa / d256 sweeps (16k tokens, 2048 / D heads), or with `article`
    # the article sweep's (B = 1, H = 16: few work tiles). Each of `rounds` rounds
    # times every candidate once, odd rounds in reverse order: under the board's
    # power cap a candidate's figure depends on when it runs (a 5-12 % dip about 0.8 s
    # into sustained load: docs/performance.md, the power cap), so one pass in a fixed
    # order is not evidence for a few per cent.
    gemm_warmup()
    for d, causal, n in itertools.product(dims, causals, ns):
        s = Shape(1, 16, 16, n, n, d, causal) if article else Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, causal)
        q = torch.randn(s.B, s.Hq, s.Nq, s.D, device="cuda", dtype=torch.float16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        out = torch.empty_like(q)
        flops = attention_flops(s)
        mode = "bottom_right" if causal else None
        band = mask_band(n, n, mode, (-1, -1))
        problem = dispatch.problem_of(Call(q, k, v, None, band, Score(1.0), False))
        # the launcher's choice (whichever kernel) and the portable kernel's tiles for this call
        chosen = [("launcher", dispatch.select(problem).tiles),
                  ("portable", dispatch.select(problem, kernel="portable").tiles)]
        cands = [(name, lambda t=t: attention_forward(q, k, v, band=band, score=Score(d ** -0.5, None),
                                                      return_lse=False, tiles=t))
                 for name, t in chosen]
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
    ap.add_argument("--variants", default="", help="comma-separated variant names to check and time (default: all; "
                    "'launcher': the launcher's own Hopper tiles)")
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--article", action="store_true", help="time the article sweep's shapes (B = 1, H = 16)")
    ap.add_argument("--rounds", type=int, default=1, help="time every candidate this many times, alternating order")
    ap.add_argument("--graphs", action="store_true",
                    help="time each candidate's CUDA graph: short calls then time the kernel, not Python's launch")
    a = ap.parse_args()
    if not require_cuda("sm90_variants"):
        return 1
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
