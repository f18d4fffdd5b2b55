"""Context parallelism: ring attention over torch.distributed, exact, with every band
vflash supports.

Each rank holds a shard of the sequence (`[B, H, N_local, D]`): `shard_sequence` gives it
from the full tensor, `unshard_sequence` puts the shards back. K/V shards pass around the
ring (point-to-point, NCCL on GPUs, gloo on CPU), one step a shard, the transfer of the
next shard posted before the current one is computed on. Each step attends the local
queries to the shard in hand with the band its global positions give (a pair of chunks
whose band hides every key is skipped), and folds the partial result into fp32
accumulators through the LSE (`vflash.merge_states`). The backward walks the ring again:
each rank adds its queries' contributions to the dK / dV of the shard in hand, in fp32,
and passes them on with the shard, so after the last step they reach their owner; dQ stays
local. Every sum runs in a fixed order: the same bits from run to run. `ring_schedule` lists one
rank's steps (the chunk pairs and their bands) without running them.

Layouts (the sequence cut into chunks):
- "zigzag" (default): 2R chunks, rank r holds chunks r and 2R-1-r, so under a causal mask
  every rank does the same work;
- "contiguous": R chunks, rank r holds chunk r.
"""

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

import vflash
from vflash import _validate, dispatch, library
from vflash.ops import metadata

LAYOUTS = ("zigzag", "contiguous")


def _chunk_ids(rank: int, world_size: int, layout: str) -> Tuple[int, ...]:
    if layout == "zigzag":
        return rank, 2 * world_size - 1 - rank
    if layout == "contiguous":
        return (rank,)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _chunks(world_size: int, layout: str) -> int:
    return 2 * world_size if layout == "zigzag" else world_size


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, *, layout: str = "zigzag",
                   dim: int = 2) -> torch.Tensor:
    """This rank's shard of the full tensor x along `dim` (the sequence), contiguous: the
    concatenation of its chunks (zigzag: chunks rank and 2R-1-rank of 2R)."""
    n_chunks = _chunks(world_size, layout)
    ids = _chunk_ids(rank, world_size, layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a world of {world_size}")
    if x.shape[dim] % n_chunks:
        raise ValueError(f"sequence length {x.shape[dim]} (dim {dim}) is not a multiple of the layout's "
                         f"{n_chunks} chunks ({layout}, world size {world_size})")
    parts = x.chunk(n_chunks, dim=dim)
    return torch.cat([parts[i] for i in ids], dim=dim).contiguous()


def unshard_sequence(shards: Sequence[torch.Tensor], *, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """The full tensor from every rank's shard (in rank order), along `dim`."""
    world_size = len(shards)
    n_chunks = _chunks(world_size, layout)
    parts: List[Optional[torch.Tensor]] = [None] * n_chunks
    for rank, shard in enumerate(shards):
        ids = _chunk_ids(rank, world_size, layout)
        if shard.shape[dim] % len(ids):
            raise ValueError(f"shard {rank} has {shard.shape[dim]} rows along dim {dim}, not a multiple of "
                             f"{len(ids)} chunks")
        for i, part in zip(ids, shard.chunk(len(ids), dim=dim)):
            parts[i] = part
    return torch.cat(parts, dim=dim)


def shard_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, rank: int, world_size: int, *,
                 layout: str = "zigzag") -> Tuple[torch.Tensor, torch.Tensor, int]:
    """This rank's shard of packed sequences x [total, ...] (int32 cu_seqlens [B + 1]): each
    sequence cut as shard_sequence cuts one (its length a multiple of the layout's chunks).
    Returns (x_local [total / R, ...], cu_seqlens_local, max_seqlen_local)."""
    lengths = torch.diff(cu_seqlens).tolist()
    parts = [shard_sequence(x[int(s):int(s) + n], rank, world_size, layout=layout, dim=0)
             for s, n in zip(cu_seqlens[:-1].tolist(), lengths)]
    local = torch.diff(cu_seqlens) // world_size
    return torch.cat(parts) if parts else x[:0], _cu_seqlens(local), int(local.max()) if len(lengths) else 0


def unshard_varlen(shards: Sequence[torch.Tensor], cu_seqlens: torch.Tensor, *, layout: str = "zigzag") -> torch.Tensor:
    """The full packed tensor (the full sequences' cu_seqlens) from every rank's shard_varlen."""
    world_size = len(shards)
    lengths = [n // world_size for n in torch.diff(cu_seqlens).tolist()]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    seqs = [unshard_sequence([sh[starts[b]:starts[b + 1]] for sh in shards], layout=layout, dim=0)
            for b in range(len(lengths))]
    return torch.cat(seqs) if seqs else shards[0][:0]


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    # int32 [B + 1] offsets of sequences of these lengths
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _pair_band(q_start: int, n_q: int, k_start: int, n_k: int, off: int, left: int, right: int):
    # The band of a (query chunk, key chunk) pair from global positions: global query p
    # sees global key t when p + off - left <= t <= p + off + right, so local row i sees
    # local key j under the same rule with the offset q_start + off - k_start. None when
    # it hides every key; edges that hide no key of the pair are dropped (as mask_band).
    o = q_start + off - k_start
    if right >= 0 and n_q - 1 + o + right < 0:
        return None
    if left >= 0 and o - left > n_k - 1:
        return None
    if left >= n_q - 1 + o:
        left = -1
    if right >= n_k - 1 - o:
        right = -1
    return o, left, right


def _ring_shift(tensors: Sequence[torch.Tensor], group, rank: int, world_size: int):
    # Post the send of `tensors` to the next rank and the receive of the previous rank's;
    # returns (the receive buffers, the requests to wait on).
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    if group is not None:
        nxt, prv = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prv)
    recv = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, prv, group) for t in recv]
    return recv, dist.batch_isend_irecv(ops)


