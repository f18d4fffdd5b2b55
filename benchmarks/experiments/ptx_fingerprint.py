"""Refactor check on the CPU: a fingerprint of the sm_90 PTX of every kernel build that matters, so that a
change that only moves code (host code, shared jit helpers, a kernel's name) can prove its kernels compile to
the same instructions: same instructions, same speed. Run it on two source trees and compare.

Each variant is a launch a launcher builds, captured from small CPU tensors on the compiled path
(vflash.harness.lab: compiled_path, captured_launches, sm90_launch) and compiled for sm_90 from its own
arguments (lab.compile_launch_sm90, the specializations Triton's JIT makes), so a variant follows its
launcher: what a GPU would compile for that call. The set covers
  the Gluon forward: dense tiles and masks over its switches (one, two and three consumers, two and three
    CTAs an SM, PINGPONG, P_FP32, LATE_PV_WAIT, LAZY_RESCALE, DYNAMIC, a left edge, softcap, no LSE, bf16),
    varlen, and KV caches (contiguous, paged with pages of 16 and of 64: page runs, pages shorter than a tile);
  the Gluon MLA decode (pages of 64 with sinks, pages of 16 split) and its split merge;
  the Gluon backward's dQ and dK / dV, dense, varlen, D 256's dK and dV apart, and a v head dim of its own
    (192 / 128, 128 / 64 varlen);
  the portable forward (dense, varlen), its KV-cache kernel (decode GQA-packed, unsplit and split with the
    in-kernel merge, paged and contiguous, chunked prefill), attention sinks (the sm90 dense build, the
    portable forward, the KV-cache kernel unsplit and split, the backward's delta and sink gradient), FP8
    inputs (the portable forward) and caches (the KV-cache kernel split, the cache write), a v head dim unlike
    q's and k's (192 / 128, the portable forward), the
    portable backward (delta, dK / dV, dQ; dense and varlen), merge_states, write_kvcache and the sequence-metadata check.

What is hashed: the PTX without its debug sections, .loc / .file lines, comments and the $L__tmp labels of
inlined scopes, so that arranging the source differently changes nothing; and, unless --no-normalise-names,
with function symbols replaced by placeholders (normalise_names), so that renaming a kernel or a non-inlined
helper changes nothing either. Constexpr names never reach the PTX.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.ptx_fingerprint --json /tmp/before.json
  PYTHONPATH=<other tree>/src:. python3 -m benchmarks.experiments.ptx_fingerprint --compare /tmp/before.json

--compare exits 1 naming each variant whose fingerprint differs (or that one side lacks). Compare runs of the
same Triton with the same options: another Triton compiles other PTX. No GPU needed (triton.compile for
sm_90; ptxas ships with Triton). Triton's compile cache keeps builds: TRITON_CACHE_DIR=<empty dir> for a
cold run.
"""

import argparse
import hashlib
import json
import os
import re
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from vflash.harness import lab
from vflash.harness.lab import (Band, BackwardLaunch, BackwardTiles, CacheWriteTiles, Sm90Tiles, KVCacheTiles,
                                MergeTiles, MetadataTiles, PortableTiles, sequence_band)
from vflash.harness.lab import Score

F16, BF16, I32 = torch.float16, torch.bfloat16, torch.int32
SMS = 132  # an H100's SMs: the Gluon forward's grid, which the compile does not read


class Group(NamedTuple):
    """The launches of one call, each a variant named GROUP.ROLE (GROUP alone for a call of one launch)."""
    launches: Callable[[], list]  # the call's launches, in order, built but not run
    roles: Tuple[Optional[str], ...]  # each launch's role; None: not fingerprinted (another group has it)
    gluon: bool = False  # needs a Triton with Gluon


def _captured(call: Callable[[], object]) -> list:
    # A launcher's launches for CPU tensors as a GPU would compile them (no interpreter forms, no bf16 by hand).
    with lab.compiled_path():
        return lab.captured_launches(call)


def _empty(*shape, dtype=F16) -> torch.Tensor:
    # Values are never read (nothing runs): only shapes, strides and dtypes reach the launch. Integer metadata
    # is zeroed all the same, so a launcher that looked at it would see something sane.
    return torch.zeros(shape, dtype=dtype) if dtype in (I32, torch.int64) else torch.empty(shape, dtype=dtype)


