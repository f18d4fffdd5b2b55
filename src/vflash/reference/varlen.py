"""Packed (varlen) attention as a loop over its sequences: each one explicit
attention on its own rows. The oracle for `vflash.attention_varlen`."""

from typing import Optional, Tuple, Union

import torch

from vflash.reference.explicit import attention_explicit


def attention_varlen_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
    causal: Union[bool, str] = False, scale: Optional[float] = None, window: Optional[Tuple[int, int]] = None,
    softcap: Optional[float] = None, sinks: Optional[torch.Tensor] = None,
    compute_dtype: Optional[torch.dtype] = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """q [total_q, Hq, D], k/v [total_k, Hkv, D] -> (out [total_q, Hq, D], lse [Hq, total_q]),
    in `compute_dtype` (None: the inputs' dtype, as eager PyTorch runs it). The band rule
    applies per sequence, with that sequence's own lengths."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    dt = q.dtype if compute_dtype is None else compute_dtype
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=dt, device=q.device)  # v's head dim
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=dt, device=q.device)
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[i], cq[i + 1], ck[i], ck[i + 1]
        if q1 == q0:
            continue
        if k1 == k0 and sinks is None:  # no keys: zeros and -inf, as for a dense call with Nk = 0
            continue
        # [n, H, D] -> [1, H, n, D]
        o, l = attention_explicit(q[q0:q1].transpose(0, 1)[None], k[k0:k1].transpose(0, 1)[None],
                                  v[k0:k1].transpose(0, 1)[None], causal=causal, scale=scale, window=window,
                                  softcap=softcap, sinks=sinks, compute_dtype=compute_dtype)
        out[q0:q1] = o[0].transpose(0, 1)
        lse[:, q0:q1] = l[0].to(dt)
    return out, lse
