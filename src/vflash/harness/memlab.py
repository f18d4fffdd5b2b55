"""`vflash memory`: the lesson's lab. Peak memory of materialised attention (the
[B, H, S, S] scores and probabilities live in memory) against vflash and SDPA,
for growing S at B = 1, H = 28, D = 128 (Qwen2.5-7B's attention), bf16, causal.
The materialised path is expected to run out of memory at long S; that is a row.
"""

import csv
import math
from typing import List, Sequence

import torch
import torch.nn.functional as F

import vflash
from vflash.harness.memory import peak_mib

GPU_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)
CPU_SIZES = (64, 128, 256)
COLUMNS = ["method", "S", "B", "H", "D", "dtype", "causal", "status", "peak_mib", "inputs_mib"]


def materialised(q, k, v):
    """The textbook path: scores and probabilities as [B, H, S, S] tensors."""
    s = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


METHODS = {"materialised": materialised, "vflash": lambda q, k, v: vflash.attention(q, k, v, causal=True),
           "sdpa": sdpa}


def run_memory_lab(device: torch.device, sizes: Sequence[int], out_csv: str, printer=print,
                   B: int = 1, H: int = 28, D: int = 128) -> List[dict]:
    """One CSV row per (size, method), and one printed line per size, written as
    it goes: `printer(text, end=...)` gets the size when it starts and each
    method's peak as that method finishes (slow under the Triton interpreter),
    then the line's end."""
    dtype = torch.bfloat16
    rows = []
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for s in sizes:
            q = torch.randn(B, H, s, D, device=device, dtype=dtype)
            k, v = torch.randn_like(q), torch.randn_like(q)
            inputs_mib = 3 * q.numel() * q.element_size() / 2**20
            printer(f"S={s:>6}", end="")
            for name, fn in METHODS.items():
                row = dict(method=name, S=s, B=B, H=H, D=D, dtype="bf16", causal=True,
                           inputs_mib=round(inputs_mib, 3))
                try:
                    with torch.no_grad():
                        row.update(status="ok", peak_mib=round(peak_mib(lambda: fn(q, k, v), device), 6))
                    printer(f"   {name} {row['peak_mib']:10.1f} MiB", end="")
                except torch.cuda.OutOfMemoryError:
                    row.update(status="oom")
                    printer(f"   {name} {'OOM':>10}    ", end="")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                w.writerow(row)
                rows.append(row)
            f.flush()
            printer("")
    return rows
