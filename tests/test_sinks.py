"""Attention sinks (`sinks=`, one fp32 logit per query head in every row's softmax denominator, gpt-oss's
`s_aux`): every path against the explicit oracle with one sink column appended (vflash.reference), the
rows that see no key, a -inf sink as no sink, the merge recipe for parts computed without the sink, the
gradients (the sink's own included, and each side alone), and the bad inputs."""

import math

import pytest
import torch

import vflash
from vflash.reference import attention_explicit, attention_varlen_reference, attention_with_kvcache_reference

F32, F64 = torch.float32, torch.float64


def _dense(B, Hq, Hkv, Nq, Nk, D, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g)
    k, v = (torch.randn(B, Hkv, Nk, D, generator=g) for _ in range(2))
    sinks = torch.randn(Hq, generator=g) * 2
    return (*(t.to(dtype).to(device) for t in (q, k, v)), sinks.to(device))


def _close(got, want, dtype):
    tol = {F32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got.double(), want.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("opts", [dict(causal=False), dict(causal=True), dict(causal=True, window=(5, -1)),
                                  dict(causal=False, softcap=3.0, window=(-1, 2))])
@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
def test_dense_matches_the_sink_column_oracle(opts, dtype, device):
    q, k, v, sinks = _dense(2, 4, 2, 21, 27, 16, dtype, device)
    out, lse = vflash.attention(q, k, v, sinks=sinks, return_lse=True, **opts)
    ref, ref_lse = attention_explicit(q, k, v, sinks=sinks, compute_dtype=F64, **opts)
    _close(out, ref, dtype)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=2e-5)


def test_the_sink_is_the_written_formula(device):
    # out_i = sum_j e^{s_ij} v_j / (e^{sink} + sum_j e^{s_ij}), lse = log(e^{sink} + sum_j e^{s_ij}): written out
    # here for one head, without the oracle
    q, k, v, sinks = _dense(1, 1, 1, 3, 5, 8, F32, device, seed=4)
    out, lse = vflash.attention(q, k, v, sinks=sinks, return_lse=True)
    s = (q[0, 0].double() @ k[0, 0].double().T) / math.sqrt(8)
    e = s.exp()
    z = sinks.double().exp() + e.sum(1)
    torch.testing.assert_close(out[0, 0].double(), (e @ v[0, 0].double()) / z[:, None], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[0, 0].double(), z.log(), atol=1e-5, rtol=1e-5)


def test_rows_without_keys_return_zero_and_the_sink_as_lse(device):
    # more queries than keys under causal (bottom-right): the first rows see no key; and Nk = 0: out 0, lse =
    # the head's sink
    q, k, v, sinks = _dense(1, 2, 1, 6, 3, 16, F32, device)
    out, lse = vflash.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))
    assert torch.equal(lse[:, :, :3], sinks.view(1, 2, 1).expand(1, 2, 3))
    assert (lse[:, :, 3:] > sinks.view(1, 2, 1)).all()
    q, k, v, sinks = _dense(1, 2, 1, 4, 0, 16, F32, device)
    out, lse = vflash.attention(q, k, v, sinks=sinks, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, sinks.view(1, 2, 1).expand(1, 2, 4))


def test_minus_inf_is_no_sink(device):
    q, k, v, sinks = _dense(1, 2, 2, 9, 11, 16, F32, device)
    sinks[1] = float("-inf")
    out, lse = vflash.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    plain, plain_lse = vflash.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out[:, 1], plain[:, 1]) and torch.equal(lse[:, 1], plain_lse[:, 1])
    assert not torch.equal(out[:, 0], plain[:, 0])


def test_a_sink_far_above_the_scores_neither_overflows_nor_loses_the_keys(device):
    q, k, v, _ = _dense(1, 2, 1, 5, 7, 16, F32, device)
    sinks = torch.tensor([200.0, -200.0], device=device)
    out, lse = vflash.attention(q, k, v, sinks=sinks, return_lse=True)
    ref, ref_lse = attention_explicit(q, k, v, sinks=sinks, compute_dtype=F64)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-6)


