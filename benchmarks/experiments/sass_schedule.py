"""Issue 4 tool: what ptxas made of the Hopper kernel's key-tile loop, without a GPU.

Compiles attention_fwd_hopper_kernel for sm_90 (ops/hopper.compile_sm90, the
interpreter off), disassembles the cubin with the cuobjdump that Triton ships, and
prints for each innermost loop of the consumers (one per consumer and masking
kind): its instruction count, spill instructions (local memory), PRMTs, the span
of its MUFU.EX2s, and where the PV wait (WARPGROUP.DEPBAR.LE gsb0, 0x0) sits.
LATE_PV_WAIT exists because ptxas hoisted that wait above the softmax
(benchmarks/NOTES.md session 7, lead h); --check exits 1 unless every loop of a
late_pv_wait build has its wait after its last MUFU.EX2, and unless no loop holds a
PRMT (the byte shuffles ptxas put before each PV product while P was carried as
16-bit values: 32 a key tile, 7 % of the loop, NOTES session 9).

CPU:  PYTHONPATH=src python3 benchmarks/experiments/sass_schedule.py [--check] [--variants "[dict(...)]"]
"""

import argparse
import os
import re
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "0"  # Gluon compiles only with the interpreter off

import torch  # noqa: E402

from vflash.ops import hopper  # noqa: E402

DEFAULT_VARIANTS = [
    dict(head_dim=64, block_m=192, q_buffers=2, pingpong=True, lse=False),
    dict(head_dim=64, block_m=192, q_buffers=2, pingpong=True, lse=False, late_pv_wait=True),
    dict(head_dim=128, q_buffers=2, lse=False),
    dict(head_dim=128, q_buffers=2, lse=False, late_pv_wait=True),
    dict(head_dim=128, causal=True, p_fp32=True, late_pv_wait=True),
    dict(head_dim=256, block_n=64, causal=True, late_pv_wait=True),
]


def sass(kernel) -> str:
    tool = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "cuobjdump")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"vflash_sass_{os.getpid()}.cubin")
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    try:
        return subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.remove(path)


def inner_loops(text: str):
    """[(instructions, stats)] for the innermost loops of a SASS listing: a loop is
    a backward branch spanning more than 64 instructions (shorter ones are the
    mbarrier spin-waits) with no such loop inside it."""
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    loops = []
    for addr, op in ins:
        m = re.search(r"\bBRA\s+(?:`\()?(0x[0-9a-f]+)", op)
        if m and int(m.group(1), 16) < addr - 64 * 16:
            loops.append((int(m.group(1), 16), addr))
    inner = [(s, e) for s, e in loops
             if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in loops)]
    out = []
    for s, e in sorted(set(inner)):
        body = [op for addr, op in ins if s <= addr <= e]
        mufu = [i for i, op in enumerate(body) if "MUFU.EX2" in op]
        out.append(dict(instructions=len(body), spills=sum(bool(re.search(r"\b(STL|LDL)\b", op)) for op in body),
                        prmt=sum("PRMT" in op for op in body), mufu=(mufu[0], mufu[-1]) if mufu else None,
                        pv_wait=[i for i, op in enumerate(body) if "DEPBAR.LE gsb0, 0x0" in op]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", help="a Python list of compile_sm90 keyword dicts")
    ap.add_argument("--check", action="store_true",
                    help="fail unless late_pv_wait builds wait after the softmax and no loop has a PRMT")
    a = ap.parse_args()
    ok = True
    for kw in eval(a.variants) if a.variants else DEFAULT_VARIANTS:
        kw = dict(kw, dtype=torch.float16) if "dtype" not in kw else kw
        loops = [lp for lp in inner_loops(sass(hopper.compile_sm90(**kw))) if lp["mufu"]]
        print({k: v for k, v in kw.items() if k != "dtype"})
        for lp in loops:
            late = bool(lp["pv_wait"]) and min(lp["pv_wait"]) > lp["mufu"][1]
            print(f"  loop: {lp['instructions']} instructions, {lp['spills']} spill, {lp['prmt']} PRMT, "
                  f"MUFU.EX2 at {lp['mufu'][0]}-{lp['mufu'][1]}, PV wait at {lp['pv_wait']}"
                  f" ({'after' if late else 'before'} the exponentials)")
            if (kw.get("late_pv_wait") and not late) or lp["prmt"]:
                ok = False
        if not loops:
            print("  no key-tile loop found")
            ok = False
    print("CHECK", "PASS" if ok else "FAIL")
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
