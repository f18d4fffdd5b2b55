"""The README's python blocks ("Usage", "Use it in transformers", "Use it in your own model") run
exactly as written (CPU through the interpreter, or the GPU), and do what they say."""

import os
import re

import pytest
import torch

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _section_body(text, title):
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _section_code(title):
    with open(README) as f:
        text = f.read()
    body = _section_body(text, title)
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


def _sdpa(q, k, v, causal):
    """fp32 SDPA with GQA, [B, H, N, D]; top-left causal, which is vflash's bottom-right when Nq == Nk."""
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                            enable_gqa=True)


def test_usage_runs_as_written_and_matches_sdpa():
    scope = {}
    exec(compile(_section_code("Usage"), "README.md", "exec"), scope)
    k, v, x, lse = scope["k"], scope["v"], scope["x"], scope["lse"]
    assert lse.shape == (2, 8, 128) and lse.dtype == torch.float32 and torch.isfinite(lse).all()
    # the last dense call: the [B, N, H, D] activations as q
    out = scope["out"]
    assert out.shape == (2, 8, 128, 64) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _sdpa(x.transpose(1, 2), k, v, True), atol=2e-2, rtol=2e-2)
    # the packed call: each sequence as its own dense call
    cu = scope["cu_seqlens"]
    assert cu.dtype == torch.int32
    q_packed, k_packed, v_packed, out_packed = (scope[n] for n in ("q_packed", "k_packed", "v_packed", "out_packed"))
    assert out_packed.shape == q_packed.shape == (185, 8, 64)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        want = _sdpa(*(t[a:b].transpose(0, 1)[None] for t in (q_packed, k_packed, v_packed)), True)
        torch.testing.assert_close(out_packed[a:b].float(), want[0].transpose(0, 1), atol=2e-2, rtol=2e-2)


def test_every_python_block_of_the_readme_is_run_by_a_test():
    # the other fenced blocks are shell commands, a signature or a picture, not python
    with open(README) as f:
        text = f.read()
    tested = sum(len(re.findall(r"```python\n", _section_body(text, t)))
                 for t in ("Usage", "Use it in transformers", "Use it in your own model"))
    assert tested == len(re.findall(r"```python\n", text)) == 3
