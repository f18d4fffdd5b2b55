"""Tiled attention with online softmax, in PyTorch: the recurrence the kernel
implements, run with explicit Python loops over Q and K/V tiles."""

import math
from typing import Optional, Tuple, Union

import torch

from vflash.reference.explicit import visible_mask


def attention_tiled(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    causal: Union[bool, str] = False, scale: Optional[float] = None,
    window: Optional[Tuple[int, int]] = None, softcap: Optional[float] = None,
    block_m: int = 64, block_n: int = 64, compute_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns (out [B, Hq, Nq, D], lse [B, Hq, Nq]) in `compute_dtype`.

    Per query tile keeps m (running max), l (running sum of exp) and acc
    (running sum of exp * V); every K/V tile rescales them by exp(m_old - m_new).
    Tail tiles are shorter; any block sizes >= 1 work.
    """
    if block_m < 1 or block_n < 1:
        raise ValueError(f"block sizes must be >= 1, got block_m={block_m}, block_n={block_n}")
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    group = Hq // k.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    dt = compute_dtype
    kc = k.repeat_interleave(group, dim=1).to(dt)
    vc = v.repeat_interleave(group, dim=1).to(dt)
    keep = visible_mask(Nq, Nk, causal, window, device=q.device)
    out = torch.zeros(B, Hq, Nq, D, dtype=dt, device=q.device)
    lse = torch.full((B, Hq, Nq), float("-inf"), dtype=dt, device=q.device)
    for m0 in range(0, Nq, block_m):
        m1 = min(m0 + block_m, Nq)
        q_tile = q[:, :, m0:m1].to(dt)  # [B, Hq, rows, D]
        m = torch.full((B, Hq, m1 - m0), float("-inf"), dtype=dt, device=q.device)
        l = torch.zeros((B, Hq, m1 - m0), dtype=dt, device=q.device)
        acc = torch.zeros((B, Hq, m1 - m0, D), dtype=dt, device=q.device)
        for n0 in range(0, Nk, block_n):
            n1 = min(n0 + block_n, Nk)
            s = torch.matmul(q_tile, kc[:, :, n0:n1].transpose(-1, -2)) * scale  # [B, Hq, rows, cols]
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            s = s.masked_fill(~keep[m0:m1, n0:n1], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            # Rows with nothing visible so far keep m = -inf; shift by 0 there.
            m_ref = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - m_ref)
            p = torch.exp(s - m_ref.unsqueeze(-1))
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha.unsqueeze(-1) + torch.matmul(p, vc[:, :, n0:n1])
            m = m_new
        seen = l > 0
        out[:, :, m0:m1] = torch.where(seen.unsqueeze(-1), acc / l.clamp_min(1e-30).unsqueeze(-1), 0.0)
        lse[:, :, m0:m1] = torch.where(seen, m + torch.log(l.clamp_min(1e-30)), float("-inf"))
    return out, lse
