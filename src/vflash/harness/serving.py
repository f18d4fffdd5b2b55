"""`vflash bench --sweep decode | varlen | chunked | merge | write`: the serving path against
the engines people would otherwise use, in the same run.

decode   one new query per sequence (bf16, Hq 32 / Hkv 8, D 128), B x KV rows. GB/s of K+V
         read per call (2 * B * KV * Hkv * D * 2 bytes over the time) for vflash on a paged
         cache with a shuffled block table (page size 16 and 64; 16 also batch-invariant; 1)
         and on a contiguous cache,
         and SDPA cuDNN / flash on the same contiguous cache ([B, KV, Hkv, D] seen as
         [B, Hkv, KV, D], enable_gqa). Timed as CUDA-graph replays over rotating cache copies
         (at least ROTATE_BYTES of caches, so no call finds its cache in L2), with the run's
         own copy bandwidth measured first; vflash's host cost a call is timed apart.
varlen   8 causal sequences of mixed lengths packed in one attention_varlen call, against
         vflash.attention and SDPA cuDNN called once per sequence (the GPU time of the loop):
         TFLOP/s counting each sequence's own causal pairs.
chunked  a chunk of new queries per sequence against a cached prefix on a paged cache
         (page size 16 and 64, shuffled; 16 also with each sequence's pages in order) and on a
         contiguous cache, against the same work done dense by vflash.attention.
merge    vflash.merge_states on [B, H, N, D] bf16 outputs and their fp32 LSEs (decode's and
         ring attention's shapes) against the same formula in PyTorch ops: GB/s of the
         bytes it must move (two outputs and LSEs read, one written), beside the run's copy
         bandwidth.
write    vflash.write_kvcache of T new tokens (bf16, Hkv 8, D 128) into a paged cache at
         shuffled slots against PyTorch's index_copy_ into the same cache: GB/s of the
         new K / V read and written.

Every method of a row is timed in the same process, one after another.
"""

import csv
import math
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

import vflash
from vflash.harness.bench import error_text, visible_pairs
from vflash.harness.env import environment
# The sweeps' timers and their settings live in vflash.harness.timing, which the lab scripts share (one
# implementation); the settings stay importable from here. _host_us, the sweeps' own host timer, looks the CPU
# probe up under this module's name, where a test replaces it.
from vflash.harness.timing import REPLAYS, ROTATE_BYTES, WARMUP_MS  # noqa: F401
from vflash.harness.timing import cpu_probe_us as _cpu_probe_us
from vflash.harness.timing import graph_runner, graph_time, replay_times, rotating_copies, summarize, wall_us

DECODE_ROWS = [(b, kv) for b in (1, 8, 32, 128) for kv in (1024, 8192, 32768)]
DECODE_HEADS = (32, 8, 128)  # Hq, Hkv, D
DECODE_METHODS = ["vflash_paged16", "vflash_paged64", "vflash_paged16_invariant", "vflash_paged1", "vflash_contig",
                  "sdpa_cudnn", "sdpa_flash"]
VARLEN_LENGTHS = [512, 1024, 1536, 2048, 3072, 4096, 8192, 11000]  # 31,480 tokens
CHUNKED_ROWS = [(4, 512, 2048), (4, 2048, 8192), (2, 1024, 32768)]  # (B, new queries, cached prefix)
# merge_states' [B, H, N, D]: split / cascade decode (B 1-128, one query), ring attention's chunk outputs
MERGE_ROWS = [(1, 32, 1, 128), (128, 32, 1, 128), (1, 32, 4096, 128), (4, 32, 8192, 128), (1, 32, 32768, 64)]
WRITE_TOKENS = [1, 128, 2048, 32768]  # write_kvcache: a decode step (B 1, 128), prefill chunks
WRITE_HEADS = (8, 128)  # Hkv, D
WRITE_PAGE = 16
COLUMNS = ["date", "gpu", "sweep", "method", "dtype", "B", "Hq", "Hkv", "Nq", "Nk", "D", "page", "status",
           "us_median", "us_p20", "us_p80", "reps", "gbps", "tflops", "copy_gbps", "host_us", "host_out_us",
           "host_rounds", "host_probe_us", "vs_sdpa_cudnn", "vs_vflash_dense", "max_diff_vs_dense", "vs_torch",
           "checked_wall_us", "unchecked_wall_us"]
