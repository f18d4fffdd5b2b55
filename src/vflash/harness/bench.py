"""`vflash bench`: latency, TFLOP/s and incremental peak memory of vflash and the
engines people would otherwise use, measured in the same run.

Methods (a method that cannot run here is left out or gets a status row):
  explicit_fp32  materialised scores/probabilities in fp32 (the oracle's recipe)
  explicit       materialised attention in the inputs' dtype (eager PyTorch)
  tiled          tiled PyTorch online softmax; stopped above N = 2048 (skipped_slow)
  vflash         vflash.attention
  vflash_sinks   the same call with a sink logit a head (opt-in: --methods)
  vflash_fp8     the same shape in FP8 (e4m3 q / k / v, a descale each, bf16 out; forward; opt-in)
  sdpa_flash     SDPA restricted to FLASH_ATTENTION (fails rather than falling back)
  sdpa_cudnn     SDPA restricted to CUDNN_ATTENTION
  flex           torch.compile(flex_attention), when it compiles
  fa4            FlashAttention-4 (flash_attn.cute), when importable

TFLOP/s counts useful FLOPs: 4 * D per visible (query, key) pair, with the exact
pair count for causal masks and Nq != Nk (bottom-right alignment); the backward
counts 2.5x the forward's (FlashAttention's convention), forward + backward 3.5x.

Modes: fwd times the call; bwd times torch.autograd.grad of one recorded forward
(retained graph) with respect to q, k and v; fwd_bwd times both.
"""

import csv
import itertools
import json
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

import vflash
from vflash.harness.cases import DTYPES
from vflash.harness.env import environment
from vflash.harness.memory import peak_mib
# The timing protocol lives in vflash.harness.timing (the lab scripts share it); its names stay importable from here.
from vflash.harness.timing import Stats, gemm_warmup, time_call, time_calls_interleaved  # noqa: F401
from vflash.reference import attention_explicit, attention_tiled

CSV_COLUMNS = [
    "date", "gpu", "sweep", "method", "dtype", "B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "status",
    "ms_median", "ms_p20", "ms_p80", "reps", "tflops", "peak_mib", "out_lse_mib",
    "vs_sdpa_flash", "vs_sdpa_cudnn", "mode",
]
METHODS = ["explicit_fp32", "explicit", "tiled", "vflash", "vflash_sinks", "vflash_fp8", "sdpa_flash", "sdpa_cudnn",
           "flex", "fa4"]
OPT_IN = ("vflash_sinks", "vflash_fp8")  # methods a sweep runs only when --methods names them
MODES = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}  # mode -> FLOPs as a multiple of the forward's
TILED_MAX_N = 2048


class Unavailable(Exception):
    """The method cannot run on this shape or machine; the reason becomes the status."""


@dataclass(frozen=True)
class Shape:
    B: int
    Hq: int
    Hkv: int
    Nq: int
    Nk: int
    D: int
    causal: bool

    @staticmethod
    def parse(text: str, causal: bool) -> "Shape":
        parts = text.split(",")
        if len(parts) != 6 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"--shape wants six integers B,Hq,Hkv,Nq,Nk,D, got {text!r}")
        B, Hq, Hkv, Nq, Nk, D = (int(p) for p in parts)
        # Nq = 0 or Nk = 0 is a call vflash.attention takes (an empty output; zeros and lse -inf).
        if min(B, Hq, Hkv, D) < 1 or Hq % Hkv:
            raise ValueError(f"--shape {text!r}: B, Hq, Hkv and D must be >= 1 (Nq and Nk may be 0), "
                             f"and Hq a multiple of Hkv")
        return Shape(B, Hq, Hkv, Nq, Nk, D, causal)


def visible_pairs(n_q: int, n_k: int, causal: bool) -> int:
    """Exact count of (query, key) pairs kept; causal is bottom-right aligned."""
    if not causal:
        return n_q * n_k
    # Row i sees keys 0 .. i + n_k - n_q, clamped to [0, n_k].
    return sum(min(n_k, max(0, i + n_k - n_q + 1)) for i in range(n_q))


def attention_flops(s: Shape) -> float:
    return 4.0 * s.D * visible_pairs(s.Nq, s.Nk, s.causal) * s.B * s.Hq


