"""`vflash check`: the correctness matrix against the fp32/fp64 oracle."""

import itertools
import time
from typing import Callable, Iterable, Optional, TextIO

from vflash.harness.cases import (BaselineCheck, CacheWriteCase, Case, Fp8Case, GradCase, KVCacheCase, MergeCase,
                                  TiledCheck,
                                  VarlenCase)

CAUSAL_MODES = (False, True, "top_left")


def reference_checks() -> list:
    """The tiled PyTorch recurrence against the oracle: tails, masks, block shapes."""
    return [TiledCheck(127, 127), TiledCheck(128, 128, causal=True), TiledCheck(129, 129, causal=True),
            TiledCheck(100, 257, causal=True, block_m=32, block_n=48),
            TiledCheck(257, 100, causal="top_left", block_m=48, block_n=32),
            TiledCheck(65, 65, D=128, block_m=1, block_n=7), TiledCheck(200, 200, window=(31, 9)),
            TiledCheck(513, 513, causal=True, window=(100, -1), block_m=128, block_n=64)]


def cpu_matrix() -> list:
    """Small shapes that the Triton interpreter runs in a few minutes."""
    cases = reference_checks()
    cases += [BaselineCheck("explicit", 128, 64, c, dt) for c in (False, True) for dt in ("fp16", "bf16")]
    for dtype, causal, n, d in itertools.product(("fp16", "bf16"), (False, True), (127, 128, 129), (64, 128)):
        cases.append(Case(Nq=n, Nk=n, D=d, dtype=dtype, causal=causal))
    for dtype, causal, (nq, nk) in itertools.product(
            ("fp16", "bf16", "fp32"), CAUSAL_MODES, ((63, 63), (65, 129), (129, 64))):
        cases.append(Case(Nq=nq, Nk=nk, D=64, dtype=dtype, causal=causal))
    for d in (16, 40, 80, 128, 256):
        cases.append(Case(Nq=65, Nk=65, D=d, causal=True))
    cases += [
        Case(Hq=8, Hkv=1, Nq=33, Nk=70, causal=True, tag="MQA"),
        Case(Hq=4, Hkv=2, Nq=64, Nk=64, dtype="bf16", tag="GQA"),
        Case(Nq=70, Nk=70, layout="bnhd"),
        Case(Nq=70, Nk=90, causal=True, layout="sliced"),
        Case(Nq=100, Nk=100, window=(16, 8)),
        Case(Nq=64, Nk=100, causal=True, window=(20, -1)),
        Case(Nq=80, Nk=80, softcap=5.0, amplify=3.0),
        Case(Nq=96, Nk=40, causal=True, tag="fully masked rows"),
        Case(Nq=513, Nk=513, amplify=4.0, causal=True, tag="stability"),
    ]
    # packed sequences: zero lengths, tile edges, Nq != Nk per sequence
    for causal in CAUSAL_MODES:
        cases.append(VarlenCase((5, 0, 65, 1), (5, 3, 65, 1), causal=causal))
        cases.append(VarlenCase((3, 40, 0), (70, 33, 4), causal=causal, tag="chunked"))
    cases += [VarlenCase((17, 64), (17, 64), dtype="bf16", window=(8, 0), causal=True),
              VarlenCase((30, 9), (30, 9), Hq=8, Hkv=1, D=32, softcap=5.0, tag="MQA")]
    # a KV cache: decode (split and not) and chunked prefill on shuffled pages
    cases += [KVCacheCase((1, 1, 1), (70, 1, 33), page=16, tag="decode"),
              KVCacheCase((1, 2), (90, 17), page=17, num_splits=3, dtype="bf16", tag="decode"),
              KVCacheCase((9, 0, 20), (40, 5, 20), page=16, window=(12, 0), tag="chunked"),
              KVCacheCase((1, 3), (60, 30), page=8, Hq=8, Hkv=1, softcap=5.0, batch_invariant=True, tag="MQA")]
    # partial results merged (split keys, causal queries that see no key of a part), cache writes
    cases += [MergeCase(70, 29, causal=True), MergeCase(40, 33, Hq=2, Hkv=1, D=32, dtype="bf16"),
              CacheWriteCase(37, 8, page=16, pad_every=5), CacheWriteCase(9, 20, page=1, Hkv=1, D=24, dtype="bf16")]
    # gradients (the backward), fp32 and half precision, the band, softcap, GQA
    cases += [GradCase(Case(Hq=4, Hkv=2, Nq=33, Nk=47, D=16, dtype="fp32", causal=True)),
              GradCase(Case(Nq=40, Nk=30, D=32, dtype="bf16", causal="top_left", window=(9, 4))),
              GradCase(Case(Hq=2, Hkv=1, Nq=25, Nk=25, D=24, dtype="fp16", softcap=3.0, layout="bnhd"))]
    # attention sinks on every path: dense (rows with no key too), packed, a cache split and not, gradients
    cases += [Case(Hq=4, Hkv=2, Nq=70, Nk=40, causal=True, sinks=True, tag="fully masked rows"),
              Case(Nq=65, Nk=65, dtype="bf16", window=(16, 8), softcap=5.0, sinks=True),
              VarlenCase((5, 0, 65, 1), (5, 3, 0, 1), causal=True, sinks=True),
              KVCacheCase((1, 2, 1), (70, 17, 0), page=16, sinks=True, tag="decode"),
              KVCacheCase((1, 2), (90, 17), page=17, num_splits=3, dtype="bf16", sinks=True, tag="decode"),
              KVCacheCase((1, 3), (60, 30), page=8, Hq=8, Hkv=1, batch_invariant=True, sinks=True, tag="MQA"),
              GradCase(Case(Hq=4, Hkv=2, Nq=33, Nk=47, D=16, dtype="fp32", causal=True, sinks=True)),
              GradCase(Case(Hq=2, Hkv=1, Nq=25, Nk=25, D=24, dtype="bf16", window=(9, 4), sinks=True))]
    # FP8 inputs: descales per tensor, per (sequence, KV head) and none; both outputs; the band, softcap, sinks,
    # GQA, packed sequences (an empty one too)
    cases += [Fp8Case(Hq=4, Hkv=2, Nq=40, Nk=70, D=32, causal=True, descale="head"),
              Fp8Case(Nq=50, Nk=30, D=16, causal="top_left", window=(8, 2), tag="fully masked rows"),
              Fp8Case(D=32, softcap=5.0, sinks=True, out_dtype="fp16", descale="none"),
              Fp8Case(Hq=4, Hkv=1, D=32, lens=((5, 9), (0, 3), (17, 17), (3, 0)), causal=True, descale="head",
                      sinks=True)]
    # a v head dim unlike q's and k's: dense with the band and sinks, a cache split and not
    cases += [Case(Hq=4, Hkv=2, Nq=40, Nk=60, D=32, Dv=16, causal=True, window=(9, 3), sinks=True),
              Case(Nq=33, Nk=33, D=24, Dv=40, dtype="bf16", softcap=4.0),
              GradCase(Case(Hq=4, Hkv=2, Nq=30, Nk=41, D=32, Dv=16, dtype="fp32", causal=True, sinks=True)),
              GradCase(Case(Nq=25, Nk=25, D=24, Dv=40, dtype="bf16", window=(9, 4))),
              KVCacheCase((1, 2), (90, 17), page=16, D=32, Dv=64, num_splits=3, tag="decode"),
              KVCacheCase((9, 0, 20), (40, 5, 20), page=16, D=48, Dv=32, tag="chunked"),
              # MLA decode on one latent cache (v = the cache's first 512 columns): MTP queries, 128 heads
              KVCacheCase((2, 1), (70, 33), page=64, Hq=16, Hkv=1, D=576, Dv=512, dtype="bf16", latent=True,
                          num_splits=2, tag="MLA"),
              KVCacheCase((1, 1), (40, 9), page=16, Hq=128, Hkv=1, D=576, Dv=512, latent=True, sinks=True,
                          fp8="tensor", tag="MLA")]
    # FP8 KV caches: descales per cache, per KV head and per (sequence, KV head); split, chunked, invariant
    cases += [KVCacheCase((1, 1, 1), (70, 1, 33), page=16, dtype="bf16", fp8="tensor", tag="decode"),
              KVCacheCase((1, 2), (90, 17), page=17, num_splits=3, dtype="bf16", fp8="head", tag="decode"),
              KVCacheCase((9, 0, 20), (40, 5, 20), page=16, window=(12, 0), fp8="seq", tag="chunked"),
              KVCacheCase((1, 3), (60, 30), page=8, Hq=8, Hkv=1, softcap=5.0, batch_invariant=True, fp8="seq",
                          sinks=True, tag="MQA")]
    return cases


