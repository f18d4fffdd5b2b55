"""vflash.attention_with_kvcache against reference/paged.py (each sequence's keys gathered
from its pages, then explicit fp64 attention), through the interpreter on the CPU (or the
device VFLASH_TEST_DEVICE names): decode and chunked prefill, contiguous and paged caches,
page sizes 1..64 with shuffled and shared pages, GQA/MQA, windows across page edges, more
queries than keys; bad metadata refused before the launch."""

import pytest
import torch

import vflash
from _sm90 import needs_sm90, tile_variants
from vflash.harness.oracle import compare
from vflash.reference import attention_with_kvcache_reference
from vflash.call import Cache, Call, Score

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _paged(lens, page, hkv, d, dtype, device, seed=0, share_first=False, spare=3, runs=False):
    """A shuffled paged cache holding sequences of the given lengths: (k_cache, v_cache, table).
    runs: pages handed out in order, as a block allocator does, every 19th swapped with one
    from the far end (runs of consecutive pages, broken here and there)."""
    g = torch.Generator().manual_seed(seed)
    need = [max(1, -(-n // page)) for n in lens]
    max_pages = max(need)
    n_pages = sum(need) + spare
    order = torch.randperm(n_pages, generator=g).tolist()
    if runs:
        order = list(range(n_pages))
        for i in range(3, n_pages // 2, 19):
            order[i], order[n_pages - 1 - i] = order[n_pages - 1 - i], order[i]
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


def _check(q, k_cache, v_cache, cache_seqlens, table, cu_seqlens_q=None, max_seqlen_q=None, num_splits=None,
           batch_invariant=False, **opts):
    dt = q.dtype
    out, lse = vflash.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=table,
                                             cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                             num_splits=num_splits, batch_invariant=batch_invariant,
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
    return out, lse


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
    (lambda a: dict(cache_seqlens=torch.stack([a["cache_seqlens"]] * 2, 1)[:, 0]), ValueError,
     "cache_seqlens must be contiguous"),
    (lambda a: dict(block_table=a["block_table"].long()), TypeError, "block_table must be an int32"),
    (lambda a: dict(block_table=a["block_table"] + 100), ValueError,
     r"block_table\[0, 0\] = \d+ is not a page of the cache"),
    (lambda a: dict(block_table=a["block_table"][:1]), ValueError, "block_table has 1 rows for 2 sequences"),
    (lambda a: dict(q=a["q"][:1]), ValueError, "q holds 1 sequences"),
    (lambda a: dict(v_cache=a["v_cache"][:, :4]), ValueError, "one shape"),
    (lambda a: dict(q=a["q"].float()), TypeError, "share q's dtype"),
    (lambda a: dict(causal="top_left"), ValueError, "does not apply to a KV cache"),
    (lambda a: dict(num_splits=2, batch_invariant=True), ValueError, "leave num_splits None"),
    (lambda a: dict(num_splits=1000), ValueError, "num_splits=1000 is above 256"),
    (lambda a: dict(batch_invariant=1), TypeError, "batch_invariant must be a bool"),
    (lambda a: dict(num_splits=0), ValueError, "num_splits must be None or an int >= 1"),
    (lambda a: dict(max_seqlen_q=1), ValueError, "max_seqlen_q goes with packed queries"),
    (lambda a: dict(q=a["q"][:, 0], cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32, device=a["q"].device),
                    max_seqlen_q=2), ValueError, r"cu_seqlens_q\[-1\] must be the packed length of q \(2\)"),
    (lambda a: dict(q=a["q"][:, 0], cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32, device=a["q"].device),
                    max_seqlen_q=2), ValueError, "2 entries for 2 sequences"),
    (lambda a: dict(cache_seqlens=torch.tensor([20, -1], dtype=torch.int32, device=a["q"].device)), ValueError,
     r"cache_seqlens\[1\] = -1 is outside 0..24"),
    (lambda a: dict(cache_seqlens=a["cache_seqlens"][:0], q=a["q"][:0]), ValueError,
     "cache_seqlens must hold 1 to 65535 sequences, got 0"),
    (lambda a: dict(cache_seqlens=a["cache_seqlens"].to("meta")), ValueError,
     "cache_seqlens must be on q's device"),
    (lambda a: dict(block_table=a["block_table"].to("meta")), ValueError, "block_table must be on q's device"),
    (lambda a: dict(block_table=a["block_table"].t().contiguous().t()), ValueError,
     "block_table's rows must be contiguous"),
    (lambda a: dict(block_table=None), ValueError,
     r"a contiguous cache \[batch, max_len, Hkv, D\] must have one row per sequence: \d+ for 2 sequences"),
    (lambda a: dict(k_cache=a["k_cache"][:, :0], v_cache=a["v_cache"][:, :0]), ValueError,
     "k_cache's second dim .* must be at least 1"),
    (lambda a: dict(q=a["q"][:, 0], cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32, device=a["q"].device),
                    max_seqlen_q=2**64), ValueError, r"max_seqlen_q \(\d+\) exceeds 2\*\*31 - 1"),
    (lambda a: dict(q=a["q"][:, 0], cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32, device="meta"),
                    max_seqlen_q=1), ValueError, "cu_seqlens_q must be on q's device"),
    (lambda a: dict(q=a["q"][:, 0], cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32, device=a["q"].device),
                    max_seqlen_q=1.0), TypeError, "max_seqlen_q must be an int >= 0 with cu_seqlens_q"),
    (lambda a: dict(q=a["q"][:, 0].repeat(2, 1, 1),
                    cu_seqlens_q=torch.tensor([0, 3, 4], dtype=torch.int32, device=a["q"].device), max_seqlen_q=2),
     ValueError, "sequence 0 has 3 rows .* more than max_seqlen_q = 2"),
])
def test_bad_metadata_is_refused_before_launch(change, error, match, device):
    args = _args(device)
    args.update(change(args))
    with pytest.raises(error, match=match):
        vflash.attention_with_kvcache(**args)


