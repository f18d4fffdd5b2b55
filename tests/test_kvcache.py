"""vflash.attention_with_kvcache against reference/paged.py (each sequence's keys gathered
from its pages, then explicit fp64 attention), through the interpreter on the CPU (or the
device VFLASH_TEST_DEVICE names): decode and chunked prefill, contiguous and paged caches,
page sizes 1..64 with shuffled and shared pages, GQA/MQA, windows across page edges, more
queries than keys; bad metadata refused before the launch."""

import pytest
import torch

import vflash
from vflash.harness.oracle import compare
from vflash.reference import attention_with_kvcache_reference

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _paged(lens, page, hkv, d, dtype, device, seed=0, share_first=False, spare=3):
    """A shuffled paged cache holding sequences of the given lengths: (k_cache, v_cache, table)."""
    g = torch.Generator().manual_seed(seed)
    need = [max(1, -(-n // page)) for n in lens]
    max_pages = max(need)
    n_pages = sum(need) + spare
    order = torch.randperm(n_pages, generator=g).tolist()
    table = torch.zeros(len(lens), max_pages, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        for j in range(n):
            table[b, j] = order[used]
            used += 1
    if share_first:  # prefix sharing: every sequence's first page is sequence 0's
        table[:, 0] = table[0, 0]
    k_cache, v_cache = (torch.randn(n_pages, page, hkv, d, generator=g).to(dtype).to(device) for _ in range(2))
    return k_cache, v_cache, table.to(device)


def _check(q, k_cache, v_cache, cache_seqlens, table, cu_seqlens_q=None, max_seqlen_q=None, **opts):
    dt = q.dtype
    out, lse = vflash.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=table,
                                             cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                             return_lse=True, **opts)
    assert out.shape == q.shape and out.dtype == dt
    if cu_seqlens_q is None:  # the reference takes packed queries
        B, n_q, hq, d = q.shape
        cu = torch.arange(B + 1, dtype=torch.int32, device=q.device) * n_q
        qp = q.reshape(B * n_q, hq, d)
    else:
        cu, qp = cu_seqlens_q, q
    if table is None:  # a contiguous cache: one page a sequence
        table = torch.arange(k_cache.shape[0], dtype=torch.int32, device=q.device)[:, None]
    ref = {c: attention_with_kvcache_reference(qp, k_cache, v_cache, cache_seqlens, table, cu, compute_dtype=c,
                                               **opts) for c in (torch.float64, None, torch.float32)}
    if cu_seqlens_q is None:
        assert lse.shape == (B, hq, n_q)
        out_p, lse_p = out.reshape(B * n_q, hq, d), lse.transpose(0, 1).reshape(hq, B * n_q)
    else:
        assert lse.shape == (q.shape[1], q.shape[0])
        out_p, lse_p = out, lse
    for verdict in (compare("out", out_p.cpu(), ref[torch.float64][0].cpu(), ref[None][0].cpu(), dt),
                    compare("lse", lse_p.cpu(), ref[torch.float64][1].cpu(), ref[torch.float32][1].cpu(),
                            torch.float32)):
        assert verdict.passed, f"{verdict.what}: max err {verdict.max_err:.3e} > tol {verdict.tol:.3e} {verdict.note}"


def _q(B, n_q, hq, d, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, n_q, hq, d, generator=g).to(dtype).to(device)


@pytest.mark.parametrize("page", [1, 16, 17, 64])
@pytest.mark.parametrize("n_q", [1, 3])
def test_decode_on_a_paged_cache(page, n_q, device):
    lens = [37, 1, 70, 5]
    k_cache, v_cache, table = _paged(lens, page, 2, 32, torch.float16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    _check(_q(4, n_q, 8, 32, torch.float16, device), k_cache, v_cache, seqlens, table)


@pytest.mark.parametrize("opts", [dict(causal=False), dict(window=(9, 0)), dict(softcap=5.0), dict(scale=0.3)],
                         ids=["noncausal", "window", "softcap", "scale"])
def test_options(opts, device):
    lens = [33, 20]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, device)  # windows across page edges
    _check(_q(2, 4, 4, 16, torch.float16, device), k_cache, v_cache,
           torch.tensor(lens, dtype=torch.int32, device=device), table, **opts)


@pytest.mark.parametrize("hq,hkv", [(2, 2), (8, 2), (16, 1)], ids=["mha", "gqa4", "mqa16"])
def test_gqa_ratios(hq, hkv, device):
    lens = [25, 8]
    k_cache, v_cache, table = _paged(lens, 8, hkv, 16, torch.bfloat16, device)
    _check(_q(2, 2, hq, 16, torch.bfloat16, device), k_cache, v_cache,
           torch.tensor(lens, dtype=torch.int32, device=device), table)


def test_contiguous_cache(device):
    g = torch.Generator().manual_seed(4)
    k_cache, v_cache = (torch.randn(3, 50, 2, 16, generator=g).half().to(device) for _ in range(2))
    _check(_q(3, 2, 4, 16, torch.float16, device), k_cache, v_cache,
           torch.tensor([50, 7, 1], dtype=torch.int32, device=device), None)


def test_shared_prefix_pages(device):
    lens = [40, 40, 23]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, device, share_first=True)
    _check(_q(3, 1, 4, 16, torch.float16, device), k_cache, v_cache,
           torch.tensor(lens, dtype=torch.int32, device=device), table)


def test_chunked_prefill_with_packed_queries(device):
    # a chunk of new queries per sequence, of different lengths, against its cached prefix;
    # sequence 2 has more new queries than keys: its first rows see none (zeros, -inf)
    lens_q, lens_k = [5, 0, 9, 32], [40, 3, 6, 32]
    k_cache, v_cache, table = _paged(lens_k, 16, 2, 16, torch.float16, device)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lens_q), 4, 16, generator=g).half().to(device)
    cu = torch.tensor([0, 5, 5, 14, 46], dtype=torch.int32, device=device)
    for opts in (dict(), dict(window=(4, 0))):
        _check(q, k_cache, v_cache, torch.tensor(lens_k, dtype=torch.int32, device=device), table, cu_seqlens_q=cu,
               max_seqlen_q=32, **opts)


