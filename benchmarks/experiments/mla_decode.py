"""MLA decode on one latent cache (issue 55's speed rows), timed on the GPU beside the run's own yardsticks.

DeepSeek-V3's absorbed attention: q [B, Nq, Hq, 576] against a paged latent cache [pages, 64, 1, 576] with
v_cache = k_cache[..., :512] (a view of the same memory; vflash reads each tile's 512 shared columns once for
both products). Two kinds of row:

  memory-bound  Hq 16 (8-way tensor parallelism), B 32-128, KV 4k-32k: GB/s of the latent cache's bytes
                (B * KV * 576 * 2) and their share of the run's HBM read bandwidth (`hbm`, below); bar 0.80
  compute-bound Hq 128, B 32-128, KV 4k-8k: TFLOP/s counting 2 * (576 + 512) flops a query head and key;
                bar 550

`vflash` is the dispatch's choice, `vflash-portable` the portable KV-cache kernel's latent path forced (the
dispatch's tiles for it), `vflash-sm90` the sm90 MLA kernel (kernels/mla_decode_sm90.py) at the dispatch's tiles
and split count (runs before session 52 also timed a second schedule, `vflash-sm90-seesaw`).
Beside each row, in the same process: SDPA on the unpacked cache (K [B, 1, KV, 576], V [B, 1, KV, 512]
contiguous, `enable_gqa`, unmasked: with Nq > 1 it skips the last queries' few masked keys), each backend
that takes it ("sdpa-<backend>"), and vflash's own GQA decode
(`gqa-d128`: Hq heads over one KV head of D 128, the same B and KV, pages of 64: the decode path's GB/s
on its own cache). `hbm`: a read-only reduction (torch.sum over 4 GiB of bf16 in fp32) a run, GB/s.
CUDA-graph replays over rotating cache copies (vflash.harness.timing.graph_time, the decode sweep's protocol).

--tiles times the latent path's candidate tiles (rows a program, keys a tile, warps, stages: the table's
LATENT_ROWS and KVCACHE_LATENT) at every row through the launcher with its tiles forced, besides the
dispatch's. --smoke runs one tiny row of each kind on the CPU (the interpreter): a test of this script.

  PYTHONPATH=src python3 -m benchmarks.experiments.mla_decode [--out mla_decode.csv] [--rows mem|compute|all]
      [--tiles "32,32,8,2;16,64,4,2"] [--nq 1] [--smoke]
"""

import argparse
from typing import Callable, List, Optional, Tuple

import torch

from benchmarks.experiments.common import shuffled_table, write_rows
import vflash
from vflash import dispatch
from vflash.dispatch import tables
from vflash.harness.lab import Cache, Call, KVCacheTiles, Score, attention_kvcache_forward, sequence_band
from vflash.harness.timing import graph_time, rotating_copies

D_QK, D_V, PAGE = 576, 512, 64
MEMORY_ROWS = [(16, b, kv) for b in (32, 64, 128) for kv in (4096, 8192, 32768)]  # (Hq, B, KV)
COMPUTE_ROWS = [(128, b, kv) for b in (32, 64, 128) for kv in (4096, 8192)]
TILES = [(32, 32, 8, 2), (16, 32, 4, 2), (16, 64, 4, 2), (16, 64, 8, 2), (32, 32, 8, 3), (32, 64, 8, 2),
         (64, 32, 8, 2)]
MEMORY_BAR, FLOPS_BAR = 0.80, 550.0


