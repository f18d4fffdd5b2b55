"""Launcher of merge_states_kernel (kernels/combine.py)."""

from typing import Hashable, Optional, Tuple

import torch

from vflash import _backend
from vflash.kernels.combine import merge_states_kernel
from vflash.ops import launch as launches
from vflash.ops.launch import Alloc, KernelLaunch, Slot
from vflash.ops.tiles import MergeTiles

INPUTS = ("out_a", "lse_a", "out_b", "lse_b")
OUTPUTS = ("out", "lse")


def _rows(t: torch.Tensor, D: int) -> torch.Tensor:
    # [..., D] as [rows, D]: a view where the strides allow it, else a copy.
    return t.reshape(-1, D)


def merge_states_forward(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
                         tiles: MergeTiles, plan_key: Optional[Hashable] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """out [..., D] in out_a's dtype and lse [...] fp32 of the union of two partial
    results (inputs validated by vflash._validate.check_merge). With a `plan_key`
    (vflash.ops.plans) the launch is recorded for later calls of the same metadata,
    where the kernel reads the caller's tensors themselves (no copy made their rows)."""
    D = out_a.shape[-1]
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty(lse_a.shape, dtype=torch.float32, device=out_a.device)
    rows = lse.numel()
    if rows == 0 or D == 0:
        return out, lse
    a, b, o = _rows(out_a, D), _rows(out_b, D), out.view(-1, D)
    la, lb = lse_a.reshape(-1).contiguous(), lse_b.reshape(-1).contiguous()
    grid = ((rows + tiles.block_rows - 1) // tiles.block_rows, (D + tiles.block_d - 1) // tiles.block_d, 1)
    args = (a, la, b, lb, o, lse.view(-1), a.stride(), b.stride(), o.stride(), rows, D)
    slots = tuple(Slot(i, name) for i, name in enumerate(INPUTS + OUTPUTS))
    constexprs = dict(BLOCK_ROWS=tiles.block_rows, BLOCK_D=tiles.block_d, EMULATE_BF16=_backend.emulates_bf16(out_a))
    launch = KernelLaunch(merge_states_kernel, grid, args, constexprs, dict(num_warps=tiles.num_warps), slots)
    compiled = launches.run(launch, out_a.device)
    views = all(x.data_ptr() == y.data_ptr() for x, y in ((a, out_a), (b, out_b), (la, lse_a), (lb, lse_b)))
    if plan_key is not None and views and out_a.device.index == torch.cuda.current_device():
        allocs = (Alloc("out", tuple(out.shape), out.dtype), Alloc("lse", tuple(lse.shape), lse.dtype))
        launches.record(plan_key, launch, compiled, INPUTS, allocs, OUTPUTS, out_a.device.index)
    return out, lse