def test_a_checked_repeat_still_refuses_bad_metadata(device):
    # a checked call's repeat (on CUDA, its recorded plan) checks the values again: the key holds no value
    args = _args(device)
    vflash.attention_with_kvcache(**args)
    vflash.attention_with_kvcache(**args)
    args["cache_seqlens"][1] = 25
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 25 is outside 0..24"):
        vflash.attention_with_kvcache(**args)
    args["cache_seqlens"][1] = 5
    args["block_table"][0, 1] = -3
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = -3 is not a page of the cache"):
        vflash.attention_with_kvcache(**args)


def _metadata_flags(lens, table, cu=None, capacity=None, page=4, pages=300, total_q=0, max_q=0):
    # the flags under several tiles of sequences a program (the same verdict): the GPU's table tile and 2, and
    # the interpreter's 1024 on CPU only (on a GPU a [1024, 128] tile in one warp takes minutes to compile)
    from vflash import _backend
    from vflash.dispatch import tables
    from vflash.ops.metadata import sequence_metadata_flags
    verdicts = set()
    for block_seq in (1, 2, 1024) if _backend.interpreted(lens.device) else (tables.METADATA.block_seq, 2):
        tiles = tables.METADATA._replace(block_seq=block_seq)
        flags = sequence_metadata_flags(lens.numel(), tiles, lens, table, cu,
                                        capacity=capacity or page * table.shape[1], page_size=page, num_pages=pages,
                                        total_q=total_q, max_seqlen_q=max_q)
        assert flags[3] == 0  # no cu_seqlens_k given: never flagged
        verdicts.add(tuple(flags[:3]))
    assert len(verdicts) == 1, verdicts
    return list(verdicts.pop())


def test_metadata_kernel_flags_each_fault_and_nothing_else(device):
    # the flags, one per fault, against tables longer than two steps of the kernel's loop (128 entries): a bad
    # page past the first step is found, a bad entry past the pages a sequence uses is not
    from vflash.dispatch import tables
    width = 2 * tables.METADATA.block_pages + 9
    table = torch.arange(3 * width, dtype=torch.int32, device=device).view(3, width) % 300
    lens = torch.tensor([4 * width, 4 * 200 + 1, 0], dtype=torch.int32, device=device)
    assert _metadata_flags(lens, table) == [0, 0, 0]
    late = table.clone()
    late[1, 200] = 300  # the last page sequence 1 uses (keys 800..800)
    assert _metadata_flags(lens, late) == [0, 1, 0]
    late[1, 200], late[1, 201], late[2, 0] = 5, -1, 10**6  # past what they use: not read
    assert _metadata_flags(lens, late) == [0, 0, 0]
    assert _metadata_flags(lens.clone().fill_(4 * width + 1), table) == [1, 0, 0]
    assert _metadata_flags(torch.tensor([-1, 3, 0], dtype=torch.int32, device=device), late) == [1, 0, 0]
    contiguous = _metadata_flags(torch.tensor([7, 8], dtype=torch.int32, device=device), None, capacity=7)
    assert contiguous == [1, 0, 0]


@pytest.mark.parametrize("offsets,total,longest,flagged", [
    ([0, 2, 5], 5, 3, 0), ([0, 0, 0], 0, 0, 0), ([1, 2, 5], 5, 4, 1), ([0, 3, 2], 2, 3, 1), ([0, 2, 5], 6, 3, 1),
    ([0, 2, 6], 6, 3, 1), ([0, -2**31, 2**31 - 1], 2**31 - 1, 2**31 - 1, 1),
])
def test_metadata_kernel_checks_cu_seqlens_q(offsets, total, longest, flagged, device):
    lens = torch.tensor([4, 4], dtype=torch.int32, device=device)
    table = torch.zeros(2, 1, dtype=torch.int32, device=device)
    cu = torch.tensor(offsets, dtype=torch.int32, device=device)
    assert _metadata_flags(lens, table, cu, total_q=total, max_q=longest) == [0, 0, flagged]


def test_unused_table_entries_are_not_checked(device):
    # a sequence's table row past its pages may hold anything (vLLM pads with garbage)
    args = _args(device)
    args["block_table"][1, 1:] = 10**6
    vflash.attention_with_kvcache(**args)
    args["check_metadata"] = False
    vflash.attention_with_kvcache(**args)


