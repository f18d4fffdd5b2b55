"""Launcher of sequence_metadata_kernel (kernels/metadata.py): the values of a batch's
sequence metadata (a KV cache's lengths and block table, packed offsets) checked on their
device, with one host sync to read the verdict."""

from typing import List, Optional

import torch

from vflash.kernels.metadata import sequence_metadata_kernel
from vflash.ops import launch as launches
from vflash.ops import plans
from vflash.ops.launch import Alloc, KernelLaunch, Slot
from vflash.ops.tiles import MetadataTiles

# "anchor": the first tensor given, the flags' device; an absent tensor's pointer is the anchor's (never
# read: its flag is off), so every pointer of the launch is a slot
INPUTS = ("anchor", "cache_seqlens", "block_table", "cu_seqlens_q", "cu_seqlens_k")
FLAGS = ("cache_seqlens", "block_table", "cu_seqlens_q", "cu_seqlens_k")


def sequence_metadata_flags(batch: int, tiles: MetadataTiles, cache_seqlens: Optional[torch.Tensor] = None,
                            block_table: Optional[torch.Tensor] = None, cu_seqlens_q: Optional[torch.Tensor] = None,
                            cu_seqlens_k: Optional[torch.Tensor] = None, capacity: int = 0, page_size: int = 1,
                            num_pages: int = 0, total_q: int = 0, max_seqlen_q: int = 0, total_k: int = 0,
                            max_seqlen_k: int = 0) -> List[int]:
    """One flag for each of FLAGS, nonzero where some sequence b of `batch` breaks its rule:
    cache_seqlens[b] within 0..capacity; the block_table entries of the cdiv(cache_seqlens[b],
    page_size) pages it uses within 0..num_pages - 1; cu_seqlens_q[0] = 0, cu_seqlens_q[b] <=
    cu_seqlens_q[b + 1] <= cu_seqlens_q[b] + max_seqlen_q, cu_seqlens_q[batch] = total_q (the same
    for cu_seqlens_k). Absent tensors are not checked; the structure (dtypes, shapes, a page size
    of at least 1) is vflash._validate's. One small kernel and one host sync. A KV-cache call's check
    records its launch as the plan of later calls of the same metadata (vflash.ops.plans), keyed as
    finely as the attention's own plan; a varlen call's is not planned (its packed lengths change from
    call to call, and attention_varlen's launches are not planned either)."""
    given = (cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k)
    anchor = next(t for t in given if t is not None)
    values = (capacity, page_size, num_pages, total_q, max_seqlen_q, total_k, max_seqlen_k)
    key = None
    if cache_seqlens is not None:
        key = plans.op_plan_key("sequence_metadata", (anchor,) + given, (batch, *values, *tiles))
    plan = plans.lookup(key, anchor)
    if plan is not None:
        (flags,) = plan(anchor, *given)
        return flags.tolist()
    flags = torch.zeros(len(FLAGS), dtype=torch.int32, device=anchor.device)
    names = tuple(name if t is not None else "anchor" for name, t in zip(INPUTS[1:], given))
    args = (*(t if t is not None else anchor for t in given), flags,
            block_table.stride(0) if block_table is not None else 0, *values, batch)
    slots = tuple(Slot(i, name) for i, name in enumerate(names + ("flags",)))
    constexprs = dict(HAS_CACHE=cache_seqlens is not None, IS_PAGED=block_table is not None,
                      HAS_CU_Q=cu_seqlens_q is not None, HAS_CU_K=cu_seqlens_k is not None,
                      BLOCK_SEQ=tiles.block_seq, BLOCK_PAGES=tiles.block_pages)
    grid = ((batch + tiles.block_seq - 1) // tiles.block_seq, 1, 1)
    launch = KernelLaunch(sequence_metadata_kernel, grid, args, constexprs, dict(num_warps=tiles.num_warps), slots)
    compiled = launches.run(launch, anchor.device)
    if key is not None and anchor.device.index == torch.cuda.current_device():
        launches.record(key, launch, compiled, INPUTS, (Alloc("flags", (len(FLAGS),), torch.int32, zero=True),),
                        ("flags",), anchor.device.index)
    return flags.tolist()
