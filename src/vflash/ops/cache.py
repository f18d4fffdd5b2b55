"""Launcher of write_kvcache_kernel (kernels/cache.py)."""

from typing import Hashable, Optional

import torch

from vflash.kernels.cache import write_kvcache_kernel
from vflash.ops import launch as launches
from vflash.ops.launch import KernelLaunch, Slot
from vflash.ops.tiles import CacheWriteTiles

INPUTS = ("k_cache", "v_cache", "k_new", "v_new", "slot_mapping")


def write_kvcache_forward(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                          slot_mapping: torch.Tensor, tiles: CacheWriteTiles,
                          plan_key: Optional[Hashable] = None) -> None:
    """Write k_new / v_new [T, Hkv, D] into the caches [num_blocks, block_size, Hkv, D]
    in place, token t at slot slot_mapping[t] (inputs validated by
    vflash._validate.check_kvcache_write). With a `plan_key` (vflash.ops.plans) the
    launch is recorded for later calls of the same metadata."""
    T, H, D = k_new.shape
    if T == 0:
        return
    grid = (T, (H + tiles.block_h - 1) // tiles.block_h, 1)
    args = (k_cache, v_cache, k_new, v_new, slot_mapping, *k_cache.stride(), *v_cache.stride(), *k_new.stride(),
            *v_new.stride(), k_cache.shape[1], k_cache.shape[0] * k_cache.shape[1], H, D)
    slots = tuple(Slot(i, name) for i, name in enumerate(INPUTS))
    block_d = max(16, 1 << (D - 1).bit_length())
    launch = KernelLaunch(write_kvcache_kernel, grid, args, dict(BLOCK_H=tiles.block_h, BLOCK_D=block_d),
                          dict(num_warps=tiles.num_warps), slots)
    compiled = launches.run(launch, k_cache.device)
    if plan_key is not None and k_cache.device.index == torch.cuda.current_device():
        launches.record(plan_key, launch, compiled, INPUTS, (), (), k_cache.device.index)
