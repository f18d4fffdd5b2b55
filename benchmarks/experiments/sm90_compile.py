"""The portable backward's launches compiled for sm_90 on a machine without a GPU: catches
what only the compiled path rejects (layouts, shared memory, Triton-version differences)
before device time is spent. Every launch the launcher makes for a set of features is
captured on the compiled path, then compiled for sm_90 from its own arguments
(vflash.harness.lab: compiled_path, captured_launches, compile_launch_sm90).

  PYTHONPATH=src python3 -m benchmarks.experiments.sm90_compile [--tiles all] [--spills]

--spills: each compiled launch's registers and spill bytes from ptxas -v (sm_90a): a tile
that spills is a lead to time, before device time is spent.
"""

import argparse
import itertools
import os
import re
import subprocess
import tempfile
import time

import torch

from benchmarks.experiments import common
from vflash import dispatch
from vflash.harness import lab
from vflash.harness.lab import BackwardLaunch, BackwardTiles, mask_band

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def spills(compiled) -> str:
    """'R regs, S/L B spilled' from ptxas -v on the compiled launch's PTX (the ptxas Triton ships)."""
    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(compiled.asm["ptx"])
        err = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", err)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", err)
    if not regs or not spill:
        return "ptxas: " + err.strip()[-200:]
    return f"{regs.group(1)} regs, {spill.group(1)}/{spill.group(2)} B spilled (stores/loads)"


def backward_launches(d, causal, window, softcap, dtype, tiles, hq=4, hkv=2, n=300):
    q = torch.randn(1, hq, n, d, dtype=dtype)
    k = torch.randn(1, hkv, n, d, dtype=dtype)
    v, do, out = torch.randn_like(k), torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(1, hq, n)
    return common.backward_launches(do, q, k, v, out, lse, mask_band(n, n, causal, window), d ** -0.5, softcap,
                                    tiles)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiles", default="table", help="table: the dispatch table's; all: bwd_tune's candidates too")
    ap.add_argument("--spills", action="store_true", help="registers and spills of each launch (ptxas -v)")
    args = ap.parse_args()
    with lab.compiled_path():  # the launches a GPU would compile, from CPU tensors
        return compile_all(args.tiles, args.spills)


def compile_all(which: str, with_spills: bool) -> int:
    features = [(None, (-1, -1), None), ("bottom_right", (-1, -1), None), (None, (64, 32), 20.0)]
    failures = 0
    for d, dtype in itertools.product((64, 128, 256), (torch.bfloat16, torch.float16)):
        problem = dispatch.Problem(dtype, d, 1, 4, 300, 300, mask_band(300, 300, None, (-1, -1)),
                                   torch.device("cuda"), False)
        table = dispatch.backward_tiles(problem)
        candidates = [table]
        if which == "all":
            from benchmarks.experiments.bwd_tune import DKDV, DQ
            candidates += [BackwardTiles(BackwardLaunch(*a), BackwardLaunch(*b)) for a, b in zip(DKDV, DQ)]
        for tiles, (causal, window, softcap) in itertools.product(candidates, features):
            for launch in backward_launches(d, causal, window, softcap, dtype, tiles):
                t0 = time.time()
                try:
                    compiled = lab.compile_launch_sm90(launch)
                    status = "ok" + (f", {spills(compiled)}" if with_spills else "")
                except Exception as e:  # noqa: BLE001 - report every failure, go on
                    status, failures = f"FAILED {type(e).__name__}: {str(e)[:300]}", failures + 1
                print(f"D{d} {_DTYPES[dtype]} causal={causal} window={window} softcap={softcap} "
                      f"{launch.kernel.__name__} {launch.constexprs.get('BLOCK_M')}x"
                      f"{launch.constexprs.get('BLOCK_N')} {launch.options}: {status} ({time.time() - t0:.1f} s)",
                      flush=True)
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