class _Ring:
    """The schedule of one call: which chunk pairs meet at each step, with their bands.
    Dense shards: chunks of q_chunk / k_chunk rows, bands from global positions. Packed
    (varlen) shards, q_chunk = k_chunk = None: each sequence cut alike, self-attention with
    no window, so a pair is the diagonal (causal), entirely visible, or skipped."""

    def __init__(self, rank, world_size, layout, n_q, n_k, off, left, right):
        self.rank, self.world_size = rank, world_size
        ids = _chunk_ids(rank, world_size, layout)
        self.q_ids, self.layout = ids, layout
        self.q_chunk = None if n_q is None else n_q // len(ids)
        self.k_chunk = None if n_k is None else n_k // len(ids)
        self.off, self.left, self.right = off, left, right

    def pairs(self, step):
        # (query chunk index, key chunk index, band) for the K/V shard of rank
        # (rank - step) mod R, the pairs in a fixed order
        src = (self.rank - step) % self.world_size
        k_ids = _chunk_ids(src, self.world_size, self.layout)
        for a, qc in enumerate(self.q_ids):
            for b, kc in enumerate(k_ids):
                if self.q_chunk is None:
                    causal = self.right >= 0
                    band = None if causal and qc < kc else (0, -1, 0 if causal and qc == kc else -1)
                else:
                    band = _pair_band(qc * self.q_chunk, self.q_chunk, kc * self.k_chunk, self.k_chunk, self.off,
                                      self.left, self.right)
                if band is not None:
                    yield a, b, band


class _Dense:
    """[B, H, N_local, D] shards: a chunk is a view along the sequence dim; LSE [B, H, n]."""
    lse_heads = 1  # the kernels' LSE's head dimension

    def __init__(self, n_chunks):
        self.n = n_chunks

    def split(self, x):
        return list(x.chunk(self.n, dim=2))  # views: the kernels take any strides

    def join(self, parts):
        return torch.cat(parts, dim=2)

    def add_into(self, dst, b, src):  # dst's chunk b += src
        dst.chunk(self.n, dim=2)[b].add_(src)

    def empty_lse(self, q_part):
        B, H, n, _ = q_part.shape
        return q_part.new_full((B, H, n), float("-inf"), dtype=torch.float32)

    def merge_lse(self, lse):  # merge_states' layout: out's leading dims
        return lse

    def split_lse(self, lse):
        return [c.contiguous() for c in lse.chunk(self.n, dim=2)]

    def join_lse(self, parts):
        return torch.cat(parts, dim=2)

    def forward(self, q, k, v, band, score):
        return library.attention_fwd(q, k, v, *band, *score)

    def backward(self, do, dlse, q, k, v, out, lse, band, score):
        return library.attention_bwd(do, dlse, q, k, v, out, lse, *band, *score)


