"""The README's "Use it in transformers" and "Use it in your own model" sections run exactly
as written (CPU through the interpreter, or the GPU), and do what they say."""

import os
import re

import pytest
import torch

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _section_code(title):
    with open(README) as f:
        text = f.read()
    body = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, re.S)
    assert blocks, f"no python block under '{title}'"
    return "\n".join(blocks)


def test_use_it_in_transformers_runs_as_written():
    pytest.importorskip("transformers")
    scope = {}
    exec(compile(_section_code("Use it in transformers"), "README.md", "exec"), scope)
    assert scope["name"] == "vf_attention"
    assert scope["model"].config._attn_implementation == "vf_attention"
    assert scope["tokens"].shape == (2, 12 + 8)
    assert torch.isfinite(scope["loss"])
    assert all(p.grad is not None for p in scope["model"].parameters() if p.requires_grad)


def test_use_it_in_your_own_model_runs_as_written_and_matches_sdpa():
    scope = {}
    exec(compile(_section_code("Use it in your own model"), "README.md", "exec"), scope)
    layer, y = scope["layer"], scope["y"]
    assert y.shape == (2, 16, 64)
    assert layer.q.weight.grad is not None
    # the line it replaces gives the same output
    x = torch.randn(2, 16, 64, device=y.device)
    B, N, _ = x.shape
    q = layer.q(x).view(B, N, 4, 16).transpose(1, 2)
    k, v = layer.kv(x).view(B, N, 2, 2, 16).permute(2, 0, 3, 1, 4)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = layer.out(want.transpose(1, 2).reshape(B, N, -1))
    torch.testing.assert_close(layer(x), want, atol=1e-5, rtol=1e-5)
