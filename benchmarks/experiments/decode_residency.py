"""Decode's compiled builds on the GPU: registers, shared memory and the programs an SM holds, beside
the output against the paged reference.

For each row (B:KV, bf16, Hq 32 / Hkv 8, D 128 or --head-dim, one query a sequence) and cache (pages of 16 and 64
shuffled, contiguous), one `attention_with_kvcache` call with the dispatch's tiles, its max error against
the gathered reference (reference.paged, fp32; a contiguous cache as one page a sequence), and every compiled build of
the kernels the call launches (attention_kvcache_kernel) so far: its stages, registers, shared bytes and the
programs an SM holds by both (the occupancy that dispatch/tables.KVCACHE_WAVES assumes), printed after the call
that compiled it.

  PYTHONPATH=src python3 -m benchmarks.experiments.decode_residency [--rows 64:8192 128:1024 ...]
"""

import argparse

import torch

import vflash
from benchmarks.experiments.common import decode_inputs
from vflash import dispatch
from vflash.harness import lab
from vflash.reference import attention_with_kvcache_reference

REG_FILE, SMEM_PER_SM, SMEM_RESERVED = 65536, 228 * 1024, 1024


def builds(kernels):
    """(kernel name, stages, registers, shared bytes, programs an SM) of every build of these @triton.jit
    kernels (their launches' .kernel) compiled so far."""
    out = []
    for fn in kernels:
        for caches in fn.device_caches.values():
            for kernel in caches[0].values():
                threads = 32 * kernel.metadata.num_warps
                regs = -(-kernel.n_regs // 8) * 8  # allocated a warp at a time, 8 a thread
                per_sm = min(REG_FILE // (regs * threads), SMEM_PER_SM // (kernel.metadata.shared + SMEM_RESERVED))
                out.append((fn.__name__, kernel.metadata.num_stages, kernel.n_regs, kernel.metadata.shared, per_sm))
    return sorted(set(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="*", default=["48:8192", "64:1024", "64:8192", "128:1024", "128:8192"])
    ap.add_argument("--head-dim", type=int, default=128, help="D (Hq 32 / Hkv 8 at every D)")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    Hq, Hkv, D = 32, 8, args.head_dim
    seen = set()
    for row in args.rows:
        B, KV = (int(x) for x in row.split(":"))
        for page in (16, 64, 0):
            q, kc, vc, table, seqlens = decode_inputs(B, KV, page, (Hq, Hkv, D), dev, dt)
            out = vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table)
            ref_table = table if page else torch.arange(B, dtype=torch.int32, device=dev)[:, None]
            ref, _ = attention_with_kvcache_reference(q.view(B, Hq, D), kc, vc, seqlens, ref_table,
                                                      torch.arange(B + 1, dtype=torch.int32, device=dev))
            err = float((out.view(B, Hq, D).float() - ref).abs().max())
            layout = lab.Cache(seqlens, table if page else None, None, 1, None, False, False, tuple(q.shape))
            tiles = dispatch.choose(lab.Call(q.view(B, Hq, D), kc, vc, layout,
                                             lab.sequence_band("bottom_right", (-1, -1)), lab.Score(D ** -0.5),
                                             False)).tiles
            print(f"B {B:4d} KV {KV:6d} D {D} page {page:3d}: stages {tiles.num_stages} splits {tiles.num_splits} "
                  f"chunk {tiles.split_chunk}, max err {err:.2e}", flush=True)
            launched = lab.captured_launches(lambda: vflash.attention_with_kvcache(
                q, kc, vc, seqlens, block_table=table, check_metadata=False))
            for build in builds({launch.kernel for launch in launched}):  # the builds this call compiled
                if build not in seen:
                    seen.add(build)
                    name, stages, regs, shared, per_sm = build
                    print(f"  build of {name}: {stages} stages, {regs} registers, {shared} B shared -> {per_sm} "
                          "programs an SM")
            del kc, vc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
