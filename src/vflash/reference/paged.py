"""Paged KV caches in PyTorch: the oracle for `vflash.write_kvcache`."""

from typing import Tuple

import torch


def write_kvcache_reference(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                            slot_mapping: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """New caches (copies): token t's [Hkv, D] rows at slot slot_mapping[t] of the
    cache [num_blocks, block_size, Hkv, D], i.e. block slot // block_size, offset
    slot % block_size; slot -1 skipped."""
    k_out, v_out = k_cache.clone(), v_cache.clone()
    block_size = k_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot == -1:
            continue
        k_out[slot // block_size, slot % block_size] = k_new[t]
        v_out[slot // block_size, slot % block_size] = v_new[t]
    return k_out, v_out
