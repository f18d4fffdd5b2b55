"""Launcher of the attention backward (kernels/attention_bwd.py): delta, then the
dK/dV and dQ kernels. Inputs come from vflash.autograd, whose forward saved q, k, v,
out and lse."""

from typing import Optional, Tuple

import torch

from vflash import _backend
from vflash.kernels.attention_bwd import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel
from vflash.ops import launch as launches
from vflash.ops.band import Band
from vflash.ops.launch import KernelLaunch, Slot
from vflash.ops.scales import score_scales
from vflash.ops.tiles import BackwardTiles, head_dim_pad


def attention_backward(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
    band: Band, scale: float, softcap: Optional[float], tiles: BackwardTiles, dlse: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq [B, Hq, Nq, D], dk [B, Hkv, Nk, D], dv [B, Hkv, Nk, D]) in the inputs' dtype, contiguous,
    for do [B, Hq, Nq, D] (any strides) and the forward's out and natural-log lse [B, Hq, Nq].
    Deterministic: every output tile is written by one program, its sums in a fixed order.
    dlse [B, Hq, Nq]: the loss's gradient with respect to lse too (lse's dS term is P * dlse)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    dq = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, Hkv, Nk, D), dtype=k.dtype, device=q.device)
    dv = torch.empty((B, Hkv, Nk, D), dtype=v.dtype, device=q.device)
    if Nq == 0 or Nk == 0 or B == 0 or Hq == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = (do.float() * out.float()).sum(-1)  # [B, Hq, Nq]: rowsum(dO * O)
    if dlse is not None:
        delta = delta - dlse.float()
    delta = delta.contiguous()
    lse = lse.float().contiguous()
    qk_scale, softcap_in, softcap_out = score_scales(scale, softcap)
    common = dict(HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad(D), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                  HAS_LEFT=band.has_left, HAS_RIGHT=band.has_right, SOFTCAP=softcap is not None,
                  UPCAST_DOT=_backend.interpreted(q.device) and q.dtype == torch.bfloat16,
                  DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    scalars = (band.off, band.left, band.right, qk_scale, scale, softcap_in, softcap_out)
    dkdv = KernelLaunch(
        attention_bwd_dkdv_kernel, (-(-Nk // tiles.block_n), Hkv, B),
        (q, k, v, do, lse, delta, dk, dv, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(),
         *dv.stride(), Hq, Nq, Nk, *scalars),
        dict(common, GROUP=Hq // Hkv), options,
        tuple(Slot(i, n) for i, n in enumerate(("q", "k", "v", "do", "lse", "delta", "dk", "dv"))))
    dq_launch = KernelLaunch(
        attention_bwd_dq_kernel, (-(-Nq // tiles.block_m), Hq, B),
        (q, k, v, do, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
         Hq, Hq // Hkv, Nq, Nk, *scalars),
        common, options, tuple(Slot(i, n) for i, n in enumerate(("q", "k", "v", "do", "lse", "delta", "dq"))))
    launches.run(dkdv, q.device)
    launches.run(dq_launch, q.device)
    return dq, dk, dv
