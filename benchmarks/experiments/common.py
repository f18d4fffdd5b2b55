"""What several experiment scripts share: the sm90 kernel's feature cases, input
makers (attention's, a backward's, a decode step's), the sweeps' shapes, the SDPA yardsticks and TFLOP/s.
Timers are vflash.harness.timing's; the library's internals are reached through vflash.harness.lab.

Imported as `from benchmarks.experiments.common import ...` by scripts run as
`python3 -m benchmarks.experiments.NAME` from the repository root.

At import only `vflash.harness.bench` and `vflash.harness.timing` are loaded; the helpers that need more
(`vflash.dispatch`, `vflash.harness.lab`, `vflash.harness.serving`) import it when called. ab_trees.py and
clock_ramp.py load this module against another source tree (an A/B), which then needs those two modules only.
"""

import csv
import sys
from typing import TYPE_CHECKING, Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from vflash.harness.bench import Shape, sweep_shapes
from vflash.harness.timing import graphed, time_call
from vflash.harness.lab import Call, Score

if TYPE_CHECKING:
    from vflash.harness.lab import Band

# Feature cases of the sm90 kernel (oracle checks in sm90_variants.py):
# (B, Hq, Hkv, Nq, Nk, D, causal, window, softcap, lse, dtype, layout)
CASES = [
    (2, 4, 4, 256, 256, 128, None, None, None, True, torch.float16, "bhsd"),
    (2, 4, 4, 256, 256, 64, None, None, None, True, torch.float16, "bhsd"),
    (2, 4, 4, 256, 256, 128, "bottom_right", None, None, True, torch.float16, "bhsd"),
    (2, 4, 4, 256, 256, 64, "bottom_right", None, None, True, torch.bfloat16, "bhsd"),
    (1, 3, 3, 1, 1, 128, None, None, None, True, torch.float16, "bhsd"),
    (1, 3, 3, 129, 129, 128, "bottom_right", None, None, True, torch.float16, "bhsd"),
    (2, 2, 2, 77, 301, 64, "bottom_right", None, None, True, torch.float16, "bhsd"),
    (2, 2, 2, 301, 77, 64, "bottom_right", None, None, True, torch.float16, "bhsd"),
    (2, 2, 2, 301, 77, 128, "top_left", None, None, True, torch.bfloat16, "bhsd"),
    (2, 8, 2, 513, 513, 128, None, None, None, True, torch.bfloat16, "bshd"),
    (2, 8, 1, 200, 700, 64, None, (100, 50), None, True, torch.float16, "bshd"),
    (1, 4, 4, 640, 640, 128, "bottom_right", (256, -1), 30.0, True, torch.float16, "bhsd"),
    (1, 4, 4, 1000, 1000, 64, None, (0, 0), None, True, torch.float16, "bhsd"),
    (1, 2, 2, 64, 5, 128, "top_left", None, None, True, torch.float16, "bhsd"),
    (3, 4, 4, 1024, 1024, 128, "bottom_right", None, None, False, torch.float16, "bhsd"),
    (2, 4, 2, 300, 333, 256, None, None, None, True, torch.float16, "bhsd"),
    (2, 4, 2, 300, 333, 256, "bottom_right", (100, -1), 20.0, True, torch.bfloat16, "bshd"),
]


def sweep_shape(d: int, n: int, causal: bool) -> Optional[Shape]:
    """The fa or d256 bench sweep's shape of this head dim, length and masking;
    None where neither sweep has one."""
    return next((s for s in sweep_shapes("fa") + sweep_shapes("d256") if (s.D, s.Nq, s.causal) == (d, n, causal)),
                None)


def parse_sweep_shapes(specs: str) -> List[Shape]:
    """"D:N[:c],..." (c: causal) -> the sweeps' shapes; ValueError naming a spec
    that is not a shape of the fa or d256 sweep."""
    shapes = []
    for spec in specs.split(","):
        d, n, *c = spec.split(":")
        s = sweep_shape(int(d), int(n), bool(c))
        if s is None:
            raise ValueError(f"{spec}: not a shape of the fa or d256 sweep")
        shapes.append(s)
    return shapes


