"""Decode tiles and split counts of attention_kvcache_kernel, timed on the GPU.

For a few decode rows (bf16, Hq 32 / Hkv 8, D 128, one query a sequence, a shuffled paged
cache of page size 16), every candidate tile (block_m, block_n, warps, stages) at the
dispatch's split count, then the best tile at other split counts. CUDA-graph replays over
rotating cache copies (vflash.harness.timing.graph_time, the decode sweep's protocol). Prints one line a
candidate and writes a CSV.

--grid: every row of the decode sweep (B 1-128 x KV 1k-32k), every GRID_TILES tile at every split
count that leaves a split at least 128 keys (and at most 16k programs), then the row's best tile on
pages of 64 and a contiguous cache; --rows / --tiles / --splits replace the grid's rows, tiles and
split counts. --head-dim sets D (default 128; Hq 32 / Hkv 8 at every D). --fp8 (not with --grid): e4m3 caches
with 0-d descales (GB/s then of their own bytes, half the bf16 cache's). --page (not with --grid): the page size
(default 16). A tile's optional fifth field, 1 or 0, sets one_loop (every key tile in one masked loop) whatever
the split count; without it the dispatch's choice for the row holds.

  PYTHONPATH=src python3 -m benchmarks.experiments.decode_tune [--out decode_tune.csv] [--quick | --grid]
      [--rows 1:8192,8:8192] [--tiles "16,64,4,3;16,128,4,2"] [--splits 16,32,48,64] [--head-dim 64] [--fp8] [--page 64]
"""

import argparse

import torch

from benchmarks.experiments.common import shuffled_table, write_rows
from vflash import dispatch
from vflash.harness.lab import KVCacheTiles, attention_kvcache_forward, sequence_band
from vflash.harness.timing import graph_time, rotating_copies
from vflash.harness.lab import Cache, Call, Score

ROWS = [(1, 8192), (8, 8192), (32, 8192), (128, 8192)]
TILES = [
    (16, 64, 4, 2), (16, 32, 4, 2), (16, 32, 4, 3), (16, 32, 4, 4), (16, 32, 8, 4), (16, 64, 8, 2), (16, 64, 8, 3),
    (16, 64, 4, 3),
]
SPLITS = [1, 2, 4, 8, 16, 32]
GRID_ROWS = [(b, kv) for b in (1, 8, 32, 128) for kv in (1024, 8192, 32768)]
GRID_TILES = [(16, 32, 4, 3), (16, 32, 4, 4), (16, 32, 8, 4), (16, 64, 4, 2), (16, 64, 4, 3), (16, 64, 8, 2),
              (16, 64, 8, 3), (16, 128, 8, 2)]
GRID_SPLITS = [1, 2, 4, 8, 16, 32, 64]


