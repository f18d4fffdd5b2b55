"""Explicit attention: the whole [Nq, Nk] score matrix is built."""

import math
from typing import Optional, Tuple, Union

import torch


def visible_mask(n_q: int, n_k: int, causal: Union[bool, str] = False,
                 window: Optional[Tuple[int, int]] = None, device=None) -> torch.Tensor:
    """bool [n_q, n_k]: True where query i may attend to key j.

    Written from the API contract, independently of the kernel's launcher:
    query i sits at key position i + (n_k - n_q) (bottom-right alignment) unless
    causal == "top_left", where it sits at i. Causal hides keys after that
    position; window (left, right) keeps keys within [pos - left, pos + right],
    -1 meaning unbounded on that side.
    """
    top_left = causal == "top_left"
    is_causal = causal is True or causal in ("top_left", "bottom_right")
    i = torch.arange(n_q, device=device).unsqueeze(1)
    j = torch.arange(n_k, device=device).unsqueeze(0)
    pos = i if top_left else i + (n_k - n_q)
    keep = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if is_causal:
        keep &= j <= pos
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= j >= pos - left
        if right >= 0:
            keep &= j <= pos + right
    return keep


def _expand_kv(x: torch.Tensor, n_heads_q: int) -> torch.Tensor:
    return x.repeat_interleave(n_heads_q // x.shape[1], dim=1)


def attention_explicit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    causal: Union[bool, str] = False, scale: Optional[float] = None,
    window: Optional[Tuple[int, int]] = None, softcap: Optional[float] = None,
    sinks: Optional[torch.Tensor] = None,
    compute_dtype: Optional[torch.dtype] = torch.float32, return_lse: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Returns (out [B, Hq, Nq, D], lse [B, Hq, Nq] or None) in `compute_dtype`.

    sinks [Hq]: one more score column per head, its logit (not softcapped) and no value row: the softmax
    and the LSE take it, the output does not.

    compute_dtype=torch.float32 / float64: the oracle. compute_dtype=None: every
    step in the inputs' dtype, as eager PyTorch would run it.
    """
    dt = q.dtype if compute_dtype is None else compute_dtype
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    qc, kc, vc = q.to(dt), _expand_kv(k, q.shape[1]).to(dt), _expand_kv(v, q.shape[1]).to(dt)
    scores = torch.matmul(qc, kc.transpose(-1, -2)) * scale  # [B, Hq, Nq, Nk]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    masked = (causal is not False) or window is not None
    if masked:
        keep = visible_mask(q.shape[2], k.shape[2], causal, window, device=q.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        column = sinks.to(dt).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, column], dim=-1)
    lse = torch.logsumexp(scores, dim=-1) if return_lse else None  # -inf for rows with no visible key
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1].nan_to_num(0.0)  # a row with neither keys nor a sink: NaN -> 0
    if masked:
        probs = probs.masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)  # NaN rows -> 0
    out = torch.matmul(probs, vc)
    return out, lse
