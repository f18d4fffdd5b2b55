"""FP8 (e4m3) inputs: their dequantization (the oracle's inputs) and the explicit FP8 pipeline that is their
error yardstick, as issue 54 states it:

- S = q.k in fp32 from the stored values, times the descales and the scale (then the softcap, the mask);
- the softmax in fp32, with P = exp(S - rowmax) rounded to e4m3 after it is scaled by 256 (the row max at
  256, e4m3's top binade: FlashAttention-3's choice), its row sum taken before the rounding;
- P.V summed in fp32 from the stored values, divided by 256 and the row sum, times v's descale;
- rounded to the output dtype.

A result passes when its max error and RMSE against the fp64 oracle on the dequantized inputs are at most
twice this pipeline's, plus the output dtype's floor. Nothing here imports a kernel.
"""

import math
from typing import Optional, Tuple, Union

import torch

from vflash.reference.explicit import visible_mask

E4M3 = torch.float8_e4m3fn
P_SCALE = 256.0  # P's row max before its rounding to e4m3


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to e4m3 (nearest, ties to even), saturated at +-448: torch's conversion after a clamp."""
    return x.clamp(-448.0, 448.0).to(E4M3)


def descale_rows(descale: Optional[torch.Tensor], batch: int, heads: int, group: int = 1) -> torch.Tensor:
    """A descale (None, 0-d or [B, Hkv]) as fp64 [B, heads, 1, 1] for a dense [B, heads, N, D] tensor whose
    heads are `group` to a KV head (q's: Hq / Hkv; k's and v's: 1)."""
    if descale is None:
        return torch.ones(batch, heads, 1, 1, dtype=torch.float64)
    d = descale.detach().double().cpu()
    d = d.expand(batch, heads // group) if d.dim() == 0 else d
    return d.repeat_interleave(group, dim=1)[:, :, None, None]


def dequantize(x: torch.Tensor, descale: Optional[torch.Tensor], group: int = 1) -> torch.Tensor:
    """A dense [B, H, N, D] FP8 tensor's real values in fp64: stored * descale."""
    return x.detach().cpu().double() * descale_rows(descale, x.shape[0], x.shape[1], group)


def quantize(x: torch.Tensor, descale: Optional[torch.Tensor], group: int = 1) -> torch.Tensor:
    """A dense [B, H, N, D] tensor stored as e4m3 with `descale`: to_e4m3(x / descale), on x's device."""
    d = descale_rows(descale, x.shape[0], x.shape[1], group).to(x.device)
    return to_e4m3((x.double() / d).float())


def attention_fp8_yardstick(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale=None, k_descale=None, v_descale=None, *,
    causal: Union[bool, str] = False, scale: Optional[float] = None, window: Optional[Tuple[int, int]] = None,
    softcap: Optional[float] = None, sinks: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The explicit FP8 pipeline (the module's steps) on dense e4m3 q [B, Hq, Nq, D], k / v [B, Hkv, Nk, D]:
    out [B, Hq, Nq, D] in out_dtype (on the CPU). sinks [Hq]: one more term e^{sink} in each row sum."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qs, ks, vs = (t.detach().cpu().float() for t in (q, k, v))
    ks, vs = ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1)
    qk_descale = (descale_rows(q_descale, B, Hq, group) * descale_rows(k_descale, B, Hq, group)).float()
    s = torch.matmul(qs, ks.transpose(-1, -2)) * qk_descale * scale  # fp32 [B, Hq, Nq, Nk]
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if causal is not False or window is not None:
        s = s.masked_fill(~visible_mask(Nq, Nk, causal, window), float("-inf"))
    m = s.amax(-1, keepdim=True) if Nk else torch.full((B, Hq, Nq, 1), float("-inf"))
    if sinks is not None:
        m = torch.maximum(m, sinks.detach().cpu().float().view(1, -1, 1, 1))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows with no key (and no sink): p = 0
    p = torch.exp(s - m)
    row_sum = p.sum(-1, keepdim=True)
    if sinks is not None:
        row_sum = row_sum + torch.exp(sinks.detach().cpu().float().view(1, -1, 1, 1) - m)
    p8 = to_e4m3(p * P_SCALE).float()
    out = torch.matmul(p8, vs) / P_SCALE
    out = out / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    out = out * descale_rows(v_descale, B, Hq, group).float()
    return out.to(out_dtype)
