"""Launchers of the Gluon sm90 backward kernels (kernels/attention_bwd_sm90.py):
dQ and dK / dV, their descriptors, grids and arguments, and ahead-of-time compiles for
sm_90 that need no GPU. ops/attention_bwd.py launches them where vflash.dispatch.select_backward
picks the sm90 kernels."""

from typing import Callable, NamedTuple, Optional

import torch

from vflash.kernels import attention_bwd_sm90 as kernels
from vflash.call import Band, Score
from vflash.ops.tiles import CONSUMER_REGS as CONSUMER_REGS_FWD
from vflash.ops.tiles import CONSUMER_ROWS
from vflash.ops.tma import describers, heads_first
from vflash.ops.launch import KernelLaunch, Slot, compile_sm90_launch
from vflash.ops.scales import score_scales

HAVE_GLUON = kernels.HAVE_GLUON
STAGES = 2  # the ring's depth unless a launch says otherwise
# One CTA an SM (its shared memory): each consumer warpgroup's registers a thread by consumer count (the
# forward's one-CTA shares), the producer what is left.
CONSUMER_REGS = {1: 240, 2: CONSUMER_REGS_FWD[(2, 1)], 3: CONSUMER_REGS_FWD[(3, 1)]}
SMEM_BYTES = 227 * 1024  # an sm_90 CTA's shared memory


def smem_bytes(head_dim: int, own: int, streamed: int, stages: int = STAGES, itemsize: int = 2,
               head_dim_v: Optional[int] = None) -> int:
    """Either kernel's shared memory: the CTA's own rows of two tensors (dQ: Q and dO; dK / dV: K and V)
    and `stages` tiles of the two it streams, one of each head_dim columns (Q, K) and one head_dim_v (dO, V;
    default head_dim), each a tile's padded columns (tile_cols)."""
    cols = tile_cols(head_dim) + tile_cols(head_dim if head_dim_v is None else head_dim_v)
    return (own + stages * streamed) * cols * itemsize


def tile_cols(head_dim: int) -> int:
    """A head dim's tile columns in the kernels: the power of two at or above it (Gluon's tensors are
    powers of two; TMA fills the columns past the tensor's with zeros and clips them from the stores)."""
    return 1 << max(0, head_dim - 1).bit_length()


class _Shape(NamedTuple):
    # what both launchers read off their inputs: dense [B, H, N, D] or varlen packed [total, H, D]
    batch: int
    heads_q: int
    heads_k: int
    n_q: int  # varlen: the longest sequence's
    n_k: int
    total_q: int  # varlen: LSE's head stride (dense: n_q, unread)
    head_dim: int  # q's and k's
    head_dim_v: int  # v's, dO's
    cu: tuple  # (cu_seqlens_q, cu_seqlens_k), dense (None, None)
    top_left: bool
    view: Callable  # a tensor as the [B, H, N, D] (varlen: [1, H, total, D]) view its descriptor covers


def _shape(q, k, v, lse, delta, own: int, streamed: int, stages: int, varlen) -> _Shape:
    # The inputs' layout, and what the kernels assume of their tiles and inputs (the dispatch's
    # tables and the backward's launcher keep to it; a direct call gets a ValueError, not a failed
    # compile). varlen: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, top_left).
    Dv = v.shape[-1]
    if varlen is None:
        B, Hq, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        shape = _Shape(B, Hq, Hkv, Nq, Nk, Nq, D, Dv, (None, None), False, lambda t: t)
        stats = (B, Hq, Nq)
    else:
        cu_q, cu_k, max_q, max_k, top_left = varlen
        (total_q, Hq, D), Hkv = q.shape, k.shape[1]
        shape = _Shape(cu_q.numel() - 1, Hq, Hkv, max_q, max_k, total_q, D, Dv, (cu_q, cu_k), top_left, heads_first)
        stats = (Hq, total_q)
    if own not in (CONSUMER_ROWS, 2 * CONSUMER_ROWS, 3 * CONSUMER_ROWS) or smem_bytes(D, own, streamed, stages,
                                                                            head_dim_v=Dv) > SMEM_BYTES:
        raise ValueError(f"the sm90 backward kernels take 64, 128 or 192 rows a CTA in {SMEM_BYTES} bytes of shared "
                         f"memory, not {own} x {streamed} ({stages} stages) at D {D} / {Dv}")
    if any(d % 8 or not 16 <= d <= 256 for d in (D, Dv)) or tile_cols(Dv) > tile_cols(D) or Hq % Hkv != 0:
        raise ValueError(f"the sm90 backward kernels take head dims 16-256 in multiples of 8 (v's tiles no wider "
                         f"than q's) and whole GQA groups, not D {D} / {Dv}, {Hq} / {Hkv} heads")
    for name, t in (("lse", lse), ("delta", delta)):
        if t.shape != stats or not t.is_contiguous() or t.dtype != torch.float32:
            raise ValueError(f"{name} must be contiguous fp32 {list(stats)}, got {list(t.shape)}")
    return shape


