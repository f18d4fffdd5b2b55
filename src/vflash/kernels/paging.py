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


@triton.jit
def key_row(block_table, seq, table_stride, n_k, key, first_row, PAGE_SIZE: tl.constexpr):
    # The cache row of sequence seq's key `key` (what a TMA descriptor over the cache's rows addresses). Paged
    # (PAGE_SIZE > 0): through the sequence's block-table row, read no further than its last page (keys past it
    # come from page 0 and are masked); contiguous: first_row (the sequence's first row) + key.
    if PAGE_SIZE > 0:
        page = page_ids(table_row(block_table, seq, table_stride), key, pages_used(n_k, PAGE_SIZE), PAGE_SIZE)
        return cache_row(page, key, PAGE_SIZE)
    else:
        return first_row + key