@pytest.mark.parametrize("page", [128, 256])
def test_large_pages(page, device):
    lens = [300, 2, 129]
    k_cache, v_cache, table = _paged(lens, page, 2, 16, torch.float16, device)
    _check(_q(3, 1, 4, 16, torch.float16, device), k_cache, v_cache,
           torch.tensor(lens, dtype=torch.int32, device=device), table)


@pytest.mark.parametrize("hq,hkv", [(3, 1), (6, 2), (12, 4), (7, 7), (16, 16), (4, 2), (10, 2), (16, 2)],
                         ids=["mqa3", "g3", "g3x4", "mha7", "mha16", "g2", "g5", "g8"])
def test_gqa_packing_of_uneven_groups(hq, hkv, device):
    # groups that do not divide the tile's rows: the rows past the last whole query are never stored
    lens = [45, 17, 2]
    k_cache, v_cache, table = _paged(lens, 16, hkv, 16, torch.float16, device)
    _check(_q(3, 3, hq, 16, torch.float16, device), k_cache, v_cache,
           torch.tensor(lens, dtype=torch.int32, device=device), table)


@pytest.mark.parametrize("group", range(1, 17))
def test_every_gqa_group_size_from_1_to_16_with_one_kv_head(group, device):
    # MQA (one KV head) with 1..16 query heads, two new queries a sequence: 2-32 packed rows a tile
    lens = [21, 4]
    k_cache, v_cache, table = _paged(lens, 16, 1, 16, torch.float16, device)
    q = _q(2, 2, group, 16, torch.float16, device)
    if group == 1:  # one query head over one KV head passes packed (dense [B, 2, 1, D] reads as either layout)
        cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=device)
        _check(q.reshape(4, 1, 16), k_cache, v_cache, torch.tensor(lens, dtype=torch.int32, device=device), table,
               cu_seqlens_q=cu, max_seqlen_q=2)
    else:
        _check(q, k_cache, v_cache, torch.tensor(lens, dtype=torch.int32, device=device), table)


def test_a_sequence_with_an_empty_cache_sees_no_key(device):
    # cache_seqlens 0 (the bottom-right rule then gives its queries no key): out 0 and lse -inf, split or not,
    # beside sequences that do have keys
    lens = [0, 19, 0]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = _q(3, 1, 4, 16, torch.float16, device)
    for splits in (None, 1, 3):
        out, lse = _check(q, k_cache, v_cache, seqlens, table, num_splits=splits)
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isneginf(lse[[0, 2]]).all()
        assert torch.isfinite(lse[1]).all()


@pytest.mark.parametrize("splits", [1, 2, 3, 5, 16])
def test_split_kv_matches_the_reference(splits, device):
    # splits of 16-key tiles (the interpreter's): with 16 splits most of sequence 1's are empty
    lens = [200, 9, 77]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = _q(3, 2, 8, 16, torch.float16, device)
    _check(q, k_cache, v_cache, seqlens, table, num_splits=splits)
    _check(q, k_cache, v_cache, seqlens, table, num_splits=splits, window=(30, 0), softcap=4.0)


def test_fixed_split_keys_off_the_key_tiles_still_cover_every_key(device):
    # a fixed split of keys only counts a sequence's splits (cdiv(length, split_keys), its tiles interleaved
    # among them): 24 keys a split over 16-key tiles gives the 40-key sequence two splits and the 7-key one
    # one, and the merged result is attention over every key
    from vflash.ops import attention_kvcache_forward
    from vflash._validate import sequence_band
    from vflash.ops.tiles import KVCacheTiles
    lens = [40, 7]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = _q(2, 1, 4, 16, torch.float16, device).reshape(2, 4, 16)
    cu = torch.arange(3, dtype=torch.int32, device=device)
    tiles = KVCacheTiles(16, 16, 4, 1, num_splits=2, split_keys=24, split_chunk=2, merge_rows=2, one_loop=True)
    out, lse = attention_kvcache_forward(q, k_cache, v_cache, seqlens, table, cu, 1,
                                         band=sequence_band("bottom_right", (-1, -1)), score=Score(0.25, None),
                                         return_lse=True, tiles=tiles, kernel="portable")
    ref = {c: attention_with_kvcache_reference(q, k_cache, v_cache, seqlens, table, cu, compute_dtype=c,
                                               scale=0.25)
           for c in (torch.float64, None, torch.float32)}
    for verdict in (compare("out", out.cpu(), ref[torch.float64][0].cpu(), ref[None][0].cpu(), torch.float16),
                    compare("lse", lse.cpu(), ref[torch.float64][1].cpu(), ref[torch.float32][1].cpu(),
                            torch.float32)):
        assert verdict.passed, f"{verdict.what}: max err {verdict.max_err:.3e} > tol {verdict.tol:.3e} {verdict.note}"