def gpu_matrix() -> list:
    """The article's matrix and every feature, at realistic sizes."""
    cases = reference_checks()
    cases += [BaselineCheck(m, 1024, d, c) for m in ("explicit", "sdpa_flash") for d in (64, 128)
              for c in (False, True)]
    for dtype, causal, n, d in itertools.product(
            ("fp16", "bf16"), (False, True), (1, 63, 64, 65, 127, 128, 129, 257, 513, 1000),
            (64, 128)):
        cases.append(Case(B=2, Hq=4, Hkv=4, Nq=n, Nk=n, D=d, dtype=dtype, causal=causal))
    for dtype, causal, (nq, nk) in itertools.product(
            ("fp16", "bf16", "fp32"), CAUSAL_MODES, ((1, 513), (100, 1037), (1037, 100), (384, 385))):
        cases.append(Case(B=2, Hq=4, Hkv=2, Nq=nq, Nk=nk, D=128, dtype=dtype, causal=causal))
    for d, causal in itertools.product((8, 16, 40, 64, 80, 96, 112, 128, 192, 256), (False, True)):
        cases.append(Case(B=2, Hq=4, Hkv=2, Nq=300, Nk=300, D=d, causal=causal))
    for d in (192, 256):  # fp32 tiles at the largest head dims: the tightest shared-memory fit
        cases.append(Case(B=1, Hq=2, Hkv=2, Nq=200, Nk=333, D=d, dtype="fp32", causal=True))
    for group in (1, 2, 8, 32):
        cases.append(Case(B=2, Hq=32, Hkv=32 // group, Nq=257, Nk=513, D=128, dtype="bf16", causal=True))
    for layout in ("bnhd", "sliced"):
        for causal in (False, True):
            cases.append(Case(B=2, Hq=8, Hkv=2, Nq=777, Nk=777, D=128, layout=layout, causal=causal))
    for window, causal in itertools.product(((128, 0), (64, 64), (0, 0), (255, -1), (-1, 31)), (False, True)):
        cases.append(Case(B=2, Hq=4, Hkv=2, Nq=1000, Nk=1100, D=64, window=window, causal=causal))
    cases += [
        Case(B=2, Hq=4, Hkv=4, Nq=600, Nk=600, D=128, softcap=30.0, amplify=4.0, causal=True),
        Case(B=2, Hq=4, Hkv=4, Nq=600, Nk=600, D=128, dtype="bf16", softcap=50.0, scale=0.3),
        Case(B=2, Hq=4, Hkv=4, Nq=1024, Nk=300, D=64, causal=True, tag="fully masked rows"),
        Case(B=1, Hq=4, Hkv=4, Nq=513, Nk=513, D=64, amplify=4.0, tag="stability"),
        Case(B=1, Hq=4, Hkv=4, Nq=513, Nk=513, D=128, dtype="bf16", amplify=4.0, causal=True, tag="stability"),
    ]
    for n, causal in itertools.product((2048, 4096, 8192), (False, True)):
        cases.append(Case(B=1, Hq=4, Hkv=4, Nq=n, Nk=n, D=128, causal=causal, tag="long"))
    # Grids large enough for the split (two-half) tiles at D = 96/128 without a right edge.
    for dtype, d, window in itertools.product(("fp16", "bf16"), (96, 128), (None, (100, -1))):
        cases.append(Case(B=2, Hq=72, Hkv=8, Nq=300, Nk=333, D=d, dtype=dtype, window=window, tag="split"))
    cases += [Case(B=2, Hq=72, Hkv=8, Nq=300, Nk=300, D=128, softcap=30.0, tag="split"),
              Case(B=1, Hq=16, Hkv=16, Nq=4096, Nk=4096, D=128, tag="long split")]
    # packed sequences of mixed lengths (prefill), and chunks of queries against longer keys
    lens = (1000, 1, 0, 127, 128, 129, 513, 3000, 64)
    for causal, dtype in itertools.product(CAUSAL_MODES, ("fp16", "bf16")):
        cases.append(VarlenCase(lens, lens, Hq=8, Hkv=2, D=128, dtype=dtype, causal=causal))
    cases += [VarlenCase((512, 100, 2048), (4096, 1000, 2048), Hq=8, Hkv=2, D=128, causal=True, tag="chunked"),
              VarlenCase(lens, lens, Hq=8, Hkv=8, D=64, window=(256, 0), causal=True),
              VarlenCase(lens, lens, Hq=4, Hkv=1, D=256, softcap=30.0, tag="MQA")]
    # decode and chunked prefill on paged caches: Llama-3-8B's heads, page sizes 1 / 16 / 64
    decode = (1, 1, 1, 1, 1, 1, 1, 1)
    kv = (1, 100, 4096, 8191, 333, 16, 2048, 17)
    for page, splits in itertools.product((16, 64), (None, 1, 8)):
        cases.append(KVCacheCase(decode, kv, page=page, Hq=32, Hkv=8, D=128, dtype="bf16", num_splits=splits,
                                 tag="decode"))
    cases += [KVCacheCase(decode, kv, page=1, Hq=32, Hkv=8, D=128, dtype="bf16", tag="decode"),
              KVCacheCase(decode, kv, page=16, Hq=32, Hkv=8, D=128, dtype="bf16", batch_invariant=True, tag="decode"),
              KVCacheCase((512, 1, 100), (3000, 2048, 100), page=16, Hq=32, Hkv=8, D=128, tag="chunked"),
              KVCacheCase((4, 4), (5000, 64), page=16, Hq=16, Hkv=1, D=64, window=(1000, 0), tag="MQA")]
    # partial results merged (ring attention's and split-KV's step), cache writes of a decode step and a prefill
    cases += [MergeCase(4096, 1500, B=2, Hq=8, Hkv=2, D=128, dtype="bf16", causal=True),
              MergeCase(3000, 1024, Hq=8, Hkv=8, D=64, causal=False),
              CacheWriteCase(128, 1024, page=16, Hkv=8, D=128, dtype="bf16", tag="decode"),
              CacheWriteCase(5000, 512, page=16, Hkv=8, D=128, dtype="bf16", pad_every=7, tag="prefill")]
    # gradients: lengths around tile edges, GQA ratios, long sequences, every option
    for dtype, causal, n, d in itertools.product(("fp16", "bf16"), (False, True), (63, 129, 1000), (64, 128)):
        cases.append(GradCase(Case(B=2, Hq=8, Hkv=2, Nq=n, Nk=n, D=d, dtype=dtype, causal=causal)))
    cases += [GradCase(Case(B=1, Hq=8, Hkv=1, Nq=8192, Nk=8192, D=128, dtype="bf16", causal=True, tag="long")),
              GradCase(Case(B=1, Hq=4, Hkv=4, Nq=300, Nk=700, D=256, dtype="fp16", causal=True)),
              GradCase(Case(B=1, Hq=4, Hkv=2, Nq=500, Nk=500, D=96, window=(100, 20), softcap=30.0)),
              GradCase(Case(B=1, Hq=4, Hkv=4, Nq=700, Nk=300, D=64, causal=True, tag="fully masked rows"))]
    # attention sinks (gpt-oss's shapes: 64 query heads, 8 KV heads, D 64, a window of 128 on alternate layers)
    cases += [Case(B=2, Hq=64, Hkv=8, Nq=1000, Nk=1000, D=64, dtype="bf16", causal=True, sinks=True),
              Case(B=2, Hq=64, Hkv=8, Nq=1000, Nk=1000, D=64, dtype="bf16", causal=True, window=(127, 0), sinks=True),
              Case(B=2, Hq=4, Hkv=4, Nq=1024, Nk=300, D=128, causal=True, sinks=True, tag="fully masked rows"),
              VarlenCase(lens, lens, Hq=64, Hkv=8, D=64, dtype="bf16", causal=True, sinks=True),
              VarlenCase(lens, lens, Hq=64, Hkv=8, D=64, dtype="bf16", causal=True, window=(127, 0), sinks=True),
              KVCacheCase((512, 1, 100), (3000, 2048, 100), page=16, Hq=64, Hkv=8, D=64, dtype="bf16", sinks=True,
                          tag="chunked")]
    for page, splits in itertools.product((16, 64), (None, 1, 8)):
        cases.append(KVCacheCase(decode, kv, page=page, Hq=64, Hkv=8, D=64, dtype="bf16", num_splits=splits,
                                 sinks=True, tag="decode"))
    cases += [KVCacheCase(decode, kv, page=16, Hq=64, Hkv=8, D=64, dtype="bf16", batch_invariant=True, sinks=True,
                          tag="decode"),
              GradCase(Case(B=2, Hq=8, Hkv=2, Nq=1000, Nk=1000, D=64, dtype="bf16", causal=True, sinks=True)),
              GradCase(Case(B=1, Hq=8, Hkv=1, Nq=600, Nk=600, D=128, window=(100, 0), causal=True, sinks=True))]
    # FP8 inputs at the head dims the sm_90 kernels take, tile edges, GQA, the band, packed sequences
    for d, causal in itertools.product((64, 128, 256), (False, True)):
        cases.append(Fp8Case(B=2, Hq=8, Hkv=2, Nq=1000, Nk=1000, D=d, causal=causal, descale="head"))
    cases += [Fp8Case(B=1, Hq=4, Hkv=4, Nq=1024, Nk=300, D=128, causal=True, tag="fully masked rows"),
              Fp8Case(B=2, Hq=4, Hkv=2, Nq=700, Nk=700, D=128, window=(100, 20), softcap=30.0, out_dtype="fp16"),
              Fp8Case(Hq=64, Hkv=8, D=64, lens=tuple(zip(lens, lens)), causal=True, window=(127, 0), sinks=True,
                      descale="head")]
    # a v head dim unlike q's and k's: DeepSeek's 192 / 128 prefill (dense and chunked on a cache), 128 / 64
    cases += [Case(B=2, Hq=8, Hkv=8, Nq=1000, Nk=1000, D=192, Dv=128, dtype="bf16", causal=True),
              GradCase(Case(B=2, Hq=8, Hkv=8, Nq=1000, Nk=1000, D=192, Dv=128, dtype="bf16", causal=True)),
              GradCase(Case(B=1, Hq=8, Hkv=2, Nq=700, Nk=900, D=128, Dv=64, window=(100, 0))),
              Case(B=2, Hq=8, Hkv=2, Nq=700, Nk=900, D=128, Dv=64, window=(100, 0)),
              KVCacheCase((512, 1, 100), (3000, 2048, 100), page=64, Hq=16, Hkv=16, D=192, Dv=128, dtype="bf16",
                          tag="chunked"),
              KVCacheCase(decode, kv, page=16, Hq=32, Hkv=8, D=128, Dv=64, dtype="bf16", tag="decode")]
    # MLA decode on one latent cache (DeepSeek's 576 = 512 + 64, pages of 64 as FlashMLA): 16 heads (8-way tensor
    # parallel) split and not, packed and as [B, Nq, H, D] (the sm90 MLA kernel's form), 128 heads with two new
    # queries a sequence (MTP), an FP8 latent cache
    cases += [KVCacheCase(decode, kv, page=64, Hq=16, Hkv=1, D=576, Dv=512, dtype="bf16", latent=True, tag="MLA"),
              KVCacheCase(decode, kv, page=64, Hq=16, Hkv=1, D=576, Dv=512, dtype="bf16", latent=True, dense_q=True,
                          tag="MLA"),
              KVCacheCase(decode, kv, page=64, Hq=16, Hkv=1, D=576, Dv=512, dtype="bf16", latent=True, num_splits=8,
                          dense_q=True, tag="MLA"),
              KVCacheCase(tuple(2 for _ in kv), kv, page=64, Hq=128, Hkv=1, D=576, Dv=512, dtype="bf16",
                          latent=True, sinks=True, dense_q=True, tag="MLA"),
              KVCacheCase(decode, kv, page=16, Hq=16, Hkv=1, D=576, Dv=512, dtype="bf16", latent=True, fp8="tensor",
                          tag="MLA")]
    # FP8 KV caches at Llama-3-8B's heads: decode split and not (unsplit: tables.KVCACHE_DECODE_FP8's tile), pages
    # of 16 and 64, chunked prefill, invariant
    for page, splits, how in ((16, None, "head"), (16, 8, "seq"), (16, 1, "head"), (64, 1, "tensor"),
                              (64, None, "seq")):
        cases.append(KVCacheCase(decode, kv, page=page, Hq=32, Hkv=8, D=128, dtype="bf16", num_splits=splits,
                                 fp8=how, tag="decode"))
    cases += [KVCacheCase((512, 1, 100), (3000, 2048, 100), page=16, Hq=32, Hkv=8, D=128, dtype="bf16",
                          fp8="head", tag="chunked"),
              KVCacheCase(decode, kv, page=16, Hq=32, Hkv=8, D=128, dtype="fp16", batch_invariant=True, fp8="seq",
                          tag="decode")]
    return cases


def run_matrix(cases: Iterable, device, stream: Optional[TextIO] = None,
               attention: Optional[Callable] = None) -> int:
    """Print one line per case and a summary; return the number of failures. A case that a forced kernel
    (VFLASH_KERNEL, `vflash check --kernel`) cannot take is reported as refused, with the dispatch's reason, and
    counted apart: neither a pass nor a failure (but a run whose every case was refused checked nothing, and
    fails)."""
    passed = failed = refused = 0
    for case in cases:
        t0 = time.perf_counter()
        status = None
        try:
            verdicts = case.run(device, attention)
            ok = all(v.passed for v in verdicts)
            detail = "  ".join(
                f"{v.what}: max {v.max_err:.3e} mean {v.mean_err:.3e} tol {v.tol:.3e}"
                + (f" ({v.note})" if v.note else "") for v in verdicts)
        except ValueError as exc:
            ok, detail = False, f"raised ValueError: {exc}"
            if "cannot take this call" in str(exc):  # the forced kernel's refusal (vflash.dispatch)
                status, detail = "REFUSED", str(exc)
        except Exception as exc:  # a crash is a failed case, reported by name
            ok, detail = False, f"raised {type(exc).__name__}: {exc}"
        if status is None:
            status = "PASS" if ok else "FAIL"
            passed += ok
            failed += not ok
        else:
            refused += 1
        line = f"{status:<5} {case.name:<60} {detail}  [{time.perf_counter() - t0:.1f}s]"
        print(line, file=stream, flush=True)
    print(f"{passed} passed, {failed} failed" + (f", {refused} refused by the forced kernel" if refused else ""),
          file=stream, flush=True)
    return failed if passed or not refused else 1
