"""MLA decode on one latent cache (issue 55): q of 576 columns against a cache [pages, page_size, 1, 576] whose
v_cache is the cache's first 512 columns, a view of the same memory. The KV-cache kernel reads each tile once for
both products (V_IN_K) and splits a group wider than its rows over programs (HEAD_BLOCKS). Against the paged
oracle (each sequence's pages gathered in PyTorch, V the first 512 columns, explicit fp64 attention); paged at
several page sizes and contiguous, split-KV, speculative decoding's 1-4 queries, LSE, sinks, an FP8 latent
cache; the limits refused with the limit named; a latent plan never serving a v that is not the view."""

import pytest
import torch

import vflash
from vflash.dispatch import tables
from vflash.harness.cases import KVCacheCase
from vflash.harness.lab import captured_launches
from vflash.reference import attention_with_kvcache_reference
from _devices import needs_interpreter

F64 = torch.float64
D, DV = 576, 512


def _latent(lens, page, device, dtype=torch.float16, seed=0):
    # a shuffled paged latent cache (page 0: contiguous [B, max_len, 1, 576]) and its table (None contiguous)
    g = torch.Generator().manual_seed(seed)
    if page == 0:
        cache = torch.randn(len(lens), max(lens), 1, D, generator=g).to(dtype).to(device)
        return cache, None
    need = [max(1, -(-n // page)) for n in lens]
    order = torch.randperm(sum(need) + 1, generator=g)
    cache = torch.randn(sum(need) + 1, page, 1, D, generator=g).to(dtype).to(device)
    table = torch.zeros(len(lens), max(need), dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at:at + n]
        at += n
    return cache, table.to(device)


@pytest.mark.parametrize("page,hq,n_q,splits", [(64, 16, 1, None), (16, 128, 1, 3), (0, 16, 4, None),
                                                (17, 32, 2, 2)])
def test_latent_decode_matches_the_oracle(page, hq, n_q, splits, device):
    lens = [70, 5, 33]
    cache, table = _latent(lens, page, device, seed=page + hq)
    g = torch.Generator().manual_seed(n_q)
    q = torch.randn(len(lens), n_q, hq, D, generator=g).to(torch.float16).to(device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    out, lse = vflash.attention_with_kvcache(q, cache, cache[..., :DV], seqlens, block_table=table, causal=True,
                                             num_splits=splits, return_lse=True)
    assert out.shape == (len(lens), n_q, hq, DV) and lse.shape == (len(lens), hq, n_q)
    # the oracle: packed rows against the cache gathered page by page (a contiguous cache as one page a sequence)
    if table is None:
        table_ref, cache_ref = torch.arange(len(lens), dtype=torch.int32, device=device)[:, None], cache
    else:
        table_ref, cache_ref = table, cache
    cu = torch.arange(0, (len(lens) + 1) * n_q, n_q, dtype=torch.int32, device=device)
    ref, ref_lse = attention_with_kvcache_reference(q.reshape(-1, hq, D), cache_ref, cache_ref[..., :DV], seqlens,
                                                    table_ref, cu, causal=True, compute_dtype=F64)
    torch.testing.assert_close(out.reshape(-1, hq, DV).double().cpu(), ref.cpu(), atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(lse.permute(1, 0, 2).reshape(hq, -1).double().cpu(), ref_lse.cpu(), atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("case", [
    KVCacheCase((1, 3), (90, 20), page=64, Hq=16, Hkv=1, D=D, Dv=DV, dtype="bf16", latent=True, sinks=True),
    KVCacheCase((1, 1), (40, 9), page=16, Hq=128, Hkv=1, D=D, Dv=DV, latent=True, fp8="head", num_splits=2),
    KVCacheCase((2, 2), (30, 64), page=8, Hq=16, Hkv=1, D=D, Dv=DV, latent=True, batch_invariant=True),
], ids=lambda c: c.name)
def test_latent_cases_pass_the_accuracy_rule(case, device):
    # the harness's rule (2x the same-dtype yardstick), NaN in every cache row no sequence holds
    for verdict in case.run(device):
        assert verdict.passed, f"{verdict.what}: max {verdict.max_err:.3e} tol {verdict.tol:.3e} {verdict.note}"


@needs_interpreter
def test_the_kernel_reads_v_from_k_and_splits_a_wide_group():
    cache, table = _latent([40], 64, "cpu")
    q = torch.randn(1, 1, 128, D, dtype=torch.float16)
    seqlens = torch.tensor([40], dtype=torch.int32)
    launches = captured_launches(lambda: vflash.attention_with_kvcache(
        q, cache, cache[..., :DV], seqlens, block_table=table, check_metadata=False))
    c = launches[-1].constexprs
    assert c["V_IN_K"] and c["HEAD_DIM_PAD"] == 64 and c["HEAD_DIM_V_PAD"] == 512
    assert c["HEAD_BLOCKS"] == 128 // tables.LATENT_ROWS and launches[-1].grid[1] == c["HEAD_BLOCKS"]
    assert c["GROUP"] == tables.LATENT_ROWS
    # the same shapes with a v of its own: two caches read, one head block
    launches = captured_launches(lambda: vflash.attention_with_kvcache(
        q[..., :256], cache[..., :256], cache[..., :DV].clone()[..., :128], seqlens, block_table=table,
        check_metadata=False))
    assert not launches[-1].constexprs["V_IN_K"] and launches[-1].constexprs["HEAD_BLOCKS"] == 1


@pytest.mark.parametrize("d,v_of,words", [
    (576, "copy", "between 8 and 256; against a latent cache"),  # 576 needs v as the cache's view
    (584, "view", "between 8 and 576"),
    (576, "wide", "v's head dim must be a multiple of 8 between 8 and 512"),
])
def test_head_dims_past_the_limits_are_refused(d, v_of, words, device):
    cache, table = _latent([10], 16, device)
    cache = torch.nn.functional.pad(cache, (0, d - D)) if d != D else cache
    v = {"copy": cache[..., :DV].clone(), "view": cache[..., :DV], "wide": cache[..., :520]}[v_of]
    q = torch.randn(1, 1, 8, d, device=device, dtype=cache.dtype)
    with pytest.raises(ValueError, match=words):
        vflash.attention_with_kvcache(q, cache, v, torch.tensor([10], dtype=torch.int32, device=device),
                                      block_table=table)


def test_a_latent_plan_never_serves_a_v_of_its_own(interpreted_plans):
    # a v with the view's exact metadata (a slice of another cache as wide as k) has the latent call's plan
    # key; the plan reads V from k's rows, so it hands such a call to the full path: there 576 columns without
    # the view are refused, and 192 / 128 (a v of its own is allowed there) get the oracle's result
    seqlens = torch.tensor([50, 20], dtype=torch.int32)
    cu = torch.arange(3, dtype=torch.int32)
    for d, dv in ((D, DV), (192, 128)):
        cache, table = _latent([50, 20], 16, "cpu")
        cache = cache[..., :d].contiguous()
        other = torch.randn_like(cache)
        q = torch.randn(2, 1, 16, d, dtype=torch.float16)
        vflash.attention_with_kvcache(q, cache, cache[..., :dv], seqlens, block_table=table)  # records the plan
        assert any(key[0] == "attention_with_kvcache" for key in interpreted_plans._plans)
        if d == D:
            with pytest.raises(ValueError, match="against a latent cache"):
                vflash.attention_with_kvcache(q, cache, other[..., :dv], seqlens, block_table=table)
            continue
        got = vflash.attention_with_kvcache(q, cache, other[..., :dv], seqlens, block_table=table)
        want, _ = attention_with_kvcache_reference(q.reshape(2, 16, d), cache, other[..., :dv], seqlens, table, cu,
                                                   compute_dtype=F64)
        torch.testing.assert_close(got.reshape(2, 16, dv).double(), want, atol=4e-3, rtol=4e-3)