def test_split_kv_agrees_with_unsplit_and_repeats_bitwise(device):
    lens = [150, 64, 1]
    k_cache, v_cache, table = _paged(lens, 17, 2, 32, torch.bfloat16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = _q(3, 1, 4, 32, torch.bfloat16, device)
    run = lambda n: vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=n,
                                                  return_lse=True)
    one, one_lse = run(1)
    four, four_lse = run(4)
    torch.testing.assert_close(four.float(), one.float(), atol=2e-2, rtol=0)  # bf16 rounding of one output
    torch.testing.assert_close(four_lse, one_lse, atol=1e-5, rtol=1e-5)
    assert not torch.equal(four_lse, torch.full_like(four_lse, float("-inf")))
    for _ in range(3):
        again, again_lse = run(4)
        assert torch.equal(again, four) and torch.equal(again_lse, four_lse)


def test_split_kv_scratch_is_reused_call_after_call(device):
    # the stream's pool (ops.scratch) serves every split call: each launch leaves the arrival
    # counters at zero (the last split of a tile takes its launch's arrivals back off), so repeats,
    # at other lengths and after a larger call regrew the pool, give the bits of a fresh pool
    from vflash.ops import scratch
    lens = [150, 64, 1]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, device)
    q = _q(3, 2, 8, 16, torch.float16, device)

    def run(lens, splits=3):
        seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
        return vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=splits,
                                             return_lse=True)
    calls = [(lens, 3), ([149, 63, 0], 3), ([150, 64, 1], 5), (lens, 3)]
    fresh = []
    for args in calls:
        scratch.clear()
        fresh.append(run(*args))
    scratch.clear()
    for args, want in zip(calls, fresh):
        got = run(*args)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), args
        pools = list(scratch._pools.values())
        assert len(pools) == 1 and pools[0][2].eq(0).all()
    assert pools[0][2].numel() >= 3 * 2  # the counters of the largest call's row tiles


def test_split_kv_scratch_past_the_pool_limit_is_allocated_per_call(device, monkeypatch):
    # partials above POOL_MAX_BYTES get their own tensors (the pool does not grow to them): same bits
    from vflash.ops import plans, scratch
    lens = [150, 64, 1]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, device)
    q = _q(3, 2, 8, 16, torch.float16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    run = lambda: vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=4)
    scratch.clear()
    pooled = run()
    scratch.clear()
    plans.clear()  # a plan keeps the pooling its recording call chose (the limit is a constant)
    monkeypatch.setattr(scratch, "POOL_MAX_BYTES", 1024)  # below these partials' 4 x 6 x 8 x 16 x 4 bytes
    assert torch.equal(run(), pooled) and not scratch._pools


