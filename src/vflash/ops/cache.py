"""Launcher of write_kvcache_kernel (kernels/cache.py)."""

from typing import Hashable, Optional

import torch

from vflash import _backend
from vflash.kernels.cache import write_kvcache_kernel
from vflash.ops import launch as launches
from vflash.ops.launch import KernelLaunch, Slot, given_slots
from vflash.ops.tiles import CacheWriteTiles

INPUTS = ("k_cache", "v_cache", "k_new", "v_new", "slot_mapping")
# the slot check on the host up to this many slots, else on the device: on the H200's host a checked call
# took about 250 us for the device's sort and flags whatever the count, where the host's check costs about
# 0.1 us a slot
_HOST_SLOT_CHECK = 1024


def write_kvcache_forward(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                          slot_mapping: torch.Tensor, k_descale: Optional[torch.Tensor] = None,
                          v_descale: Optional[torch.Tensor] = None, tiles: Optional[CacheWriteTiles] = None,
                          check_metadata: bool = False, plan_key: Optional[Hashable] = None) -> None:
    """Write k_new / v_new [T, Hkv, D] into the caches [num_blocks, block_size, Hkv, D]
    in place, token t at slot slot_mapping[t] (inputs validated by
    vflash._validate.check_kvcache_write; an FP8 cache quantized with k_descale / v_descale, fp32 0-d or
    [Hkv], None for 1), the slots' values checked first with
    check_metadata (check_slots). With a `plan_key` (vflash.ops.plans) the launch is
    recorded for later calls of the same metadata, which check their slots as this one."""
    num_blocks, block_size = k_cache.shape[:2]
    if check_metadata:
        check_slots(slot_mapping, num_blocks, block_size)
    T, H, D = k_new.shape
    if T == 0:
        return
    grid = (T, (H + tiles.block_h - 1) // tiles.block_h, 1)
    quantize = k_cache.dtype == torch.float8_e4m3fn
    descale_strides = tuple(d.stride(0) if d is not None and d.dim() == 1 else 0
                            for d in (k_descale, v_descale)) if quantize else None
    args = (k_cache, v_cache, k_new, v_new, slot_mapping, k_descale, v_descale, k_cache.stride(), v_cache.stride(),
            k_new.stride(), v_new.stride(), descale_strides, k_cache.shape[1], k_cache.shape[0] * k_cache.shape[1],
            H, D)
    slots = tuple(Slot(i, name) for i, name in enumerate(INPUTS)) + given_slots(k_descale=k_descale,
                                                                              v_descale=v_descale)
    block_d = max(16, 1 << (D - 1).bit_length())
    launch = KernelLaunch(write_kvcache_kernel, grid, args,
                          dict(BLOCK_H=tiles.block_h, BLOCK_D=block_d, QUANTIZE=quantize,
                               EMULATE=quantize and _backend.interpreted(k_cache.device)),
                          dict(num_warps=tiles.num_warps), slots)
    compiled = launches.run(launch, k_cache.device)
    if plan_key is not None and k_cache.device.index == torch.cuda.current_device():
        def admit(*args) -> bool:  # a repeat's slots checked as this call's
            check_slots(args[4], num_blocks, block_size)
            return True
        launches.record(plan_key, launch, compiled, INPUTS + ("k_descale", "v_descale"), (), (), k_cache.device.index,
                        admit=admit if check_metadata else None)


def check_slots(slot_mapping: torch.Tensor, num_blocks: int, block_size: int) -> None:
    """slot_mapping's values (its structure checked by vflash._validate.check_kvcache_write): every slot -1 or a
    distinct slot of the cache [num_blocks, block_size, ...]. One host sync for CUDA tensors."""
    if slot_mapping.numel():
        capacity = num_blocks * block_size
        if slot_mapping.numel() <= _HOST_SLOT_CHECK:  # a decode step's few slots: one copy to the host
            slots = slot_mapping.tolist()
            pad = slots.count(-1)
            bad = min(slots) < -1 or max(slots) >= capacity or len(set(slots)) != len(slots) - pad + (pad > 0)
        else:  # a prefill's many: reduced on the device to two flags, one sync
            s = slot_mapping.to(torch.int64)
            srt = torch.sort(s).values
            bad = any(torch.stack([((s < -1) | (s >= capacity)).any(),
                                   ((srt[1:] == srt[:-1]) & (srt[1:] >= 0)).any()]).tolist())
        if bad:  # only a bad call walks the slots, to name the first bad one
            _name_bad_slot(slot_mapping.tolist(), num_blocks, block_size)


def _name_bad_slot(slots, num_blocks: int, block_size: int) -> None:
    capacity = num_blocks * block_size
    seen = {}
    for t, s in enumerate(slots):
        if s == -1:
            continue
        if not 0 <= s < capacity:
            raise ValueError(f"slot_mapping[{t}] = {s} is outside the cache's {capacity} slots "
                             f"({num_blocks} blocks of {block_size}); -1 skips a token")
        if s in seen:
            raise ValueError(f"slot_mapping[{t}] = {s} repeats slot_mapping[{seen[s]}]: a slot takes one "
                             f"token a call")
        seen[s] = t