class _Packed:
    """[total_local, H, D] shards of packed sequences, each sequence's rows cut into the
    layout's chunks: a chunk is the gathered rows of every sequence's chunk; LSE [H, total]."""
    lse_heads = 0

    def __init__(self, n_chunks, cu_seqlens, max_seqlen):
        self.n = n_chunks
        lengths = torch.diff(cu_seqlens).long()
        self.total = int(cu_seqlens[-1])
        # each row's sequence and its chunk there; chunk c's rows of every sequence, in order
        seq = torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device), lengths,
                                      output_size=self.total)
        chunk = (torch.arange(self.total, device=cu_seqlens.device) - cu_seqlens[:-1].long()[seq]) \
            // (lengths // n_chunks)[seq]
        self.index = [torch.nonzero(chunk == c).flatten() for c in range(n_chunks)]
        self.cu = _cu_seqlens(lengths // n_chunks)
        self.max = max_seqlen // n_chunks

    def split(self, x):
        return [x.index_select(0, i) for i in self.index]

    def join(self, parts):
        out = parts[0].new_empty((self.total,) + tuple(parts[0].shape[1:]))
        for i, p in zip(self.index, parts):
            out.index_copy_(0, i, p)
        return out

    def add_into(self, dst, b, src):  # dst's chunk b += src (each row once: the same bits every run)
        dst.index_add_(0, self.index[b], src.to(dst.dtype))

    def empty_lse(self, q_part):
        return q_part.new_full((q_part.shape[1], q_part.shape[0]), float("-inf"), dtype=torch.float32)

    def merge_lse(self, lse):
        return lse.transpose(0, 1).contiguous()

    def split_lse(self, lse):
        return [lse.index_select(1, i).contiguous() for i in self.index]

    def join_lse(self, parts):
        out = parts[0].new_empty((parts[0].shape[0], self.total))
        for i, p in zip(self.index, parts):
            out.index_copy_(1, i, p)
        return out

    def forward(self, q, k, v, band, score):
        _, left, right = band
        return library.attention_varlen_fwd(q, k, v, self.cu, self.cu, self.max, self.max, left, right, False,
                                            *score, False)

    def backward(self, do, dlse, q, k, v, out, lse, band, score):
        _, left, right = band
        return library.attention_varlen_bwd(do, dlse, q, k, v, out, lse, self.cu, self.cu, self.max, self.max,
                                            left, right, False, *score)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, ring, group, score, chunks):
        # The steps' parts carry no sink (score's sinks None); each query chunk's sink enters once, after
        # the last step, as one more part of output 0 and LSE the sink.
        R = ring.world_size
        nq = len(ring.q_ids)
        qs = chunks.split(q)
        acc: List[Optional[Tuple[torch.Tensor, torch.Tensor]]] = [None] * nq
        kv = (k.contiguous(), v.contiguous())
        for step in range(R):
            pending = _ring_shift(kv, group, ring.rank, R) if step < R - 1 else None
            ks, vs = chunks.split(kv[0]), chunks.split(kv[1])
            for a, b, band in ring.pairs(step):
                out, lse = chunks.forward(qs[a], ks[b], vs[b], band, score)
                lse = chunks.merge_lse(lse)
                if acc[a] is None:
                    acc[a] = (out.float(), lse)
                else:
                    acc[a] = vflash.merge_states(acc[a][0], acc[a][1], out.float(), lse)
            if pending is not None:
                recv, reqs = pending
                for r in reqs:
                    r.wait()
                kv = tuple(recv)
        outs, lses = [], []
        for a in range(nq):
            if acc[a] is None:  # no key visible to any of these rows
                lse = chunks.empty_lse(qs[a])
                acc[a] = (qs[a].new_zeros(qs[a].shape, dtype=torch.float32), chunks.merge_lse(lse))
            if sinks is not None:  # merged LSEs are [B, H, n] or [n, H]: heads on dim 1 either way
                part_out, part_lse = acc[a]
                sink_lse = sinks.detach().view(1, -1, *[1] * (part_lse.dim() - 2)).expand_as(part_lse)
                acc[a] = vflash.merge_states(part_out, part_lse, torch.zeros_like(part_out), sink_lse.contiguous())
            outs.append(acc[a][0])
            lses.append(chunks.merge_lse(acc[a][1]))  # a transpose is its own inverse
        out = chunks.join(outs).to(q.dtype)
        lse = chunks.join_lse(lses)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.ring, ctx.group, ctx.score, ctx.chunks = ring, group, score, chunks
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        ring, group, chunks = ctx.ring, ctx.group, ctx.chunks
        R = ring.world_size
        dout = torch.zeros_like(out) if dout is None else dout
        qs, outs, douts = chunks.split(q), chunks.split(out), chunks.split(dout)
        lses = chunks.split_lse(lse)
        dlses = [None] * len(qs) if dlse is None else chunks.split_lse(dlse.float())
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = (k.contiguous(), v.contiguous())
        dkv = (torch.zeros(k.shape, dtype=torch.float32, device=k.device),
               torch.zeros(v.shape, dtype=torch.float32, device=v.device))
        # the steps' backward takes the sinks for their gradient alone (the kernels read P from the final
        # LSE, which holds the sink): each query chunk's, the same from any of its pairs
        score = ctx.score._replace(sinks=sinks.detach() if ctx.needs_input_grad[3] else None)
        dsinks = [None] * len(qs)
        for step in range(R):
            pending = _ring_shift(kv, group, ring.rank, R) if step < R - 1 else None
            ks, vs = chunks.split(kv[0]), chunks.split(kv[1])
            for a, b, band in ring.pairs(step):
                gq, gk, gv, dsinks[a] = chunks.backward(douts[a], dlses[a], qs[a], ks[b], vs[b], outs[a], lses[a],
                                                        band, score)
                chunks.add_into(dq, a, gq)
                chunks.add_into(dkv[0], b, gk)
                chunks.add_into(dkv[1], b, gv)
            if R == 1:  # nothing travels
                break
            recv_dkv, reqs_dkv = _ring_shift(dkv, group, ring.rank, R)  # after the last step: home
            if pending is not None:
                recv, reqs = pending
                for r in reqs:
                    r.wait()
                kv = tuple(recv)
            for r in reqs_dkv:
                r.wait()
            dkv = tuple(recv_dkv)
        total = None
        if ctx.needs_input_grad[3]:  # this rank's rows' share; a replicated parameter's ranks sum theirs
            total = sum(_no_key_sink_gradient(sinks, lses[a], dlses[a], chunks.lse_heads) if d is None else d
                        for a, d in enumerate(dsinks))
        return (dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), total) + (None,) * 4


