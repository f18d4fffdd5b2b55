"""A gpt-oss-20b-shaped stack of a few layers (its attention: 64 query heads, 8 KV heads, D 64, a window
of 128 keys on alternate layers, a learnable sink a head; its MoE: 32 experts, 4 a token; random weights,
bf16) in Hugging Face transformers, with vflash (vflash.integrations.transformers, sinks as `s_aux`)
against attn_implementation="eager" in the same run (transformers refuses "sdpa" for gpt-oss: SDPA has no
sinks): prefill tokens/s (a left-padded batch of mixed lengths and an unpadded one), greedy decode
tokens/s with the model's KV cache, and a training step in ms. Each measurement alternates the two,
ROUNDS times, and keeps the median; each layer's attention output and the prefill logits are compared on
real tokens.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.hf_gpt_oss --out hf_gpt_oss.csv [--layers 4]
"""

import argparse
import statistics

import torch

import vflash.integrations.transformers as vt
from benchmarks.experiments.common import model_inputs, wall_seconds, write_rows

ROUNDS = 3


def main() -> int:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="hf_gpt_oss.csv")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    name = vt.register()
    dev = torch.device("cuda")
    cfg = transformers.GptOssConfig(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=args.layers,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128, num_local_experts=32,
        num_experts_per_tok=4, layer_types=["sliding_attention", "full_attention"] * (args.layers // 2),
        max_position_embeddings=131072)
    torch.manual_seed(0)
    with torch.device(dev):
        model = transformers.GptOssForCausalLM(cfg).to(torch.bfloat16).eval()
        with torch.no_grad():  # sinks of a trained model's size (the init's ~0.02 are nearly no sink)
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e9:.2f}B parameters, {args.layers} layers, transformers {transformers.__version__}",
          flush=True)
    lengths, ids, mask, dense, prompts, train_ids = model_inputs(cfg.vocab_size, dev, train_batch=2)
    new_tokens = 64
    impls = ("eager", name)
    logits, timings = {}, {}

    def generate():
        return model.generate(prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    valid = mask.bool()
    # Each layer's attention output on real tokens, to tell the kernels' rounding from its growth through the
    # stack: layer 0 sees the same input under both implementations; a later layer's input already differs,
    # and a token whose top-4 experts change on a near tie moves its hidden state by far more than rounding.
    attn_out = {}

    def keep(i):
        def hook(module, args, output):
            if current[0] is not None:  # the padded prefill only, not generate's calls
                attn_out[(current[0], i)] = output[0][valid].float()
        return hook
    current = [None]
    hooks = [layer.self_attn.register_forward_hook(keep(i)) for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        for impl in impls:  # warm-up (Triton compiles) and the agreement check
            model.set_attn_implementation(impl)
            current[0] = impl
            logits[impl] = model(input_ids=ids, attention_mask=mask).logits[valid].float()
            current[0] = None
            generate()
        for h in hooks:
            h.remove()
        layer_diffs = []
        for i in range(args.layers):
            ref, got = attn_out[("eager", i)], attn_out[(name, i)]
            layer_diffs.append((ref - got).abs().max().item())
            print(f"layer {i} attention output: max |vflash - eager| {layer_diffs[-1]:.4f}, "
                  f"mean {(ref - got).abs().mean().item():.5f} (max |out| {ref.abs().max().item():.3f})", flush=True)
        attn_out.clear()
        err = (logits["eager"] - logits[name]).abs()
        diff, mean_diff = err.max().item(), err.mean().item()
        same_top1 = (logits["eager"].argmax(-1) == logits[name].argmax(-1)).float().mean().item()
        print(f"prefill logits max |vflash - eager| {diff:.4f}, mean {mean_diff:.5f} (max |logit| "
              f"{logits['eager'].abs().max().item():.2f}); same top-1 token on {same_top1:.2%} of "
              f"{err.shape[0]} tokens", flush=True)
        del logits, err
        for _ in range(ROUNDS):
            for impl in impls:
                model.set_attn_implementation(impl)
                timings.setdefault(("prefill_padded", impl), []).append(
                    wall_seconds(lambda: model(input_ids=ids, attention_mask=mask)))
                timings.setdefault(("prefill_dense", impl), []).append(wall_seconds(lambda: model(input_ids=dense)))
                timings.setdefault(("prefill_prompts", impl), []).append(wall_seconds(lambda: model(input_ids=prompts)))
                timings.setdefault(("generate", impl), []).append(wall_seconds(generate))
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=train_ids, labels=train_ids).loss.backward()
    for impl in impls:
        model.set_attn_implementation(impl)
        step()  # warm-up
    for _ in range(ROUNDS):
        for impl in impls:
            model.set_attn_implementation(impl)
            timings.setdefault(("train_step", impl), []).append(wall_seconds(step))
    med = {k: statistics.median(v) for k, v in timings.items()}
    rows = []
    for impl in impls:
        for what, seconds, tokens in (
                ("prefill padded 8 x mixed", med[("prefill_padded", impl)], sum(lengths)),
                ("prefill dense 4 x 2048", med[("prefill_dense", impl)], dense.numel()),
                (f"decode 8 x {new_tokens} after 512", med[("generate", impl)] - med[("prefill_prompts", impl)],
                 prompts.shape[0] * new_tokens),
                ("forward + backward 2 x 1024", med[("train_step", impl)], train_ids.numel())):
            rows.append(dict(what=what, impl=impl, ms=seconds * 1e3, tokens_per_s=tokens / seconds, params=params,
                             layers=args.layers, logits_max_diff=diff, logits_mean_diff=mean_diff,
                             same_top1=same_top1, attention_max_diff=" ".join(f"{d:.4f}" for d in layer_diffs)))
            print(f"{what:28s} {impl:12s} {seconds * 1e3:9.2f} ms {tokens / seconds:10.0f} tokens/s", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
