"""A v head dim unlike q's and k's (issue 55, first part: the portable kernels): the forward dense, packed and
against a KV cache (paged and contiguous, split and not, the batch-invariant mode), with every option, against the
explicit oracle (which takes v's own head dim); the backward's dq, dk (q's head dim) and dv (v's), the sinks' and
the LSE's gradient included, against the oracle's autograd, deterministic; every output element written; the
refusals (limits, the sm90 kernels, ring attention not yet) before any launch."""

import pytest
import torch

import vflash
from vflash import dispatch
from vflash.call import Band, Call, Score
from vflash.ops.attention import attention_forward
from vflash.ops.tiles import PortableTiles
from vflash.reference import attention_explicit, attention_varlen_reference, attention_with_kvcache_reference

F32, F64 = torch.float32, torch.float64
DIMS = [(32, 16), (24, 40), (16, 64)]  # (q / k, v): narrower and wider v, padded and not


def _close(got, want, dtype=F32):
    tol = {F32: 2e-5, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got.double(), want.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("d_qk,d_v", DIMS)
@pytest.mark.parametrize("opts", [dict(), dict(causal=True, window=(7, 2), softcap=3.0, sinks=True)],
                         ids=["plain", "options"])
def test_dense_matches_the_oracle(d_qk, d_v, opts, device):
    g = torch.Generator().manual_seed(d_qk + d_v)
    q, k = torch.randn(2, 4, 30, d_qk, generator=g), torch.randn(2, 2, 37, d_qk, generator=g)
    v = torch.randn(2, 2, 37, d_v, generator=g)
    opts = dict(opts, sinks=torch.randn(4, generator=g).to(device) if opts.get("sinks") else None)
    q, k, v = (t.to(device) for t in (q, k, v))
    out, lse = vflash.attention(q, k, v, return_lse=True, **opts)
    ref, ref_lse = attention_explicit(q, k, v, compute_dtype=F64, **opts)
    assert out.shape == (2, 4, 30, d_v)
    _close(out, ref)
    _close(lse, ref_lse)


def test_bf16_matches_the_oracle(device):
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, 40, 32, generator=g), torch.randn(1, 1, 40, 32, generator=g)
    v = torch.randn(1, 1, 40, 48, generator=g)
    q, k, v = (t.to(torch.bfloat16).to(device) for t in (q, k, v))
    out = vflash.attention(q, k, v, causal=True)
    _close(out, attention_explicit(q, k, v, causal=True, compute_dtype=F64)[0], torch.bfloat16)


@pytest.mark.parametrize("d_qk,d_v", DIMS)
def test_packed_matches_the_oracle(d_qk, d_v, device):
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(20, 4, d_qk, generator=g), torch.randn(25, 2, d_qk, generator=g)
    v = torch.randn(25, 2, d_v, generator=g)
    cq = torch.tensor([0, 7, 7, 20], dtype=torch.int32)
    ck = torch.tensor([0, 10, 12, 25], dtype=torch.int32)
    q, k, v, cq, ck = (t.to(device) for t in (q, k, v, cq, ck))
    out, lse = vflash.attention_varlen(q, k, v, cq, ck, 13, 13, causal=True, return_lse=True)
    ref, ref_lse = attention_varlen_reference(q, k, v, cq, ck, causal=True, compute_dtype=F64)
    assert out.shape == (20, 4, d_v)
    _close(out, ref)
    _close(lse, ref_lse)


@pytest.mark.parametrize("d_qk,d_v", DIMS)
@pytest.mark.parametrize("splits,invariant", [(1, False), (3, False), (None, True)])
def test_paged_cache_matches_the_oracle(d_qk, d_v, splits, invariant, device):
    g = torch.Generator().manual_seed(11)
    kc, vc = torch.randn(8, 16, 2, d_qk, generator=g), torch.randn(8, 16, 2, d_v, generator=g)
    table = torch.randperm(8, generator=g).view(2, 4).to(torch.int32)
    lens = torch.tensor([50, 17], dtype=torch.int32)
    q = torch.randn(2, 2, 4, d_qk, generator=g)
    q, kc, vc, table, lens = (t.to(device) for t in (q, kc, vc, table, lens))
    out, lse = vflash.attention_with_kvcache(q, kc, vc, lens, block_table=table, num_splits=None if invariant else
                                             splits, batch_invariant=invariant, return_lse=True)
    cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=device)
    ref, ref_lse = attention_with_kvcache_reference(q.reshape(-1, 4, d_qk), kc, vc, lens, table, cu, compute_dtype=F64)
    assert out.shape == (2, 2, 4, d_v)
    _close(out, ref.view(2, 2, 4, d_v))
    _close(lse, ref_lse.view(4, 2, 2).permute(1, 0, 2))


