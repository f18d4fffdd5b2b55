"""Decode's kernels one launch at a time, for Nsight Compute: where a split decode call's time goes.

Runs attention_with_kvcache on one decode row (bf16, Hq 32 / Hkv 8, D 128, one query a sequence, a
shuffled paged cache) a few times; under `ncu` each launch (the split kernel, which merges its splits
itself) is measured on its own (duration, DRAM bytes and throughput), apart from the host and the graph
overheads the CUDA-graph timing of `vflash bench --sweep decode` includes.

  ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
      python3 -m benchmarks.experiments.profile_decode --b 1 --kv 8192 [--page 16] [--method paged] [--sinks] [--fp8]
"""

import argparse

import torch

import vflash
from benchmarks.experiments.common import decode_inputs
from vflash.harness.serving import DECODE_HEADS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--kv", type=int, default=8192)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--method", default="paged", choices=["paged", "contiguous", "sdpa_cudnn"],
                    help="vflash on a paged or contiguous cache, or SDPA cuDNN on the contiguous one")
    ap.add_argument("--sinks", action="store_true", help="vflash with a sink logit a query head")
    ap.add_argument("--fp8", action="store_true", help="vflash on e4m3 caches (a descale a KV head)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    page = args.page if args.method == "paged" else 0
    q, kc, vc, table, seqlens = decode_inputs(args.b, args.kv, page, DECODE_HEADS, dev)
    if args.method == "sdpa_cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)  # [B, H, N, D] views

        def call():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    else:
        sinks = torch.randn(q.shape[-2], device=dev) if args.sinks else None
        descales = {}
        if args.fp8:  # as the decode sweep's _fp8 methods: e4m3 caches, a descale a KV head
            kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
            descales = dict(k_descale=torch.full((kc.shape[-2],), 0.5, device=dev),
                            v_descale=torch.full((kc.shape[-2],), 0.5, device=dev))

        def call():
            vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False, sinks=sinks,
                                          **descales)
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print(f"B {args.b} KV {args.kv} {args.method}" + (f" (page {page})" if page else "")
          + (" sinks" if args.sinks else "") + (" fp8 cache" if args.fp8 else "")
          + f": {args.calls} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
