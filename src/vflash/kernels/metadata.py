"""A batch's sequence metadata checked on its own device: one program a sequence raises
a flag where the sequence's cache length is outside the cache's capacity, where a page
it uses is not a page of the cache, or where its cu_seqlens_q / cu_seqlens_k entries run
backwards, past their max_seqlen or off the packed length. The host reads the flags in
one copy and looks for the offender (to name it) only when one is raised."""

import triton
import triton.language as tl


@triton.jit
def _offsets_fault(CU, b, total, longest, n_seq):
    # sequence b's rows [CU[b], CU[b + 1]): in order, at most `longest`, from 0 (b = 0) to `total` (the last);
    # int64, so that no difference of two int32 entries wraps
    lo = tl.load(CU + b).to(tl.int64)
    hi = tl.load(CU + b + 1).to(tl.int64)
    return (hi < lo) | (hi - lo > longest) | ((b == 0) & (lo != 0)) | ((b == n_seq - 1) & (hi != total))


@triton.jit
def sequence_metadata_kernel(
    SEQLENS, TABLE, CU_Q, CU_K, FLAGS,
    stride_table, capacity, page_size, num_pages, total_q, max_seqlen_q, total_k, max_seqlen_k, n_seq,
    HAS_CACHE: tl.constexpr, IS_PAGED: tl.constexpr, HAS_CU_Q: tl.constexpr, HAS_CU_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # grid = (sequences,); FLAGS int32 [4], zeroed by the launcher: [cache length, page, cu_seqlens_q,
    # cu_seqlens_k]. A raised flag is a store of 1 (programs raising the same flag write the same value).
    b = tl.program_id(0)
    if HAS_CACHE:
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
    if HAS_CU_Q:
        tl.store(FLAGS + 2, 1, mask=_offsets_fault(CU_Q, b, total_q, max_seqlen_q, n_seq))
    if HAS_CU_K:
        tl.store(FLAGS + 3, 1, mask=_offsets_fault(CU_K, b, total_k, max_seqlen_k, n_seq))
