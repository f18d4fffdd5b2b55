"""Launch plans (the host fast path): keys, recording order, and GPU equivalence."""

import pytest
import torch

import vflash
from vflash.kernels.attention_fwd import attention_fwd_kernel
from vflash.ops import attention as ops
from vflash.ops import plans
from vflash.reference import attention_explicit


@pytest.fixture
def keyed(monkeypatch):
    # Keys are computed only for compiled kernels; pretend, to test the key itself.
    monkeypatch.setattr(plans, "interpreting", lambda: False)
    q = torch.randn(1, 2, 8, 16)
    return q, lambda *a, **kw: plans.plan_key(q, q, q, *a, **kw)


def test_key_tells_apart_what_validation_tells_apart(keyed):
    q, key = keyed
    base = key(True, None, None, None, False)
    assert base is not None and base == key(True, None, None, None, False)
    # Equal values of refused types never share an accepted value's key.
    assert key(1, None, None, None, False) != base
    assert key(True, None, None, None, 0) != base
    assert key(False, None, (1.0, 2), None, False) != key(False, None, (1, 2), None, False)
    assert key(False, None, [1, 2], None, False) != key(False, None, (1, 2), None, False)
    assert key(False, 1, None, None, False) != key(False, 1.0, None, None, False)
    # Options that change the launch change the key.
    assert key("top_left", None, None, None, False) != base
    assert key(True, None, None, 30.0, False) != base
    assert key(True, None, None, None, True) != base


def test_key_covers_metadata_and_alignment(keyed):
    q, _ = keyed
    args = (False, None, None, None, False)
    k = q.clone()
    base = plans.plan_key(q, k, k, *args)
    assert plans.plan_key(q, k.transpose(1, 2).contiguous().transpose(1, 2), k, *args) != base  # strides
    assert plans.plan_key(q, k.half(), k, *args) != base
    shifted = torch.randn(2 * q.numel() + 1)[1:1 + q.numel()].view(q.shape)  # 4-byte offset
    assert plans.plan_key(shifted, k, k, *args) != base


def test_key_is_none_for_unkeyable_input(keyed):
    q, key = keyed
    assert plans.plan_key(q.numpy(), q, q, False, None, None, None, False) is None
    assert key(False, None, 4, None, False) is None  # window not a pair: the full path raises
    assert key(False, None, ({}, 2), None, False) is None


def test_interpreter_never_plans():
    q = torch.randn(1, 1, 4, 16)
    if vflash._backend.interpreting():
        assert plans.plan_key(q, q, q, False, None, None, None, False) is None


def test_recorded_plan_passes_every_parameter_in_signature_order(monkeypatch):
    calls = []

    class FakeCompiled:
        def __getitem__(self, grid):
            calls.append(("grid", grid))
            return lambda *args: calls.append(("launch", args))

    recorded = {}
    monkeypatch.setattr(plans, "record", lambda key, plan: recorded.setdefault(key, plan))
    q = torch.randn(1, 2, 8, 16)
    out = torch.empty_like(q)
    lse = torch.empty(1, 2, 8)
    cfg = ops.TileConfig(32, 32, 4, 1)
    args, constexprs = ops._kernel_args(q, q, q, out, lse, 2, 2, 8, 8, 16, 16, 0, -1, 0, 0.25, None, cfg)
    ops._record_plan("k", attention_fwd_kernel, FakeCompiled(), (1, 2, 1), args, constexprs, out, lse, None)
    plan = recorded["k"]
    assert calls == [("grid", (1, 2, 1))]
    o2, l2 = plan(q, q, q)
    launched = calls[-1][1]
    names = attention_fwd_kernel.arg_names
    assert len(launched) == len(names)
    assert launched[0] is q and launched[3] is o2 and launched[4] is l2
    by_name = dict(zip(names, launched))
    assert by_name["stride_qm"] == 16 and by_name["n_q"] == 8 and by_name["right"] == 0
    assert by_name["qk_scale"] == pytest.approx(0.25 * 1.4426950408889634)
    for name, value in constexprs.items():
        assert by_name[name] == value
    assert o2.shape == q.shape and l2.shape == (1, 2, 8) and l2.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans record compiled GPU launches")
@pytest.mark.parametrize("opts", [dict(), dict(causal=True, return_lse=True), dict(window=(64, 0), softcap=20.0)])
def test_gpu_planned_calls_match_the_full_path(opts):
    plans.clear()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    first = vflash.attention(q, k, v, **opts)
    assert len(plans._plans) == 1
    q2, k2, v2 = (torch.randn_like(q) for _ in range(3))
    second = vflash.attention(q2, k2, v2, **opts)  # planned launch, new data
    assert len(plans._plans) == 1
    for got, (qq, kk, vv) in ((first, (q, k, v)), (second, (q2, k2, v2))):
        ref = attention_explicit(qq, kk, vv, compute_dtype=torch.float32, **opts)
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip(got, ref):
            assert torch.isfinite(a).all()
            assert (a.float() - b.float()).abs().max().item() < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans record compiled GPU launches")
@pytest.mark.parametrize("d", [64, 128])  # 128: the Hopper kernel on sm_90, which needs 16-byte alignment
def test_gpu_misaligned_view_gets_its_own_plan(d):
    plans.clear()
    n = 2 * 4 * 64 * d
    base = torch.randn(n + 8, device="cuda", dtype=torch.float16)
    aligned = base[:n].view(2, 4, 64, d)
    shifted = base[1:1 + n].view(2, 4, 64, d)  # 2-byte offset
    for t in (aligned, shifted, aligned, shifted):
        out = vflash.attention(t, t, t)
        ref, _ = attention_explicit(t, t, t, compute_dtype=torch.float32)
        assert (out.float() - ref.float()).abs().max().item() < 1e-2
    assert len(plans._plans) == 2