def hbm_read_gbps(device: torch.device, gib: float = 4.0) -> float:
    """The run's HBM read bandwidth: a read-only reduction over `gib` GiB of bf16 (torch.sum in fp32)."""
    x = torch.ones(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    us = graph_time([lambda: x.sum(dtype=torch.float32)], device)[0]
    return x.numel() * 2 / us / 1e3


def _latent_inputs(hq: int, b: int, kv: int, nq: int, device: torch.device, copies: int, page: int = PAGE):
    pages = -(-kv // page)
    q = torch.randn(b, nq, hq, D_QK, device=device, dtype=torch.bfloat16)
    caches = [torch.randn(b * pages, page, 1, D_QK, device=device, dtype=torch.bfloat16) for _ in range(copies)]
    return q, caches, shuffled_table(b, pages, device), torch.full((b,), kv, dtype=torch.int32, device=device)


def _sdpa_calls(q, kc, table, seqlens, kv) -> List[Tuple[str, Callable]]:
    # SDPA on the unpacked cache, each backend that takes the shapes: K [B, 1, KV, 576], V [B, 1, KV, 512]
    b, nq, hq, _ = q.shape
    k = kc[table.long()].flatten(1, 2)[:, :kv].transpose(1, 2).contiguous()  # [B, 1, KV, 576]
    v = k[..., :D_V].contiguous()
    qh = q.transpose(1, 2)
    calls = []
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
        be = getattr(torch.nn.attention.SDPBackend, backend)

        def sdpa(be=be):
            with torch.nn.attention.sdpa_kernel([be]):
                return torch.nn.functional.scaled_dot_product_attention(qh, k, v, enable_gqa=True)
        calls.append(("sdpa-" + backend.split("_")[0].lower(), sdpa))
    return calls


def _time(calls: List[Callable], device: torch.device) -> Optional[float]:
    try:
        return graph_time(calls, device)[0]
    except Exception as exc:  # a backend that refuses the shapes, a tile out of shared memory
        print(f"    {type(exc).__name__}: {str(exc)[:100]}")
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="mla_decode.csv")
    ap.add_argument("--rows", choices=("mem", "compute", "all"), default="all")
    ap.add_argument("--tiles", nargs="?", const="", default=None,
                    help="time the latent path's candidate tiles (rows,keys,warps,stages; semicolon-separated; "
                         "empty: TILES)")
    ap.add_argument("--nq", type=int, default=1, help="new queries a sequence (1-4: speculative decoding)")
    ap.add_argument("--smoke", action="store_true", help="one tiny row of each kind on the CPU")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:
        rows = [(4, 2, 100), (32, 1, 70)]
    else:
        rows = (MEMORY_ROWS if args.rows in ("mem", "all") else []) + \
            (COMPUTE_ROWS if args.rows in ("compute", "all") else [])
    tiles = None if args.tiles is None else (
        [tuple(int(x) for x in t.split(",")) for t in args.tiles.split(";")] if args.tiles else TILES)
    if args.smoke and tiles is not None:
        tiles = tiles[:1]
    hbm = 0.0 if args.smoke else hbm_read_gbps(device)
    print(f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}: HBM read {hbm:.0f} GB/s",
          flush=True)
    out_rows = [dict(kind="hbm", Hq=0, B=0, KV=0, nq=0, method="hbm", tiles="", us=0.0, gbps=round(hbm, 1),
                     hbm_share=1.0, tflops=0.0)]
    band = sequence_band("bottom_right", (-1, -1))
    for hq, b, kv in rows:
        kind = "memory" if hq <= 16 else "compute"
        nq = args.nq
        cache_bytes = b * kv * D_QK * 2
        flops = 2.0 * (D_QK + D_V) * b * nq * hq * kv
        copies = 1 if args.smoke else rotating_copies(cache_bytes)
        q, caches, table, seqlens = _latent_inputs(hq, b, kv, nq, device, copies)

        def record(method: str, us: Optional[float], tiles_text: str = "", own_bytes: Optional[int] = None):
            if us is None:
                return
            gbps = (cache_bytes if own_bytes is None else own_bytes) / us / 1e3
            row = dict(kind=kind, Hq=hq, B=b, KV=kv, nq=nq, method=method, tiles=tiles_text, us=round(us, 2),
                       gbps=round(gbps, 1), hbm_share=round(gbps / hbm, 3) if hbm else 0.0,
                       tflops=round(flops / us / 1e6, 1) if own_bytes is None else 0.0)
            out_rows.append(row)
            print(f"{kind:7s} Hq {hq:3d} B {b:3d} KV {kv:6d} nq {nq} {method:18s} {tiles_text:14s} {us:9.2f} us "
                  f"{row['gbps']:7.1f} GB/s ({row['hbm_share']:.2f} of HBM) {row['tflops']:6.1f} TFLOP/s", flush=True)

        calls = [lambda kc=kc: vflash.attention_with_kvcache(q, kc, kc[..., :D_V], seqlens, block_table=table,
                                                               causal=True, check_metadata=False) for kc in caches]
        record("vflash", _time(calls, device))
        # the launcher's calls with tiles forced: the call as dispatch sees it, q as its (query, head) rows
        rows_q = q.flatten(0, 1)
        cached = Cache(seqlens, table, None, nq, None, False, False, tuple(q.shape))
        call = Call(rows_q, caches[0], caches[0][..., :D_V], cached, band, Score(D_QK ** -0.5), False)

        def forced(t) -> List[Callable]:
            return [lambda kc=kc: attention_kvcache_forward(rows_q, kc, kc[..., :D_V], seqlens, table, None, nq,
                                                             band=band, score=call.score, return_lse=False, tiles=t)
                    for kc in caches]
        portable = dispatch.choose(call, "portable").tiles  # the portable latent path at the dispatch's tiles
        record("vflash-portable", _time(forced(portable), device), f"{portable.block_m},{portable.block_n},"
               f"{portable.num_warps},{portable.num_stages} x{portable.num_splits}")
        if not args.smoke:  # the sm90 MLA kernel at the dispatch's tiles and split count
            t = dispatch.choose(call, "sm90").tiles
            record("vflash-sm90", _time(forced(t), device), f"{t.block_n},{t.stages} x{t.num_splits}")
        if tiles is not None:
            for cand in tiles:
                saved = tables.LATENT_ROWS, tables.KVCACHE_LATENT
                tables.LATENT_ROWS, tables.KVCACHE_LATENT = cand[0], KVCacheTiles(*cand)
                try:
                    chosen = dispatch.choose(call, "portable").tiles
                finally:
                    tables.LATENT_ROWS, tables.KVCACHE_LATENT = saved
                text = ",".join(map(str, cand))
                record("vflash-tiles", _time(forced(chosen), device), f"{text} x{chosen.num_splits}")
        if not args.smoke:
            for name, fn in _sdpa_calls(q, caches[0], table, seqlens, kv):
                record(name, _time([fn], device))
        caches = None
        # vflash's own GQA decode at the same B and KV: Hq heads over one KV head of D 128 (K and V caches)
        gq = torch.randn(b, nq, hq, 128, device=device, dtype=torch.bfloat16)
        pages = -(-kv // PAGE)
        gqa_bytes = 2 * b * kv * 128 * 2
        gcopies = 1 if args.smoke else rotating_copies(gqa_bytes)
        gcaches = [(torch.randn(b * pages, PAGE, 1, 128, device=device, dtype=torch.bfloat16),
                    torch.randn(b * pages, PAGE, 1, 128, device=device, dtype=torch.bfloat16)) for _ in range(gcopies)]
        gcalls = [lambda kc=kc, vc=vc: vflash.attention_with_kvcache(gq, kc, vc, seqlens, block_table=table,
                                                                      causal=True, check_metadata=False)
                  for kc, vc in gcaches]
        record("gqa-d128", _time(gcalls, device), own_bytes=gqa_bytes)
        gcaches = None
    write_rows(args.out, out_rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