def _packed(lens_q, lens_k, Hq, Hkv, D, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), Hq, D, generator=g).to(dtype).to(device)
    k, v = (torch.randn(sum(lens_k), Hkv, D, generator=g).to(dtype).to(device) for _ in range(2))
    cq, ck = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=device)
              for n in (lens_q, lens_k))
    return q, k, v, cq, ck, (torch.randn(Hq, generator=g) * 2).to(device)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_the_oracle_a_sequence_without_keys_included(causal, device):
    q, k, v, cq, ck, sinks = _packed([5, 3, 9], [7, 0, 12], 4, 2, 16, F32, device)
    out, lse = vflash.attention_varlen(q, k, v, cq, ck, 9, 12, causal=causal, sinks=sinks, return_lse=True)
    ref, ref_lse = attention_varlen_reference(q, k, v, cq, ck, causal=causal, sinks=sinks, compute_dtype=F64)
    _close(out, ref, F32)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=2e-5)
    assert torch.equal(lse[:, 5:8], sinks[:, None].expand(4, 3))  # the sequence with no key


def _cache(lens, new, Hq, Hkv, D, page, device, seed=2):
    # a paged cache holding each sequence's lens[b] keys (its new queries' own among them), pages shuffled
    g = torch.Generator().manual_seed(seed)
    pages_each = [-(-n // page) for n in lens]
    width = max(max(pages_each), 1)
    n_pages = sum(pages_each) + 2
    order = torch.randperm(n_pages, generator=g).tolist()
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for b, p in enumerate(pages_each):
        table[b, :p] = torch.tensor(order[used:used + p], dtype=torch.int32)
        used += p
    k_cache, v_cache = (torch.randn(n_pages, page, Hkv, D, generator=g).to(device) for _ in range(2))
    q = torch.randn(sum(new), Hq, D, generator=g).to(device)
    cq = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, seqlens, table.to(device), cq, (torch.randn(Hq, generator=g) * 2).to(device)


@pytest.mark.parametrize("splits", [dict(num_splits=1), dict(num_splits=3), dict(batch_invariant=True)])
def test_paged_cache_with_splits_matches_the_oracle(splits, device):
    # the sink enters once: in the unsplit row's finish, or at the merged row of a split sequence
    q, kc, vc, seqlens, table, cq, sinks = _cache([37, 0, 70], [2, 1, 3], 4, 2, 16, 16, device)
    out, lse = vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, cu_seqlens_q=cq, max_seqlen_q=3,
                                             sinks=sinks, return_lse=True, **splits)
    ref, ref_lse = attention_with_kvcache_reference(q, kc, vc, seqlens, table, cq, sinks=sinks, compute_dtype=F64)
    _close(out, ref, F32)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=2e-5)
    assert torch.equal(lse[:, 2:3], sinks[:, None])  # the sequence with an empty cache


def test_contiguous_cache_decode_matches_dense_attention(device):
    # dense q [B, 1, Hq, D] against a contiguous cache: each sequence's attention over its own keys
    g = torch.Generator().manual_seed(5)
    kc, vc = (torch.randn(2, 40, 2, 16, generator=g).to(device) for _ in range(2))
    q = torch.randn(2, 1, 4, 16, generator=g).to(device)
    sinks = torch.randn(4, generator=g).to(device)
    seqlens = torch.tensor([33, 40], dtype=torch.int32, device=device)
    out = vflash.attention_with_kvcache(q, kc, vc, seqlens, sinks=sinks, num_splits=2)
    for b, n in enumerate(seqlens.tolist()):
        ref, _ = attention_explicit(q[b:b + 1].transpose(1, 2), kc[b:b + 1, :n].transpose(1, 2),
                                    vc[b:b + 1, :n].transpose(1, 2), sinks=sinks, compute_dtype=F64)
        _close(out[b:b + 1].transpose(1, 2), ref, F32)


