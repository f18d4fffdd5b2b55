"""vflash inside transformers' continuous batching (issue 56, first part): `register()` also registers
"paged|<name>", which `model.generate_batch` switches the model to. Random-weight tiny models on the CPU: the
greedy tokens equal `paged|sdpa`'s (or `paged|eager`'s, for gpt-oss) and, without sliding layers, plain
`generate`'s, with mixed prompt
lengths, a shared prefix and a `max_batch_tokens` small enough to split prompts into chunks (chunked prefill);
the batch's metadata checked once a batch, not once a layer. transformers sizes its paged cache from the GPU's
free memory, which a CPU does not report: the tests give its probe 1 GiB. On a GPU, the engine with its steps
captured as CUDA graphs gives the tokens it gives without."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
cb_cache = pytest.importorskip("transformers.generation.continuous_batching.cache")

import vflash  # noqa: E402
import vflash.integrations.transformers as vt  # noqa: E402
from vflash._backend import interpreter_refusal  # noqa: E402
from vflash.reference import attention_explicit  # noqa: E402

NEW_TOKENS = 6


@pytest.fixture
def cpu_engine(monkeypatch):
    refusal = interpreter_refusal()  # the CPU tensors run through Triton's interpreter (refused on some machines)
    if refusal is not None:
        pytest.skip(refusal)
    monkeypatch.setattr(cb_cache, "get_device_and_memory_breakdown", lambda: (torch.device("cpu"), 1 << 30, 0, 0))


def _prompts(vocab, lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, vocab, (12,), generator=g).tolist()
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    return prompts + [shared + [3, 4], shared + [5]]  # two requests with a common prefix


def _generate_batch(model, impl, prompts, max_batch_tokens=24, **engine_options):
    model.set_attn_implementation(impl)
    config = transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                           pad_token_id=0)
    engine = transformers.ContinuousBatchingConfig(block_size=16, num_blocks=48, max_batch_tokens=max_batch_tokens,
                                                   **engine_options)
    out = model.generate_batch(prompts, generation_config=config, continuous_batching_config=engine)
    by_prompt = {tuple(r.prompt_ids): r.generated_tokens for r in out.values()}
    return [by_prompt[tuple(p)] for p in prompts]


def _generate(model, impl, prompts):
    model.set_attn_implementation(impl)
    return [model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                           do_sample=False, pad_token_id=0)[0, len(p):].tolist() for p in prompts]


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_generate_batch_matches_paged_sdpa_and_generate(cpu_engine):
    name = vt.register()
    model = _llama()
    prompts = _prompts(128, (5, 30, 9))  # 30 > max_batch_tokens: a prompt prefilled in chunks
    ours = _generate_batch(model, name, prompts)
    assert model.config._attn_implementation == name  # the engine gives the model its implementation back
    assert ours == _generate_batch(model, "sdpa", prompts)
    assert ours == _generate(model, "sdpa", prompts)


def test_the_batch_metadata_is_checked_once_a_batch(cpu_engine, monkeypatch):
    name = vt.register()
    model = _llama()
    calls = []
    real = vflash.attention_varlen

    def counting(*args, **kwargs):
        calls.append(kwargs["check_metadata"])
        return real(*args, **kwargs)
    monkeypatch.setattr(vt.vflash, "attention_varlen", counting)
    _generate_batch(model, name, _prompts(128, (5, 9)))
    layers = model.config.num_hidden_layers
    assert len(calls) % layers == 0 and all(calls[::layers]) and not any(
        c for i, c in enumerate(calls) if i % layers)  # the first layer of each batch checks, the others not


def test_decode_batches_read_the_paged_cache_in_place(cpu_engine, monkeypatch):
    # a decode-only batch gets the engine's block table (register() admits vflash to that path): each layer writes
    # its new keys into their slots and reads the cache through the table (no gather), the batch's metadata
    # checked at its first layer only; the tokens are plain generate's
    name = vt.register()
    model = _llama()
    calls = []
    real = vflash.attention_with_kvcache

    def recording(q, k_cache, v_cache, cache_seqlens, **kwargs):
        calls.append((kwargs["block_table"] is not None, kwargs["check_metadata"]))
        return real(q, k_cache, v_cache, cache_seqlens, **kwargs)
    monkeypatch.setattr(vt.vflash, "attention_with_kvcache", recording)
    prompts = _prompts(128, (5, 9))
    ours = _generate_batch(model, name, prompts)
    layers = model.config.num_hidden_layers
    assert len(calls) >= 3 * layers and len(calls) % layers == 0
    assert all(table for table, _ in calls)
    checks = [check for _, check in calls]
    assert all(checks[::layers]) and not any(c for i, c in enumerate(checks) if i % layers)
    assert ours == _generate(model, "sdpa", prompts)


def test_an_empty_prompt_is_served_as_paged_sdpa_serves_it(cpu_engine):
    # a request with no prompt token beside a real one: vflash's attention sees a sequence with no query row in
    # the prefill batch, and the tokens are transformers' own paged implementation's
    name = vt.register()
    model = _llama()
    prompts = [[5, 6, 7], []]
    assert _generate_batch(model, name, prompts) == _generate_batch(model, "sdpa", prompts)


@pytest.mark.skipif(interpreter_refusal() is not None, reason=str(interpreter_refusal()))
def test_a_padded_decode_batch_writes_and_reads_its_requests_only():
    # transformers pads a decode batch to a captured size: rows with no key (cu_seq_lens_k plateaus) and a block
    # table row of -1. They write nothing and return zeros; the real rows write their token's slot and attend to
    # their pages through the table
    g = torch.Generator().manual_seed(0)
    pages, page, Hkv, Hq, D = 9, 4, 2, 4, 16
    k_cache, v_cache = (torch.randn(pages, page, Hkv, D, generator=g) for _ in range(2))
    table = torch.tensor([[3, 7, -1], [0, -1, -1], [-1, -1, -1]], dtype=torch.int32)
    lengths = [6, 2, 0]  # each request's keys, its new one included
    cu_k = torch.tensor([0, 6, 8, 8], dtype=torch.int32)
    q, k, v = (torch.randn(1, h, 3, D, generator=g) for h in (Hq, Hkv, Hkv))
    before = (k_cache.clone(), v_cache.clone())
    opts = dict(causal=True, scale=None, window=None, softcap=None, sinks=None)
    out = vt._decode_in_place(None, q, k, v, k_cache, v_cache, table, cu_k, opts)  # [1, 3, Hq, D]
    changed = (k_cache != before[0]).any(-1).any(-1).nonzero().tolist()
    assert changed == [[0, 1], [7, 1]]  # request 1's slot (page 0, row 1) and request 0's (page 7, row 1)
    assert torch.equal(k_cache[7, 1], k[0, :, 0]) and torch.equal(v_cache[0, 1], v[0, :, 1])
    assert torch.equal(out[0, 2], torch.zeros(Hq, D))
    for b in range(2):
        keys, values = (c[table[b, :-(-lengths[b] // page)].long()].flatten(0, 1)[:lengths[b]] for c in (k_cache,
                                                                                                           v_cache))
        ref, _ = attention_explicit(q[:, :, b:b + 1], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                                    causal=True)
        torch.testing.assert_close(out[0, b], ref[0, :, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_generate_batch_with_sliding_and_full_layers(cpu_engine):
    name = vt.register()
    cfg = transformers.Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   use_sliding_window=True, sliding_window=8, max_window_layers=1,
                                   layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    prompts = _prompts(128, (5, 30, 9))
    # transformers' own paged|sdpa is the reference here: in 5.17 it differs from plain generate on models with
    # sliding layers (the 9-token prompt's first token already, window 8; docs/features.md)
    assert _generate_batch(model, name, prompts) == _generate_batch(model, "sdpa", prompts)


@pytest.mark.slow
def test_generate_batch_gpt_oss_with_sinks(cpu_engine):
    name = vt.register()
    cfg = transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                                    num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
                                    layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    prompts = _prompts(128, (5, 30, 9))
    assert _generate_batch(model, name, prompts) == _generate_batch(model, "eager", prompts)  # as above


def test_the_paged_function_refuses_a_call_without_the_engines_cache():
    q = torch.randn(1, 2, 3, 16)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="paged cache"):
        vt.paged_attention_forward(module, q, q, q, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_generate_batch_under_cuda_graphs_matches_the_engine_without_them(monkeypatch):
    # transformers' engine on the GPU capturing its prefill and decode steps as CUDA graphs (use_cuda_graph):
    # vflash's paged attention runs inside the captures (the batch metadata check skipped there: no host sync in
    # a capture) and in their replays, with the engine's padded batches; the greedy tokens equal the same
    # engine's without graphs
    real, capturing = vt.paged_attention_forward, []

    def spy(*args, **kwargs):  # whether each call of vflash's paged attention runs inside a capture
        capturing.append(torch.cuda.is_current_stream_capturing())
        return real(*args, **kwargs)
    monkeypatch.setattr(vt, "paged_attention_forward", spy)
    name = vt.register()  # registers the spy under "paged|<name>"
    model = _llama().cuda()
    prompts = _prompts(128, (5, 30, 9))
    plain = _generate_batch(model, name, prompts, use_cuda_graph=False)
    assert capturing and not any(capturing)
    capturing.clear()
    assert _generate_batch(model, name, prompts, use_cuda_graph=True) == plain
    assert any(capturing)  # the engine captured steps with vflash's attention inside
    assert len(plain) == len(prompts) and all(len(tokens) == NEW_TOKENS for tokens in plain)
    monkeypatch.setattr(vt, "paged_attention_forward", real)
    vt.register()  # the real function registered again (the spy only records, should an assert above stop here)


@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "capture"])
def test_a_padded_continuous_batch_gives_its_requests_the_unpadded_rows(cpu_engine, monkeypatch, capturing):
    # the engine pads a batch to a CUDA-graph size: q rows and k / v rows past cu_seq_lens' last entries belong to
    # no request (and cu_seq_lens plateau for padding requests). The requests' rows equal the unpadded batch's,
    # whether the padding is measured (eager) or, inside a capture, every row may be padding
    monkeypatch.setattr(vt, "_capturing", lambda: capturing)
    g = torch.Generator().manual_seed(3)
    lens_q, lens_k, pad_q, pad_k = [3, 1, 4], [5, 1, 9], 5, 7
    total_q, total_k = sum(lens_q), sum(lens_k)
    q = torch.randn(1, 4, total_q + pad_q, 16, generator=g).half()
    k, v = (torch.randn(1, 2, total_k + pad_k, 16, generator=g).half() for _ in range(2))
    cu = {}
    for name, lens in (("q", lens_q), ("k", lens_k)):
        cu[name] = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist(), sum(lens)], dtype=torch.int32)
    module = torch.nn.Module()
    kwargs = dict(cu_seq_lens_q=cu["q"], cu_seq_lens_k=cu["k"], max_length_q=4, max_length_k=9, read_index=[])
    padded, _ = vt.attention_forward(module, q, k, v, None, **kwargs)
    plain, _ = vt.attention_forward(module, q[:, :, :total_q], k[:, :, :total_k], v[:, :, :total_k], None,
                                    **dict(kwargs, cu_seq_lens_q=cu["q"][:-1], cu_seq_lens_k=cu["k"][:-1]))
    assert padded.shape == (1, total_q + pad_q, 4, 16)
    torch.testing.assert_close(padded[:, :total_q], plain, rtol=0, atol=0)
    assert torch.isfinite(padded).all()