def _constexprs(sh: _Shape, block_m: int, block_n: int, own: int, band: Band, softcap: bool,
                stages: int = STAGES, varlen: bool = False) -> dict:
    # own: the CTA's own rows (dQ: block_m, dK / dV: block_n), 64 a consumer warpgroup
    return dict(HEAD_DIM=tile_cols(sh.head_dim), HEAD_DIM_V=tile_cols(sh.head_dim_v), QK_COLS=sh.head_dim,
                V_COLS=sh.head_dim_v, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, HAS_LEFT=band.has_left,
                HAS_RIGHT=band.has_right, SOFTCAP=softcap, CONSUMER_REGS=CONSUMER_REGS[own // CONSUMER_ROWS],
                IS_VARLEN=varlen, TOP_LEFT=sh.top_left)


def _described(name: str, describe: Callable, view: Callable) -> Slot:
    # the tensor `name`'s descriptor, in the kernel's parameter name_desc
    return Slot(f"{name}_desc", name, describe if view is None else (lambda t: describe(view(t))))


def dq_launch(q, k, v, do, lse, delta, dq, band: Band, score: Score, block_m: int = 128,
              block_n: int = 64, stages: int = STAGES, varlen: Optional[tuple] = None) -> KernelLaunch:
    """attention_bwd_dq_sm90_kernel over TMA-ready tensors (ops.tma.tma_ready): dq from q, k, v, do,
    the forward's lse and delta = rowsum(do * out), fp32. Dense: q, do, dq [B, Hq, Nq, D], k, v [B, Hkv,
    Nk, D], lse / delta [B, Hq, Nq]. varlen (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    top_left): packed q, do, dq [total_q, Hq, D], k, v [total_k, Hkv, D], lse / delta [Hq, total_q]. v and
    do may have a head dim of their own (D_v)."""
    sh = _shape(q, k, v, lse, delta, block_m, block_n, stages, varlen)
    rows, keys = describers(block_n, tile_cols(sh.head_dim), q.dtype)
    rows_v, keys_v = describers(block_n, tile_cols(sh.head_dim_v), q.dtype)
    view = None if varlen is None else sh.view
    qk_scale, softcap_in, softcap_out = score_scales(score)
    out_strides = (0, 0) if varlen is None else (dq.stride(0), dq.stride(1))  # the crossing slabs' pointer stores
    args = (rows(sh.view(q)), keys(sh.view(k)), keys_v(sh.view(v)), rows_v(sh.view(do)), rows(sh.view(dq)), lse, delta,
            *sh.cu, None if varlen is None else dq,
            sh.batch, sh.heads_q, sh.heads_q // sh.heads_k, sh.n_q, sh.n_k, sh.total_q, *out_strides,
            (band.off, band.left, band.right), (qk_scale, score.scale, softcap_in, softcap_out))
    grid = (sh.batch * sh.heads_q * -(-sh.n_q // block_m), 1, 1)
    slots = (_described("q", rows, view), _described("k", keys, view), _described("v", keys_v, view),
             _described("do", rows_v, view), _described("dq", rows, view), Slot("LSE", "lse"), Slot("DELTA", "delta"))
    if varlen is not None:
        slots += (Slot("cu_seqlens_q", "cu_seqlens_q"), Slot("cu_seqlens_k", "cu_seqlens_k"), Slot("DQ", "dq"))
    constexprs = _constexprs(sh, block_m, block_n, block_m, band, score.softcap is not None, stages, varlen is not None)
    return KernelLaunch(kernels.attention_bwd_dq_sm90_kernel, grid, args, constexprs, dict(num_warps=4), slots)


def dkdv_launch(q, k, v, do, lse, delta, dk, dv, band: Band, score: Score, block_m: int = 64,
                block_n: int = 128, stages: int = STAGES, outputs: str = "dk dv",
                varlen: Optional[tuple] = None) -> KernelLaunch:
    """attention_bwd_dkdv_sm90_kernel over TMA-ready tensors: dk, dv (k's layout; summed over each KV
    head's query heads in order) from q, k, v, do, lse and delta, dense or varlen as dq_launch's.
    block_n keys a CTA (64 a consumer), block_m query rows a streamed tile. outputs: "dk dv", or "dk" or
    "dv" alone (one accumulator a consumer, where two do not fit in registers; the other is not written)."""
    if outputs not in ("dk dv", "dk", "dv"):
        raise ValueError(f"outputs must be 'dk dv', 'dk' or 'dv', not {outputs!r}")
    sh = _shape(q, k, v, lse, delta, block_n, block_m, stages, varlen)
    rows, streamed = describers(block_m, tile_cols(sh.head_dim), q.dtype)
    rows_v, streamed_v = describers(block_m, tile_cols(sh.head_dim_v), q.dtype)
    view = None if varlen is None else sh.view
    qk_scale, softcap_in, softcap_out = score_scales(score)
    if varlen is not None and (dk.stride() != dv.stride() if sh.head_dim == sh.head_dim_v else
                               not (dk.is_contiguous() and dv.is_contiguous())):
        raise ValueError("the sm90 dK / dV kernel stores packed dk and dv with one set of strides (v's head dim "
                         "of its own: both contiguous)")
    out_strides = (0, 0) if varlen is None else (dk.stride(0), dk.stride(1))
    args = (streamed(sh.view(q)), rows(sh.view(k)), rows_v(sh.view(v)), streamed_v(sh.view(do)), rows(sh.view(dk)),
            rows_v(sh.view(dv)), lse, delta, *sh.cu, *((None, None) if varlen is None else (dk, dv)),
            sh.batch, sh.heads_k, sh.heads_q // sh.heads_k, sh.n_q, sh.n_k, sh.total_q, *out_strides,
            (band.off, band.left, band.right), (qk_scale, score.scale, softcap_in, softcap_out))
    grid = (sh.batch * sh.heads_k * -(-sh.n_k // block_n), 1, 1)
    slots = (_described("q", streamed, view), _described("k", rows, view), _described("v", rows_v, view),
             _described("do", streamed_v, view), _described("dk", rows, view), _described("dv", rows_v, view),
             Slot("LSE", "lse"), Slot("DELTA", "delta"))
    if varlen is not None:
        slots += (Slot("cu_seqlens_q", "cu_seqlens_q"), Slot("cu_seqlens_k", "cu_seqlens_k"), Slot("DK", "dk"),
                  Slot("DV", "dv"))
    constexprs = dict(_constexprs(sh, block_m, block_n, block_n, band, score.softcap is not None, stages,
                                  varlen is not None), WANT_DK="dk" in outputs, WANT_DV="dv" in outputs)
    return KernelLaunch(kernels.attention_bwd_dkdv_sm90_kernel, grid, args, constexprs, dict(num_warps=4), slots)


def compile_dkdv_sm90(head_dim: int, dtype: torch.dtype = torch.bfloat16, block_m: int = 64, block_n: int = 128, *,
                      band: Band = Band(0, -1, 0), softcap: bool = False, outputs: str = "dk dv",
                      varlen: bool = False, top_left: bool = False, head_dim_v: Optional[int] = None):
    """Compile the dK / dV kernel for sm_90 without a GPU (outputs as dkdv_launch's; varlen: the packed
    sequences' build; head_dim_v: v's of its own); returns Triton's CompiledKernel (_compiled: no signature
    written by hand)."""
    t = _cpu_call(head_dim, dtype, varlen, top_left, head_dim_v)
    return compile_sm90_launch(dkdv_launch(t.q, t.k, t.v, t.do, t.lse, t.delta, torch.empty_like(t.k),
                                           torch.empty_like(t.v), band, _score(head_dim, softcap), block_m, block_n,
                                           outputs=outputs, varlen=t.varlen))


def compile_dq_sm90(head_dim: int, dtype: torch.dtype = torch.bfloat16, block_m: int = 128, block_n: int = 64, *,
                    band: Band = Band(0, -1, 0), softcap: bool = False, varlen: bool = False,
                    top_left: bool = False, head_dim_v: Optional[int] = None):
    """Compile the dQ kernel for sm_90 without a GPU (varlen: the packed sequences' build; head_dim_v: v's
    of its own); returns Triton's CompiledKernel (_compiled: no signature written by hand)."""
    t = _cpu_call(head_dim, dtype, varlen, top_left, head_dim_v)
    return compile_sm90_launch(dq_launch(t.q, t.k, t.v, t.do, t.lse, t.delta, torch.empty_like(t.q), band,
                                         _score(head_dim, softcap), block_m, block_n, varlen=t.varlen))


class _CpuCall(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor
    varlen: Optional[tuple]


def _cpu_call(head_dim: int, dtype: torch.dtype, varlen: bool, top_left: bool,
              head_dim_v: Optional[int] = None) -> _CpuCall:
    # The CPU tensors of a backward call whose launches the compile helpers build and compile from their own
    # arguments (ops.launch.compile_sm90_launch, as Triton's JIT takes them): 2 sequences, 4 / 2 heads, lengths
    # that are no multiple of 16.
    dv = head_dim if head_dim_v is None else head_dim_v
    if varlen:
        q, k, v, do = (torch.empty((600, h, d), dtype=dtype) for h, d in ((4, head_dim), (2, head_dim), (2, dv),
                                                                         (4, dv)))
        stats = (4, 600)
        cu = torch.tensor([0, 250, 600], dtype=torch.int32)
        packed = (cu, cu, 350, 350, top_left)
    else:
        q, k, v, do = (torch.empty((2, h, 300, d), dtype=dtype) for h, d in ((4, head_dim), (2, head_dim), (2, dv),
                                                                            (4, dv)))
        stats, packed = (2, 4, 300), None
    lse, delta = (torch.empty(stats, dtype=torch.float32) for _ in range(2))
    return _CpuCall(q, k, v, do, lse, delta, packed)


def _score(head_dim: int, softcap: bool) -> Score:
    return Score(head_dim ** -0.5, 30.0 if softcap else None)