def test_merge_recipe_for_parts_computed_without_the_sink(device):
    # the keys in two parts, each without the sink; merge_states joins them, and the sink enters once more
    # as a part whose output is 0 and whose LSE is the sink
    q, k, v, sinks = _dense(1, 4, 2, 8, 24, 16, F32, device)
    a, lse_a = vflash.attention(q, k[:, :, :10], v[:, :, :10], return_lse=True)
    b, lse_b = vflash.attention(q, k[:, :, 10:], v[:, :, 10:], return_lse=True)
    out, lse = vflash.merge_states(a, lse_a, b, lse_b)
    out, lse = vflash.merge_states(out, lse, torch.zeros_like(out), sinks.view(1, 4, 1).expand_as(lse))
    want, want_lse = vflash.attention(q, k, v, sinks=sinks, return_lse=True)
    torch.testing.assert_close(out, want, atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(lse, want_lse, atol=2e-6, rtol=2e-6)


def _grads(fn, leaves, do):
    leaves = [t.detach().clone().requires_grad_(need) for t, need in leaves]
    out = fn(*leaves)
    (out * do).sum().backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("opts", [dict(causal=True), dict(causal=False, window=(4, 1), softcap=5.0)])
def test_gradients_of_q_k_v_and_the_sinks(opts, device):
    q, k, v, sinks = _dense(2, 4, 2, 13, 17, 16, F32, device, seed=6)
    do = torch.randn(2, 4, 13, 16, generator=torch.Generator().manual_seed(7)).to(device)
    got = _grads(lambda a, b, c, s: vflash.attention(a, b, c, sinks=s, **opts), [(t, True) for t in (q, k, v, sinks)],
                 do)
    want = _grads(lambda a, b, c, s: attention_explicit(a, b, c, sinks=s, compute_dtype=F64, **opts)[0],
                  [(t.double(), True) for t in (q, k, v, sinks)], do.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, atol=5e-5, rtol=5e-5)


def test_sinks_alone_or_qkv_alone_require_grad(device):
    q, k, v, sinks = _dense(1, 2, 1, 9, 9, 16, F32, device, seed=8)
    do = torch.randn(1, 2, 9, 16, generator=torch.Generator().manual_seed(9)).to(device)
    only_sinks = _grads(lambda a, b, c, s: vflash.attention(a, b, c, causal=True, sinks=s),
                        [(q, False), (k, False), (v, False), (sinks, True)], do)
    assert only_sinks[:3] == [None, None, None] and only_sinks[3].shape == (2,)
    only_qkv = _grads(lambda a, b, c, s: vflash.attention(a, b, c, causal=True, sinks=s),
                      [(q, True), (k, True), (v, True), (sinks, False)], do)
    assert only_qkv[3] is None
    both = _grads(lambda a, b, c, s: vflash.attention(a, b, c, causal=True, sinks=s),
                  [(t, True) for t in (q, k, v, sinks)], do)
    assert torch.equal(both[3], only_sinks[3]) and all(torch.equal(a, b) for a, b in zip(both[:3], only_qkv[:3]))


def test_varlen_gradients_with_a_sequence_without_keys(device):
    # the empty sequence's rows: their sink takes every row's weight (lse = sink), out 0: dsink = -sum dlse there
    q, k, v, cq, ck, sinks = _packed([4, 3, 6], [5, 0, 6], 2, 1, 16, F32, device, seed=10)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(11)).to(device)

    def ref(a, b, c, s):
        out, _ = attention_varlen_reference(a, b, c, cq, ck, causal=True, sinks=s, compute_dtype=F64)
        return out
    got = _grads(lambda a, b, c, s: vflash.attention_varlen(a, b, c, cq, ck, 6, 6, causal=True, sinks=s),
                 [(t, True) for t in (q, k, v, sinks)], do)
    want = _grads(ref, [(t.double(), True) for t in (q, k, v, sinks)], do.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, atol=5e-5, rtol=5e-5)


