"""A gpt-oss-20b-shaped stack of a few layers (its attention: 64 query heads, 8 KV heads, D 64, a window
of 128 keys on alternate layers, a learnable sink a head; its MoE: 32 experts, 4 a token; random weights,
bf16) in Hugging Face transformers, with vflash (vflash.integrations.transformers, sinks as `s_aux`)
against attn_implementation="eager" in the same run (transformers refuses "sdpa" for gpt-oss: SDPA has no
sinks): prefill tokens/s (a left-padded batch of mixed lengths and an unpadded one), greedy decode
tokens/s with the model's KV cache, and a training step in ms. Each measurement alternates the two,
ROUNDS times, and keeps the median. Agreement on real tokens: each layer's attention output with every layer
fed eager's input, and the prefill logits of both against the same model run in fp32 under eager.

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
    # Agreement, in three parts:
    # - each layer's attention output on real tokens with every layer fed eager's input to it (a pre-hook swaps
    #   the hidden states in), so a layer's difference is the kernels' own, not its growth through the stack;
    # - the prefill logits of the two bf16 runs;
    # - the same model in fp32 under eager as the yardstick: how far bf16 eager's own logits are from it, beside
    #   vflash's (random experts on near ties turn rounding into large logit moves in either implementation).
    layer_in, layer_out, mode = {}, {}, [None]

    def pre_hook(i):
        def hook(module, args, kwargs):
            if mode[0] == "capture":
                layer_in[i] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            elif mode[0] == "replay":
                if "hidden_states" in kwargs:
                    kwargs = dict(kwargs, hidden_states=layer_in[i])
                else:
                    args = (layer_in[i],) + tuple(args[1:])
            return args, kwargs
        return hook

    def post_hook(i):
        def hook(module, args, output):
            if mode[0] is not None:
                layer_out[(mode[0], i)] = output[0][valid].float()
        return hook
    layers = model.model.layers
    hooks = [m.self_attn.register_forward_pre_hook(pre_hook(i), with_kwargs=True) for i, m in enumerate(layers)]
    hooks += [m.self_attn.register_forward_hook(post_hook(i)) for i, m in enumerate(layers)]
    with torch.no_grad():
        for impl in impls:  # warm-up (Triton compiles) and the agreement check
            model.set_attn_implementation(impl)
            mode[0] = "capture" if impl == "eager" else "replay"
            model(input_ids=ids, attention_mask=mask)
            mode[0] = None
            logits[impl] = model(input_ids=ids, attention_mask=mask).logits[valid].float()
            generate()
        for h in hooks:
            h.remove()
        layer_diffs = []
        for i in range(args.layers):
            ref, got = layer_out[("capture", i)], layer_out[("replay", i)]
            layer_diffs.append((ref - got).abs().max().item())
            print(f"layer {i} attention output, eager's input: max |vflash - eager| {layer_diffs[-1]:.4f}, "
                  f"mean {(ref - got).abs().mean().item():.5f} (max |out| {ref.abs().max().item():.3f})", flush=True)
        layer_in.clear()
        layer_out.clear()
        model.set_attn_implementation("eager")
        model.float()
        logits["fp32"] = model(input_ids=ids, attention_mask=mask).logits[valid].float()
        model.to(torch.bfloat16)
        agreement = {}
        for a, b in (("eager", name), ("fp32", "eager"), ("fp32", name)):
            err = (logits[a] - logits[b]).abs()
            top1 = (logits[a].argmax(-1) == logits[b].argmax(-1)).float().mean().item()
            agreement[(a, b)] = (err.max().item(), err.mean().item(), top1)
            print(f"prefill logits {b} against {a}: max diff {err.max().item():.4f}, mean {err.mean().item():.5f}, "
                  f"same top-1 token on {top1:.2%} of {err.shape[0]} tokens (max |logit| "
                  f"{logits[a].abs().max().item():.2f})", flush=True)
        diff, mean_diff, same_top1 = agreement[("eager", name)]
        fp32_eager, fp32_vflash = agreement[("fp32", "eager")], agreement[("fp32", name)]
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
                             same_top1=same_top1, attention_max_diff=" ".join(f"{d:.4f}" for d in layer_diffs),
                             fp32_eager_max_diff=fp32_eager[0], fp32_eager_top1=fp32_eager[2],
                             fp32_vflash_max_diff=fp32_vflash[0], fp32_vflash_top1=fp32_vflash[2]))
            print(f"{what:28s} {impl:12s} {seconds * 1e3:9.2f} ms {tokens / seconds:10.0f} tokens/s", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
