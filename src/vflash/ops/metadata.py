"""The values of a batch's sequence metadata (a KV cache's lengths and block table, packed
offsets), checked on their device by sequence_metadata_kernel (kernels/metadata.py) with one
host sync to read the verdict, before a launch that would read out of bounds with them:
`checker(call, tiles)` for a validated call (vflash.call.Call; its structure is
vflash._validate's), run by the launcher before the launch and by its plan before each
repeat. A flagged rule's offender is looked for, to be named in the ValueError, only then."""

from typing import Callable, List, Optional, Tuple

import torch

from vflash.call import Cache, Call, Packed
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
    plan = plans.lookup(key)
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


def checker(call: Call, tiles: MetadataTiles) -> Tuple[Callable[..., None], Tuple[str, ...]]:
    """(check, names): the check of a packed or cached call's metadata values, as a function of the
    tensors whose values change from call to call, named as the layout's fields (and the entry points'
    arguments) name them; the rest, shapes and maxima, fixed as a plan's key fixes them. check raises
    ValueError naming the first offender."""
    layout = call.layout
    if isinstance(layout, Packed):
        totals = (call.q.shape[0], call.k.shape[0], layout.max_seqlen_q, layout.max_seqlen_k)
        return ((lambda cu_seqlens_q, cu_seqlens_k: check_offsets(cu_seqlens_q, cu_seqlens_k, *totals, tiles)),
                ("cu_seqlens_q", "cu_seqlens_k"))
    assert isinstance(layout, Cache)
    pages, rows = call.k.shape[0], call.k.shape[1]
    total_q = call.q.shape[0]
    max_seqlen_q = layout.max_seqlen_q
    return ((lambda cache_seqlens, block_table, cu_seqlens_q: check_cache(
        cache_seqlens, block_table, cu_seqlens_q, pages, rows, total_q, max_seqlen_q, tiles)),
        ("cache_seqlens", "block_table", "cu_seqlens_q"))


def check_offsets(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int,
                  max_seqlen_q: int, max_seqlen_k: int, tiles: MetadataTiles) -> None:
    """cu_seqlens' values: 0 first, non-decreasing, the packed length last, no sequence longer than its
    max_seqlen. Under torch.compile the varlen custom op runs it (a traced host read would be a
    data-dependent graph break)."""
    batch = cu_seqlens_q.numel() - 1
    if cu_seqlens_k.numel() != batch + 1:  # vflash._validate's, again for the custom op's own call
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length [batch + 1], got "
                         f"{batch + 1} and {cu_seqlens_k.numel()}")
    flags = sequence_metadata_flags(batch, tiles, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                    total_q=total_q, max_seqlen_q=max_seqlen_q, total_k=total_k,
                                    max_seqlen_k=max_seqlen_k)
    for flag, name, cu, total, longest in ((flags[2], "cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q),
                                           (flags[3], "cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k)):
        if flag:
            _name_bad_offset(name, cu.tolist(), total, longest)
            _flagged(_OFFSETS_RULE.format(name=name, longest=longest))


def check_cache(cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                cu_seqlens_q: Optional[torch.Tensor], pages: int, rows: int, total_q: int, max_seqlen_q: int,
                tiles: MetadataTiles) -> None:
    """A KV-cache call's values: every sequence's length within its capacity, every page it uses a
    page of the cache (`pages` of `rows` rows; a contiguous cache is one page a sequence), cu_seqlens_q
    (packed q) 0, non-decreasing to total_q in steps of at most max_seqlen_q. The tables of a large
    batch hold 10^5-10^6 entries: no loop over them on the host."""
    capacity = rows * (1 if block_table is None else block_table.shape[1])
    packed = cu_seqlens_q is not None
    batch = cache_seqlens.numel()
    bad_len, bad_page, bad_offsets, _ = sequence_metadata_flags(
        batch, tiles, cache_seqlens, block_table, cu_seqlens_q, capacity=capacity, page_size=rows,
        num_pages=pages, total_q=total_q if packed else 0, max_seqlen_q=max_seqlen_q if packed else 0)
    holds = "block_table row holds" if block_table is not None else "cache row holds"
    if bad_len:
        lens = cache_seqlens.long()
        for b in ((lens < 0) | (lens > capacity)).nonzero()[:1, 0].tolist():
            raise ValueError(f"cache_seqlens[{b}] = {int(cache_seqlens[b])} is outside 0..{capacity}, the rows "
                             f"sequence {b}'s {holds}")
        _flagged(f"cache_seqlens must lie within 0..{capacity}, the rows a sequence's {holds}")
    if bad_page:
        lens = cache_seqlens.long()
        used = torch.arange(block_table.shape[1], device=lens.device)[None, :] < ((lens + rows - 1) // rows)[:, None]
        for b, j in (used & ((block_table < 0) | (block_table >= pages))).nonzero()[:1].tolist():
            n, page = int(cache_seqlens[b]), int(block_table[b, j])
            raise ValueError(f"block_table[{b}, {j}] = {page} is not a page of the cache (0..{pages - 1}); "
                             f"sequence {b} uses it for its keys {j * rows}..{min(n, (j + 1) * rows) - 1}")
        _flagged(f"the block_table entries of the pages a sequence uses must be pages of the cache "
                 f"(0..{pages - 1})")
    if bad_offsets:
        _name_bad_offset("cu_seqlens_q", cu_seqlens_q.tolist(), total_q, max_seqlen_q)
        _flagged(_OFFSETS_RULE.format(name="cu_seqlens_q", longest=max_seqlen_q))


_OFFSETS_RULE = "{name} must run from 0 to the packed length, non-decreasing, in steps of at most {longest}"


def _flagged(rule: str) -> None:
    # the device check's verdict where the host's search for the offender found none (never, while the two
    # read the rule alike): the rule, unnamed
    raise ValueError(f"{rule} (the metadata check flagged it)")


def _name_bad_offset(name: str, offsets, total: int, longest: int) -> None:
    tensor = "q" if name.endswith("_q") else "k and v"
    if offsets[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {offsets[0]}")
    for i in range(len(offsets) - 1):
        length = offsets[i + 1] - offsets[i]
        if length < 0:
            raise ValueError(f"{name} must be non-decreasing: sequence {i} runs from {offsets[i]} to "
                             f"{offsets[i + 1]}")
        if length > longest:
            raise ValueError(f"sequence {i} has {length} rows ({name}[{i + 1}] - {name}[{i}]), more than "
                             f"max_seqlen_{name[-1]} = {longest}")
    if offsets[-1] != total:
        raise ValueError(f"{name}[-1] must be the packed length of {tensor} ({total}), got {offsets[-1]}")