def _no_key_sink_gradient(sinks, lse, dlse, heads: int):
    # The sinks' gradient over a chunk whose rows saw no key on any step (no pair, no backward call): their
    # LSE is the sink, so its share of each row is 1, and their delta is -dlse (out is 0).
    if dlse is None:
        return torch.zeros_like(sinks)
    total = dlse.sum([d for d in range(lse.dim()) if d != heads])
    return torch.where(sinks == float("-inf"), 0.0, total)  # no sink either: LSE -inf, no share


def _dense_ring(rank: int, world_size: int, layout: str, n_q: int, n_k: int, causal_mode: Optional[str], left: int,
                right: int) -> _Ring:
    # ring_attention's schedule for dense shards of n_q / n_k rows: the band's offset and right edge from the
    # causal mode on the full sequence (Nq = R * n_q, Nk = R * n_k)
    n_ids = len(_chunk_ids(rank, world_size, layout))
    if n_q % n_ids or n_k % n_ids:
        raise ValueError(f"the {layout} layout cuts each shard into {n_ids} chunks: Nq_local {n_q} and Nk_local "
                         f"{n_k} must be multiples of {n_ids}")
    off = 0 if causal_mode == "top_left" else world_size * (n_k - n_q)
    if causal_mode is not None:
        right = 0 if right < 0 else min(right, 0)
    return _Ring(rank, world_size, layout, n_q, n_k, off, left, right)


def ring_schedule(rank: int, world_size: int, n_q_local: int, n_k_local: int, *, causal: Union[bool, str] = False,
                  window: Optional[Tuple[int, int]] = None,
                  layout: str = "zigzag") -> Tuple[int, List[List[Tuple[int, int, Tuple[int, int, int]]]]]:
    """The work `ring_attention` does on rank `rank` of `world_size`, without the transfers (for a lab that runs
    one rank's steps on one GPU): (chunks, steps). Each shard ([B, H, N_local, D]) is cut along the sequence into
    `chunks` equal chunks (2 under zigzag, 1 contiguous); steps[s] lists, in ring_attention's order, the
    (query chunk, key chunk, band) pairs computed at step s on the K/V shard of rank (rank - s) mod world_size,
    band = (offset, left, right) as the library's attention_fwd op takes it (pairs whose band hides every key
    left out). causal, window: as ring_attention's, on the full sequence."""
    ring = _dense_ring(rank, world_size, layout, n_q_local, n_k_local, _validate.resolve_causal(causal),
                       *_validate.check_window(window))
    return len(ring.q_ids), [list(ring.pairs(s)) for s in range(world_size)]


