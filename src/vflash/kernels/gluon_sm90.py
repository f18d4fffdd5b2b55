"""The Gluon names the sm_90 kernels (attention_fwd_sm90.py, attention_bwd_sm90.py) use,
the same across the Triton releases vflash runs on, and the shared-memory helpers both kernels' varlen
paths share. HAVE_GLUON is False on a Triton without
Gluon, where the portable kernels serve everything and nothing else here exists."""

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.language.core import _aggregate as aggregate
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    # Triton 3.6 (the GPU machine) names the TMA copies async_copy_*; later
    # releases renamed them async_load / async_store. Either serves.
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    HAVE_GLUON = True
except (ImportError, AttributeError):
    HAVE_GLUON = False

if HAVE_GLUON:
    @gluon.constexpr_function
    def tail_layout(head_dim):
        # [rows, head_dim] over a consumer warpgroup's 4 warps, 8 values (16 bytes) a thread
        cols = min(32, head_dim // 8)
        return gl.BlockedLayout([1, 8], [32 // cols, cols], [4, 1], [1, 0])

    @gluon.jit
    def zero_rows_from(tile, first, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
        # Rows [first, ROWS) of a landed [ROWS, HEAD_DIM] tile set to zero in shared memory, in
        # 16-row pieces, then fenced for the wgmma that reads it: a ring tile that reaches past its
        # sequence's end holds the next sequence's rows (or a cache's unused ones), which a zero
        # weight would not cancel if they held inf or NaN. In the forward every consumer of the tile
        # does it before its own read, unsynchronized with the others: rows before `first` are
        # stored back with the bytes TMA wrote, rows from it with zeros, so a consumer's wgmma may
        # overlap another's stores of the same bytes but never sees other bytes (a race by the
        # PTX memory model's letter, harmless because the values agree). The MLA decode kernel's
        # tile owner does it alone, before it hands the tile to the other consumer.
        PIECE: gl.constexpr = 16
        layout: gl.constexpr = tail_layout(HEAD_DIM)
        for c in gl.static_range(ROWS // PIECE):
            if (c + 1) * PIECE > first:
                piece = tile.slice(c * PIECE, PIECE)
                vals = piece.load(layout)
                rows = c * PIECE + gl.arange(0, PIECE, layout=gl.SliceLayout(1, layout))
                piece.store(gl.where((rows < first)[:, None], vals, gl.zeros_like(vals)))
        fence_async_shared()

    @gluon.jit
    def ring(tile, STAGES: gl.constexpr):
        # (slot, phase) of ring tile `tile` >= 0 of a STAGES-slot ring, in unsigned arithmetic: signed % and //
        # cost sign fix-ups in the uniform datapath.
        t = tile.to(gl.uint32)
        return (t % STAGES).to(gl.int32), ((t // STAGES) & 1).to(gl.int32)

__all__ = ["HAVE_GLUON", "gluon", "gl", "aggregate", "fence_async_shared", "mbarrier", "tma", "warpgroup_mma",
           "warpgroup_mma_wait", "tma_load", "tma_store", "ring", "tail_layout", "zero_rows_from"]
