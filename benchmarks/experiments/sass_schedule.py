"""Issue 4 tool: what ptxas made of the sm90 kernel's key-tile loop, without a GPU.

Compiles attention_fwd_sm90_kernel for sm_90 (vflash.harness.lab.compile_sm90_forward,
the interpreter off), disassembles the cubin with the cuobjdump that Triton ships, and
prints for each innermost loop of the consumers (one per consumer and masking
kind): its instruction count, spill instructions (local memory), PRMTs, the span
of its MUFU.EX2s, and where the PV wait (WARPGROUP.DEPBAR.LE gsb0, 0x0) sits.
LATE_PV_WAIT exists because ptxas hoisted that wait above the softmax (lead h
in docs/perf/log.md); --check exits 1 unless every loop of a late_pv_wait build
has its wait after its last MUFU.EX2, and unless no loop holds a PRMT (the byte
shuffles ptxas put before each PV product while P was carried as 16-bit values:
32 a key tile, 7 % of the loop).

A variant is a dict: head_dim, and optionally dtype, causal (a right mask edge),
window_left (a left one), softcap, lse, and any Sm90Tiles field (block_m,
block_n, stages, q_buffers, pingpong, p_fp32, late_pv_wait, lazy_rescale,
ctas_per_sm, dynamic) over Sm90Tiles(128, 128, 2) -- or, with table=True, over
the launcher's table entry for the head dim and mask (tables.SM90).

CPU:  PYTHONPATH=src:. python3 -m benchmarks.experiments.sass_schedule [--check] [--variants "[dict(...)]"]
      (TRITON_INTERPRET unset or 0: Gluon compiles only with the interpreter off)
"""

import argparse
import ast
import os
import re
import subprocess
import sys

import torch

from vflash.dispatch import tables
from vflash.harness import lab
from vflash.harness.lab import Sm90Tiles

BUILD_OPTIONS = ("dtype", "softcap", "lse")  # compile_sm90_forward's own keywords, passed through

DEFAULT_VARIANTS = [
    dict(head_dim=64, block_m=192, q_buffers=2, pingpong=True, lse=False),
    dict(head_dim=64, block_m=192, q_buffers=2, pingpong=True, lse=False, late_pv_wait=True),
    dict(head_dim=128, q_buffers=2, lse=False),
    dict(head_dim=128, q_buffers=2, lse=False, late_pv_wait=True),
    dict(head_dim=128, causal=True, p_fp32=True, late_pv_wait=True),
    dict(head_dim=256, block_n=64, causal=True, late_pv_wait=True),
]


def compile_variant(variant: dict):
    """lab.compile_sm90_forward of one variant dict (see the module's docstring)."""
    kw = dict(variant)
    head_dim = kw.pop("head_dim")
    right_edge, left_edge = bool(kw.pop("causal", False)), bool(kw.pop("window_left", False))
    base = tables.SM90[(head_dim, right_edge)] if kw.pop("table", False) else Sm90Tiles(128, 128, 2)
    build = {name: kw.pop(name) for name in BUILD_OPTIONS if name in kw}
    unknown = set(kw) - set(Sm90Tiles._fields)
    if unknown:
        raise ValueError(f"unknown variant keys {sorted(unknown)}")
    return lab.compile_sm90_forward(head_dim, tiles=base._replace(**kw), right_edge=right_edge, left_edge=left_edge,
                                   **build)


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


def parse_variants(text: str) -> list:
    """--variants: a list of dict(...) calls or {...} literals, read without eval."""
    def value(node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
            return {kw.arg: value(kw.value) for kw in node.keywords}
        if isinstance(node, ast.Dict):
            return {value(k): value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            return getattr(torch, node.attr)  # torch.bfloat16
        return ast.literal_eval(node)
    tree = ast.parse(text, mode="eval").body
    if not isinstance(tree, ast.List):
        raise ValueError("--variants must be a list")
    return [value(x) for x in tree.elts]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", help="a Python list of variant dicts, e.g. \"[dict(head_dim=64, table=True)]\"")
    ap.add_argument("--check", action="store_true",
                    help="fail unless late_pv_wait builds wait after the softmax and no loop has a PRMT")
    a = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes"):
        ap.error("TRITON_INTERPRET is set: Gluon compiles only with the interpreter off")
    if not lab.HAVE_GLUON:
        ap.error("this Triton has no Gluon")
    ok = True
    for kw in parse_variants(a.variants) if a.variants else DEFAULT_VARIANTS:
        kw = dict(kw, dtype=torch.float16) if "dtype" not in kw else kw
        loops = [lp for lp in inner_loops(sass(compile_variant(kw))) if lp["mufu"]]
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