def test_contiguous_cache_and_a_given_out(device):
    g = torch.Generator().manual_seed(13)
    kc, vc = torch.randn(2, 40, 1, 32, generator=g), torch.randn(2, 40, 1, 16, generator=g)
    q = torch.randn(2, 1, 4, 32, generator=g)
    lens = torch.tensor([40, 9], dtype=torch.int32)
    q, kc, vc, lens = (t.to(device) for t in (q, kc, vc, lens))
    out = torch.full((2, 1, 4, 16), float("nan"), device=device)
    got = vflash.attention_with_kvcache(q, kc, vc, lens, out=out)
    assert got is out and torch.isfinite(out).all()
    for b, n in enumerate(lens.tolist()):
        ref, _ = attention_explicit(q[b:b + 1].transpose(1, 2), kc[b:b + 1, :n].transpose(1, 2),
                                    vc[b:b + 1, :n].transpose(1, 2), causal=True, compute_dtype=F64)
        _close(out[b:b + 1].transpose(1, 2), ref)
    with pytest.raises(ValueError, match="v's head dim"):
        vflash.attention_with_kvcache(q, kc, vc, lens, out=torch.empty_like(q))


def test_every_element_is_written(device):
    # NaN-poisoned out and lse, rows that see no key included
    g = torch.Generator().manual_seed(17)
    q, k = torch.randn(1, 2, 20, 32, generator=g).to(device), torch.randn(1, 2, 12, 32, generator=g).to(device)
    v = torch.randn(1, 2, 12, 24, generator=g).to(device)
    out = torch.full((1, 2, 20, 24), float("nan"), device=device)
    lse = torch.full((1, 2, 20), float("nan"), device=device)
    attention_forward(q, k, v, band=Band(12 - 20, -1, 0), score=Score(0.2), return_lse=True,
                      tiles=PortableTiles(16, 16, 4, 1), kernel="portable", out=out, lse=lse)
    assert torch.isfinite(out).all() and torch.equal(out[:, :, :8], torch.zeros_like(out[:, :, :8]))
    ref, _ = attention_explicit(q, k, v, causal=True, scale=0.2, compute_dtype=F64)
    _close(out, ref)


def test_the_sm90_forward_takes_a_narrower_power_of_two_and_refuses_the_rest(monkeypatch):
    monkeypatch.setattr(dispatch.rules, "_sm90_device_refusal", lambda p: None)  # as on an H100
    q, k = torch.empty(1, 2, 64, 64), torch.empty(1, 2, 64, 64)
    p = dispatch.problem_of(Call(q, k, torch.empty(1, 2, 64, 32), None, Band(0, -1, -1), Score(0.125), False))
    assert p.head_dim_v == 32 and p.head_dim_pad == 64
    assert dispatch.REGISTRY["sm90"].forward_refusal(p) is None
    for d_v in (24, 128):  # no power of two; wider than q's
        p = dispatch.problem_of(Call(q, k, torch.empty(1, 2, 64, d_v), None, Band(0, -1, -1), Score(0.125), False))
        assert "v's head dim of its own as a power of two" in dispatch.REGISTRY["sm90"].forward_refusal(p)


@pytest.mark.parametrize("d_v,words", [(12, "multiple of 8"), (264, "between 8 and 256")])
def test_v_head_dims_past_the_limits_are_refused(d_v, words, device):
    q = torch.randn(1, 2, 8, 16, device=device)
    with pytest.raises(ValueError, match=words):
        vflash.attention(q, q, torch.randn(1, 2, 8, d_v, device=device))


def _grads(fn, inputs, out_shape, lse_shape, seed):
    # the gradients of a fixed random projection of out and of the LSE (so dLSE is exercised too)
    g = torch.Generator().manual_seed(seed)
    w_out, w_lse = torch.randn(out_shape, generator=g), torch.randn(lse_shape, generator=g)
    out, lse = fn(*inputs)
    loss = (out.double() * w_out.to(out.device, F64)).sum() + (lse.double() * w_lse.to(lse.device, F64)).sum()
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("d_qk,d_v", DIMS)
@pytest.mark.parametrize("opts", [dict(causal=True), dict(window=(9, 3), softcap=4.0, sinks=True)],
                         ids=["causal", "options"])
