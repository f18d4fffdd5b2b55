"""A Llama-shaped model of about 1.2B parameters (Llama-3.2-1B's shape, random weights, bf16)
in Hugging Face transformers, with vflash (vflash.integrations.transformers) against
attn_implementation="sdpa" in the same run: prefill tokens/s (a left-padded batch of mixed
lengths and an unpadded one), greedy decode tokens/s with the model's KV cache, and a
training step (forward, backward, AdamW) in ms. Each measurement alternates the two
implementations, ROUNDS times, and keeps the median. Also checks the two agree: the
prefill logits' largest difference on real tokens, each one's error against the same
weights in fp32, and the greedy tokens (random bf16 weights leave near-ties between the
top logits, so greedy runs part ways after a few tokens whichever two kernels run).

  PYTHONPATH=src python3 -m benchmarks.experiments.hf_llama --out hf_llama.csv
"""

import argparse
import copy
import statistics

import torch

import vflash.integrations.transformers as vt
from benchmarks.experiments.common import llama_1b_config, model_inputs, wall_seconds, write_rows

ROUNDS = 3


def main() -> int:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="hf_llama.csv")
    ap.add_argument("--layers", type=int, default=16)
    args = ap.parse_args()
    name = vt.register()
    dev = torch.device("cuda")
    cfg = llama_1b_config(transformers, args.layers)
    torch.manual_seed(0)
    with torch.device(dev):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e9:.2f}B parameters, {args.layers} layers, transformers {transformers.__version__}",
          flush=True)
    lengths, ids, mask, dense, prompts, train_ids = model_inputs(cfg.vocab_size, dev, train_batch=4)
    new_tokens = 64

    rows = []

    def record(what, impl, seconds, tokens=None):
        row = dict(what=what, impl=impl, ms=seconds * 1e3, tokens_per_s=(tokens / seconds) if tokens else "")
        rows.append(row)
        print(f"{what:28s} {impl:12s} {seconds * 1e3:9.2f} ms" + (f" {tokens / seconds:10.0f} tokens/s"
                                                                   if tokens else ""), flush=True)

    impls = ("sdpa", name)
    logits, tokens = {}, {}
    with torch.no_grad():
        for impl in impls:  # warm-up (Triton compiles) and the agreement checks
            model.set_attn_implementation(impl)
            logits[impl] = model(input_ids=ids, attention_mask=mask).logits.float()
            model(input_ids=dense)
            tokens[impl] = model.generate(prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                          do_sample=False)
        valid = mask.bool()
        diff = (logits["sdpa"] - logits[name])[valid].abs().max().item()
        scale = logits["sdpa"][valid].abs().max().item()
        # the yardstick: each bf16 run against the same weights in fp32 (SDPA)
        ref = copy.deepcopy(model).float()
        ref.set_attn_implementation("sdpa")
        want = ref(input_ids=ids, attention_mask=mask).logits[valid]
        del ref
        fp32_err = {impl: (logits[impl][valid] - want).abs().max().item() for impl in impls}
        print("prefill logits max |bf16 - fp32|: " + ", ".join(f"{k} {v:.4f}" for k, v in fp32_err.items()),
              flush=True)
        same = (tokens["sdpa"] == tokens[name]).all(1).sum().item()
        first = (tokens["sdpa"] != tokens[name]).int().argmax(1)
        print(f"prefill logits max |diff| {diff:.4f} (max |logit| {scale:.2f}); greedy: {same} of "
              f"{len(prompts)} rows identical over {new_tokens} tokens", flush=True)
        timings = {}
        for _ in range(ROUNDS):
            for impl in impls:
                model.set_attn_implementation(impl)
                timings.setdefault(("prefill_padded", impl), []).append(
                    wall_seconds(lambda: model(input_ids=ids, attention_mask=mask), 3))
                timings.setdefault(("prefill_dense", impl), []).append(
                    wall_seconds(lambda: model(input_ids=dense), 3))
                timings.setdefault(("prefill_prompts", impl), []).append(
                    wall_seconds(lambda: model(input_ids=prompts), 3))
                timings.setdefault(("generate", impl), []).append(wall_seconds(lambda: model.generate(
                    prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=train_ids, labels=train_ids).loss
        loss.backward()
        opt.step()
        return loss

    for impl in impls:  # warm-up
        model.set_attn_implementation(impl)
        step()
    for _ in range(ROUNDS):
        for impl in impls:
            model.set_attn_implementation(impl)
            timings.setdefault(("train_step", impl), []).append(wall_seconds(step, 2))
    med = {k: statistics.median(v) for k, v in timings.items()}
    for impl in impls:
        record("prefill padded 8 x mixed", impl, med[("prefill_padded", impl)], sum(lengths))
        record("prefill dense 4 x 2048", impl, med[("prefill_dense", impl)], dense.numel())
        decode = med[("generate", impl)] - med[("prefill_prompts", impl)]
        record(f"decode 8 x {new_tokens} after 512", impl, decode, prompts.shape[0] * new_tokens)
        record("train step 4 x 1024", impl, med[("train_step", impl)], train_ids.numel())
    write_rows(args.out, [dict(r, params=params, logits_max_diff=diff, logits_err_vs_fp32=fp32_err[r["impl"]],
                               greedy_rows_identical=f"{same}/{len(prompts)}",
                               first_divergence=" ".join(map(str, first.tolist()))) for r in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