def sweep_shapes(name: str) -> List[Shape]:
    if name == "fa":  # FlashAttention papers: 16k tokens, hidden 2048
        return [Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, c)
                for d, c, n in itertools.product((64, 128), (False, True), (512, 1024, 2048, 4096, 8192, 16384))]
    if name == "d256":  # the largest head dim, 16k tokens, hidden 2048
        return [Shape(16384 // n, 8, 8, n, n, 256, c)
                for c, n in itertools.product((False, True), (512, 1024, 2048, 4096, 8192, 16384))]
    if name == "article":  # the seed article: B = 1, H = 16, D = 64
        return [Shape(1, 16, 16, n, n, 64, c)
                for c, n in itertools.product((False, True), (128, 256, 512, 1024, 2048, 4096, 8192))]
    if name == "smoke":  # tiny, for the interpreter: exercises the harness, not the GPU
        return [Shape(1, 2, 1, n, n, 16, c) for c, n in itertools.product((False, True), (16, 40))]
    raise ValueError(f"unknown sweep {name!r}; choose 'fa', 'article' or 'smoke'")


# Each method: prepare(q, k, v, causal) -> zero-argument call. Work a real user
# does once per shape (masks, layout copies, compilation) happens in prepare.

def _explicit(dtype: Optional[torch.dtype]):
    def prepare(q, k, v, causal):
        return lambda: attention_explicit(q, k, v, causal=causal, compute_dtype=dtype, return_lse=False)[0]
    return prepare


def _tiled(q, k, v, causal):
    if max(q.shape[2], k.shape[2]) > TILED_MAX_N:
        raise Unavailable("skipped_slow")
    return lambda: attention_tiled(q, k, v, causal=causal, block_m=64, block_n=64)[0]


def _vflash(q, k, v, causal):
    return lambda: vflash.attention(q, k, v, causal=causal)


def _vflash_sinks(q, k, v, causal):
    # the same call with a sink logit per query head (gpt-oss's), learnable where q is: the backward also
    # makes its gradient
    sinks = torch.randn(q.shape[1], device=q.device, generator=torch.Generator(q.device).manual_seed(1))
    sinks.requires_grad_(q.requires_grad)
    return lambda: vflash.attention(q, k, v, causal=causal, sinks=sinks)


def _vflash_fp8(q, k, v, causal):
    # the same shape in FP8: q, k, v stored as e4m3 with a descale each (0-d, the tensor's amax at 448), out
    # bf16; the quantization is the caller's work, done once here (forward only)
    if q.requires_grad:
        raise Unavailable("unavailable: FP8 inputs run forward only")
    stored, descales = [], []
    for x in (q, k, v):
        d = (x.detach().abs().amax().float() / 448.0).clamp_min(2.0**-20)
        stored.append((x.detach().float() / d).clamp(-448.0, 448.0).to(torch.float8_e4m3fn))
        descales.append(d)
    q8, k8, v8 = stored
    qd, kd, vd = descales
    return lambda: vflash.attention(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)


def _sdpa(backend_name: str):
    def prepare(q, k, v, causal):
        if q.device.type != "cuda":
            raise Unavailable("unavailable: needs CUDA")
        if causal and q.shape[2] != k.shape[2]:
            raise Unavailable("unavailable: SDPA's is_causal is top-left aligned when Nq != Nk")
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, backend_name)
        gqa = q.shape[1] != k.shape[1]

        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        return call
    return prepare


_FLEX = {}


def _flex(q, k, v, causal):
    if q.device.type != "cuda":
        raise Unavailable("unavailable: needs CUDA")
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        raise Unavailable(f"unavailable: {exc}") from None
    if "fn" not in _FLEX:
        import torch._dynamo
        for knob in ("recompile_limit", "cache_size_limit"):  # one compile per shape, many shapes
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        _FLEX["fn"] = torch.compile(flex_attention)
    n_q, n_k = q.shape[2], k.shape[2]
    block_mask = None
    if causal:
        shift = n_k - n_q
        block_mask = create_block_mask(lambda b, h, qi, ki: qi + shift >= ki, None, None, n_q, n_k,
                                       device=q.device)
    gqa = q.shape[1] != k.shape[1]
    return lambda: _FLEX["fn"](q, k, v, block_mask=block_mask, enable_gqa=gqa)


def _fa4(q, k, v, causal):
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError:
        raise Unavailable("unavailable: flash_attn.cute not importable") from None
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FA4 takes [B, N, H, D]
    return lambda: flash_attn_func(qt, kt, vt, causal=causal)


PREPARE: Dict[str, Callable] = {
    "explicit_fp32": _explicit(torch.float32), "explicit": _explicit(None), "tiled": _tiled,
    "vflash": _vflash, "vflash_sinks": _vflash_sinks, "vflash_fp8": _vflash_fp8, "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "flex": _flex, "fa4": _fa4,
}


def fa4_importable() -> bool:
    try:
        import flash_attn.cute  # noqa: F401
        return True
    except ImportError:
        return False


def default_methods(device: torch.device) -> List[str]:
    if device.type != "cuda":
        return ["explicit_fp32", "explicit", "tiled", "vflash"]
    return [m for m in METHODS if m not in OPT_IN and (m != "fa4" or fa4_importable())]


def error_text(exc: Exception) -> str:
    """An exception as a CSV status: its type and first line, commas made semicolons (the serving sweeps' and
    the lab's rows too)."""
    first = (str(exc).splitlines() or [""])[0][:100].replace(",", ";")
    return f"{type(exc).__name__}: {first}"


def _in_mode(call: Callable[[], torch.Tensor], inputs, mode: str, device: torch.device) -> Callable[[], object]:
    """The timed call of a mode: the forward, the backward of one recorded forward, or both."""
    if mode == "fwd":
        return call
    do = torch.randn_like(inputs[0])
    if mode == "bwd":
        out = call()
        return lambda: torch.autograd.grad(out, inputs, do, retain_graph=True)
    return lambda: torch.autograd.grad(call(), inputs, do)


