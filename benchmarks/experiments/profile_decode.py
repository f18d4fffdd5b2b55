"""Decode's kernels one launch at a time, for Nsight Compute: where a split decode call's time goes.

Runs attention_with_kvcache on one decode row (bf16, Hq 32 / Hkv 8, D 128, one query a sequence, a
shuffled paged cache) a few times; under `ncu` each launch (the split kernel, which merges its splits
itself) is measured on its own (duration, DRAM bytes and throughput), apart from the host and the graph
overheads the CUDA-graph timing of `vflash bench --sweep decode` includes.

  ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
      python3 -m benchmarks.experiments.profile_decode --b 1 --kv 8192 [--page 16] [--method paged]
"""

import argparse

import torch

import vflash
from vflash.harness.serving import _sdpa_call, _shuffled_table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--kv", type=int, default=8192)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--method", default="paged", choices=["paged", "contiguous", "sdpa_cudnn"],
                    help="vflash on a paged or contiguous cache, or SDPA cuDNN on the contiguous one")
    args = ap.parse_args()
    dev = torch.device("cuda")
    Hq, Hkv, D = 32, 8, 128
    pages = -(-args.kv // args.page)
    k = torch.randn(args.b * pages, args.page, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    table = _shuffled_table(args.b, pages, dev)
    seqlens = torch.full((args.b,), args.kv, dtype=torch.int32, device=dev)
    q = torch.randn(args.b, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    if args.method == "paged":
        def call():
            vflash.attention_with_kvcache(q, k, v, seqlens, block_table=table, check_metadata=False)
    else:
        kc = torch.randn(args.b, args.kv, Hkv, D, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        if args.method == "contiguous":
            def call():
                vflash.attention_with_kvcache(q, kc, vc, seqlens, check_metadata=False)
        else:
            call = _sdpa_call("sdpa_cudnn", q, kc, vc)
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print(f"B {args.b} KV {args.kv} {args.method} (page {args.page}): {args.calls} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