def _split_fields(t: KVCacheTiles) -> dict:
    # the dispatch's split-dependent fields (split count, merge chunk and rows, one loop) for a candidate tile
    return dict(num_splits=t.num_splits, split_keys=t.split_keys, split_chunk=t.split_chunk,
                merge_rows=t.merge_rows, one_loop=t.one_loop)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="decode_tune.csv")
    ap.add_argument("--quick", action="store_true", help="three rows only")
    ap.add_argument("--grid", action="store_true", help="every decode row, tile and split count")
    ap.add_argument("--smoke", action="store_true", help="--grid on the CPU, one tiny row (a test of this script)")
    ap.add_argument("--rows", help="rows B:KV, comma-separated (default: ROWS)")
    ap.add_argument("--tiles", help="tiles block_m,block_n,warps,stages, semicolon-separated (default: TILES)")
    ap.add_argument("--splits", help="split counts, comma-separated (default: SPLITS; with --grid GRID_SPLITS)")
    ap.add_argument("--head-dim", type=int, default=128, help="D (Hq 32 / Hkv 8 at every D)")
    ap.add_argument("--fp8", action="store_true", help="e4m3 caches (not with --grid)")
    ap.add_argument("--page", type=int, default=16, help="page size (not with --grid)")
    args = ap.parse_args()
    parse_rows = lambda text: [tuple(int(x) for x in r.split(":")) for r in text.split(",")]  # noqa: E731
    parse_tiles = lambda text: [tuple(int(x) for x in t.split(",")) for t in text.split(";")]  # noqa: E731
    if args.grid or args.smoke:
        return grid(args.out, args.smoke, grid_rows=parse_rows(args.rows) if args.rows else None,
                    grid_tiles=parse_tiles(args.tiles) if args.tiles else None,
                    grid_splits=[int(x) for x in args.splits.split(",")] if args.splits else None,
                    head_dim=args.head_dim)
    dev = torch.device("cuda")
    Hq, Hkv, D, page = 32, 8, args.head_dim, args.page
    dt = torch.bfloat16
    kv_dt = torch.float8_e4m3fn if args.fp8 else dt
    band = sequence_band("bottom_right", (-1, -1))
    scale = D ** -0.5
    score = Score(scale, None, None, None, *((torch.ones((), device=dev),) * 2 if args.fp8 else ()))
    out_rows = []
    rows = parse_rows(args.rows) if args.rows else (ROWS[:3] if args.quick else ROWS)
    tiles = parse_tiles(args.tiles) if args.tiles else TILES
    splits = [int(x) for x in args.splits.split(",")] if args.splits else SPLITS
    for B, KV in rows:
        pages = -(-KV // page)
        cache_bytes = 2 * B * KV * Hkv * D * kv_dt.itemsize
        n = rotating_copies(cache_bytes)
        caches = [(torch.randn(B * pages, page, Hkv, D, device=dev, dtype=dt).to(kv_dt),
                   torch.randn(B * pages, page, Hkv, D, device=dev, dtype=dt).to(kv_dt)) for _ in range(n)]
        table = shuffled_table(B, pages, dev)
        seqlens = torch.full((B,), KV, dtype=torch.int32, device=dev)
        q = torch.randn(B, Hq, D, device=dev, dtype=dt)
        cu = torch.arange(B + 1, dtype=torch.int32, device=dev)
        cached = Cache(seqlens, table, cu, 1, None, False, False, tuple(q.shape))
        call = Call(q, *caches[0], cached, band, score, False)
        chosen = dispatch.choose(call).tiles

        def time_tiles(t: KVCacheTiles) -> float:
            calls = [lambda kc=kc, vc=vc: attention_kvcache_forward(
                q, kc, vc, seqlens, table, cu, 1, band=band, score=score, return_lse=False,
                tiles=t) for kc, vc in caches]
            return graph_time(calls, dev)[0]

        def record(kind, t, us):
            gbps = cache_bytes / us / 1e3
            out_rows.append(dict(B=B, KV=KV, D=D, page=page, kv_dtype=str(kv_dt).replace("torch.", ""), kind=kind,
                                 block_m=t.block_m, block_n=t.block_n, warps=t.num_warps,
                                 stages=t.num_stages, splits=t.num_splits, one_loop=int(t.one_loop), us=round(us, 2),
                                 gbps=round(gbps, 1)))
            print(f"B {B:4d} KV {KV:6d} D {D} page {page} {kind:8s} {tuple(t)} {us:9.2f} us {gbps:7.1f} GB/s",
                  flush=True)
            return gbps

        record("dispatch", chosen, time_tiles(chosen))
        best, best_gbps = chosen, 0.0
        for tl in tiles:
            t = KVCacheTiles(*tl[:4])._replace(**_split_fields(chosen))
            if len(tl) > 4:
                t = t._replace(one_loop=bool(tl[4]))
            try:
                g = record("tile", t, time_tiles(t))
            except Exception as exc:  # out of shared memory, say
                print(f"B {B} KV {KV} {tl}: {type(exc).__name__} {str(exc)[:80]}")
                continue
            if g > best_gbps:
                best, best_gbps = t, g
        for s in splits:
            if s != best.num_splits:
                split = dispatch.choose(call._replace(layout=cached._replace(num_splits=s))).tiles
                t = best._replace(**_split_fields(split))
                record("splits", t, time_tiles(t))
        caches = None
    write_rows(args.out, out_rows)
    print(f"wrote {args.out}")
    return 0


def grid(out_path: str, smoke: bool = False, grid_rows=None, grid_tiles=None, grid_splits=None,
         head_dim: int = 128) -> int:
    dev = torch.device("cpu" if smoke else "cuda")
    Hq, Hkv, D = (4, 2, 16) if smoke else (32, 8, head_dim)
    dt = torch.bfloat16
    row_list, tile_list = ([(2, 512)], GRID_TILES[:1]) if smoke else (grid_rows or GRID_ROWS,
                                                                          grid_tiles or GRID_TILES)
    split_list = grid_splits or GRID_SPLITS
    band = sequence_band("bottom_right", (-1, -1))
    scale = D ** -0.5
    rows = []
    for B, KV in row_list:
        cache_bytes = 2 * B * KV * Hkv * D * 2
        n = rotating_copies(cache_bytes)
        q = torch.randn(B, Hq, D, device=dev, dtype=dt)
        cu = torch.arange(B + 1, dtype=torch.int32, device=dev)
        seqlens = torch.full((B,), KV, dtype=torch.int32, device=dev)

        def layout(page):
            if page == 0:
                return [(torch.randn(B, KV, Hkv, D, device=dev, dtype=dt),
                         torch.randn(B, KV, Hkv, D, device=dev, dtype=dt)) for _ in range(n)], None
            pages = -(-KV // page)
            return [(torch.randn(B * pages, page, Hkv, D, device=dev, dtype=dt),
                     torch.randn(B * pages, page, Hkv, D, device=dev, dtype=dt)) for _ in range(n)], \
                shuffled_table(B, pages, dev)

        def time_tiles(caches, table, t):
            calls = [lambda kc=kc, vc=vc: attention_kvcache_forward(
                q, kc, vc, seqlens, table, cu, 1, band=band, score=Score(scale, None), return_lse=False,
                tiles=t) for kc, vc in caches]
            return graph_time(calls, dev)[0]

        def record(kind, page, t, us):
            gbps = cache_bytes / us / 1e3
            rows.append(dict(B=B, KV=KV, D=D, kind=kind, page=page, block_m=t.block_m, block_n=t.block_n,
                             warps=t.num_warps, stages=t.num_stages, splits=t.num_splits, us=round(us, 2),
                             gbps=round(gbps, 1)))
            print(f"B {B:4d} KV {KV:6d} D {D} {kind:8s} page {page:3d} {tuple(t)} {us:9.2f} us {gbps:7.1f} GB/s",
                  flush=True)
            return us

        caches, table = layout(16)
        cached = Cache(seqlens, table, cu, 1, None, False, False, tuple(q.shape))
        call = Call(q, *caches[0], cached, band, Score(scale), False)
        chosen = dispatch.choose(call).tiles
        record("dispatch", 16, chosen, time_tiles(caches, table, chosen))
        best, best_us = chosen, float("inf")
        for tl_ in tile_list:
            for s in split_list:
                if KV // s < 128 or B * Hkv * s > 16384 or (smoke and s > 2):
                    continue
                t = KVCacheTiles(*tl_)._replace(**_split_fields(dispatch.choose(
                    call._replace(layout=cached._replace(num_splits=s))).tiles))
                try:
                    us = record("grid", 16, t, time_tiles(caches, table, t))
                except Exception as exc:  # out of shared memory, say
                    print(f"B {B} KV {KV} {tuple(t)}: {type(exc).__name__} {str(exc)[:80]}")
                    continue
                if us < best_us:
                    best, best_us = t, us
        print(f"B {B:4d} KV {KV:6d} D {D} best {tuple(best)} {best_us:.2f} us", flush=True)
        caches = None
        for page in (64, 0):
            caches, table = layout(page)
            record("best", page, best, time_tiles(caches, table, best))
            caches = None
    write_rows(out_path, rows)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