def bench_shape(s: Shape, dtype: str, sweep: str, env: Dict[str, object], methods: Sequence[str],
                device: torch.device, interleave: bool = False, mode: str = "fwd") -> List[dict]:
    dt = DTYPES[dtype]
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(s.B, s.Hq, s.Nq, s.D, device=device, dtype=dt, generator=g)
    k = torch.randn(s.B, s.Hkv, s.Nk, s.D, device=device, dtype=dt, generator=g)
    v = torch.randn(s.B, s.Hkv, s.Nk, s.D, device=device, dtype=dt, generator=g)
    if mode != "fwd":
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    grad = torch.no_grad if mode == "fwd" else torch.enable_grad
    flops = attention_flops(s) * MODES[mode]
    out_lse_mib = (q.numel() * q.element_size() + s.B * s.Hq * s.Nq * 4) / 2**20
    rows = []
    ready = []  # interleave: (name, call, row) of the methods that ran once, to be timed together
    for name in methods:
        row = dict(date=env["date"], gpu=env["gpu"], sweep=sweep, method=name, dtype=dtype, B=s.B, Hq=s.Hq,
                   Hkv=s.Hkv, Nq=s.Nq, Nk=s.Nk, D=s.D, causal=s.causal, out_lse_mib=round(out_lse_mib, 3),
                   mode=mode)
        try:
            with grad():
                call = _in_mode(PREPARE[name](q, k, v, s.causal), (q, k, v), mode, device)
            if interleave:
                with grad():
                    call()  # a method that fails, fails here and alone
                ready.append((name, call, row))
                rows.append(row)
                continue
            if device.type == "cuda":
                # The slow references leave the GPU idle on the host's loops; bring the
                # clocks back up so every method starts from the same state.
                gemm_warmup(0.1)
            with grad():
                med, p20, p80, reps = time_call(call, device)
                peak = peak_mib(call, device)
            row.update(status="ok", ms_median=med, ms_p20=p20, ms_p80=p80, reps=reps,
                       tflops=flops / (med * 1e-3) / 1e12, peak_mib=round(peak, 6))
        except Unavailable as why:
            row.update(status=str(why))
        except torch.cuda.OutOfMemoryError:
            row.update(status="oom")
        except Exception as exc:  # a baseline that fails on a shape is a row, not a crash
            row.update(status=f"error: {error_text(exc)}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
    if ready:
        try:
            with grad():
                stats = time_calls_interleaved([(name, call) for name, call, _ in ready], device)
                for name, call, row in ready:
                    med, p20, p80, reps = stats[name]
                    row.update(status="ok", ms_median=med, ms_p20=p20, ms_p80=p80, reps=reps,
                               tflops=flops / (med * 1e-3) / 1e12, peak_mib=round(peak_mib(call, device), 6))
        except torch.cuda.OutOfMemoryError:
            for _, _, row in ready:
                row.update(status="oom")
        except Exception as exc:  # one row per method still, each saying why
            for _, _, row in ready:
                row.update(status=f"error (interleaved): {error_text(exc)}")
    by = {r["method"]: r for r in rows}
    for r in rows:
        for base, col in (("sdpa_flash", "vs_sdpa_flash"), ("sdpa_cudnn", "vs_sdpa_cudnn")):
            if r["status"] == "ok" and by.get(base, {}).get("status") == "ok":
                r[col] = round(by[base]["ms_median"] / r["ms_median"], 4)
    return rows


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total)
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def env_path(out_csv: str) -> str:
    root, _ = os.path.splitext(out_csv)
    return root + ".env.json"


def run_bench(shapes: Sequence[Shape], sweep: str, dtypes: Sequence[str], out_csv: str,
              methods: Optional[Sequence[str]], device: torch.device, printer=print,
              interleave: bool = False, mode: str = "fwd") -> List[dict]:
    methods = list(methods or default_methods(device))
    env = dict(environment(device), timing="interleaved" if interleave else "one method after another", mode=mode)
    with open(env_path(out_csv), "w") as f:
        json.dump(env, f, indent=2)
    if device.type == "cuda":
        gemm_warmup()
    rows = []
    total = len(shapes) * len(dtypes)
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for i, (dtype, s) in enumerate(itertools.product(dtypes, shapes)):
            shape_rows = bench_shape(s, dtype, sweep, env, methods, device, interleave, mode)
            for r in shape_rows:
                w.writerow(r)
            f.flush()
            rows += shape_rows
            cols = "  ".join(f"{r['method']} {r['tflops']:.1f}" if r["status"] == "ok"
                             else f"{r['method']} {r['status'].split(':')[0]}" for r in shape_rows)
            printer(f"{_bar(i + 1, total)} {mode} {dtype} B{s.B} H{s.Hq}/{s.Hkv} N{s.Nq}x{s.Nk} D{s.D} "
                    f"causal={s.causal}: {cols} (TFLOP/s)")
    return rows