def _sinks(heads: int, on: bool) -> Optional[torch.Tensor]:
    # a call's sinks (fp32 [Hq]) where the variant has them
    return torch.zeros(heads) if on else None


def _offsets(*lengths: int) -> torch.Tensor:
    # cu_seqlens of sequences of these lengths
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=I32)


# --- the Gluon forward ---

def gluon_dense(head_dim: int, tiles: Sm90Tiles, dtype=F16, right_edge=False, left_edge=False, softcap=False,
                lse=True, heads=(8, 2), sinks=False) -> Group:
    """The dense build: [B, H, N, D] tensors, B 2, N 1024, GQA unless heads are equal (kv_group 1, a constant
    to the JIT)."""
    def launches():
        (hq, hkv), n = heads, 1024
        q, k = _empty(2, hq, n, head_dim, dtype=dtype), _empty(2, hkv, n, head_dim, dtype=dtype)
        counter = _empty(1, dtype=I32) if tiles.dynamic else None
        band = Band(0, 256 if left_edge else -1, 0 if right_edge else -1)
        return [lab.sm90_launch(q, k, k.clone(), torch.empty_like(q), _empty(2, hq, n, dtype=torch.float32)
                                  if lse else None, counter, band, Score(head_dim ** -0.5, 20.0 if softcap else None,
                                                                         _sinks(hq, sinks)), tiles, SMS)]
    return Group(launches, ("",), gluon=True)


def gluon_varlen(head_dim: int, tiles: Sm90Tiles, causal: Optional[str] = "bottom_right", heads=(8, 2)) -> Group:
    """The packed build (IS_VARLEN): [total, H, D] tensors of three sequences."""
    def launches():
        hq, hkv = heads
        cu_q, cu_k = _offsets(300, 700, 1000), _offsets(500, 700, 1200)
        q, k = _empty(2000, hq, head_dim), _empty(2400, hkv, head_dim)
        counter = _empty(1, dtype=I32) if tiles.dynamic else None
        return [lab.sm90_launch(q, k, k.clone(), torch.empty_like(q), _empty(hq, 2000, dtype=torch.float32),
                                  counter, sequence_band(causal, (-1, -1)), Score(head_dim ** -0.5, None), tiles, SMS,
                                  varlen=(cu_q, cu_k, 1000, causal == "top_left"))]
    return Group(launches, ("",), gluon=True)