# chunked: a vflash method whose output differs from vflash.attention's on the same work by more than this
# (bf16, unit-variance inputs: two right kernels differ by a few bf16 roundings, about 1e-2) is marked wrong
CHUNKED_MAX_DIFF = 0.05
SWEEPS = ("decode", "varlen", "chunked", "merge", "write")  # run_serving's, as `vflash bench --sweep` names them
SMOKE_DECODE = [(2, 40)]
SMOKE_HEADS = (4, 2, 16)

# Varlen and chunked rows: the methods timed in turn this many rounds, each round after this much warmup
PREFILL_ROUNDS = 5
PREFILL_ROUND_WARMUP_MS = 10.0


def _time_into(row: Dict[str, object], calls: Sequence[Callable[[], object]], device: torch.device, field: str,
               work_per_us: float) -> None:
    """Time `calls` (timing.graph_time) into `row`: the microsecond statistics and `field`, the
    rate work_per_us / median (bytes a us / 1e3 -> GB/s; FLOPs a us / 1e6 -> TFLOP/s)."""
    _put_stats(row, graph_time(calls, device), field, work_per_us)


def _round_kept(x: float, places: int) -> float:
    # round to `places` decimals, keeping three significant figures where that would round a small
    # rate or ratio (an interpreter run's GB/s, a slow CPU ratio) to zero
    if not x or not math.isfinite(x):
        return x
    return round(x, max(places, 2 - math.floor(math.log10(abs(x)))))


def _put_stats(row: Dict[str, object], stats: Tuple[float, float, float, int], field: str,
               work_per_us: float) -> None:
    # (median, p20, p80, reps) microseconds into `row`, and `field`: the rate work_per_us / median
    med, p20, p80, reps = stats
    row.update(us_median=round(med, 2), us_p20=round(p20, 2), us_p80=round(p80, 2), reps=reps,
               **{field: _round_kept(work_per_us / med, 1)})


def prefill_rows(methods: Dict[str, Callable[[], object]], base: Dict[str, object], flops: float,
                 device: torch.device) -> List[Dict[str, object]]:
    """The varlen and chunked sweeps' timing of several ways to do the same prefill work: one row a method
    (`base` and its name), TFLOP/s of `flops` a call; a method that fails gets its status. On the GPU
    the methods are timed in turn, PREFILL_ROUNDS rounds of REPLAYS replays each (after one WARMUP_MS),
    and each row's statistics pool its rounds: the board's clock moves by several per cent within a
    sweep, and a row's ratios are between methods that saw the same clocks."""
    rows = {name: dict(base, method=name, status="ok") for name in methods}
    if device.type != "cuda":
        for name, call in methods.items():
            try:
                _time_into(rows[name], [call], device, "tflops", flops / 1e6)
            except Exception as exc:
                rows[name]["status"] = error_text(exc)
        return list(rows.values())
    runners, times = {}, {name: [] for name in methods}
    for name, call in methods.items():
        try:
            runners[name] = graph_runner([call], device)
        except Exception as exc:
            rows[name]["status"] = error_text(exc)
    for rnd in range(PREFILL_ROUNDS):
        for name, run in runners.items():
            times[name] += replay_times(run, 1, REPLAYS, WARMUP_MS if rnd == 0 else PREFILL_ROUND_WARMUP_MS)
    for name in runners:
        _put_stats(rows[name], summarize(times[name]), "tflops", flops / 1e6)
    return list(rows.values())


