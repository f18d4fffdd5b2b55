"""What the serving calls' default metadata checks cost (issue 22: checks cheap enough to stay on).
For rows (B, KV; bf16, Hq 32 / Hkv 8, D 128), the wall time of a checked call (the default) and of an
unchecked one, each synchronized after every round of 50 calls (the kernel's time included; the check's
sync keeps the host from running ahead), for: attention_with_kvcache decode on a shuffled paged cache
(pages of 16), a contiguous cache and packed queries (cu_seqlens_q, one query a sequence);
write_kvcache of a decode step's B tokens at shuffled slots of that paged cache (`write`); and
attention_varlen over B causal sequences of 128 tokens (`varlen128`). Run against the library on
PYTHONPATH (an A/B: the tree before the change, then after), one CSV row per call kind; --kinds picks.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.check_cost --label new [--out check_cost_new.csv]
"""

import argparse

import torch

import vflash
from benchmarks.experiments.common import decode_inputs, require_cuda, write_rows
from vflash.harness.serving import DECODE_HEADS
from vflash.harness.timing import wall_us

ROWS = ["1:1024", "1:8192", "8:8192", "32:1024", "128:1024", "128:32768"]
KINDS = ["paged16", "contiguous", "paged16_packed", "write", "varlen128"]
PAGE = 16  # the paged kinds' page size
VARLEN_TOKENS = 128  # each sequence's length in the varlen kind: a short prefill, where a check weighs most


def calls(b: int, kv: int, dev: torch.device, dtype: torch.dtype, heads) -> dict:
    """The call kinds of a row: name -> call(checked)."""
    hq, hkv, d = heads
    q, *paged, table, seqlens = decode_inputs(b, kv, PAGE, heads, dev, dtype)
    contiguous = decode_inputs(b, kv, 0, heads, dev, dtype)[1:3]
    cu = torch.arange(b + 1, dtype=torch.int32, device=dev)
    k_new = torch.randn(b, hkv, d, device=dev, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    # b distinct slots of the paged cache (its pages x page rows)
    slots = torch.randperm(paged[0].shape[:2].numel(), generator=g)[:b].to(torch.int32).to(dev)
    qv = torch.randn(b * VARLEN_TOKENS, hq, d, device=dev, dtype=dtype)
    kvv = torch.randn(b * VARLEN_TOKENS, hkv, d, device=dev, dtype=dtype)
    cu_v = torch.arange(0, b * VARLEN_TOKENS + 1, VARLEN_TOKENS, dtype=torch.int32, device=dev)
    return {
        "paged16": lambda checked: vflash.attention_with_kvcache(q, *paged, seqlens, block_table=table,
                                                                  check_metadata=checked),
        "contiguous": lambda checked: vflash.attention_with_kvcache(q, *contiguous, seqlens, check_metadata=checked),
        "paged16_packed": lambda checked: vflash.attention_with_kvcache(
            q[:, 0], *paged, seqlens, block_table=table, cu_seqlens_q=cu, max_seqlen_q=1, check_metadata=checked),
        "write": lambda checked: vflash.write_kvcache(*paged, k_new, k_new, slots, check_metadata=checked),
        "varlen128": lambda checked: vflash.attention_varlen(qv, kvv, kvv, cu_v, cu_v, VARLEN_TOKENS, VARLEN_TOKENS,
                                                             causal=True, check_metadata=checked),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True, help="the tree's name in the CSV")
    ap.add_argument("--out", default="check_cost.csv")
    ap.add_argument("--rows", nargs="*", default=ROWS, help="B:KV")
    ap.add_argument("--kinds", nargs="*", default=None, help=f"call kinds (default all: {', '.join(KINDS)})")
    args = ap.parse_args()
    if not require_cuda("check_cost"):
        return 0
    dev, dtype = torch.device("cuda"), torch.bfloat16
    out_rows = []
    for row in args.rows:
        b, kv = (int(x) for x in row.split(":"))
        cases = calls(b, kv, dev, dtype, DECODE_HEADS)
        if args.kinds:
            cases = {name: cases[name] for name in args.kinds}
        for name, call in cases.items():
            call(True), call(False)  # compiles, plans
            checked = wall_us(lambda: call(True))
            unchecked = wall_us(lambda: call(False))
            out_rows.append(dict(label=args.label, B=b, KV=kv, cache=name, checked_wall_us=round(checked, 2),
                                 unchecked_wall_us=round(unchecked, 2), check_us=round(checked - unchecked, 2)))
            print(f"{args.label:6s} B {b:4d} KV {kv:6d} {name:15s} checked {checked:9.2f} us  unchecked "
                  f"{unchecked:9.2f} us  check {checked - unchecked:8.2f} us", flush=True)
    write_rows(args.out, out_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