def test_fp32(device):
    lens = [19, 3]
    k_cache, v_cache, table = _paged(lens, 4, 1, 8, torch.float32, device)
    _check(_q(2, 2, 2, 8, torch.float32, device), k_cache, v_cache,
           torch.tensor(lens, dtype=torch.int32, device=device), table)


def _args(device):
    lens = [20, 5]
    k_cache, v_cache, table = _paged(lens, 8, 2, 16, torch.float16, device, spare=0)
    return dict(q=_q(2, 1, 4, 16, torch.float16, device), k_cache=k_cache, v_cache=v_cache,
                cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=device), block_table=table)


@pytest.mark.parametrize("change,error,match", [
    (lambda a: dict(cache_seqlens=a["cache_seqlens"].long()), TypeError, "cache_seqlens must be an int32"),
    (lambda a: dict(cache_seqlens=torch.tensor([25, 5], dtype=torch.int32, device=a["q"].device)), ValueError,
     r"cache_seqlens\[0\] = 25 is outside 0..24"),
    (lambda a: dict(block_table=a["block_table"].long()), TypeError, "block_table must be an int32"),
    (lambda a: dict(block_table=a["block_table"] + 100), ValueError,
     r"block_table\[0, 0\] = \d+ is not a page of the cache"),
    (lambda a: dict(block_table=a["block_table"][:1]), ValueError, "block_table has 1 rows for 2 sequences"),
    (lambda a: dict(q=a["q"][:1]), ValueError, "q holds 1 sequences"),
    (lambda a: dict(v_cache=a["v_cache"][:, :4]), ValueError, "one shape"),
    (lambda a: dict(q=a["q"].float()), TypeError, "share one dtype"),
    (lambda a: dict(causal="top_left"), ValueError, "does not apply to a KV cache"),
    (lambda a: dict(num_splits=2), ValueError, "split-KV is not implemented yet"),
    (lambda a: dict(num_splits=0), TypeError, "num_splits must be None or an int >= 1"),
    (lambda a: dict(max_seqlen_q=1), ValueError, "max_seqlen_q goes with packed queries"),
    (lambda a: dict(q=a["q"][:, 0], cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32, device=a["q"].device),
                    max_seqlen_q=2), ValueError, r"cu_seqlens_q\[-1\] must be the packed length of q \(2\)"),
    (lambda a: dict(q=a["q"][:, 0], cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32, device=a["q"].device),
                    max_seqlen_q=2), ValueError, "2 entries for 2 sequences"),
])
def test_bad_metadata_is_refused_before_launch(change, error, match, device):
    args = _args(device)
    args.update(change(args))
    with pytest.raises(error, match=match):
        vflash.attention_with_kvcache(**args)


def test_unused_table_entries_are_not_checked(device):
    # a sequence's table row past its pages may hold anything (vLLM pads with garbage)
    args = _args(device)
    args["block_table"][1, 1:] = 10**6
    vflash.attention_with_kvcache(**args)
    args["check_metadata"] = False
    vflash.attention_with_kvcache(**args)