# 4: the split cap binds for the 3000-key sequence, not for 1500
@pytest.mark.parametrize("most", [pytest.param(None, marks=pytest.mark.slow), 4])
def test_batch_invariant_mode_is_bitwise_independent_of_the_batch(most, device, monkeypatch):
    # sequence 0 alone, then batched with longer and shorter ones (more splits in the grid, other
    # row counts): its output and LSE are the same bits, and still attention's
    from vflash.dispatch import tables
    if most is not None:
        monkeypatch.setattr(tables, "INVARIANT_SPLIT_KEYS", 512)
        monkeypatch.setattr(tables, "INVARIANT_MAX_SPLITS", most)
    lens = [1500, 3000, 7]
    k_cache, v_cache, table = _paged(lens, 64, 1, 16, torch.float16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(3, 3, 4, 16, generator=g).half().to(device)
    own = table[:1, :(lens[0] + 63) // 64]  # its own pages only: a smaller capacity, fewer splits in the grid
    alone, alone_lse = vflash.attention_with_kvcache(q[:1, :1], k_cache, v_cache, seqlens[:1], block_table=own,
                                                     batch_invariant=True, return_lse=True)
    cu = torch.tensor([0, 1, 4, 6], dtype=torch.int32, device=device)  # 1, 3 and 2 new queries
    packed = torch.cat([q[0, :1], q[1], q[2, :2]])
    batched, batched_lse = vflash.attention_with_kvcache(packed, k_cache, v_cache, seqlens, block_table=table,
                                                         cu_seqlens_q=cu, max_seqlen_q=3, batch_invariant=True,
                                                         return_lse=True)
    assert torch.equal(batched[:1], alone[0]) and torch.equal(batched_lse[:, :1], alone_lse[0])
    _check(packed, k_cache, v_cache, seqlens, table, cu_seqlens_q=cu, max_seqlen_q=3, batch_invariant=True)


@pytest.mark.gpu
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("splits", [None, 1, 7, "invariant"])
def test_decode_at_serving_sizes_on_the_gpu(page, splits):
    # Llama-3-8B's attention shape (Hq 32 / Hkv 8, D 128, bf16), lengths across split and page edges; 17000
    # keys pass the batch-invariant mode's split cap
    lens = [4000, 1, 777, 8192, 17000]
    k_cache, v_cache, table = _paged(lens, page, 8, 128, torch.bfloat16, "cuda")
    opts = dict(batch_invariant=True) if splits == "invariant" else dict(num_splits=splits)
    _check(_q(len(lens), 1, 32, 128, torch.bfloat16, "cuda"), k_cache, v_cache,
           torch.tensor(lens, dtype=torch.int32, device="cuda"), table, **opts)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv", [(32, 32), (32, 2), (16, 1), (40, 8)], ids=["mha", "gqa16", "mqa16", "gqa5"])
def test_chunked_prefill_at_serving_sizes_on_the_gpu(hq, hkv):
    lens_q, lens_k = [512, 1, 100], [3000, 2048, 100]
    k_cache, v_cache, table = _paged(lens_k, 16, hkv, 128, torch.float16, "cuda")
    g = torch.Generator().manual_seed(6)
    q = torch.randn(sum(lens_q), hq, 128, generator=g).half().cuda()
    cu = torch.tensor([0, 512, 513, 613], dtype=torch.int32, device="cuda")
    _check(q, k_cache, v_cache, torch.tensor(lens_k, dtype=torch.int32, device="cuda"), table, cu_seqlens_q=cu,
           max_seqlen_q=512)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [None, 1, 4])
def test_planned_repeats_follow_growing_lengths_and_capture_in_a_graph(splits):
    # a generation loop: check_metadata=False calls with the same metadata take the recorded plan;
    # cache_seqlens grows on the device, and the plan (and a CUDA graph of it) reads the new lengths
    lens = [300, 1000]
    k_cache, v_cache, table = _paged(lens, 16, 8, 128, torch.bfloat16, "cuda")
    q = _q(2, 1, 32, 128, torch.bfloat16, "cuda")
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")

    def call(check=False):
        return vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=splits,
                                             return_lse=True, check_metadata=check)
    first = call()
    again = call()
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    seqlens.add_(3)
    planned, checked = call(), call(check=True)  # the plan, and the full path with its checks
    assert all(torch.equal(a, b) for a, b in zip(planned, checked))
    assert not torch.equal(planned[0], first[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    seqlens.add_(2)
    graph.replay()
    want = call(check=True)
    assert all(torch.equal(a, b) for a, b in zip(captured, want))


@pytest.mark.gpu
def test_a_whole_decode_step_captures_in_a_graph():
    # one decode step as a serving loop runs it: the new token's K / V written at the slot its length and
    # block table give (computed on the device), the length grown, attention against the cache, all in one
    # CUDA graph (unchecked calls: no host sync, planned launches); replayed step after step it matches the
    # same steps run eagerly, bit for bit
    lens, page = [300, 47], 16
    k_cache, v_cache, table = _paged([n + 8 for n in lens], page, 8, 128, torch.bfloat16, "cuda")
    g = torch.Generator().manual_seed(3)
    steps = [(torch.randn(2, 1, 32, 128, generator=g), torch.randn(2, 8, 128, generator=g),
              torch.randn(2, 8, 128, generator=g)) for _ in range(3)]
    steps = [tuple(t.to(torch.bfloat16).cuda() for t in step) for step in steps]

    def run(kc, vc, seqlens, q, k, v, out):
        pos = seqlens.long()
        slots = table[torch.arange(2, device="cuda"), pos // page].long() * page + pos % page
        vflash.write_kvcache(kc, vc, k, v, slots, check_metadata=False)
        seqlens.add_(1)
        vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, check_metadata=False, out=out)

    eager_kc, eager_vc = k_cache.clone(), v_cache.clone()
    eager_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    want = []
    for q, k, v in steps:
        out = torch.empty_like(q)
        run(eager_kc, eager_vc, eager_lens, q, k, v, out)
        want.append(out)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q_in, k_in, v_in = (t.clone() for t in steps[0])
    out = torch.empty_like(q_in)
    warm_kc, warm_vc, warm_lens = k_cache.clone(), v_cache.clone(), seqlens.clone()
    run(warm_kc, warm_vc, warm_lens, q_in, k_in, v_in, out)  # records the plans outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(k_cache, v_cache, seqlens, q_in, k_in, v_in, out)
    for (q, k, v), expected in zip(steps, want):
        q_in.copy_(q), k_in.copy_(k), v_in.copy_(v)
        graph.replay()
        assert torch.equal(out, expected)
    assert torch.equal(k_cache, eager_kc) and torch.equal(v_cache, eager_vc)
    assert seqlens.tolist() == [n + 3 for n in lens]


def _poisoned_cache(lens, page, hkv, d, dtype, seed=0, device="cuda", runs=False):
    """A cache whose rows past each sequence's length (and spare pages) hold NaN: paged
    (page > 0, shuffled pages) or contiguous [B, max_len] (page 0)."""
    if page == 0:
        g = torch.Generator().manual_seed(seed)
        k_cache, v_cache = (torch.randn(len(lens), max(lens) + 37, hkv, d, generator=g).to(dtype).to(device)
                            for _ in range(2))
        for b, n in enumerate(lens):
            k_cache[b, n:] = float("nan")
            v_cache[b, n:] = float("nan")
        return k_cache, v_cache, None
    k_cache, v_cache, table = _paged(lens, page, hkv, d, dtype, device, seed=seed, runs=runs)
    used = set()
    for b, n in enumerate(lens):
        need = max(1, -(-n // page))
        used |= {int(p) for p in table[b, :need]}
        last = int(table[b, need - 1])
        k_cache[last, n - (need - 1) * page:] = float("nan")
        v_cache[last, n - (need - 1) * page:] = float("nan")
    spare = [p for p in range(k_cache.shape[0]) if p not in used]
    k_cache[spare] = float("nan")
    v_cache[spare] = float("nan")
    return k_cache, v_cache, table


# Chunked prefill on the sm_90 kernel's KV_CACHE build: (page size (0: contiguous), options)
SM90_CACHE = [(0, dict()), (16, dict()), (32, dict()), (64, dict()), (256, dict()), (16, dict(causal=False)),
                (16, dict(window=(100, 0))), (64, dict(softcap=20.0)), (16, dict(empty=True)), (0, dict(empty=True)),
                # pages in runs (one copy a tile where a tile's pages are consecutive)
                (16, dict(runs=True)), (32, dict(runs=True, causal=False)), (16, dict(runs=True, window=(100, 0)))]


def _cu_of(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("page,opts", SM90_CACHE,
                         ids=[f"page{p}-" + ("-".join(f"{k}={v}" for k, v in o.items()) or "causal")
                              for p, o in SM90_CACHE])
def test_gpu_hopper_chunked_prefill_matches_the_reference(d, page, opts):
    # The table's tiles (with DYNAMIC flipped and each Q-buffer count) straight through the
    # launcher; cache rows past every sequence's length hold NaN, which must not reach the
    # output (K there is masked, V's tail tile read as zeros). Lengths: tails that fill no
    # tile, more new queries than keys, a sequence with one key.
    from vflash.ops import attention_kvcache_forward
    from vflash._validate import sequence_band
    from vflash.reference import attention_with_kvcache_reference as reference
    lens_q, lens_k = [300, 1, 129, 5], [1000, 77, 129, 3]
    if opts.get("empty"):  # sequences whose cache is empty (zeros, -inf), one with no new queries
        lens_q, lens_k = [300, 1, 0, 134], [0, 77, 50, 0]
    k_cache, v_cache, table = _poisoned_cache(lens_k, page, 2, d, torch.bfloat16, seed=d + page,
                                              runs=opts.get("runs", False))
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens_q), 8, d, generator=g).to(torch.bfloat16).cuda()
    cu = _cu_of(lens_q)
    seqlens = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    causal = opts.get("causal", True)
    band = sequence_band("bottom_right" if causal else None, opts.get("window", (-1, -1)))
    ref_table = table if table is not None else torch.arange(4, dtype=torch.int32, device="cuda")[:, None]
    ref_opts = dict(causal=causal, window=opts.get("window"), softcap=opts.get("softcap"))
    ref = {c: reference(q, k_cache, v_cache, seqlens, ref_table, cu, compute_dtype=c, **ref_opts)
           for c in (torch.float64, None, torch.float32)}
    for tiles in tile_variants(d, band.has_right):
        out, lse = attention_kvcache_forward(q, k_cache, v_cache, seqlens, table, cu, max(lens_q), band=band,
                                             score=Score(d ** -0.5, opts.get("softcap")), return_lse=True,
                                             tiles=tiles, kernel="sm90")
        assert not out.isnan().any() and not lse.isnan().any(), tiles
        for verdict in (compare("out", out.cpu(), ref[torch.float64][0].cpu(), ref[None][0].cpu(), torch.bfloat16),
                        compare("lse", lse.cpu(), ref[torch.float64][1].cpu(), ref[torch.float32][1].cpu(),
                                torch.float32)):
            assert verdict.passed, f"{tiles}: {verdict.what} max err {verdict.max_err:.3e} > {verdict.tol:.3e}"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [0, 16, 17])
def test_gpu_chunked_prefill_dispatch_takes_sm90_where_the_pages_fit(page):
    # the public call with [B, Nq] queries: the sm90 kernel for a contiguous cache and
    # page 16, the portable kernel for page 17; both right against the reference
    from vflash import dispatch
    from vflash._validate import sequence_band
    lens = [2048, 1500]
    if page == 17:
        k_cache, v_cache, table = _paged(lens, page, 8, 128, torch.bfloat16, "cuda", seed=2)
    else:
        k_cache, v_cache, table = _poisoned_cache(lens, page, 8, 128, torch.bfloat16, seed=2)
    q = _q(2, 512, 32, 128, torch.bfloat16, "cuda")
    lengths = torch.tensor(lens, dtype=torch.int32, device="cuda")
    layout = Cache(lengths, table, None, 512, None, False, False, tuple(q.shape))
    choice = dispatch.choose(Call(q.reshape(-1, 32, 128), k_cache, v_cache, layout,
                                  sequence_band("bottom_right", (-1, -1)), Score(128 ** -0.5), False))
    assert choice.kernel == ("portable" if page == 17 else "sm90"), choice.why
    _check(q, k_cache, v_cache, torch.tensor(lens, dtype=torch.int32, device="cuda"), table)


@pytest.mark.parametrize("page", [0, 1, 16, 17])
def test_cache_rows_past_each_length_may_hold_nan(page, device):
    # a cache's rows past cache_seqlens (and spare pages) are not the sequence's: NaN there
    # must not reach the output, on decode and on a chunk of new queries
    lens = [40, 7, 17, 3]
    k_cache, v_cache, table = _poisoned_cache(lens, page, 2, 16, torch.float32, seed=page, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    for n_q in (1, 5):
        _check(_q(4, n_q, 4, 16, torch.float32, device), k_cache, v_cache, seqlens, table)


@pytest.mark.parametrize("splits,return_lse,packed", [(1, False, False),
                                                     pytest.param(3, True, False, marks=pytest.mark.slow),
                                                     pytest.param(4, False, False, marks=pytest.mark.slow),
                                                     (3, True, True)])
def test_planned_repeats_match_the_full_path_on_the_cpu(interpreted_plans, monkeypatch, splits, return_lse, packed):
    # a generation loop through the recorded plans, unchecked and checked (the metadata check's own plan
    # before the attention's): growing lengths, the same bits as the full path (dense q [B, 1, Hq, D], whose
    # plan takes q and allocates out in that layout, or packed rows)
    lens = [150, 64, 1]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, "cpu")
    q = _q(3, 1, 8, 16, torch.float16, "cpu")
    seqlens = torch.tensor(lens, dtype=torch.int32)
    extra = dict(cu_seqlens_q=torch.arange(4, dtype=torch.int32), max_seqlen_q=1) if packed else {}
    q = q.reshape(3, 8, 16) if packed else q

    def call(check):
        return vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=splits,
                                             return_lse=return_lse, check_metadata=check, **extra)
    call(False), call(True)  # record the plans
    recorded = interpreted_plans._plans
    assert sorted(key[0] for key in recorded) == ["attention_with_kvcache"] * 2 + ["sequence_metadata"]
    used = []
    plan_call = type(next(iter(recorded.values()))).__call__
    monkeypatch.setattr(type(next(iter(recorded.values()))), "__call__",
                        lambda self, *t: used.append(self) or plan_call(self, *t))
    for step in range(3):
        planned, checked = call(False), call(True)
        with monkeypatch.context() as full_path:
            full_path.setattr(interpreted_plans, "lookup", lambda *args: None)
            full_path.setattr(interpreted_plans, "record", lambda *args: None)
            full = call(True)
        for got in (planned, checked):
            got, want = (got, full) if return_lse else ((got,), (full,))
            assert all(torch.equal(a, b) for a, b in zip(got, want)), step
        seqlens.add_(1)
    assert len(used) == 9 and set(map(id, used)) == set(map(id, recorded.values()))
    assert all((plan.scratch is None) == (splits == 1)
               for key, plan in recorded.items() if key[0] == "attention_with_kvcache")


def test_the_varlen_check_records_no_plan(interpreted_plans):
    # packed lengths change from call to call in the loops that check them (and are part of such a key): a
    # plan a call would fill the table, and its clearing would drop the decode plans with it
    from vflash import dispatch
    from vflash.ops import metadata
    for total in (8, 9, 10):
        cu = torch.tensor([0, total // 2, total], dtype=torch.int32)
        metadata.check_offsets(cu, cu, total, total, total, total, dispatch.metadata_tiles(2, cu.device))
    assert not interpreted_plans._plans


def test_a_query_whose_rows_need_a_copy_is_not_planned(interpreted_plans):
    # dense q [B, Nq, Hq, D] whose (batch, query) dims do not merge: the kernel reads a copy, which a
    # plan taking q itself could not, so the call stays on the full path (and is still right)
    lens = [40, 9]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, "cpu")
    q = _q(2, 8, 2, 16, torch.float16, "cpu").transpose(1, 2)  # [2, 2, 8, 16], query stride 16, batch 256
    seqlens = torch.tensor(lens, dtype=torch.int32)
    got = vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, check_metadata=False)
    assert not interpreted_plans._plans
    want = vflash.attention_with_kvcache(q.contiguous(), k_cache, v_cache, seqlens, block_table=table)
    assert torch.equal(got, want)


@pytest.mark.parametrize("splits,packed", [(1, False), (3, False), (3, True)])
def test_out_is_written_in_place_with_the_bits_of_an_allocated_out(splits, packed, device):
    # out= (a serving engine's own buffer): the same tensor comes back holding the same bits, also when it is
    # a strided view of a larger buffer (every head's rows apart) poisoned with NaN beforehand
    lens = [70, 33]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, device)
    q = _q(2, 2, 4, 16, torch.float16, device)
    extra = {}
    if packed:
        q, extra = q.reshape(4, 4, 16), dict(cu_seqlens_q=torch.tensor([0, 2, 4], dtype=torch.int32, device=device),
                                             max_seqlen_q=2)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    want, want_lse = vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table,
                                                   num_splits=splits, return_lse=True, **extra)
    buffer = torch.full((*q.shape[:-1], 24), float("nan"), dtype=q.dtype, device=device)
    out = buffer[..., 4:20]
    got, lse = vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=splits,
                                             return_lse=True, out=out, **extra)
    assert got is out and torch.equal(got, want) and torch.equal(lse, want_lse)
    assert buffer[..., :4].isnan().all() and buffer[..., 20:].isnan().all()  # nothing outside out is written


