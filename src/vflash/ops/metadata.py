"""Launcher of kvcache_metadata_kernel (kernels/metadata.py): the values of a KV-cache
call's metadata checked on their device, with one host sync to read the verdict."""

from typing import List, Optional

import torch

from vflash.kernels.metadata import kvcache_metadata_kernel
from vflash.ops import launch as launches
from vflash.ops import plans
from vflash.ops.launch import Alloc, KernelLaunch, Slot

INPUTS = ("cache_seqlens", "block_table", "cu_seqlens_q")
# table entries a program reads at once: a sequence of 32k keys in pages of 16 is 2048 pages, 16 steps
BLOCK_PAGES = 128


def kvcache_metadata_flags(cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                           cu_seqlens_q: Optional[torch.Tensor], capacity: int, page_size: int, num_pages: int,
                           total_q: int, max_seqlen_q: int) -> List[int]:
    """[length, page, offsets]: nonzero where some sequence's cache_seqlens entry is outside
    0..capacity, where a block_table entry among the pages it uses is outside 0..num_pages - 1,
    or where cu_seqlens_q is not 0, non-decreasing to total_q in steps of at most max_seqlen_q
    (structure validated by vflash._validate). One small kernel and one host sync; repeats of
    a call's metadata launch the plan its first call recorded (vflash.ops.plans)."""
    paged, varlen = block_table is not None, cu_seqlens_q is not None
    options = (capacity, page_size, num_pages, total_q, max_seqlen_q)
    key = plans.op_plan_key("kvcache_metadata", (cache_seqlens, block_table, cu_seqlens_q), options)
    plan = plans.lookup(key, cache_seqlens)
    if plan is not None:
        (flags,) = plan(cache_seqlens, block_table, cu_seqlens_q)
        return flags.tolist()
    device = cache_seqlens.device
    flags = torch.zeros(3, dtype=torch.int32, device=device)
    # an absent tensor's pointer is cache_seqlens' (never read: its flag is off), so every pointer is a slot
    table_name = "block_table" if paged else "cache_seqlens"
    cu_name = "cu_seqlens_q" if varlen else "cache_seqlens"
    args = (cache_seqlens, block_table if paged else cache_seqlens, cu_seqlens_q if varlen else cache_seqlens, flags,
            block_table.stride(0) if paged else 0, *options, cache_seqlens.numel())
    slots = (Slot(0, "cache_seqlens"), Slot(1, table_name), Slot(2, cu_name), Slot(3, "flags"))
    launch = KernelLaunch(kvcache_metadata_kernel, (cache_seqlens.numel(), 1, 1), args,
                          dict(IS_PAGED=paged, IS_VARLEN=varlen, BLOCK=BLOCK_PAGES), dict(num_warps=1), slots)
    compiled = launches.run(launch, device)
    if key is not None and device.index == torch.cuda.current_device():
        launches.record(key, launch, compiled, INPUTS, (Alloc("flags", (3,), torch.int32, zero=True),), ("flags",),
                        device.index)
    return flags.tolist()
