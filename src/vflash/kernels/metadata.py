"""A batch's sequence metadata checked on its own device: each program takes BLOCK_SEQ
sequences and raises a flag where a sequence's cache length is outside the cache's
capacity, where a page it uses is not a page of the cache, or where its cu_seqlens_q /
cu_seqlens_k entries run backwards, past their max_seqlen or off the packed length. The
host reads the flags in one copy and looks for the offender (to name it) only when one is
raised."""

import triton
import triton.language as tl

from vflash.kernels.paging import pages_used, table_row


@triton.jit
def _offsets_fault(CU, seq, valid, total, longest, n_seq):
    # [BLOCK_SEQ] sequence seq's rows [CU[seq], CU[seq + 1]): in order, at most `longest`, from 0 (the first)
    # to `total` (the last); int64, so that no difference of two int32 entries wraps
    lo = tl.load(CU + seq, mask=valid, other=0).to(tl.int64)
    hi = tl.load(CU + seq + 1, mask=valid, other=0).to(tl.int64)
    fault = (hi < lo) | (hi - lo > longest) | ((seq == 0) & (lo != 0)) | ((seq == n_seq - 1) & (hi != total))
    return tl.max((valid & fault).to(tl.int32), 0) > 0


@triton.jit
def sequence_metadata_kernel(
    SEQLENS, TABLE, CU_Q, CU_K, FLAGS,
    stride_table, capacity, page_size, num_pages, total_q, max_seqlen_q, total_k, max_seqlen_k, n_seq,
    HAS_CACHE: tl.constexpr, IS_PAGED: tl.constexpr, HAS_CU_Q: tl.constexpr, HAS_CU_K: tl.constexpr,
    BLOCK_SEQ: tl.constexpr, BLOCK_PAGES: tl.constexpr,
):
    # grid = (cdiv(sequences, BLOCK_SEQ),); FLAGS int32 [4], zeroed by the launcher: [cache length, page,
    # cu_seqlens_q, cu_seqlens_k]. A raised flag is a store of 1 (programs raising the same flag write the
    # same value).
    seq = tl.program_id(0) * BLOCK_SEQ + tl.arange(0, BLOCK_SEQ)  # [BLOCK_SEQ]
    valid = seq < n_seq
    if HAS_CACHE:
        n = tl.load(SEQLENS + seq, mask=valid, other=0).to(tl.int64)
        bad_len = valid & ((n < 0) | (n > capacity))
        tl.store(FLAGS, 1, mask=tl.max(bad_len.to(tl.int32), 0) > 0)
        if IS_PAGED:
            # the pages each sequence's keys use, [0, cdiv(n, page_size)); none for a length already flagged
            # (past the table's row); the rest of a row may hold anything (serving engines pad it)
            used = tl.where(valid & ~bad_len, pages_used(n, page_size), 0).to(tl.int32)
            rows = table_row(TABLE, seq, stride_table)[:, None]  # [BLOCK_SEQ, 1]
            bad = tl.zeros([BLOCK_SEQ, BLOCK_PAGES], dtype=tl.int32)
            for start in range(0, tl.max(used, 0), BLOCK_PAGES):
                j = start + tl.arange(0, BLOCK_PAGES)[None, :]  # [1, BLOCK_PAGES]
                in_use = j < used[:, None]
                page = tl.load(rows + j, mask=in_use, other=0)
                bad = tl.maximum(bad, (in_use & ((page < 0) | (page >= num_pages))).to(tl.int32))
            tl.store(FLAGS + 1, 1, mask=tl.max(tl.max(bad, 1), 0) > 0)
    if HAS_CU_Q:
        tl.store(FLAGS + 2, 1, mask=_offsets_fault(CU_Q, seq, valid, total_q, max_seqlen_q, n_seq))
    if HAS_CU_K:
        tl.store(FLAGS + 3, 1, mask=_offsets_fault(CU_K, seq, valid, total_k, max_seqlen_k, n_seq))