def gluon_kvcache(head_dim: int, tiles: Sm90Tiles, page_size: int = 0, lse=True, heads=(8, 2)) -> Group:
    """The KV-cache build (chunked prefill): three sequences of 512 new queries against caches of 4096 rows a
    sequence, contiguous (page_size 0) or paged; pages shorter than a tile take page runs (a run of
    consecutive pages in one copy of the tile's rows)."""
    def launches():
        (hq, hkv), batch, rows, max_q = heads, 3, 4096, 512
        q = _empty(batch * max_q, hq, head_dim)
        if page_size:
            k = _empty(batch * rows // page_size, page_size, hkv, head_dim)
            table = _empty(batch, rows // page_size, dtype=I32)
        else:
            k, table = _empty(batch, rows, hkv, head_dim), None
        # the launcher's queries of a dense q: max_q rows a sequence (lab.attention_kvcache_forward's cu_seqlens_q)
        cu_q = torch.arange(0, (batch + 1) * max_q, max_q, dtype=I32)
        counter = _empty(1, dtype=I32) if tiles.dynamic else None
        return [lab.sm90_launch(q, k, k.clone(), torch.empty_like(q), _empty(hq, q.shape[0], dtype=torch.float32)
                                  if lse else None, counter, sequence_band("bottom_right", (-1, -1)),
                                  Score(head_dim ** -0.5, None), tiles, SMS, varlen=(cu_q, None, max_q, False),
                                  cache=(_empty(batch, dtype=I32), table))]
    return Group(launches, ("",), gluon=True)


def gluon_mla(tiles, page_size: int = 64, heads: int = 128, n_q: int = 1, sinks: bool = False) -> Group:
    """The Gluon MLA decode (a latent cache [pages, page_size, 1, 576], v its first 512 columns): 64 sequences of
    n_q new queries over caches of 4096 rows, causal; split (tiles.num_splits > 1), its merge launch too."""
    def launches():
        batch, rows = 64, 4096
        q = _empty(batch * n_q, heads, 576, dtype=BF16)
        k = _empty(batch * rows // page_size, page_size, 1, 576, dtype=BF16)
        out = _empty(batch * n_q, heads, 512, dtype=BF16)
        return lab.mla_launches(q, k, out, _empty(heads, batch * n_q, dtype=torch.float32), _empty(batch, dtype=I32),
                                _empty(batch, rows // page_size, dtype=I32), n_q, sequence_band("bottom_right",
                                                                                                 (-1, -1)),
                                Score(576 ** -0.5, None, _sinks(heads, sinks)), tiles)
    return Group(launches, ("mla", "merge") if tiles.num_splits > 1 else ("",), gluon=True)


# --- the backward: delta, then dK / dV and dQ, portable or Gluon ---

def backward(head_dim: int, tiles: BackwardTiles, kernel: str, dtype=BF16, causal: Optional[str] = "bottom_right",
             window=(-1, -1), softcap=None, varlen=False, heads=(8, 2), sinks=False,
             head_dim_v: Optional[int] = None) -> Group:
    """lab.attention_backward's launches: dense [B 2, H, N 1024, D], or varlen packed sequences. The Gluon
    groups leave the delta launch (a portable kernel) to the portable ones. sinks: the delta launch with the
    sinks' parts and the sink gradient's launch (the dK / dV and dQ launches are the ones without);
    head_dim_v: v's (and out's, dO's) head dim where it differs."""
    def launches():
        hq, hkv = heads
        if varlen:
            cu_q, cu_k = _offsets(300, 700, 1000), _offsets(300, 700, 1000)
            q, k = _empty(2000, hq, head_dim, dtype=dtype), _empty(2000, hkv, head_dim, dtype=dtype)
            lse, band = _empty(hq, 2000, dtype=torch.float32), sequence_band(causal, window)
            packed = (cu_q, cu_k, 1000, 1000, causal == "top_left")
        else:
            q, k = _empty(2, hq, 1024, head_dim, dtype=dtype), _empty(2, hkv, 1024, head_dim, dtype=dtype)
            lse, band = _empty(2, hq, 1024, dtype=torch.float32), lab.mask_band(1024, 1024, causal, window)
            packed = None
        v = k.clone() if head_dim_v is None else _empty(*k.shape[:-1], head_dim_v, dtype=dtype)
        out = torch.empty_like(q) if head_dim_v is None else _empty(*q.shape[:-1], head_dim_v, dtype=dtype)
        return _captured(lambda: lab.attention_backward(
            torch.empty_like(out), q, k, v, out, lse, band=band,
            score=Score(head_dim ** -0.5, softcap, _sinks(hq, sinks)), tiles=tiles, varlen=packed, kernel=kernel))
    mains = ("dk", "dv") if tiles.dkdv_apart else ("dkdv",)
    if sinks:
        return Group(launches, ("delta", *(None for _ in mains), None, "dsinks"), gluon=kernel == "sm90")
    return Group(launches, (None if kernel == "sm90" else "delta", *mains, "dq"), gluon=kernel == "sm90")


# --- the portable forward and its KV-cache kernel ---

def portable_dense(head_dim: int, tiles: PortableTiles, has_left: bool, has_right: bool, softcap: bool,
                   store_lse: bool, dtype=F16, sinks=False, head_dim_v: Optional[int] = None) -> Group:
    """attention_fwd_kernel's dense launch: [1, 2, 256, D]; FP8 (dtype e4m3) with [B, Hkv] descales and a bf16
    out, after V's copy with its keys contiguous (kernels/layout.py, role v_copy); head_dim_v: v's head dim where
    it differs."""
    def launches():
        q = _empty(1, 2, 256, head_dim, dtype=dtype)
        v = q if head_dim_v is None else _empty(1, 2, 256, head_dim_v, dtype=dtype)
        band = Band(0, 32 if has_left else -1, 0 if has_right else -1)
        descales = [torch.ones(1, 2)] * 3 if dtype == torch.float8_e4m3fn else []
        return _captured(lambda: lab.attention_forward(
            q, q, v, band=band, score=Score(head_dim ** -0.5, 20.0 if softcap else None, _sinks(2, sinks), *descales),
            return_lse=store_lse, tiles=tiles, out_dtype=BF16 if descales else None))
    return Group(launches, ("v_copy", "") if dtype == torch.float8_e4m3fn else ("",))


def portable_varlen(head_dim: int, tiles: PortableTiles, causal: Optional[str], window=(-1, -1), softcap=None,
                    heads=(8, 2), dtype=F16) -> Group:
    """attention_fwd_kernel's packed launch (IS_VARLEN): three sequences."""
    def launches():
        hq, hkv = heads
        cu_q, cu_k = _offsets(300, 700, 1000), _offsets(500, 700, 1200)
        q, k = _empty(2000, hq, head_dim, dtype=dtype), _empty(2400, hkv, head_dim, dtype=dtype)
        return _captured(lambda: lab.attention_varlen_forward(
            q, k, k.clone(), cu_q, cu_k, 1000, band=sequence_band(causal, window), top_left=causal == "top_left",
            score=Score(head_dim ** -0.5, softcap), return_lse=True, tiles=tiles))
    return Group(launches, ("",))


def portable_kvcache(head_dim: int, tiles: KVCacheTiles, page_size: int = 0, n_q: int = 1, packed_q=False,
                     window=(-1, -1), softcap=None, lse=False, heads=(32, 8), dtype=BF16, sinks=False,
                     fp8=False, latent_v: Optional[int] = None) -> Group:
    """attention_kvcache_kernel: four sequences of n_q new queries (packed through cu_seqlens_q, or n_q a
    sequence) against caches of 4096 rows a sequence, contiguous (page_size 0) or paged; the query heads of a
    KV head packed into a tile's rows (GQA). tiles.num_splits > 1: split-KV, merged in the kernel. latent_v: v the
    cache's first latent_v columns, a view (MLA's latent cache)."""
    def launches():
        (hq, hkv), batch, rows = heads, 4, 4096
        q = _empty(batch * n_q, hq, head_dim, dtype=dtype)
        kv_dtype = torch.float8_e4m3fn if fp8 else dtype
        if page_size:
            k = _empty(batch * rows // page_size, page_size, hkv, head_dim, dtype=kv_dtype)
            table = _empty(batch, rows // page_size, dtype=I32)
        else:
            k, table = _empty(batch, rows, hkv, head_dim, dtype=kv_dtype), None
        cu_q = torch.arange(0, (batch + 1) * n_q, n_q, dtype=I32) if packed_q else None
        v = k.clone() if latent_v is None else k[..., :latent_v]
        return _captured(lambda: lab.attention_kvcache_forward(
            q, k, v, _empty(batch, dtype=I32), table, cu_q, n_q, band=sequence_band("bottom_right", window),
            score=Score(head_dim ** -0.5, softcap, _sinks(hq, sinks), None,
                        *((torch.ones(batch, hkv), torch.ones(())) if fp8 else ())),
            return_lse=lse, tiles=tiles))
    return Group(launches, ("",))


# --- merge, cache write, metadata ---

def merge(head_dim: int, dtype=BF16) -> Group:
    """merge_states_kernel over [512 rows, 8 heads, D] partials (the dispatch's MERGE tiles)."""
    def launches():
        a, lse = _empty(512, 8, head_dim, dtype=dtype), _empty(512, 8, dtype=torch.float32)
        return _captured(lambda: lab.merge_states_forward(a, lse, a.clone(), lse.clone(), MergeTiles(16, 64, 4)))
    return Group(launches, ("",))


def cache_write(head_dim: int, page_size=16, dtype=BF16, fp8=False) -> Group:
    """write_kvcache_kernel: 64 tokens' K and V into paged caches, int64 slots (the dispatch's CACHE_WRITE);
    fp8: e4m3 caches, a descale a head for K, one for V."""
    def launches():
        cache = _empty(256, page_size, 8, head_dim, dtype=torch.float8_e4m3fn if fp8 else dtype)
        new = _empty(64, 8, head_dim, dtype=dtype)
        descales = (torch.ones(8), torch.ones(())) if fp8 else (None, None)
        return _captured(lambda: lab.write_kvcache_forward(cache, cache.clone(), new, new.clone(),
                                                           _empty(64, dtype=torch.int64), *descales,
                                                           tiles=CacheWriteTiles(8, 4)))
    return Group(launches, ("",))


def metadata(kvcache: bool) -> Group:
    """sequence_metadata_kernel as the API checks a KV-cache call's metadata (lengths, block table, packed
    queries) or a varlen call's (cu_seqlens_q and cu_seqlens_k); the dispatch's METADATA tiles."""
    def launches():
        batch, tiles = 8, MetadataTiles(1, 128, 1)
        if kvcache:
            call = lambda: lab.sequence_metadata_flags(  # noqa: E731
                batch, tiles, _empty(batch, dtype=I32), _empty(batch, 256, dtype=I32), _offsets(*[64] * batch),
                capacity=4096, page_size=16, num_pages=2048, total_q=512, max_seqlen_q=64)
        else:
            call = lambda: lab.sequence_metadata_flags(  # noqa: E731
                batch, tiles, cu_seqlens_q=_offsets(*[300] * batch), cu_seqlens_k=_offsets(*[500] * batch),
                total_q=2400, max_seqlen_q=300, total_k=4000, max_seqlen_k=500)
        return _captured(call)
    return Group(launches, ("",))


_B = BackwardLaunch
GROUPS: Dict[str, Group] = {
    # the Gluon forward, dense: tiles and masks over its switches
    "d64_causal_pp": gluon_dense(64, Sm90Tiles(192, 128, 2, pingpong=True, p_fp32=True, lazy_rescale=True,
                                                 dynamic=True), right_edge=True),
    "d64_nc": gluon_dense(64, Sm90Tiles(192, 128, 2, q_buffers=2, pingpong=True, lazy_rescale=True)),
    "d128_bf16_all": gluon_dense(128, Sm90Tiles(128, 128, 2, q_buffers=2, late_pv_wait=True, lazy_rescale=True),
                                 BF16, left_edge=True, softcap=True, lse=False),
    "d128_causal": gluon_dense(128, Sm90Tiles(128, 128, 2, dynamic=True), right_edge=True, heads=(4, 4)),
    "d256": gluon_dense(256, Sm90Tiles(128, 64, 2)),
    "d128_short": gluon_dense(128, Sm90Tiles(64, 64, 2, q_buffers=2, ctas_per_sm=2), right_edge=True),
    "d64_three": gluon_dense(64, Sm90Tiles(64, 64, 2, q_buffers=2, p_fp32=True, lazy_rescale=True, ctas_per_sm=3,
                                             dynamic=True), right_edge=True, heads=(4, 4)),
    "d64_causal_sinks": gluon_dense(64, Sm90Tiles(192, 128, 2, pingpong=True, p_fp32=True, lazy_rescale=True,
                                                    dynamic=True), right_edge=True, sinks=True),
    # the Gluon forward's varlen and KV-cache builds (the dispatch's D 128 causal tiles)
    "varlen_d128_causal": gluon_varlen(128, Sm90Tiles(128, 128, 2, dynamic=True)),
    "kvcache_d128": gluon_kvcache(128, Sm90Tiles(128, 128, 2, dynamic=True)),
    "paged16_d128": gluon_kvcache(128, Sm90Tiles(128, 128, 2, dynamic=True), page_size=16, lse=False),
    "paged64_d128": gluon_kvcache(128, Sm90Tiles(128, 128, 2, dynamic=True), page_size=64),
    # the Gluon MLA decode: pages of 64 (FlashMLA's) unsplit with sinks, pages of 16 split (with its merge)
    "mla_paged64_sinks": gluon_mla(lab.MlaTiles(64, 2), sinks=True),
    "mla_paged16_split": gluon_mla(lab.MlaTiles(64, 2, num_splits=4), page_size=16, heads=16, n_q=2),
    # the Gluon backward (the dispatch's SM90_BACKWARD tiles)
    "bwd_d128_causal": backward(128, BackwardTiles(_B(64, 128, 4, 2), _B(192, 64, 4, 2)), "sm90"),
    "bwd_varlen_d64_window": backward(64, BackwardTiles(_B(64, 128, 4, 2), _B(192, 64, 4, 2)), "sm90", F16,
                                      causal=None, window=(200, 100), softcap=30.0, varlen=True),
    "bwd_d256_apart": backward(256, BackwardTiles(_B(32, 128, 4, 2), _B(128, 32, 4, 2), dkdv_apart=True), "sm90"),
    # a v head dim of its own: DeepSeek's 192 / 128 (q's and k's tiles padded to 256, D 256's tiles), 128 / 64 varlen
    "bwd_d192_v128_causal": backward(192, BackwardTiles(_B(32, 128, 4, 2), _B(128, 32, 4, 2), dkdv_apart=True),
                                     "sm90", head_dim_v=128),
    "bwd_varlen_d128_v64": backward(128, BackwardTiles(_B(64, 128, 4, 2), _B(192, 64, 4, 2)), "sm90", varlen=True,
                                    head_dim_v=64),
    # the portable forward: dense (HAS_LEFT, HAS_RIGHT, SOFTCAP, STORE_LSE) and varlen
    "p_d128_causal_lse": portable_dense(128, PortableTiles(128, 128, 8, 3), False, True, False, True),
    "p_d128_split": portable_dense(128, PortableTiles(256, 64, 8, 3, True), False, False, False, False),
    "p_d64_window_softcap": portable_dense(64, PortableTiles(64, 64, 4, 3), True, True, True, True, BF16),
    "p_d96_padded": portable_dense(96, PortableTiles(128, 128, 8, 3), False, False, False, True),
    "p_d192_v128_causal": portable_dense(192, PortableTiles(64, 64, 4, 2), False, True, False, True,
                                         head_dim_v=128),
    "p_d128_fp8": portable_dense(128, PortableTiles(128, 128, 8, 3), False, False, False, True, torch.float8_e4m3fn),
    "p_d16_fp8_window": portable_dense(16, PortableTiles(128, 64, 8, 3), True, True, False, True, torch.float8_e4m3fn),
    "p_d64_causal_sinks": portable_dense(64, PortableTiles(64, 64, 4, 3), False, True, False, True, sinks=True),
    "p_varlen_d128_causal": portable_varlen(128, PortableTiles(128, 128, 8, 3), "bottom_right"),
    "p_varlen_d64_top_left_softcap": portable_varlen(64, PortableTiles(64, 64, 4, 3), "top_left", window=(64, -1),
                                                     softcap=30.0, dtype=BF16),
    # the portable KV-cache kernel: decode (4 query heads a KV head, 16-row tiles as the dispatch packs them),
    # unsplit and split (one masked loop, the last split's merge), paged and contiguous; chunked prefill
    "p_kvcache_paged16_decode": portable_kvcache(128, KVCacheTiles(16, 64, 4, 3, merge_rows=4, split_chunk=32),
                                                 page_size=16),
    "p_kvcache_paged16_split": portable_kvcache(128, KVCacheTiles(16, 64, 4, 3, num_splits=8, split_chunk=8,
                                                                  merge_rows=4, one_loop=True), page_size=16, lse=True),
    "p_kvcache_contig_split_window": portable_kvcache(
        128, KVCacheTiles(16, 64, 4, 3, num_splits=4, split_chunk=4, merge_rows=8, one_loop=True), n_q=2,
        window=(1024, -1), softcap=30.0),
    "p_kvcache_paged16_decode_sinks": portable_kvcache(
        128, KVCacheTiles(16, 64, 4, 3, merge_rows=4, split_chunk=32), page_size=16, sinks=True),
    "p_kvcache_paged16_split_sinks": portable_kvcache(
        128, KVCacheTiles(16, 64, 4, 3, num_splits=8, split_chunk=8, merge_rows=4, one_loop=True), page_size=16,
        lse=True, sinks=True),
    "p_kvcache_paged16_split_fp8": portable_kvcache(
        128, KVCacheTiles(16, 64, 4, 3, num_splits=8, split_chunk=8, merge_rows=4, one_loop=True), page_size=16,
        fp8=True),
    "p_kvcache_mla_paged64_split": portable_kvcache(
        576, KVCacheTiles(32, 32, 8, 2, num_splits=4, split_chunk=4, merge_rows=32, one_loop=True, head_blocks=4),
        page_size=64, heads=(128, 1), latent_v=512),
    "p_kvcache_paged64_prefill": portable_kvcache(128, KVCacheTiles(128, 128, 8, 3, merge_rows=128), page_size=64,
                                                  n_q=256, packed_q=True, lse=True, dtype=F16),
    # the portable backward (the dispatch's BACKWARD tiles): delta, dK / dV, dQ
    "p_bwd_d128_causal": backward(128, BackwardTiles(_B(64, 64, 4, 2), _B(128, 32, 4, 3)), "portable"),
    "p_bwd_d128_causal_sinks": backward(128, BackwardTiles(_B(64, 64, 4, 2), _B(128, 32, 4, 3)), "portable",
                                        sinks=True),
    "p_bwd_d192_v128_causal": backward(192, BackwardTiles(_B(64, 64, 8, 2), _B(128, 32, 8, 3)), "portable",
                                       head_dim_v=128),
    "p_bwd_varlen_d64_window": backward(64, BackwardTiles(_B(32, 64, 4, 3), _B(64, 64, 4, 3)), "portable", F16,
                                        causal=None, window=(200, 100), softcap=30.0, varlen=True),
    # the small kernels
    "p_merge_d128": merge(128),
    "p_cache_write_d128": cache_write(128),
    "p_cache_write_d128_fp8": cache_write(128, fp8=True),
    "p_metadata_kvcache": metadata(kvcache=True),
    "p_metadata_varlen": metadata(kvcache=False),
}


def variant_names(groups: Dict[str, Group] = GROUPS) -> List[str]:
    """Every fingerprinted variant, GROUP.ROLE (or GROUP for a group of one launch), in order."""
    return [name if role == "" else f"{name}.{role}" for name, g in groups.items() for role in g.roles
            if role is not None]


def _launch(name: str):
    # The captured launch a variant name stands for.
    group, _, role = name.partition(".")
    g = GROUPS[group]
    launches = g.launches()
    if len(launches) != len(g.roles):
        raise RuntimeError(f"{group}: {len(launches)} launches, expected {len(g.roles)} ({g.roles})")
    return launches[g.roles.index(role)]


# --- what is hashed ---

def instructions(ptx: str) -> str:
    """The PTX without its debug sections, .loc / .file lines, comments, blank lines
    and the $L__tmp labels that mark inlined scopes for the debug info (one more jit
    helper layer adds one, with the same instructions)."""
    ptx = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    lines = (line.split("//")[0].rstrip() for line in ptx.splitlines()
             if not line.strip().startswith((".loc", ".file", "//")))
    return "\n".join(line for line in lines if line.strip() and not re.fullmatch(r"\$L__tmp\d+:", line.strip()))


# A function's name where PTX declares or defines it: `.entry NAME(`, `.func NAME(`, `.func (.param ...) NAME(`.
_DECLARED = re.compile(r"\.(entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)")
# An identifier that is neither a register (%r1), a directive or opcode part (.param, ld.param) nor inside one.
_IDENTIFIER = re.compile(r"(?<![\w$%.])[A-Za-z_$][\w$]*")


def normalise_names(ptx: str) -> str:
    """ptx with every kernel (.entry) and device function (.func) symbol replaced by a placeholder, numbered in
    order of first appearance (__kernel0, __func0, __func1, ...), wherever it occurs as a whole identifier (its
    definition, prototypes, calls), and each one's parameters NAME_param_N by PLACEHOLDER_param_N. A renamed
    kernel (its entry and parameter names come from the Python function's name) or non-inlined helper then
    hashes the same; the renaming is one to one, so a call to another function still shows."""
    names: Dict[str, str] = {}
    for kind, name in _DECLARED.findall(ptx):
        if name not in names:
            prefix = "__kernel" if kind == "entry" else "__func"
            names[name] = f"{prefix}{sum(v.startswith(prefix) for v in names.values())}"

    def rename(m: "re.Match") -> str:
        token = m.group(0)
        if token in names:
            return names[token]
        base, sep, n = token.rpartition("_param_")
        return f"{names[base]}_param_{n}" if sep and n.isdigit() and base in names else token
    return _IDENTIFIER.sub(rename, ptx) if names else ptx


def fingerprint_body(ptx: str, normalise: bool = True) -> str:
    """What a variant's hash covers: instructions(ptx), its names normalised unless normalise is off."""
    body = instructions(ptx)
    return normalise_names(body) if normalise else body


def digest(body: str) -> str:
    return hashlib.sha1(body.encode()).hexdigest()


def compile_variant(name: str, normalise: bool = True) -> str:
    """The hashed body of variant `name`: its launch compiled for sm_90."""
    return fingerprint_body(lab.compile_launch_sm90(_launch(name)).asm["ptx"], normalise)


def compare(got: Dict[str, str], saved: Dict[str, str], complete: bool) -> List[str]:
    """Lines naming each variant whose hash differs from the saved one, that was saved but failed here, or (a
    complete run) that one side lacks; empty when the two agree."""
    lines = [f"{name}: {saved[name][:12]} -> {got[name][:12]}" for name in got if name in saved
             and got[name] != saved[name]]
    lines += [f"{name}: not in the saved fingerprints" for name in got if name not in saved]
    if complete:
        lines += [f"{name}: saved, not fingerprinted here" for name in saved if name not in got]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--out", help="also write each variant's hashed text to DIR/NAME.ptx (diff two trees' DIRs)")
    ap.add_argument("--json", metavar="FILE", help="write {variant: sha1} to FILE")
    ap.add_argument("--compare", metavar="FILE", help="compare with a --json FILE; exit 1 naming the differences")
    ap.add_argument("--normalise-names", action=argparse.BooleanOptionalAction, default=True,
                    help="replace kernel and function symbols by placeholders before hashing (default on)")
    ap.add_argument("--list", action="store_true", help="print the variant names and exit")
    ap.add_argument("names", nargs="*", help="variants or groups (default all; --list names them)")
    a = ap.parse_args()
    every = variant_names()
    if a.list:
        print("\n".join(every))
        return 0
    names = []
    for n in a.names or every:
        picked = [v for v in every if v == n or v.startswith(n + ".")]
        if not picked:
            ap.error(f"no variant or group {n!r} (--list names them)")
        names += [v for v in picked if v not in names]
    gluon = [n for n in names if GROUPS[n.partition(".")[0]].gluon]
    if gluon and not lab.HAVE_GLUON:
        print(f"this Triton has no Gluon: {', '.join(gluon)} need it", file=sys.stderr)
        return 1
    import triton
    print(f"triton {triton.__version__}, names {'normalised' if a.normalise_names else 'kept'}", flush=True)
    width = max(map(len, names))
    got: Dict[str, str] = {}
    failed = []
    t_all = time.time()
    for name in names:
        try:
            body = compile_variant(name, a.normalise_names)
        except Exception as e:  # noqa: BLE001 - report it, fingerprint the rest
            failed.append(name)
            print(f"{name:{width}}  FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        got[name] = digest(body)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, f"{name}.ptx"), "w") as f:
                f.write(body)
        print(f"{name:{width}}  {got[name][:12]}  {len(body.splitlines())} lines", flush=True)
    print(f"{len(got)} variants fingerprinted, {len(failed)} failed, {time.time() - t_all:.1f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(got, f, indent=1)
    status = 1 if failed else 0
    if a.compare:
        with open(a.compare) as f:
            saved = json.load(f)
        differ = compare(got, saved, complete=not a.names)
        if differ:
            print(f"{len(differ)} differ from {a.compare}:\n  " + "\n  ".join(differ))
            status = 1
        else:
            print(f"all {len(got)} equal to {a.compare}")
    return status


if __name__ == "__main__":
    sys.exit(main())
