"""transformers' continuous batching (`model.generate_batch`) with vflash's attention against the engine's own
`paged|sdpa` and `paged|eager`, in the same run (issue 56's GPU figures). A Llama-3.2-1B-shaped model (random
weights, bf16); REQUESTS requests of prompts uniform in [MIN_PROMPT, MAX_PROMPT] tokens (seeded) and NEW_TOKENS
new tokens each, the engine's default configuration (block size, batch tokens, cache from free memory).

Reported a run: wall seconds of `generate_batch`, output tokens/s (requests x new tokens / wall), time to first
token (each request's first token's timestamp less its creation; median and p90), and, from one profiled run of
PROFILE_REQUESTS requests, the attention's share of the run's time: the GPU time between the first and the last
launch of each call of the engine's attention function ("paged|X": the cache write, the engine's gather where it
makes one, and the attention; CUDA events), over the run's wall time. Greedy tokens are compared with paged|sdpa's (random bf16 weights leave near-ties between the top
logits, so runs part ways after some tokens whichever kernels run): reported, not asserted.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.hf_cb --out hf_cb.csv
"""

import argparse
import random
import statistics
import time

import torch

import vflash.integrations.transformers as vt
from benchmarks.experiments.common import llama_1b_config, write_rows


def _prompts(n: int, lo: int, hi: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _run(model, transformers, impl, prompts, new_tokens):
    model.set_attn_implementation(impl)
    config = transformers.GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    _sync(model)
    start = time.perf_counter()
    out = model.generate_batch(prompts, generation_config=config, record_timestamps=True)
    _sync(model)
    wall = time.perf_counter() - start
    failed = [r.request_id for r in out.values() if r.error is not None or len(r.generated_tokens) != new_tokens]
    ttft = sorted(r.timestamps[0] - r.created_time for r in out.values() if r.timestamps)
    tokens = {tuple(r.prompt_ids): r.generated_tokens for r in out.values()}
    return wall, ttft, failed, [tokens.get(tuple(p)) for p in prompts]


def _sync(model):
    if model.device.type == "cuda":
        torch.cuda.synchronize()


def _attention_share(model, transformers, impl, prompts, new_tokens) -> float:
    # The engine's attention function ("paged|X") wrapped in CUDA events for one run: the share is the time on the
    # GPU's stream between each call's first and last launch, summed, over the run's wall time. (The engine runs
    # its batches on a thread of its own, where a profiler started here records no ranges.) On a CPU, wall time.
    functions = transformers.AttentionInterface._global_mapping
    key = f"paged|{impl}"
    original = functions[key]
    spans = []
    cuda = model.device.type == "cuda"

    def timed(*args, **kwargs):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = original(*args, **kwargs)
            end.record()
            spans.append((begin, end))
        else:
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            spans.append(time.perf_counter() - t0)
        return out
    transformers.AttentionInterface.register(key, timed)
    try:
        wall, _, failed, _ = _run(model, transformers, impl, prompts, new_tokens)
    finally:
        transformers.AttentionInterface.register(key, original)
    if failed:  # the engine caught the requests' errors (out of memory, say): no share to give
        return float("nan")
    seconds = sum(b.elapsed_time(e) / 1e3 for b, e in spans) if cuda else sum(spans)
    return seconds / wall


def main() -> int:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="hf_cb.csv")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--requests", default="64,128,256")
    ap.add_argument("--eager-requests", default="64", help="paged|eager's sizes (it forms the score matrix)")
    ap.add_argument("--profile-requests", type=int, default=64, help="0: no profiled run (no attention share)")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--min-prompt", type=int, default=100)
    ap.add_argument("--max-prompt", type=int, default=4000)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (give it tiny sizes)")
    ap.add_argument("--hidden", type=int, default=2048)
    args = ap.parse_args()
    if args.device == "cpu":  # transformers sizes its cache from the GPU's free memory: give its probe 1 GiB
        from transformers.generation.continuous_batching import cache as cb_cache
        cb_cache.get_device_and_memory_breakdown = lambda: (torch.device("cpu"), 1 << 30, 0, 0)
    name = vt.register()
    cfg = llama_1b_config(transformers, args.layers, args.hidden)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, {args.layers} layers, "
          f"transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else args.device}", flush=True)
    sizes = [int(x) for x in args.requests.split(",")]
    eager_sizes = {int(x) for x in args.eager_requests.split(",") if x}
    impls = ["sdpa", name, "eager"]
    warm = _prompts(4, 50, 300, cfg.vocab_size, seed=99)
    for impl in impls:  # Triton compiles, the engine's first-call costs
        _run(model, transformers, impl, warm, 8)
    rows = []
    for n in sizes:
        prompts = _prompts(n, args.min_prompt, args.max_prompt, cfg.vocab_size, seed=n)
        tokens = {}
        for impl in impls:
            if impl == "eager" and n not in eager_sizes:
                continue
            try:
                wall, ttft, failed, tokens[impl] = _run(model, transformers, impl, prompts, args.new_tokens)
            except torch.OutOfMemoryError as e:
                print(f"{n} requests {impl}: out of memory ({str(e).splitlines()[0]})", flush=True)
                rows.append(dict(requests=n, impl=impl, error="out of memory"))
                torch.cuda.empty_cache()
                continue
            same = ""
            if impl != "sdpa" and "sdpa" in tokens:
                same = f"{sum(a == b for a, b in zip(tokens[impl], tokens['sdpa']))}/{n}"
            ok = not failed  # a run whose requests failed (the engine catches their errors) has no rate
            row = dict(requests=n, impl=impl, prompt_tokens=sum(map(len, prompts)), new_tokens=args.new_tokens,
                       wall_s=round(wall, 3), output_tokens_per_s=round(n * args.new_tokens / wall, 1) if ok else "",
                       ttft_median_s=round(statistics.median(ttft), 3) if ttft else "",
                       ttft_p90_s=round(ttft[int(0.9 * (len(ttft) - 1))], 3) if ttft else "",
                       failed=len(failed), greedy_same_as_sdpa=same,
                       error="" if ok else f"{len(failed)} requests failed (the engine's log says why)")
            rows.append(row)
            write_rows(args.out, rows)  # each row as it comes: a run cut short keeps the rows before it
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.profile_requests <= 0:
        return 0
    prompts = _prompts(args.profile_requests, args.min_prompt, args.max_prompt, cfg.vocab_size,
                       seed=args.profile_requests)
    for impl in impls:
        try:
            share = _attention_share(model, transformers, impl, prompts, args.new_tokens)
        except torch.OutOfMemoryError:
            share = float("nan")
            torch.cuda.empty_cache()
        print(f"attention share of the run's time, {args.profile_requests} requests, {impl}: {share:.3f}",
              flush=True)
        rows.append(dict(requests=args.profile_requests, impl=impl, attention_share=round(share, 4),
                         error="" if share == share else "the run failed (out of memory?)"))
        write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