def test_backward_matches_the_oracle(d_qk, d_v, opts, device):
    g = torch.Generator().manual_seed(d_qk * d_v)
    q, k = torch.randn(2, 4, 23, d_qk, generator=g), torch.randn(2, 2, 29, d_qk, generator=g)
    v = torch.randn(2, 2, 29, d_v, generator=g)
    sinks = torch.randn(4, generator=g) if opts.get("sinks") else None
    opts = {name: value for name, value in opts.items() if name != "sinks"}
    leaves = [t.to(device).requires_grad_() for t in (q, k, v) + ((sinks,) if sinks is not None else ())]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]

    def run(impl, compute):
        def fn(q, k, v, s=None):
            return impl(q, k, v, sinks=s, **opts, **compute)
        return fn
    got = _grads(run(vflash.attention, dict(return_lse=True)), leaves, (2, 4, 23, d_v), (2, 4, 23), 5)
    want = _grads(run(attention_explicit, dict(compute_dtype=F64)), ref_leaves, (2, 4, 23, d_v), (2, 4, 23), 5)
    assert got[0].shape[-1] == d_qk and got[1].shape[-1] == d_qk and got[2].shape[-1] == d_v
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double().cpu(), b.cpu(), atol=1e-4, rtol=1e-4)


def test_packed_backward_matches_the_oracle_and_repeats_bit_for_bit(device):
    g = torch.Generator().manual_seed(21)
    q, k = torch.randn(20, 4, 48, generator=g), torch.randn(25, 2, 48, generator=g)
    v = torch.randn(25, 2, 16, generator=g)
    cq = torch.tensor([0, 7, 7, 20], dtype=torch.int32, device=device)
    ck = torch.tensor([0, 10, 12, 25], dtype=torch.int32, device=device)
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]

    def ours(q, k, v):
        return vflash.attention_varlen(q, k, v, cq, ck, 13, 13, causal=True, return_lse=True)

    def oracle(q, k, v):
        return attention_varlen_reference(q, k, v, cq, ck, causal=True, compute_dtype=F64)
    got = _grads(ours, leaves, (20, 4, 16), (4, 20), 6)
    again = _grads(ours, leaves, (20, 4, 16), (4, 20), 6)
    want = _grads(oracle, ref_leaves, (20, 4, 16), (4, 20), 6)
    for a, b, c in zip(got, again, want):
        assert torch.equal(a, b)  # deterministic: every tile's sums in a fixed order
        torch.testing.assert_close(a.double().cpu(), c.cpu(), atol=1e-4, rtol=1e-4)


def test_the_sm90_backward_takes_what_its_forward_takes_and_refuses_the_rest(monkeypatch):
    monkeypatch.setattr(dispatch.rules, "_sm90_device_refusal", lambda p: None)  # as on an H100
    q, k = torch.empty(1, 2, 64, 128), torch.empty(1, 2, 64, 128)

    def refusal(d_v):
        p = dispatch.problem_of(Call(q, k, torch.empty(1, 2, 64, d_v), None, Band(0, -1, -1), Score(0.125), False))
        return dispatch.REGISTRY["sm90"].backward_refusal(p)
    assert refusal(64) is None and refusal(32) is None
    for d_v in (24, 256):  # no power of two; wider than q's
        assert "v's head dim of its own as a power of two" in refusal(d_v)


def test_ring_attention_refuses_it_for_now(device):  # before any process group is asked for
    q = torch.randn(1, 2, 8, 16, device=device)
    k, v = torch.randn(1, 2, 8, 16, device=device), torch.randn(1, 2, 8, 24, device=device)
    from vflash import distributed
    with pytest.raises(ValueError, match="v's head dim equal to k's"):
        distributed.ring_attention(q, k, v)


def test_opcheck_of_the_ops_with_their_own_v_head_dim(device):
    # the custom ops' schema, fake tensors (out of v's head dim) and autograd registration, dense and packed
    from vflash.library import attention_bwd, attention_fwd, attention_varlen_fwd
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, n, d, generator=g).to(device) for n, d in ((9, 16), (12, 16), (12, 24)))
    q.requires_grad_()
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(attention_fwd, (q, k, v, 3, -1, 0, 0.25, None, None), test_utils=tests)
    out, lse = attention_fwd(q.detach(), k, v, 3, -1, 0, 0.25, None, None)
    assert out.shape == (1, 2, 9, 24)
    torch.library.opcheck(attention_bwd, (torch.randn_like(out), None, q.detach(), k, v, out, lse, 3, -1, 0, 0.25,
                                          None, None), test_utils=tests[:1] + tests[2:])
    cq, ck = (torch.tensor(c, dtype=torch.int32, device=device) for c in ([0, 4, 9], [0, 5, 12]))
    torch.library.opcheck(attention_varlen_fwd, (q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(),
                                                 v[0].transpose(0, 1).contiguous(), cq, ck, 5, 7, -1, 0, False, 0.25,
                                                 None, None), test_utils=tests)