class BackwardRow(NamedTuple):
    """A backward experiment's inputs: the sweep shape, q, k, v, dO, the band and scale, the dispatch
    Problem, and the forward's out and LSE (backward_row)."""
    shape: Shape
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    band: "Band"
    scale: float
    problem: object
    out: torch.Tensor
    lse: torch.Tensor


def backward_row(row: str, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> BackwardRow:
    """"D:N:causal" (causal 0 / 1), a shape of the fa or d256 sweep: seeded random q, k, v, dO and the
    forward's out and LSE from vflash.attention (the kernel the dispatch picks)."""
    import vflash
    from vflash import dispatch
    from vflash.harness import lab
    d, n, c = (int(x) for x in row.split(":"))
    s = sweep_shape(d, n, bool(c))
    if s is None:
        raise ValueError(f"{row}: not a shape of the fa or d256 sweep")
    torch.manual_seed(0)
    q = torch.randn(s.B, s.Hq, s.Nq, d, device=device, dtype=dtype)
    k = torch.randn(s.B, s.Hkv, s.Nk, d, device=device, dtype=dtype)
    v = torch.randn_like(k)
    do = torch.randn_like(q)
    band = lab.mask_band(s.Nq, s.Nk, "bottom_right" if s.causal else None, (-1, -1))
    problem = dispatch.problem_of(Call(q, k, v, None, band, Score(1.0), False))
    out, lse = vflash.attention(q, k, v, causal=s.causal, return_lse=True)
    scale = d ** -0.5  # vflash.attention's default
    return BackwardRow(s, q, k, v, do, band, scale, problem, out, lse)


def backward_launches(do, q, k, v, out, lse, band, scale, softcap, tiles) -> list:
    """The portable backward's launches (delta, dK / dV, dQ) as it would run them, captured, not run."""
    from vflash.harness import lab
    return lab.captured_launches(lambda: lab.attention_backward(do, q, k, v, out, lse, band=band,
                                                                score=Score(scale, softcap), tiles=tiles))


def make(B, Hq, Hkv, Nq, Nk, D, dtype, layout, amp=1.0, device="cuda"):
    """q, k, v of normal entries times amp; layout "bshd" gives [B, H, N, D]
    views of [B, N, H, D] tensors (strided heads), anything else contiguous."""
    def one(H, N):
        if layout == "bshd":
            return (torch.randn(B, N, H, D, device=device, dtype=dtype) * amp).transpose(1, 2)
        return torch.randn(B, H, N, D, device=device, dtype=dtype) * amp
    return one(Hq, Nq), one(Hkv, Nk), one(Hkv, Nk)


class DecodeInputs(NamedTuple):
    q: torch.Tensor  # [B, 1, Hq, D]: one new query a sequence
    k_cache: torch.Tensor  # [B * pages, page, Hkv, D] paged, or [B, KV, Hkv, D] contiguous
    v_cache: torch.Tensor
    block_table: Optional[torch.Tensor]  # int32 [B, pages], shuffled; None for a contiguous cache
    cache_seqlens: torch.Tensor  # int32 [B], every sequence KV keys long


def shuffled_table(batch: int, pages: int, device: torch.device) -> torch.Tensor:
    """The decode sweep's block table: int32 [batch, pages], sequence b's pages a seeded shuffle of the cache's
    batch * pages pages."""
    from vflash.harness import serving  # here, not at import: A/B scripts load other trees
    return serving.shuffled_table(batch, pages, device)


def decode_inputs(b: int, kv: int, page: int, heads: Tuple[int, int, int], device: torch.device,
                  dtype: torch.dtype = torch.bfloat16) -> DecodeInputs:
    """A decode step's arguments for attention_with_kvcache: B sequences of KV cached keys, one query each,
    heads (Hq, Hkv, D); page 0 is a contiguous cache, else pages of `page` rows in a shuffled table."""
    hq, hkv, d = heads
    q = torch.randn(b, 1, hq, d, device=device, dtype=dtype)
    seqlens = torch.full((b,), kv, dtype=torch.int32, device=device)
    if not page:
        k = torch.randn(b, kv, hkv, d, device=device, dtype=dtype)
        return DecodeInputs(q, k, torch.randn_like(k), None, seqlens)
    pages = -(-kv // page)
    k = torch.randn(b * pages, page, hkv, d, device=device, dtype=dtype)
    return DecodeInputs(q, k, torch.randn_like(k), shuffled_table(b, pages, device), seqlens)


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def sdpa_calls(q, k, v, causal) -> List[Tuple[str, Callable]]:
    """(name, call) for SDPA restricted to its cuDNN ("cudnn") and to its flash
    ("flash") backend: the same-run yardsticks."""
    calls = []
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        be = getattr(torch.nn.attention.SDPBackend, backend)

        def sdpa(be=be):
            with torch.nn.attention.sdpa_kernel([be]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        calls.append((backend.split("_")[0].lower(), sdpa))
    return calls


def tflops(calls: Sequence[Tuple[str, Callable]], flops: float, graphs: bool = False) -> List[Tuple[str, float]]:
    """[(name, TFLOP/s)] per (name, call), timed after one warm call (with `graphs`,
    each call's CUDA graph replayed instead); a call that raises is reported as
    name!Error at 0 rather than ending the run."""
    res = []
    for name, fn in calls:
        try:
            fn()
            if graphs:
                fn = graphed(fn)
            res.append((name, flops / time_call(fn, torch.device("cuda"))[0] / 1e9))
        except Exception as exc:
            res.append((name + f"!{type(exc).__name__}", 0.0))
    return res


def require_cuda(script: str) -> bool:
    """False (after a note on stderr) where no CUDA device is present: the GPU-only
    scripts' mains then return early."""
    if torch.cuda.is_available():
        return True
    print(f"{script}: needs a CUDA device (none here)", file=sys.stderr)
    return False


def llama_1b_config(transformers, layers: int, hidden: int = 2048):
    """Llama-3.2-1B's shape (hidden 2048: 32 query heads, 8 KV heads, D 64) with `layers` layers; another
    `hidden` scales its widths and head counts alike (a smoke run's tiny model)."""
    return transformers.LlamaConfig(vocab_size=128256, hidden_size=hidden, intermediate_size=4 * hidden,
                                    num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                    num_key_value_heads=hidden // 256, max_position_embeddings=8192,
                                    rope_theta=500000.0, tie_word_embeddings=True)


def write_rows(path: str, rows: Sequence[dict]) -> None:
    """A list of dicts as a CSV, the columns in the order the rows first name them (a row's missing ones empty)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)), restval="")
        w.writeheader()
        w.writerows(rows)


def wall_seconds(fn: Callable[[], object], reps: int = 1) -> float:
    """Seconds a call of fn takes on the GPU, synchronized before and after reps calls (a model's forward,
    generate or training step: many kernels and host work, so wall time, not CUDA events)."""
    import time
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


class ModelInputs(NamedTuple):
    """The transformers experiments' token batches (hf_llama, hf_gpt_oss)."""
    lengths: List[int]  # the padded batch's real lengths
    ids: torch.Tensor  # [8, 2048] left-padded to its longest
    mask: torch.Tensor  # its attention mask
    dense: torch.Tensor  # [4, 2048] unpadded
    prompts: torch.Tensor  # [8, 512] greedy decode's prompts
    train_ids: torch.Tensor  # [train_batch, 1024] a training step's


def model_inputs(vocab: int, device: torch.device, train_batch: int) -> ModelInputs:
    """Random tokens from seed 1 on `device`: a left-padded batch of mixed lengths, an unpadded one, prompts
    and a training batch, drawn in that order."""
    g = torch.Generator(device=device).manual_seed(1)
    lengths = [2048, 1536, 1024, 512, 1800, 700, 1300, 256]
    n = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), n), device=device, generator=g)
    mask = torch.zeros_like(ids)
    for b, length in enumerate(lengths):
        mask[b, n - length:] = 1
    dense = torch.randint(0, vocab, (4, 2048), device=device, generator=g)
    prompts = torch.randint(0, vocab, (8, 512), device=device, generator=g)
    train_ids = torch.randint(0, vocab, (train_batch, 1024), device=device, generator=g)
    return ModelInputs(lengths, ids, mask, dense, prompts, train_ids)

