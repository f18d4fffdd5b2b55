"""Correctness cases: one shape and option set, its inputs, and its verdicts."""

import zlib
from dataclasses import dataclass, field, replace
from typing import List, Optional, Tuple, Union

import torch

import vflash
from vflash.harness.oracle import Verdict, compare
from vflash.reference import attention_explicit

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Case:
    B: int = 1
    Hq: int = 2
    Hkv: int = 2
    Nq: int = 64
    Nk: int = 64
    D: int = 64
    dtype: str = "fp16"
    causal: Union[bool, str] = False
    window: Optional[Tuple[int, int]] = None
    softcap: Optional[float] = None
    scale: Optional[float] = None
    layout: str = "bhnd"  # bhnd contiguous | bnhd (transposed view) | sliced (strided view)
    amplify: float = 1.0  # multiply q and k: large logits test the running-max rescale
    tag: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        parts = [f"{self.dtype}", f"B{self.B}", f"H{self.Hq}/{self.Hkv}", f"N{self.Nq}x{self.Nk}",
                 f"D{self.D}", f"causal={self.causal}"]
        if self.window is not None:
            parts.append(f"window={self.window[0]},{self.window[1]}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:g}")
        if self.scale is not None:
            parts.append(f"scale={self.scale:g}")
        if self.layout != "bhnd":
            parts.append(self.layout)
        if self.amplify != 1.0:
            parts.append(f"x{self.amplify:g}")
        if self.tag:
            parts.append(self.tag)
        return " ".join(parts)

    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    def with_(self, **kw) -> "Case":
        return replace(self, **kw)


def _make(shape_bhnd, layout: str, dtype, device, gen) -> torch.Tensor:
    B, H, N, D = shape_bhnd
    if layout == "bhnd":
        x = torch.randn(B, H, N, D, generator=gen)
    elif layout == "bnhd":
        x = torch.randn(B, N, H, D, generator=gen).transpose(1, 2)
    elif layout == "sliced":
        # Every stride odd-sized: extra heads, rows and head-dim columns sliced off.
        x = torch.randn(B, H + 1, N + 3, D + 8, generator=gen)[:, 1:, 3:, :D]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    # Generated on the CPU so one seed gives the same numbers on every device.
    return x.to(device=device, dtype=dtype)


def make_inputs(case: Case, device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(case.seed())
    dt = DTYPES[case.dtype]
    q = _make((case.B, case.Hq, case.Nq, case.D), case.layout, dt, device, gen)
    k = _make((case.B, case.Hkv, case.Nk, case.D), case.layout, dt, device, gen)
    v = _make((case.B, case.Hkv, case.Nk, case.D), case.layout, dt, device, gen)
    if case.amplify != 1.0:
        q, k = q * case.amplify, k * case.amplify
    return q, k, v


def run_case(case: Case, device, attention=None) -> List[Verdict]:
    """Run `attention` (default vflash.attention) on the case; judge out and lse."""
    attention = attention or vflash.attention
    q, k, v = make_inputs(case, device)
    opts = dict(causal=case.causal, scale=case.scale, window=case.window, softcap=case.softcap)
    with torch.no_grad():
        out, lse = attention(q, k, v, return_lse=True, **opts)
        ref_out, ref_lse = attention_explicit(q, k, v, compute_dtype=torch.float64, **opts)
        same_out, _ = attention_explicit(q, k, v, compute_dtype=None, **opts)
        # LSE is an fp32 output whatever the inputs: its yardstick is fp32 PyTorch.
        _, f32_lse = attention_explicit(q, k, v, compute_dtype=torch.float32, **opts)
    dt = DTYPES[case.dtype]
    shape_ok = tuple(out.shape) == tuple(ref_out.shape) and out.dtype == dt and lse.dtype == torch.float32
    if not shape_ok:
        return [Verdict("out", float("nan"), float("nan"), 0.0, False,
                        f"got out {tuple(out.shape)} {out.dtype}, lse {lse.dtype}")]
    return [compare("out", out.cpu(), ref_out.cpu(), same_out.cpu(), dt),
            compare("lse", lse.cpu(), ref_lse.cpu(), f32_lse.cpu(), torch.float32)]