def copy_gbps(device: torch.device) -> float:
    """The device's copy bandwidth (bytes read + written a second) over a 2 GiB copy: the
    better of a device-to-device copy and an elementwise kernel's."""
    if device.type != "cuda":
        return float("nan")
    a = torch.empty(1 << 29, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    us = min(graph_time([lambda: b.copy_(a)], device)[0], graph_time([lambda: torch.mul(a, 1.0, out=b)], device)[0])
    a = b = None  # free the 4 GiB before the sweep
    return 2 * (1 << 31) / us / 1e3


def shuffled_table(B: int, pages_per_seq: int, device, seed: int = 0) -> torch.Tensor:
    """The sweeps' block table: int32 [B, pages_per_seq], sequence b's pages a seeded shuffle of the cache's
    B * pages_per_seq pages (the same table for the same arguments, run to run)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(B * pages_per_seq, generator=g).to(torch.int32).view(B, pages_per_seq).to(device)


HOST_ROUNDS = 5  # _host_us's rounds in the decode sweep


def _host_us(call: Callable[[], object], device: torch.device, n: int = 300,
             rounds: int = 5) -> Tuple[float, float]:
    """Host time a call: the least over `rounds` rounds of one round's mean, each round n calls
    back to back behind a sleep kernel longer than them, so the calls only queue their kernels and
    the timer sees the host's work alone (without it a call whose kernels outlast its host path is
    timed at the GPU's pace); and `timing.cpu_probe_us` timed right after that round, which says whether
    the host ran in a slow phase then. Returns (call us, probe us)."""
    for _ in range(10):
        call()
    best, probe = float("inf"), float("nan")
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)  # ~100 ms of GPU clock cycles: longer than the n calls
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        us = (time.perf_counter() - t0) * 1e6 / n
        p = _cpu_probe_us()
        if us < best:
            best, probe = us, p
        if device.type == "cuda":
            torch.cuda.synchronize()
    return best, probe


def decode_rows(B: int, KV: int, heads: Tuple[int, int, int], dtype: torch.dtype, device: torch.device,
                methods: Sequence[str]) -> List[Dict[str, object]]:
    """One decode row: a dict per method (status, times, GB/s)."""
    Hq, Hkv, D = heads
    cache_bytes = 2 * B * KV * Hkv * D * torch.finfo(dtype).bits // 8
    n = rotating_copies(cache_bytes) if device.type == "cuda" else 1  # the interpreter: one copy, it reads no L2
    q = torch.randn(B, 1, Hq, D, device=device, dtype=dtype)
    seqlens = torch.full((B,), KV, dtype=torch.int32, device=device)
    rows = []
    contig = None
    for method in methods:
        row = dict(method=method, B=B, Hq=Hq, Hkv=Hkv, Nq=1, Nk=KV, D=D, page="", status="ok")
        try:
            if method.startswith("vflash_paged"):
                page_text, _, mode = method[len("vflash_paged"):].partition("_")  # _invariant, _sinks, _fp8
                page, invariant, fp8 = int(page_text), mode == "invariant", mode == "fp8"
                sinks = torch.randn(Hq, device=device) if mode == "sinks" else None
                row["page"] = page
                pages = -(-KV // page)
                # _fp8: e4m3 caches (half the bytes: the row's GB/s counts those) with a descale a KV head
                caches = [tuple(torch.randn(B * pages, page, Hkv, D, device=device, dtype=dtype).to(
                    torch.float8_e4m3fn if fp8 else dtype) for _ in range(2)) for _ in range(n)]
                descales = dict(k_descale=torch.full((Hkv,), 0.5, device=device),
                                v_descale=torch.full((Hkv,), 0.5, device=device)) if fp8 else {}
                table = shuffled_table(B, pages, device)
                calls = [lambda kc=kc, vc=vc: vflash.attention_with_kvcache(
                    q, kc, vc, seqlens, block_table=table, batch_invariant=invariant, sinks=sinks,
                    check_metadata=False, **descales) for kc, vc in caches]
            else:
                if contig is None:
                    contig = [(torch.randn(B, KV, Hkv, D, device=device, dtype=dtype),
                               torch.randn(B, KV, Hkv, D, device=device, dtype=dtype)) for _ in range(n)]
                if method == "vflash_contig":
                    calls = [lambda kc=kc, vc=vc: vflash.attention_with_kvcache(q, kc, vc, seqlens,
                                                                                check_metadata=False)
                             for kc, vc in contig]
                else:
                    calls = [_sdpa_call(method, q, kc, vc) for kc, vc in contig]
            read = cache_bytes // 2 if method.endswith("_fp8") else cache_bytes  # the bytes the call reads
            _time_into(row, calls, device, "gbps", read / 1e3)
            # pages of 16's host cost, measured after its GPU time: thousands of calls ahead of the timing would
            # give this one method a warmer GPU than the others of the row (a faster row, at the latency floor)
            if method == "vflash_paged16" and device.type == "cuda":
                host, probe = _host_us(calls[0], device, rounds=HOST_ROUNDS)
                row.update(host_us=round(host, 2), host_probe_us=round(probe, 2), host_rounds=HOST_ROUNDS)
                out = torch.empty_like(q)  # and with out= (the caller's buffer: the plan allocates nothing)
                host, _ = _host_us(lambda: vflash.attention_with_kvcache(
                    q, *caches[0], seqlens, block_table=table, check_metadata=False, out=out), device)
                row["host_out_us"] = round(host, 2)
                # a checked call (the default): its metadata check's device work and host sync, beside
                # an unchecked call's wall time (both synchronized, the kernel's time included)
                row["checked_wall_us"] = round(wall_us(lambda: vflash.attention_with_kvcache(
                    q, *caches[0], seqlens, block_table=table)), 2)
                row["unchecked_wall_us"] = round(wall_us(calls[0]), 2)
        except Exception as exc:  # a method that cannot run here gets its status
            row["status"] = error_text(exc)
        finally:
            caches = calls = None
        rows.append(row)
    return rows


def _sdpa_call(method: str, q, kc, vc):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[method]
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)  # [B, H, N, D] views

    def call():
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    return call


def varlen_rows(lengths: Sequence[int], heads: Tuple[int, int, int], dtype: torch.dtype,
                device: torch.device) -> List[Dict[str, object]]:
    """Causal prefill of packed sequences: vflash_varlen (one call) against vflash_dense and
    sdpa_cudnn called once per sequence."""
    Hq, Hkv, D = heads
    total = sum(lengths)
    q = torch.randn(total, Hq, D, device=device, dtype=dtype)
    k = torch.randn(total, Hkv, D, device=device, dtype=dtype)
    v = torch.randn(total, Hkv, D, device=device, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    flops = 4.0 * D * Hq * sum(visible_pairs(n, n, True) for n in lengths)
    parts = [(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None], v[a:b].transpose(0, 1)[None])
             for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def per_sequence_sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for qs, ks, vs in parts:
                torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
    methods = {
        "vflash_varlen": lambda: vflash.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                                         check_metadata=False),
        "vflash_dense": lambda: [vflash.attention(qs, ks, vs, causal=True) for qs, ks, vs in parts],
        "sdpa_cudnn": per_sequence_sdpa,
    }
    return prefill_rows(methods, dict(B=len(lengths), Hq=Hq, Hkv=Hkv, Nq=total, Nk=total, D=D, page=""), flops,
                         device)


def paged_cache(k: torch.Tensor, v: torch.Tensor, size: int,
                shuffled: bool = True) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The keys and values k, v [B, n_k, Hkv, D] in shuffled pages of `size` (or, not shuffled, each
    sequence's pages one after another): (k_cache, v_cache, block_table), sequence b's page j (keys j *
    size on) page block_table[b, j]."""
    B, n_k, Hkv, D = k.shape
    pages = -(-n_k // size)
    table = (shuffled_table(B, pages, k.device) if shuffled else
             torch.arange(B * pages, dtype=torch.int32, device=k.device).view(B, pages))
    kc, vc = (torch.zeros(B * pages, size, Hkv, D, device=k.device, dtype=k.dtype) for _ in range(2))
    for c, t in ((kc, k), (vc, v)):
        rows = torch.zeros(B, pages * size, Hkv, D, device=k.device, dtype=k.dtype)
        rows[:, :n_k] = t
        c[table.reshape(-1).long()] = rows.view(B * pages, size, Hkv, D)
    return kc, vc, table


def chunked_rows(B: int, n_new: int, prefix: int, heads: Tuple[int, int, int], dtype: torch.dtype,
                 device: torch.device, page: int = 16) -> List[Dict[str, object]]:
    """A chunk of n_new queries per sequence against prefix cached keys plus their own, on
    a shuffled paged cache of page sizes 16 and 64, on pages of 16 in order (each sequence's
    pages one after another, as a block allocator hands them out: a tile's pages in one copy)
    and on a contiguous [B, max_len] cache holding the same keys, against vflash.attention on
    dense [B, H, N, D] copies (and attention_varlen on the same tokens packed)."""
    Hq, Hkv, D = heads
    n_k = prefix + n_new
    q = torch.randn(B, n_new, Hq, D, device=device, dtype=dtype)
    k = torch.randn(B, n_k, Hkv, D, device=device, dtype=dtype)
    v = torch.randn_like(k)
    seqlens = torch.full((B,), n_k, dtype=torch.int32, device=device)
    qd, kd, vd = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    qp, kp, vp = (t.reshape(-1, t.shape[2], D) for t in (q, k, v))
    cu_q, cu_k = (torch.arange(0, (B + 1) * n, n, dtype=torch.int32, device=device) for n in (n_new, n_k))
    flops = 4.0 * D * Hq * B * visible_pairs(n_new, n_k, True)

    def paged(size, shuffled=True):
        kc, vc, table = paged_cache(k, v, size, shuffled)
        return lambda: vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False)
    methods = {f"vflash_paged{page}": paged(page), f"vflash_paged{page}_in_order": paged(page, shuffled=False),
               "vflash_paged64": paged(64),
               "vflash_contig": lambda: vflash.attention_with_kvcache(q, k, v, seqlens, check_metadata=False),
               # the same tokens packed, keys as packed sequences: the varlen build without the cache's reads
               "vflash_varlen": lambda: vflash.attention_varlen(qp, kp, vp, cu_q, cu_k, n_new, n_k, causal=True,
                                                                check_metadata=False),
               "vflash_dense": lambda: vflash.attention(qd, kd, vd, causal=True)}
    rows = prefill_rows(methods, dict(B=B, Hq=Hq, Hkv=Hkv, Nq=n_new, Nk=n_k, D=D, page=""), flops, device)
    against_dense(rows, methods, "vflash_dense", "vs_vflash_dense")
    for r in rows:
        if "paged" in r["method"]:
            r["page"] = int(r["method"][len("vflash_paged"):].partition("_")[0])
    return rows


def against_dense(rows: List[Dict[str, object]], methods: Dict[str, Callable[[], object]], dense: str,
                  field: str) -> None:
    """Chunked rows against method `dense` (vflash.attention on dense [B, H, N, D] copies): each other
    method's output, in q's [B, n_new, Hq, D] layout, within CHUNKED_MAX_DIFF of dense's or its row marked
    wrong; and `field` the dense time over the row's (the bar: within 10 % of the same work dense)."""
    ref = methods[dense]().transpose(1, 2).float()
    for r in rows:
        if r["status"] == "ok" and r["method"] != dense:
            diff = (methods[r["method"]]().reshape(ref.shape).float() - ref).abs().max().item()
            r["max_diff_vs_dense"] = f"{diff:.2e}"
            if not diff <= CHUNKED_MAX_DIFF:  # NaN included
                r["status"] = f"wrong: max diff {diff:.2e} from vflash.attention"
    dense_us = next(r for r in rows if r["method"] == dense).get("us_median")
    for r in rows:
        if r.get("us_median") and dense_us:
            r[field] = _round_kept(dense_us / r["us_median"], 3)


def _against_torch(rows: List[Dict[str, object]]) -> None:
    # each row's time against the torch_ row's of the same shape (above 1: faster)
    base = next((r.get("us_median") for r in rows if r["method"].startswith("torch_") and r["status"] == "ok"), None)
    for r in rows:
        if base and r.get("us_median"):
            r["vs_torch"] = _round_kept(base / r["us_median"], 3)


def merge_inputs(B: int, H: int, N: int, D: int, device: torch.device) -> Tuple[list, int]:
    """merge_states' inputs for the merge sweep: (out_a, lse_a, out_b, lse_b) [B, H, N, D] bf16 and [B, H, N]
    fp32 (every 7th of lse_a -inf), one set per rotating copy on the GPU; and the bytes a merge must move
    (two outputs and LSEs read, one written)."""
    one = B * H * N * (D * 2 + 4)  # one output and its LSE
    parts = []
    for _ in range(rotating_copies(3 * one) if device.type == "cuda" else 1):
        oa, ob = (torch.randn(B, H, N, D, device=device, dtype=torch.bfloat16) for _ in range(2))
        la, lb = (torch.randn(B, H, N, device=device) * 4 for _ in range(2))
        la.view(-1)[::7] = float("-inf")
        parts.append((oa, la, ob, lb))
    return parts, 3 * one


def write_inputs(T: int, heads: Tuple[int, int], page: int,
                 device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, list, int]:
    """write_kvcache's inputs for the write sweep: zeroed caches [blocks, page, Hkv, D] bf16 four times the
    tokens' size (so the slots scatter), (k_new, v_new [T, Hkv, D], distinct shuffled slots [T] int64) per
    rotating copy on the GPU; and the bytes a write must move (the new K / V read and written)."""
    Hkv, D = heads
    blocks = max(64, 4 * -(-T // page))
    kc, vc = (torch.zeros(blocks, page, Hkv, D, device=device, dtype=torch.bfloat16) for _ in range(2))
    new_bytes = 2 * T * Hkv * D * 2  # k_new and v_new
    g = torch.Generator().manual_seed(T)
    news = [(torch.randn(T, Hkv, D, device=device, dtype=torch.bfloat16),
             torch.randn(T, Hkv, D, device=device, dtype=torch.bfloat16),
             torch.randperm(blocks * page, generator=g)[:T].to(device))
            for _ in range(rotating_copies(new_bytes) if device.type == "cuda" else 1)]
    return kc, vc, news, 2 * new_bytes


def merge_rows(B: int, H: int, N: int, D: int, device: torch.device) -> List[Dict[str, object]]:
    """merge_states on [B, H, N, D] bf16 outputs with [B, H, N] fp32 LSEs (some -inf, as a split that
    saw no key leaves them) against the merge written in PyTorch ops: GB/s of the bytes it must move
    (finite outputs everywhere: the PyTorch formula would take 0 x NaN from an empty part's garbage)."""
    from vflash.reference.merge import merge_states_reference
    dtype = torch.bfloat16
    parts, moved = merge_inputs(B, H, N, D, device)

    def torch_merge(oa, la, ob, lb):  # the formula in fp32 PyTorch ops, as a user would write it
        lse = torch.logaddexp(la, lb)
        ref = torch.where(torch.isneginf(lse), 0.0, lse)  # a row no part saw: weights exp(-inf) = 0
        out = oa.float() * torch.exp(la - ref)[..., None] + ob.float() * torch.exp(lb - ref)[..., None]
        return out.to(dtype), lse
    methods = {"vflash_merge": vflash.merge_states, "torch_merge": torch_merge}
    want = merge_states_reference(*parts[0])
    tol = 2.0 ** -7 * max(1.0, want[0].abs().max().item())  # one bf16 step at the largest output: its rounding
    rows = []
    for name, fn in methods.items():
        row = dict(method=name, B=B, Hq=H, Hkv=H, Nq=N, Nk=N, D=D, page="", status="ok")
        try:
            got, got_lse = fn(*parts[0])
            diff = (got.double() - want[0]).abs().max().item()
            row["max_diff_vs_dense"] = f"{diff:.2e}"
            if not diff <= tol or not torch.equal(torch.isneginf(got_lse), torch.isneginf(want[1])):
                row["status"] = f"wrong: max diff {diff:.2e} from the fp64 merge"
            else:
                _time_into(row, [lambda p=p: fn(*p) for p in parts], device, "gbps", moved / 1e3)
                if name == "vflash_merge" and device.type == "cuda":  # a planned call's host time
                    host, probe = _host_us(lambda: fn(*parts[0]), device, rounds=HOST_ROUNDS)
                    row.update(host_us=round(host, 2), host_probe_us=round(probe, 2), host_rounds=HOST_ROUNDS)
        except Exception as exc:
            row["status"] = error_text(exc)
        rows.append(row)
    _against_torch(rows)
    return rows


def write_rows(T: int, heads: Tuple[int, int], page: int, device: torch.device) -> List[Dict[str, object]]:
    """write_kvcache of T tokens [T, Hkv, D] (bf16) into a paged cache at shuffled distinct slots,
    against PyTorch's index_copy_ of the same rows: GB/s of the new K / V read plus written."""
    Hkv, D = heads
    kc, vc, news, moved = write_inputs(T, heads, page, device)

    def vflash_write(k, v, slots):
        vflash.write_kvcache(kc, vc, k, v, slots, check_metadata=False)

    def torch_write(k, v, slots):
        kc.view(-1, Hkv, D).index_copy_(0, slots, k)
        vc.view(-1, Hkv, D).index_copy_(0, slots, v)
    rows = []
    k0, v0, s0 = news[0]
    for name, fn in (("vflash_write", vflash_write), ("torch_write", torch_write)):
        row = dict(method=name, B=T, Hq=Hkv, Hkv=Hkv, Nq=T, Nk=T, D=D, page=page, status="ok")
        try:
            kc.zero_()
            vc.zero_()
            fn(k0, v0, s0)
            ok = (torch.equal(kc.view(-1, Hkv, D)[s0], k0) and torch.equal(vc.view(-1, Hkv, D)[s0], v0)
                  and int((kc != 0).any(-1).any(-1).sum()) <= T)
            if not ok:
                row["status"] = "wrong: the cache's rows differ from the new tokens"
            else:
                calls = [lambda k=k, v=v, s=s: fn(k, v, s) for k, v, s in news]
                _time_into(row, calls, device, "gbps", moved / 1e3)
                if name == "vflash_write" and device.type == "cuda":
                    # a planned call's host time (check_metadata=False), and a checked call's wall time (its
                    # slot check's host sync included)
                    host, probe = _host_us(calls[0], device, rounds=HOST_ROUNDS)
                    row.update(host_us=round(host, 2), host_probe_us=round(probe, 2), host_rounds=HOST_ROUNDS,
                               checked_wall_us=round(wall_us(lambda: vflash.write_kvcache(kc, vc, k0, v0, s0)), 2))
        except Exception as exc:
            row["status"] = error_text(exc)
        rows.append(row)
    _against_torch(rows)
    return rows


def run_serving(sweep: str, out_csv: str, device: torch.device, methods: Optional[Sequence[str]] = None,
                printer: Callable[[str], None] = print) -> List[Dict[str, object]]:
    """Run one serving sweep ("decode", "varlen", "chunked", "merge", "write", or "smoke": tiny decode
    rows through the interpreter) and write its CSV; returns the rows."""
    env = environment()
    dtype = torch.bfloat16
    smoke = sweep == "smoke"
    heads = SMOKE_HEADS if smoke else DECODE_HEADS
    bw = copy_gbps(device)
    printer(f"copy bandwidth {bw:.0f} GB/s (read + write)")
    rows: List[Dict[str, object]] = []
    if sweep in ("decode", "smoke"):
        for B, KV in (SMOKE_DECODE if smoke else DECODE_ROWS):
            got = decode_rows(B, KV, heads, dtype, device, methods or DECODE_METHODS)
            _ratios(got, "gbps")
            rows += got
            printer(f"B {B:4d} KV {KV:6d}: " + "  ".join(f"{r['method']} {r.get('gbps', r['status'])}" for r in got))
    elif sweep == "varlen":
        rows = varlen_rows(VARLEN_LENGTHS, heads, dtype, device)
        _ratios(rows, "tflops")
        printer("  ".join(f"{r['method']} {r.get('tflops', r['status'])}" for r in rows))
    elif sweep == "chunked":
        for B, n_new, prefix in CHUNKED_ROWS:
            got = chunked_rows(B, n_new, prefix, heads, dtype, device)
            rows += got
            printer(f"B {B} new {n_new} prefix {prefix}: "
                    + "  ".join(f"{r['method']} {r.get('tflops', r['status'])}" for r in got))
    elif sweep == "merge":
        for shape in MERGE_ROWS:
            got = merge_rows(*shape, device)
            rows += got
            printer(f"merge {list(shape)}: " + "  ".join(f"{r['method']} {r.get('gbps', r['status'])}" for r in got))
    elif sweep == "write":
        for T in WRITE_TOKENS:
            got = write_rows(T, WRITE_HEADS, WRITE_PAGE, device)
            rows += got
            printer(f"write T {T}: " + "  ".join(f"{r['method']} {r.get('gbps', r['status'])}" for r in got))
    else:
        raise ValueError(f"unknown serving sweep {sweep!r}")
    gpu = env.get("gpu") or env.get("device") or device.type
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**{c: "" for c in COLUMNS}, "date": time.strftime("%Y-%m-%d"), "gpu": gpu, "sweep": sweep,
                        "dtype": "bf16", "copy_gbps": round(bw, 1) if bw == bw else "", **r})
    return rows


def _ratios(rows: List[Dict[str, object]], field: str) -> None:
    base = next((r.get(field) for r in rows if r["method"] == "sdpa_cudnn" and r["status"] == "ok"), None)
    for r in rows:
        if base and r.get(field):
            r["vs_sdpa_cudnn"] = _round_kept(r[field] / base, 3)