def _out_over_table(args):
    # out and the block table carved from one buffer: the kernel would write over the pages it reads
    table = args["block_table"]
    buffer = torch.empty_like(args["q"])
    rows = buffer.view(-1).view(torch.int32)[:table.numel()].view(table.shape)
    rows.copy_(table)
    return dict(out=buffer, block_table=rows)


@pytest.mark.parametrize("change,error,match", [
    (lambda a: dict(out=a["q"].numpy() if a["q"].is_cpu else 1.0), TypeError, "out must be a torch.Tensor"),
    (lambda a: dict(out=torch.empty_like(a["q"])[:1]), ValueError, "out must have q's shape"),
    (lambda a: dict(out=torch.empty_like(a["q"]).float()), ValueError,
     "out must have q's shape with v's head dim, q's dtype"),
    (lambda a: dict(out=torch.empty(2, 1, 16, 4, dtype=a["q"].dtype, device=a["q"].device).transpose(2, 3)),
     ValueError, "unit stride in the head dim"),
    (lambda a: dict(out=a["q"]), ValueError, "out overlaps q's memory"),
    (lambda a: dict(out=a["k_cache"].view(-1)[:a["q"].numel()].view(a["q"].shape)), ValueError,
     "out overlaps k_cache's memory"),
    (lambda a: _out_over_table(a), ValueError, "out overlaps block_table's memory"),
    (lambda a: dict(out=torch.empty(1, 1, 4, 16, dtype=a["q"].dtype, device=a["q"].device).expand(2, 1, 4, 16)),
     ValueError, "out's elements overlap each other"),
    (lambda a: dict(out=torch.empty_like(a["q"]).requires_grad_()), ValueError, "out requires grad"),
    (lambda a: dict(q=_q(2, 2, 4, 16, torch.float16, a["q"].device),
                    out=torch.empty(2, 4, 2, 16, dtype=a["q"].dtype, device=a["q"].device).transpose(1, 2)),
     ValueError, r"\[B, Nq\] strides must merge"),
])
def test_bad_out_is_refused_before_launch(change, error, match, device):
    args = _args(device)
    args.update(change(args))
    with pytest.raises(error, match=match):
        vflash.attention_with_kvcache(**args)


