"""Which feature of the FP8 varlen check case makes the sm90 kernel stop with an illegal instruction (session 50):
each variant of the case (vflash.harness.check's Fp8Case with lens) in its own process (a sticky CUDA error ends
the process), the sm90 kernel forced; one line per variant. Usage: python -m benchmarks.experiments.fp8_varlen_bisect
[--only NAME]"""

import argparse
import os
import subprocess
import sys

LENS = (1000, 1, 0, 127, 128, 129, 513, 3000, 64)
VARIANTS = {
    "case": dict(Hq=64, Hkv=8, D=64, lens=LENS, causal=True, window=(127, 0), sinks=True, descale="head"),
    "no_sinks": dict(Hq=64, Hkv=8, D=64, lens=LENS, causal=True, window=(127, 0), descale="head"),
    "no_window": dict(Hq=64, Hkv=8, D=64, lens=LENS, causal=True, sinks=True, descale="head"),
    "causal_only": dict(Hq=64, Hkv=8, D=64, lens=LENS, causal=True, descale="head"),
    "plain": dict(Hq=64, Hkv=8, D=64, lens=LENS, descale="head"),
    "plain_tensor": dict(Hq=8, Hkv=2, D=64, lens=LENS),
    "whole_tiles": dict(Hq=8, Hkv=2, D=64, lens=(128, 256, 384)),
    "two_1000": dict(Hq=8, Hkv=2, D=64, lens=(1000, 1000)),
    # the two suspects apart: a tail to zero from an aligned start, and aligned starts with tails
    "one_1000": dict(Hq=8, Hkv=2, D=64, lens=(1000,)),
    "aligned_starts": dict(Hq=8, Hkv=2, D=64, lens=(1008, 1000)),
    "d128_plain": dict(Hq=8, Hkv=2, D=128, lens=LENS),
    "d128_whole": dict(Hq=8, Hkv=2, D=128, lens=(128, 256)),
    "d128_causal_whole": dict(Hq=8, Hkv=2, D=128, lens=(128, 256), causal=True),
}


def one(name: str) -> None:
    import torch
    from vflash.harness.cases import Fp8Case
    kw = dict(VARIANTS[name])
    kw["lens"] = tuple((n, n) for n in kw["lens"])
    case = Fp8Case(**kw)
    verdicts = case.run(torch.device("cuda"))
    torch.cuda.synchronize()
    print(f"{name:<18} {'PASS' if all(v.passed for v in verdicts) else 'FAIL'} "
          + " ".join(f"{v.what} {v.max_err:.3e}/{v.tol:.3e}" for v in verdicts), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args.one)
    env = dict(os.environ, VFLASH_KERNEL="sm90")
    for name in ([args.only] if args.only else VARIANTS):
        r = subprocess.run([sys.executable, "-m", "benchmarks.experiments.fp8_varlen_bisect", "--one", name],
                           env=env, capture_output=True, text=True, timeout=240)
        if r.returncode:
            tail = (r.stderr.strip().splitlines() or ["?"])
            err = next((l for l in reversed(tail) if "Error" in l), tail[-1])
            print(f"{name:<18} RAISED {err[:160]}", flush=True)
        else:
            print(r.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
