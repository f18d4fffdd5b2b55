"""Paging: where a sequence's keys live in a paged KV cache, for every kernel that reads or checks one
(the portable KV-cache kernel, the sm90 kernel's KV_CACHE build, the metadata check).

A sequence's block-table row names its pages in order: its key j is row j % PAGE_SIZE of page
row[j // PAGE_SIZE], the cache [pages, PAGE_SIZE, Hkv, D] addressed as rows page * PAGE_SIZE + j % PAGE_SIZE.
A constexpr PAGE_SIZE makes the divisions shifts or multiplies.
"""

import triton
import triton.language as tl


@triton.jit
def table_row(block_table, seq, stride):
    # sequence seq's block-table row (64-bit: batch * stride may pass 2^31)
    return block_table + seq.to(tl.int64) * stride


@triton.jit
def pages_used(n_keys, page_size):
    # the pages n_keys keys fill: entries 0 .. pages_used - 1 of a row (what the metadata check checks)
    return (n_keys + page_size - 1) // page_size


@triton.jit
def page_ids(row, keys, entries, PAGE_SIZE: tl.constexpr):
    # The pages holding `keys` (one key or a tile of them) of the sequence whose block-table row is `row`,
    # reading no entry at or past `entries` (those read as page 0: their keys are masked, and a load bounded
    # by the row's width waits on nothing but the keys, not on the sequence's length).
    j = keys // PAGE_SIZE
    return tl.load(row + j, mask=j < entries, other=0)


@triton.jit
def cache_row(page, key, PAGE_SIZE: tl.constexpr):
    # key's row in the cache's rows [pages * PAGE_SIZE] (what a TMA descriptor over merged pages addresses)
    return page * PAGE_SIZE + key % PAGE_SIZE