def test_the_lse_gradient_reaches_the_sinks(device):
    q, k, v, sinks = _dense(1, 2, 2, 7, 7, 16, F32, device, seed=12)
    w = torch.randn(1, 2, 7, generator=torch.Generator().manual_seed(13)).to(device)

    def grads(fn, dtype):
        s = sinks.detach().to(dtype).requires_grad_()
        out, lse = fn(*(t.to(dtype) for t in (q, k, v)), s)
        (out.sum() + (lse * w.to(dtype)).sum()).backward()
        return s.grad
    got = grads(lambda a, b, c, s: vflash.attention(a, b, c, causal=True, sinks=s, return_lse=True), F32)
    want = grads(lambda a, b, c, s: attention_explicit(a, b, c, causal=True, sinks=s, compute_dtype=F64), F64)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_sink_gradient_is_bitwise_repeatable(device):
    q, k, v, sinks = _dense(1, 4, 2, 19, 23, 16, torch.bfloat16, device, seed=14)
    do = torch.randn(1, 4, 19, 16, generator=torch.Generator().manual_seed(15)).to(torch.bfloat16).to(device)
    fn = lambda a, b, c, s: vflash.attention(a, b, c, causal=True, sinks=s)  # noqa: E731
    first = _grads(fn, [(t, True) for t in (q, k, v, sinks)], do)
    for _ in range(3):
        again = _grads(fn, [(t, True) for t in (q, k, v, sinks)], do)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_sink_gradient_of_rows_without_keys_and_of_a_minus_inf_sink(device):
    # Nk = 0: out 0, lse = the sink (-inf for head 0, no sink); a loss on lse: dsink_h = the sum of its rows'
    # dlse (their sink takes the whole softmax), 0 (never NaN) for the head without a sink
    q, k, v, _ = _dense(2, 2, 1, 3, 0, 16, F32, device)
    sinks = torch.tensor([float("-inf"), 0.5], device=device, requires_grad=True)
    w = torch.randn(2, 3, generator=torch.Generator().manual_seed(21)).to(device)
    out, lse = vflash.attention(q, k, v, sinks=sinks, return_lse=True)
    (out.sum() + (lse[:, 1] * w).sum()).backward()
    assert torch.equal(sinks.grad[0], torch.tensor(0.0, device=device))
    torch.testing.assert_close(sinks.grad[1], w.sum())