@pytest.mark.parametrize("splits", [1, 3])
def test_planned_repeats_write_the_callers_out(interpreted_plans, splits):
    # with out=, the plan takes the caller's buffer (no allocation) and writes it at every step
    lens = [150, 1]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, "cpu")
    q = _q(2, 1, 8, 16, torch.float16, "cpu")
    seqlens = torch.tensor(lens, dtype=torch.int32)
    out = torch.empty_like(q)

    def call(**kw):
        return vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, num_splits=splits,
                                             check_metadata=False, **kw)
    call(out=out)  # records the plan of this out's metadata
    (plan,) = interpreted_plans._plans.values()
    assert not any(a.name == "out" for a in plan.allocs)
    for step in range(3):
        out.fill_(float("nan"))
        got = call(out=out)
        assert got is out and torch.equal(out, call()), step
        seqlens.add_(1)


def test_a_planned_repeat_checks_its_out_against_the_inputs(interpreted_plans):
    # out's overlap with q or a cache is not metadata: a repeat whose out overlaps an input is refused
    # (the full path's error), not run through the plan recorded for a separate out of the same layout
    lens = [40, 9]
    k_cache, v_cache, table = _paged(lens, 16, 2, 16, torch.float16, "cpu")
    arena = _q(3, 1, 4, 16, torch.float16, "cpu")
    q = arena[:2]
    seqlens = torch.tensor(lens, dtype=torch.int32)

    def call(out):
        return vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, check_metadata=False,
                                             out=out)
    call(torch.empty_like(q))
    assert len(interpreted_plans._plans) == 1
    for out, name in ((arena[1:], "q"), (k_cache.view(-1)[:q.numel()].view(q.shape), "k_cache")):
        kept = k_cache.clone()
        with pytest.raises(ValueError, match=f"out overlaps {name}'s memory"):
            call(out)
        assert torch.equal(k_cache, kept)


@pytest.mark.gpu
@needs_sm90
def test_gpu_chunked_prefill_into_an_out_tma_cannot_address():
    # out= 8 bytes past a 16-byte boundary (its rows' heads apart): the dispatch's TMA check covers it, so the
    # call leaves the sm_90 kernel for the portable one instead of handing TMA a misaligned base
    lens_k, lens_q = [600, 300], [200, 100]
    k_cache, v_cache = (torch.randn(2, 640, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(sum(lens_q), 8, 128, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    opts = dict(cu_seqlens_q=_cu_of(lens_q), max_seqlen_q=max(lens_q))
    want = vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, **opts)
    out = torch.full((sum(lens_q), 8, 136), float("nan"), device="cuda", dtype=torch.bfloat16)[..., 4:132]
    got = vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, out=out, **opts)
    assert got is out and not got.isnan().any()
    assert (got.float() - want.float()).abs().max().item() < 2e-2  # two right kernels: bf16 roundings apart
