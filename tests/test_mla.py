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
from vflash.harness.lab import captured_launches, plans_off
from vflash.reference import attention_with_kvcache_reference
from _devices import needs_interpreter
from _sm90 import needs_sm90

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
    _assert_oracle(q, cache, table, seqlens, out, lse)


def _assert_oracle(q, cache, table, seqlens, out, lse, sinks=None, causal=True, atol=4e-3):
    # the oracle: packed rows against the cache gathered page by page (a contiguous cache as one page a sequence)
    b, n_q, hq, _ = q.shape
    assert out.shape == (b, n_q, hq, DV) and lse.shape == (b, hq, n_q)
    if table is None:
        table = torch.arange(b, dtype=torch.int32, device=q.device)[:, None]
    cu = torch.arange(0, (b + 1) * n_q, n_q, dtype=torch.int32, device=q.device)
    ref, ref_lse = attention_with_kvcache_reference(q.reshape(-1, hq, D), cache, cache[..., :DV], seqlens, table, cu,
                                                    causal=causal, sinks=sinks, compute_dtype=F64)
    torch.testing.assert_close(out.reshape(-1, hq, DV).double().cpu(), ref.cpu(), atol=atol, rtol=atol)
    torch.testing.assert_close(lse.permute(1, 0, 2).reshape(hq, -1).double().cpu(), ref_lse.cpu(), atol=1e-4,
                               rtol=1e-4)


