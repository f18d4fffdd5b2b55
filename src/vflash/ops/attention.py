"""Launcher of the attention forward: outputs, the chosen kernel's arguments,
the launch, and its plan.

Inputs are validated (vflash._validate), the band is folded (vflash.ops.band)
and the kernel and tiles chosen (vflash.dispatch) before this runs.
"""

from typing import Hashable, Optional, Tuple, Union

import torch

from vflash import _backend
from vflash.kernels.attention_fwd import attention_fwd_kernel
from vflash.ops import hopper as hopper_launch
from vflash.ops import launch as launches
from vflash.ops.band import Band
from vflash.ops.launch import Alloc, KernelLaunch, Slot
from vflash.ops.scales import score_scales
from vflash.ops.tiles import HopperTiles, PortableTiles, head_dim_pad

INPUTS = ("q", "k", "v")
RETURNS = ("out", "lse")


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    band: Band, scale: float, softcap: Optional[float], return_lse: bool,
    tiles: Union[PortableTiles, HopperTiles],
    out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
    plan_key: Optional[Hashable] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """out [B, Hq, Nq, D] in q's dtype, lse [B, Hq, Nq] fp32 (or None).

    `tiles` picks the kernel: PortableTiles the Triton kernel, HopperTiles the
    Gluon sm_90 one. `out` (any strides) and `lse` (contiguous) may be passed
    preallocated, e.g. poisoned with NaN by tests that check every element is
    written. With a `plan_key` (vflash.ops.plans) the launch is recorded for
    later calls.
    """
    fresh_out = out is None
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    if out is None:
        out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if Nk == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse

    allocs = [Alloc("out", tuple(out.shape), q.dtype)]
    if lse is not None:
        allocs.append(Alloc("lse", tuple(lse.shape), torch.float32))
    if isinstance(tiles, HopperTiles):
        counter = None
        if tiles.dynamic:
            counter = q.new_zeros(1, dtype=torch.int32)
            allocs.append(Alloc("tile_counter", (1,), torch.int32, zero=True))
        launch = hopper_launch.build(q, k, v, out, lse, counter, band, scale, softcap, tiles,
                                     _backend.device_properties(q.device.index).multi_processor_count)
    else:
        launch = _portable_launch(q, k, v, out, lse, band, scale, softcap, tiles)
    compiled = launches.run(launch, q.device)
    if plan_key is not None and fresh_out and q.device.index == torch.cuda.current_device():
        launches.record(plan_key, launch, compiled, INPUTS, allocs, RETURNS, q.device.index)
    return out, lse


def _portable_launch(q, k, v, out, lse, band: Band, scale: float, softcap: Optional[float],
                     tiles: PortableTiles) -> KernelLaunch:
    """The launch of attention_fwd_kernel: grid (row tiles, Hq, B)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    args = (
        q, k, v, out, lse if lse is not None else out,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        Hq, Hq // Hkv, Nq, Nk,
        band.off, band.left, band.right,
        *score_scales(scale, softcap),
    )
    constexprs = dict(
        HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad(D),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, SPLIT=tiles.split,
        HAS_LEFT=band.has_left, HAS_RIGHT=band.has_right, SOFTCAP=softcap is not None,
        STORE_LSE=lse is not None, REVERSE_M=band.has_right,
        # The interpreter's bf16 dot is wrong (numpy has no bf16); upcast there only.
        UPCAST_DOT=_backend.interpreted(q.device) and q.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    slots = (Slot(0, "q"), Slot(1, "k"), Slot(2, "v"), Slot(3, "out"), Slot(4, "out" if lse is None else "lse"))
    grid = ((Nq + tiles.block_m - 1) // tiles.block_m, Hq, B)
    return KernelLaunch(attention_fwd_kernel, grid, args, constexprs,
                        dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages), slots)
