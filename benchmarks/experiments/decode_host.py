"""Where a planned decode call's host time goes (issue 22's 20 us goal). For rows (B, KV; bf16, Hq 32 /
Hkv 8, D 128, a shuffled paged cache, `check_metadata=False`), vflash.harness.timing.per_call_us (the
stream stalled by a sleep kernel, so the calls only queue work) of: the whole `attention_with_kvcache`
call, and the call with `out=` (a buffer of its own: the plan allocates nothing); its plan key alone;
key and lookup; the plan's call (allocations, split scratch, launch); its allocations alone (and out's
as `new_empty` and as `empty_like` of q); its split scratch fetch (the plan's .scratch); its launch alone
on tensors allocated and fetched once. The split count the dispatch chose is printed beside them. Writes
a CSV.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.decode_host [--out decode_host.csv] [--rows B:KV ...]
"""

import argparse

import torch

import vflash
from benchmarks.experiments.common import decode_inputs, require_cuda, write_rows
from vflash.harness import lab
from vflash.harness.serving import DECODE_HEADS
from vflash.harness.timing import per_call_us

ROWS = ["1:1024", "1:32768", "8:8192", "32:1024", "128:1024", "128:32768"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="decode_host.csv")
    ap.add_argument("--rows", nargs="*", default=ROWS, help="B:KV")
    ap.add_argument("--page", type=int, default=16)
    args = ap.parse_args()
    if not require_cuda("decode_host"):
        return 0
    dev, dtype = torch.device("cuda"), torch.bfloat16
    out_rows = []
    for row in args.rows:
        b, kv = (int(x) for x in row.split(":"))
        q, kc, vc, table, seqlens = decode_inputs(b, kv, args.page, DECODE_HEADS, dev, dtype)
        # the key of the call below: its arguments by vflash.call.ATTENTION_KVCACHE's names (None where unset)
        given = dict(q=q, k_cache=kc, v_cache=vc, cache_seqlens=seqlens, block_table=table, causal=True,
                     batch_invariant=False, return_lse=False, check_metadata=False)
        key_args = tuple(given.get(name) for name in lab.ATTENTION_KVCACHE.names)

        def call():
            return vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False)

        def key():
            return lab.kvcache_plan_key(*key_args)

        out = torch.empty_like(q)

        def call_out():
            return vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False,
                                                 out=out)

        call()
        call_out()  # its own plan (out's metadata is in the key)
        k = key()
        plan = lab.lookup_plan(k)
        if plan is None:
            print(f"{row}: no plan recorded", flush=True)
            continue
        made = [q.new_empty(a.shape, dtype=a.dtype) for a in plan.allocs]
        fetch = plan.scratch or tuple  # split-KV's scratch, none unsplit
        scratch = fetch()
        pieces = [("call", call), ("call_out", call_out), ("key", key),
                  ("key_lookup", lambda: lab.lookup_plan(key())),
                  ("plan", lambda: plan(*key_args)),
                  ("allocs", lambda: [q.new_empty(a.shape, dtype=a.dtype) for a in plan.allocs]),
                  ("new_empty_q", lambda: q.new_empty(q.shape, dtype=q.dtype)),  # out as plans allocated it
                  ("empty_like_q", lambda: torch.empty_like(q)),  # as they do now where out is q's like
                  ("scratch", fetch),
                  ("launches", lambda: plan.launch(*key_args, *made, *scratch))]
        rec = dict(B=b, KV=kv, page=args.page, allocs=len(plan.allocs),
                   splits=scratch[0].shape[0] if scratch else 1)
        for name, fn in pieces:
            rec[f"{name}_us"] = round(per_call_us(fn, n=2000, rounds=10), 2)
        out_rows.append(rec)
        print(" ".join(f"{k}={v}" for k, v in rec.items()), flush=True)
    write_rows(args.out, out_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
