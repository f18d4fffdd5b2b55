"""Launcher of write_kvcache_kernel (kernels/cache.py)."""

import torch

from vflash.kernels.cache import write_kvcache_kernel
from vflash.ops import launch as launches
from vflash.ops.launch import KernelLaunch, Slot
from vflash.ops.tiles import CacheWriteTiles


def write_kvcache_forward(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                          slot_mapping: torch.Tensor, tiles: CacheWriteTiles) -> None:
    """Write k_new / v_new [T, Hkv, D] into the caches [num_blocks, block_size, Hkv, D]
    in place, token t at slot slot_mapping[t] (inputs validated by
    vflash._validate.check_kvcache_write)."""
    T, H, D = k_new.shape
    if T == 0:
        return
    grid = (T, (H + tiles.block_h - 1) // tiles.block_h, 1)
    args = (k_cache, v_cache, k_new, v_new, slot_mapping, *k_cache.stride(), *v_cache.stride(), *k_new.stride(),
            *v_new.stride(), k_cache.shape[1], H, D)
    slots = (Slot(0, "k_cache"), Slot(1, "v_cache"), Slot(2, "k_new"), Slot(3, "v_new"), Slot(4, "slot_mapping"))
    block_d = max(16, 1 << (D - 1).bit_length())
    launch = KernelLaunch(write_kvcache_kernel, grid, args, dict(BLOCK_H=tiles.block_h, BLOCK_D=block_d),
                          dict(num_warps=tiles.num_warps), slots)
    launches.run(launch, k_cache.device)
