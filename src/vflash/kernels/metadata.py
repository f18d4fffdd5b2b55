"""attention_with_kvcache's metadata checked on its own device: one program a
sequence raises a flag where the sequence's length is outside the cache's capacity,
where a page it uses is not a page of the cache, or where its cu_seqlens_q entries run
backwards, past max_seqlen_q or off the packed length. The host reads the three flags
in one copy and looks for the offender (to name it) only when one is raised."""

import triton
import triton.language as tl


@triton.jit
def kvcache_metadata_kernel(
    SEQLENS, TABLE, CU_Q, FLAGS,
    stride_table, capacity, page_size, num_pages, total_q, max_seqlen_q, n_seq,
    IS_PAGED: tl.constexpr, IS_VARLEN: tl.constexpr, BLOCK: tl.constexpr,
):
    # grid = (sequences,); FLAGS int32 [3], zeroed by the launcher: [length, page, cu_seqlens_q].
    # Every raised flag is a store of 1 (programs that raise the same flag write the same value).
    b = tl.program_id(0)
    n = tl.load(SEQLENS + b).to(tl.int64)
    bad_len = (n < 0) | (n > capacity)
    tl.store(FLAGS, 1, mask=bad_len)
    if IS_PAGED:
        # the pages its keys use, [0, cdiv(n, page_size)); none for a length already flagged (past the
        # table's row); the rest of the row may hold anything (serving engines pad it)
        used = tl.where(bad_len, 0, (n + page_size - 1) // page_size).to(tl.int32)
        row = TABLE + b.to(tl.int64) * stride_table
        bad = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, used, BLOCK):
            j = start + tl.arange(0, BLOCK)
            in_use = j < used
            page = tl.load(row + j, mask=in_use, other=0)
            bad = tl.maximum(bad, (in_use & ((page < 0) | (page >= num_pages))).to(tl.int32))
        tl.store(FLAGS + 1, 1, mask=tl.max(bad, 0) > 0)
    if IS_VARLEN:
        lo = tl.load(CU_Q + b).to(tl.int64)
        hi = tl.load(CU_Q + b + 1).to(tl.int64)
        bad_q = (hi < lo) | (hi - lo > max_seqlen_q) | ((b == 0) & (lo != 0)) | ((b == n_seq - 1) & (hi != total_q))
        tl.store(FLAGS + 2, 1, mask=bad_q)