@pytest.mark.parametrize("bad,error,words", [
    (lambda H, d: torch.zeros(H // 2, device=d), ValueError, "[Hq] = [4]"),
    (lambda H, d: torch.zeros(1, H, device=d), ValueError, "[Hq] = [4]"),
    (lambda H, d: torch.zeros(H, dtype=torch.float16, device=d), TypeError, "float32"),
    (lambda H, d: torch.zeros(H, dtype=torch.int32, device=d), TypeError, "float32"),
    (lambda H, d: [0.0] * H, TypeError, "torch.tensor(x)"),
    (lambda H, d: torch.zeros(H, device="meta"), ValueError, "one device"),
    (lambda H, d: torch.tensor([0.0, float("nan"), 0.0, 0.0], device=d), ValueError, "NaN or +inf at heads [1]"),
    (lambda H, d: torch.tensor([0.0, 0.0, 0.0, float("inf")], device=d), ValueError, "NaN or +inf at heads [3]"),
    (lambda H, d: torch.zeros(2 * H, device=d)[::2], ValueError, "unit stride"),
])
def test_bad_sinks_are_refused_before_any_launch(bad, error, words, device):
    q, k, v, _ = _dense(1, 4, 2, 5, 5, 16, F32, device)
    sinks = bad(4, device)
    with pytest.raises(error) as info:
        vflash.attention(q, k, v, sinks=sinks)
    assert words in str(info.value)
    with pytest.raises(error):
        vflash.attention_varlen(q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(),
                                v[0].transpose(0, 1).contiguous(), *[torch.tensor([0, 5], dtype=torch.int32,
                                                                                   device=device)] * 2, 5, 5,
                                sinks=sinks)
    with pytest.raises(error):
        vflash.attention_with_kvcache(q.transpose(1, 2), k.transpose(1, 2).contiguous(),
                                      v.transpose(1, 2).contiguous(),
                                      torch.tensor([5], dtype=torch.int32, device=device), sinks=sinks)


def test_kvcache_refuses_sinks_that_require_grad(device):
    g = torch.Generator().manual_seed(16)
    kc, vc = (torch.randn(1, 8, 1, 16, generator=g).to(device) for _ in range(2))
    q = torch.randn(1, 1, 2, 16, generator=g).to(device)
    sinks = torch.zeros(2, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="no backward"):
        vflash.attention_with_kvcache(q, kc, vc, torch.tensor([8], dtype=torch.int32, device=device), sinks=sinks)
    with torch.no_grad():
        vflash.attention_with_kvcache(q, kc, vc, torch.tensor([8], dtype=torch.int32, device=device), sinks=sinks)


def test_sinks_written_in_place_are_checked_again(device):
    q, k, v, sinks = _dense(1, 4, 2, 5, 5, 16, F32, device)
    vflash.attention(q, k, v, sinks=sinks)
    sinks[2] = float("nan")  # an in-place write bumps the version: the next call reads the values again
    with pytest.raises(ValueError, match="heads \\[2\\]"):
        vflash.attention(q, k, v, sinks=sinks)


def test_opcheck_of_the_ops_with_sinks(device):
    from vflash.library import attention_bwd, attention_fwd, attention_varlen_fwd
    q, k, v, sinks = _dense(1, 2, 1, 9, 12, 16, F32, device, seed=17)
    leaves = [t.requires_grad_() for t in (q, k, v, sinks)]
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(attention_fwd, (*leaves[:3], 3, -1, 0, 0.25, None, leaves[3]), test_utils=tests)
    out, lse = attention_fwd(q.detach(), k.detach(), v.detach(), 3, -1, 0, 0.25, None, sinks.detach())
    torch.library.opcheck(attention_bwd, (torch.randn_like(out), None, q.detach(), k.detach(), v.detach(), out, lse,
                                          3, -1, 0, 0.25, None, sinks.detach()),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    q, k, v, cq, ck, sinks = _packed([5, 0, 7], [6, 2, 7], 2, 1, 16, F32, device, seed=18)
    leaves = [t.requires_grad_() for t in (q, k, v, sinks)]
    torch.library.opcheck(attention_varlen_fwd, (*leaves[:3], cq, ck, 7, 7, -1, 0, False, 0.25, None, leaves[3]),
                          test_utils=tests)


def test_torch_compile_fullgraph_with_learnable_sinks(device):
    q, k, v, sinks = _dense(1, 4, 2, 12, 12, 16, F32, device, seed=19)

    def step(a, b, c, s):
        return vflash.attention(a, b, c, causal=True, sinks=s).square().sum()
    eager = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    step(*eager).backward()
    traced = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    torch.compile(step, fullgraph=True, backend="aot_eager")(*traced).backward()
    for a, b in zip(traced, eager):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_planned_repeats_take_the_sinks_and_check_them_after_a_write(interpreted_plans):
    # a decode loop through the recorded plan (the sinks a slot of it, as q is): the full path's bits; an
    # in-place write of the sinks sends the next call down the full path, which checks the values again
    q, kc, vc, seqlens, table, cq, sinks = _cache([40, 9], [1, 1], 4, 2, 16, 16, "cpu", seed=20)

    def call(s):
        return vflash.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, cu_seqlens_q=cq, max_seqlen_q=1,
                                             sinks=s, num_splits=2)
    first = call(sinks)
    assert len(interpreted_plans._plans) >= 1
    other = sinks + 1.0
    again = call(sinks)
    assert torch.equal(again, first)
    assert not torch.equal(call(other), first)  # another sinks tensor through the same plan: its own values
    ref, _ = attention_with_kvcache_reference(q, kc, vc, seqlens, table, cq, sinks=other, compute_dtype=F64)
    _close(call(other), ref, F32)
    sinks[1] = float("nan")
    with pytest.raises(ValueError, match="heads \\[1\\]"):
        call(sinks)


def test_the_backward_plan_replays_the_sink_gradient(interpreted_plans):
    # the backward op's recorded plan (delta, dK / dV, dQ and the sinks' kernel) on a repeat: the same bits
    q, k, v, sinks = _dense(1, 4, 2, 11, 13, 16, F32, "cpu", seed=22)
    do = torch.randn(1, 4, 11, 16, generator=torch.Generator().manual_seed(23))
    fn = lambda a, b, c, s: vflash.attention(a, b, c, causal=True, sinks=s)  # noqa: E731
    first = _grads(fn, [(t, True) for t in (q, k, v, sinks)], do)
    assert any(key[0] == "attention_bwd" for key in interpreted_plans._plans)
    again = _grads(fn, [(t, True) for t in (q, k, v, sinks)], do)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    want = _grads(lambda a, b, c, s: attention_explicit(a, b, c, causal=True, sinks=s, compute_dtype=F64)[0],
                  [(t.double(), True) for t in (q, k, v, sinks)], do.double())
    torch.testing.assert_close(again[3].double(), want[3], atol=5e-5, rtol=5e-5)
