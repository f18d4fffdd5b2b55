"""The references agree with each other and with the lesson's arithmetic."""

import math

import pytest
import torch

from vflash.reference import attention_explicit, attention_tiled, visible_mask
from vflash.reference.scalar import DEMO_K, DEMO_Q, DEMO_V, full_attention, online_attention


@pytest.mark.parametrize("block", [1, 2, 6])
def test_scalar_online_equals_full(block):
    full = full_attention(DEMO_Q, DEMO_K, DEMO_V)
    online = online_attention(DEMO_Q, DEMO_K, DEMO_V, block=block)
    assert max(abs(a - b) for a, b in zip(full, online)) < 1e-15
    # The lesson's printed values.
    assert [round(x, 6) for x in full] == [0.363083, 0.449897, 0.392487, 0.386499]


def test_scalar_online_rescales_on_growing_max():
    # Scores that rise key after key force a rescale at every step.
    q = [1.0, 0.0]
    keys = [[float(i), 0.0] for i in range(40)]
    values = [[math.sin(i), math.cos(i)] for i in range(40)]
    full = full_attention(q, keys, values)
    for block in (1, 3, 7, 40):
        assert max(abs(a - b) for a, b in zip(full, online_attention(q, keys, values, block))) < 1e-14


def test_visible_mask_pictures():
    # The README's picture for Nq = 2, Nk = 5.
    br = visible_mask(2, 5, "bottom_right").int().tolist()
    tl = visible_mask(2, 5, "top_left").int().tolist()
    assert br == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert tl == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert visible_mask(3, 3, True).equal(visible_mask(3, 3, "top_left"))
    # Window (1, 0) without causal, bottom-right aligned: each query sees its key and the one before.
    w = visible_mask(2, 4, False, (1, 0)).int().tolist()
    assert w == [[0, 1, 1, 0], [0, 0, 1, 1]]
    # Nq > Nk bottom-right: the first Nq - Nk rows see nothing.
    assert visible_mask(4, 2, True).int().tolist() == [[0, 0], [0, 0], [1, 0], [1, 1]]


OPTIONS = [
    dict(),
    dict(causal=True),
    dict(causal="top_left"),
    dict(window=(5, 3)),
    dict(causal=True, window=(7, -1)),
    dict(softcap=2.0, scale=0.9),
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("blocks", [(1, 1), (16, 16), (7, 13), (64, 32)])
@pytest.mark.parametrize("nq,nk", [(37, 37), (20, 45), (45, 20)])
def test_tiled_matches_explicit(opts, blocks, nq, nk):
    g = torch.Generator().manual_seed(nq * 1000 + nk)
    q = torch.randn(2, 4, nq, 24, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, nk, 24, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, nk, 24, generator=g, dtype=torch.float64)
    ref_o, ref_l = attention_explicit(q, k, v, compute_dtype=torch.float64, **opts)
    o, l = attention_tiled(q, k, v, block_m=blocks[0], block_n=blocks[1], compute_dtype=torch.float64, **opts)
    assert torch.allclose(o, ref_o, atol=1e-12, rtol=0)
    fin = torch.isfinite(ref_l)
    assert torch.equal(torch.isinf(l), ~fin)
    assert torch.allclose(l[fin], ref_l[fin], atol=1e-12, rtol=0)


def test_explicit_fully_masked_rows_are_zero_and_minus_inf():
    q = torch.randn(1, 1, 6, 8)
    k = torch.randn(1, 1, 3, 8)
    o, lse = attention_explicit(q, k, k, causal=True)
    assert torch.equal(o[0, 0, :3], torch.zeros(3, 8))
    assert torch.isinf(lse[0, 0, :3]).all() and torch.isfinite(lse[0, 0, 3:]).all()


def test_explicit_same_dtype_runs_in_input_dtype():
    q = torch.randn(1, 2, 16, 32, dtype=torch.bfloat16)
    o, lse = attention_explicit(q, q, q, compute_dtype=None)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.bfloat16
    o32, _ = attention_explicit(q, q, q)
    assert 0 < (o.float() - o32).abs().max() < 0.05