def _poison(cache, table, lens, page):
    # NaN in every cache row no sequence holds: past each length in its last page, and the pages no table names
    cache = cache.clone()
    if table is None:
        for b, n in enumerate(lens):
            cache[b, n:] = float("nan")
        return cache
    used = torch.zeros(cache.shape[0], dtype=torch.bool)
    for b, n in enumerate(lens):
        pages = table[b, :max(1, -(-n // page))].cpu()
        used[pages] = True
        cache[pages[-1], n - (len(pages) - 1) * page:] = float("nan")
    cache[~used.to(cache.device)] = float("nan")
    return cache


@pytest.mark.parametrize("case", [
    KVCacheCase((1, 3), (90, 20), page=64, Hq=16, Hkv=1, D=D, Dv=DV, dtype="bf16", latent=True, sinks=True),
    KVCacheCase((1, 1), (40, 9), page=16, Hq=128, Hkv=1, D=D, Dv=DV, latent=True, fp8="head", num_splits=2),
    KVCacheCase((2, 2), (30, 64), page=8, Hq=16, Hkv=1, D=D, Dv=DV, latent=True, batch_invariant=True),
    # q as [B, Nq, Hq, D] (no cu_seqlens_q): the form the sm90 MLA kernel takes, MTP's two queries, split
    KVCacheCase((2, 2), (90, 20), page=64, Hq=16, Hkv=1, D=D, Dv=DV, dtype="bf16", latent=True, sinks=True,
                num_splits=2, dense_q=True),
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


def test_the_split_merge_folds_the_partials_and_the_sink_once(device):
    # kernels/combine.py's merge_splits_kernel (the sm90 MLA kernel's second launch) against the LSE merge in fp64:
    # three splits of 5 queries x 4 heads, one split that saw no key (LSE -inf, zero partial), a row that saw none
    # at all, and a sink per head (-inf: none) entering once
    from vflash.kernels.combine import merge_splits_kernel
    from vflash.harness.lab import KernelLaunch, run_launch
    g = torch.Generator().manual_seed(3)
    splits, total_q, hq, d = 3, 5, 4, 64
    parts = torch.randn(splits, total_q * hq, d, generator=g)
    lse_parts = torch.randn(splits, hq, total_q, generator=g) * 3
    lse_parts[1] = float("-inf")
    parts[1] = 0.0
    lse_parts[:, 2, 4] = float("-inf")  # query 4 of head 2: no key in any split
    parts[:, 4 * hq + 2] = 0.0
    sinks = torch.tensor([0.5, float("-inf"), -1.0, 2.0])
    for with_sinks in (False, True):
        out = torch.full((total_q * hq, d), float("nan"), dtype=torch.bfloat16, device=device)
        lse = torch.full((hq, total_q), float("nan"), device=device)
        run_launch(KernelLaunch(
            merge_splits_kernel, (-(-total_q * hq // 4), 1, 1),
            (parts.to(device), lse_parts.to(device), out, lse, sinks.to(device) if with_sinks else None,
             total_q * hq, hq, total_q, parts.stride(0), splits),
            dict(HEAD_DIM=d, HEAD_DIM_PAD=d, ROWS=4, SPLIT_CHUNK=2, STORE_LSE=True, HAS_SINK=with_sinks,
                 EMULATE_BF16=device.type == "cpu"), dict(num_warps=4), ()), device)
        terms = lse_parts.double().permute(2, 1, 0).reshape(total_q * hq, splits)  # row t * Hq + h
        if with_sinks:
            terms = torch.cat([terms, sinks.double().repeat(total_q)[:, None]], 1)
        want_lse = torch.logsumexp(terms, 1)
        weights = torch.exp(terms[:, :splits] - want_lse.nan_to_num(neginf=0.0)[:, None])
        want = (weights.T[:, :, None] * parts.double()).sum(0)
        torch.testing.assert_close(out.double().cpu(), want, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse.cpu().double(), want_lse.view(total_q, hq).T, atol=1e-5, rtol=1e-5)
        assert torch.equal(out[4 * hq + 2].float().cpu(), torch.zeros(d))  # the row without keys: 0


@pytest.mark.slow
def test_the_sm90_mla_kernel_compiles_for_sm90():
    # both products as wgmma (S over 64-key tiles, each consumer's PV over its 256 columns), TMA copies, the
    # consumers' register raise; the split build (pages of 16: four copies a tile) compiles too
    import re
    from vflash.ops import mla_sm90
    from vflash.ops.tiles import MlaTiles
    if not mla_sm90.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    ptx = mla_sm90.compile_mla_sm90(64, heads_q=128, n_q=2, sinks=True).asm["ptx"]
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)) == {"64", "256"}
    assert "cp.async.bulk.tensor" in ptx and "setmaxnreg.inc" in ptx
    split = mla_sm90.compile_mla_sm90(16, MlaTiles(64, 2, num_splits=4), causal=False).asm["ptx"]
    assert "wgmma.mma_async" in split and split != ptx


def test_the_sm90_mla_launches_take_the_latent_cache_in_three_column_parts():
    # descriptors of Q's and each key tile's parts (256, 256, 64 columns; pages shorter than a tile one copy a
    # page), the grid (splits, row tiles, sequences), the merge launch after a split one with the sink
    from vflash.ops import mla_sm90
    from vflash.call import Band, Score
    from vflash.ops.tiles import MlaTiles
    cache, table = _latent([70, 5], 16, "cpu", dtype=torch.bfloat16)
    q = torch.randn(2 * 2, 128, D, dtype=torch.bfloat16)
    out, lse = torch.empty(4, 128, DV, dtype=torch.bfloat16), torch.empty(128, 4)
    seqlens = torch.tensor([70, 5], dtype=torch.int32)
    sinks = torch.zeros(128)
    one = mla_sm90.mla_launches(q, cache, out, lse, seqlens, table, 2, Band(0, -1, 0), Score(0.1, None, sinks),
                                MlaTiles(64, 2))
    assert len(one) == 1 and one[0].grid == (1, 4, 2) and one[0].constexprs["HAS_SINK"]
    blocks = [one[0].args[i].block_shape for i in range(4)]
    assert blocks == [[1, 1, 64, 256], [1, 1, 64, 64], [1, 1, 16, 256], [1, 1, 16, 64]]
    split = mla_sm90.mla_launches(q, cache, out, lse, seqlens, table, 2, Band(0, -1, -1), Score(0.1, None, sinks),
                                  MlaTiles(64, 2, num_splits=3))
    assert len(split) == 2 and split[0].grid == (3, 4, 2) and not split[0].constexprs["HAS_SINK"]
    assert split[1].constexprs["HAS_SINK"] and split[1].grid == (-(-4 * 128 // 4), 1, 1)
    with pytest.raises(ValueError, match="no window"):
        mla_sm90.mla_launches(q, cache, out, lse, seqlens, table, 2, Band(0, 8, 0), Score(0.1), MlaTiles(64, 2))


@needs_sm90
@pytest.mark.parametrize("page,hq,n_q,splits,lens,sinks", [
    (64, 16, 1, None, [700, 5, 333], False),  # FlashMLA's page, memory-bound heads, the dispatch's splits
    (64, 16, 1, 1, [4100, 100], True),  # unsplit, the sink in the finish
    (16, 128, 1, 3, [70, 5, 1000], True),  # pages shorter than a tile, split: the sink in the merge
    (0, 128, 2, None, [900, 64, 1], False),  # contiguous, two new queries (causal), a one-key sequence
    (32, 64, 4, 2, [333, 4, 129], False),  # four new queries on four keys: rows that see one key
], ids=["p64_h16", "p64_h16_unsplit_sinks", "p16_h128_split_sinks", "contiguous_h128_q2", "p32_h64_q4"])
def test_gpu_sm90_mla_kernel_matches_the_oracle(page, hq, n_q, splits, lens, sinks, monkeypatch):
    # the sm90 MLA kernel forced (a refusal fails the test), NaN in every cache row no sequence holds
    from vflash import dispatch
    monkeypatch.setattr(dispatch.rules, "FORCED", "sm90")
    cache, table = _latent(lens, page, "cuda", dtype=torch.bfloat16, seed=page + hq)
    cache = _poison(cache, table, lens, page)
    g = torch.Generator().manual_seed(n_q)
    q = torch.randn(len(lens), n_q, hq, D, generator=g).to("cuda", torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    sink = torch.randn(hq, generator=g).cuda() if sinks else None
    with plans_off():
        out, lse = vflash.attention_with_kvcache(q, cache, cache[..., :DV], seqlens, block_table=table, causal=True,
                                                 num_splits=splits, return_lse=True, sinks=sink)
    assert torch.isfinite(out).all()
    _assert_oracle(q, cache.nan_to_num(), table, seqlens, out, lse, sinks=sink, atol=8e-3)


@needs_sm90
@pytest.mark.parametrize("splits", [1, 3])
def test_gpu_sm90_mla_plan_replays_the_kernel_and_its_merge(splits, monkeypatch):
    # the first call records the launches (the kernel, split: and its merge) as a plan; a repeat on other values
    # replays it and still matches the oracle, and a v that is not the view is never served by it
    from vflash import dispatch
    monkeypatch.setattr(dispatch.rules, "FORCED", "sm90")
    lens = [900, 37]
    cache, table = _latent(lens, 64, "cuda", dtype=torch.bfloat16, seed=splits)
    g = torch.Generator().manual_seed(splits)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    sink = torch.randn(16, generator=g).cuda()
    for _ in range(3):
        q = torch.randn(2, 1, 16, D, generator=g).to("cuda", torch.bfloat16)
        out, lse = vflash.attention_with_kvcache(q, cache, cache[..., :DV], seqlens, block_table=table, causal=True,
                                                 num_splits=splits, return_lse=True, sinks=sink)
        _assert_oracle(q, cache, table, seqlens, out, lse, sinks=sink, atol=8e-3)
    with pytest.raises(ValueError, match="against a latent cache"):
        vflash.attention_with_kvcache(q, cache, cache[..., :DV].clone(), seqlens, block_table=table, causal=True,
                                      num_splits=splits, return_lse=True, sinks=sink)
