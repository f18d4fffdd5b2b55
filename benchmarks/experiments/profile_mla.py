"""MLA decode's sm90 kernel one launch at a time, for Nsight Compute (issue 55's compute-bound rows): runs
attention_with_kvcache on one latent-cache row (bf16, pages of 64, q [B, 1, Hq, 576], v the cache's first 512
columns) a few times; gpu_session.sh's profile_mla step profiles one launch of the MLA kernel with the full set.

  ncu --set full -k regex:mla_decode --launch-skip 2 --launch-count 1 \\
      python3 -m benchmarks.experiments.profile_mla --hq 128 --b 64 --kv 4096
"""

import argparse

import torch

import vflash
from benchmarks.experiments.mla_decode import D_V, _latent_inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hq", type=int, default=128)
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--kv", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=4)
    args = ap.parse_args()
    q, caches, table, seqlens = _latent_inputs(args.hq, args.b, args.kv, 1, torch.device("cuda"), 1)
    cache = caches[0]
    for _ in range(args.calls):
        vflash.attention_with_kvcache(q, cache, cache[..., :D_V], seqlens, block_table=table, causal=True,
                                      check_metadata=False)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