def _group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring attention needs an initialised torch.distributed process group")
    return dist.get_rank(group), dist.get_world_size(group)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Optional["dist.ProcessGroup"] = None,
    causal: Union[bool, str] = False,
    scale: Optional[float] = None,
    window: Optional[Tuple[int, int]] = None,
    softcap: Optional[float] = None,
    sinks: Optional[torch.Tensor] = None,
    layout: str = "zigzag",
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact attention over a sequence sharded across the ranks of `group` (default: the
    world), as `vflash.attention` on the full sequence would give it.

    Args:
        q: [B, Hq, Nq_local, D] this rank's query shard (`shard_sequence(q_full, rank, R,
            layout=layout)`); every rank the same shape.
        k, v: [B, Hkv, Nk_local, D] its key / value shards (GQA / MQA as in `attention`).
        causal, scale, window, softcap, sinks: as in `vflash.attention`, on the full sequence
            (Nq = R * Nq_local, Nk = R * Nk_local; the band from global positions). The ring's
            steps carry no sink; it enters once per row after the last. The sinks' gradient is
            this rank's rows' share (sum it over the ranks, as for any replicated parameter).
        layout: "zigzag" (chunks r and 2R-1-r: causal load balance) or "contiguous".
        return_lse: also return the shard's natural-log LSE [B, Hq, Nq_local] fp32.

    Returns:
        out [B, Hq, Nq_local, D] in q's dtype (this rank's shard of the full output), or
        (out, lse). Differentiable: the backward passes dK / dV around the ring.
    """
    _validate.check_no_fp8("ring_attention", q=q, k=k, v=v)
    if isinstance(v, torch.Tensor) and isinstance(k, torch.Tensor) and v.shape[-1] != k.shape[-1]:
        raise ValueError(f"ring_attention takes v's head dim equal to k's, got {v.shape[-1]} and {k.shape[-1]}")
    rank, world = _group(group)
    call = _validate.attention_call(q, k, v, causal, window, scale, softcap, sinks, None, None, None, None,
                                    return_lse)  # a shard's band
    ring = _dense_ring(rank, world, layout, q.shape[2], k.shape[2], _validate.resolve_causal(causal),
                       *_validate.check_window(window))
    out, lse = _RingAttention.apply(q, k, v, call.score.sinks, ring, group, call.score._replace(sinks=None),
                                    _Dense(len(ring.q_ids)))
    return (out, lse) if call.return_lse else out


def ring_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    group: Optional["dist.ProcessGroup"] = None,
    causal: Union[bool, str] = False,
    scale: Optional[float] = None,
    softcap: Optional[float] = None,
    sinks: Optional[torch.Tensor] = None,
    layout: str = "zigzag",
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Ring attention over packed sequences, each sharded by position across the ranks
    (`shard_varlen`): self-attention, as `vflash.attention_varlen` on the full sequences.

    Args:
        q: [total_local, Hq, D], k / v: [total_local, Hkv, D], this rank's shard.
        cu_seqlens: int32 [B + 1] of the local shard (shard_varlen's); every rank the same.
        max_seqlen: the longest local sequence.
        causal, scale, softcap, sinks: as in `attention_varlen` and `ring_attention` (no window:
            a window's band differs per sequence chunk, which the varlen kernel does not take yet).
        layout: "zigzag" or "contiguous"; each local sequence a multiple of its chunks.

    Returns:
        out [total_local, Hq, D], or (out, lse [Hq, total_local] fp32).
    """
    _validate.check_no_fp8("ring_attention_varlen", q=q, k=k, v=v)
    if isinstance(v, torch.Tensor) and isinstance(k, torch.Tensor) and v.shape[-1] != k.shape[-1]:
        raise ValueError(f"ring_attention_varlen takes v's head dim equal to k's, got {v.shape[-1]} and "
                         f"{k.shape[-1]}")
    rank, world = _group(group)
    call = _validate.varlen_call(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal, None, scale,
                                 softcap, sinks, None, None, None, None, return_lse, True)
    check, _ = metadata.checker(call, dispatch.metadata_tiles(call.batch, q.device))
    check(cu_seqlens, cu_seqlens)
    causal_mode = _validate.resolve_causal(causal)
    n_ids = len(_chunk_ids(rank, world, layout))
    if bool((torch.diff(cu_seqlens) % n_ids).any()):
        raise ValueError(f"the {layout} layout cuts each local sequence into {n_ids} chunks: every length in "
                         f"cu_seqlens must be a multiple of {n_ids}")
    ring = _Ring(rank, world, layout, None, None, 0, -1, -1 if causal_mode is None else 0)
    chunks = _Packed(n_ids, cu_seqlens, max_seqlen)
    out, lse = _RingAttention.apply(q, k, v, call.score.sinks, ring, group, call.score._replace(sinks=None), chunks)
    return (out, lse) if call.return_lse else out
