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
local. Every sum runs in a fixed order: the same bits from run to run.

Layouts (the sequence cut into chunks):
- "zigzag" (default): 2R chunks, rank r holds chunks r and 2R-1-r, so under a causal mask
  every rank does the same work;
- "contiguous": R chunks, rank r holds chunk r.
"""

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

import vflash
from vflash import _validate, library

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
    """The schedule of one call: which chunk pairs meet at each step, with their bands."""

    def __init__(self, rank, world_size, layout, n_q, n_k, off, left, right):
        self.rank, self.world_size = rank, world_size
        ids = _chunk_ids(rank, world_size, layout)
        self.q_chunk, self.k_chunk = n_q // len(ids), n_k // len(ids)
        self.q_ids, self.layout = ids, layout
        self.off, self.left, self.right = off, left, right

    def pairs(self, step):
        # (query chunk index, key chunk index, band) for the K/V shard of rank
        # (rank - step) mod R, the pairs in a fixed order
        src = (self.rank - step) % self.world_size
        k_ids = _chunk_ids(src, self.world_size, self.layout)
        for a, qc in enumerate(self.q_ids):
            for b, kc in enumerate(k_ids):
                band = _pair_band(qc * self.q_chunk, self.q_chunk, kc * self.k_chunk, self.k_chunk, self.off,
                                  self.left, self.right)
                if band is not None:
                    yield a, b, band


def _split(x, n):
    return x.chunk(n, dim=2)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, group, scale, softcap):
        R = ring.world_size
        nq = len(ring.q_ids)
        qs = _split(q, nq)
        acc: List[Optional[Tuple[torch.Tensor, torch.Tensor]]] = [None] * nq
        kv = (k.contiguous(), v.contiguous())
        for step in range(R):
            pending = _ring_shift(kv, group, ring.rank, R) if step < R - 1 else None
            ks, vs = _split(kv[0], nq), _split(kv[1], nq)
            for a, b, (off, left, right) in ring.pairs(step):
                out, lse = library.attention_fwd(qs[a], ks[b], vs[b], off, left, right, scale, softcap)
                if acc[a] is None:
                    acc[a] = (out.float(), lse)
                else:
                    acc[a] = vflash.merge_states(acc[a][0], acc[a][1], out.float(), lse)
            if pending is not None:
                recv, reqs = pending
                for r in reqs:
                    r.wait()
                kv = tuple(recv)
        B, H, _, D = q.shape
        outs, lses = [], []
        for a in range(nq):
            if acc[a] is None:  # no key visible to any of these rows
                acc[a] = (q.new_zeros((B, H, qs[a].shape[2], D), dtype=torch.float32),
                          q.new_full((B, H, qs[a].shape[2]), float("-inf"), dtype=torch.float32))
            outs.append(acc[a][0])
            lses.append(acc[a][1])
        out = torch.cat(outs, dim=2).to(q.dtype)
        lse = torch.cat(lses, dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.group, ctx.scale, ctx.softcap = ring, group, scale, softcap
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ring, group = ctx.ring, ctx.group
        R, nq = ring.world_size, len(ring.q_ids)
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        qs, outs, douts = _split(q, nq), _split(out, nq), _split(dout, nq)
        lses = tuple(x.contiguous() for x in _split(lse, nq))
        dlses = (None,) * nq if dlse is None else tuple(x.contiguous() for x in _split(dlse, nq))
        dq = [torch.zeros(x.shape, dtype=torch.float32, device=q.device) for x in qs]
        kv = (k.contiguous(), v.contiguous())
        dkv = (torch.zeros(k.shape, dtype=torch.float32, device=k.device),
               torch.zeros(v.shape, dtype=torch.float32, device=v.device))
        for step in range(R):
            pending = _ring_shift(kv, group, ring.rank, R) if step < R - 1 else None
            ks, vs = _split(kv[0], nq), _split(kv[1], nq)
            dks, dvs = _split(dkv[0], nq), _split(dkv[1], nq)
            for a, b, (off, left, right) in ring.pairs(step):
                gq, gk, gv = library.attention_bwd(douts[a].contiguous(), dlses[a], qs[a].contiguous(),
                                                   ks[b].contiguous(), vs[b].contiguous(), outs[a].contiguous(),
                                                   lses[a], off, left, right, ctx.scale, ctx.softcap)
                dq[a] += gq
                dks[b].add_(gk)
                dvs[b].add_(gv)
            recv_dkv, reqs_dkv = _ring_shift(dkv, group, ring.rank, R)  # after the last step: home
            if pending is not None:
                recv, reqs = pending
                for r in reqs:
                    r.wait()
                kv = tuple(recv)
            for r in reqs_dkv:
                r.wait()
            dkv = tuple(recv_dkv)
        grad_q = torch.cat(dq, dim=2).to(q.dtype)
        return grad_q, dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None


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
    layout: str = "zigzag",
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact attention over a sequence sharded across the ranks of `group` (default: the
    world), as `vflash.attention` on the full sequence would give it.

    Args:
        q: [B, Hq, Nq_local, D] this rank's query shard (`shard_sequence(q_full, rank, R,
            layout=layout)`); every rank the same shape.
        k, v: [B, Hkv, Nk_local, D] its key / value shards (GQA / MQA as in `attention`).
        causal, scale, window, softcap: as in `vflash.attention`, on the full sequence
            (Nq = R * Nq_local, Nk = R * Nk_local; the band from global positions).
        layout: "zigzag" (chunks r and 2R-1-r: causal load balance) or "contiguous".
        return_lse: also return the shard's natural-log LSE [B, Hq, Nq_local] fp32.

    Returns:
        out [B, Hq, Nq_local, D] in q's dtype (this rank's shard of the full output), or
        (out, lse). Differentiable: the backward passes dK / dV around the ring.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_attention needs an initialised torch.distributed process group")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    _validate.check_qkv(q, k, v)
    causal_mode, (left, right), scale_f, softcap_f, return_lse = _validate.check_options(
        causal, window, scale, softcap, return_lse, q.shape[-1])
    n_ids = len(_chunk_ids(rank, world, layout))
    n_q, n_k = q.shape[2], k.shape[2]
    if n_q % n_ids or n_k % n_ids:
        raise ValueError(f"the {layout} layout cuts each shard into {n_ids} chunks: Nq_local {n_q} and Nk_local "
                         f"{n_k} must be multiples of {n_ids}")
    off = 0 if causal_mode == "top_left" else world * (n_k - n_q)
    if causal_mode is not None:
        right = 0 if right < 0 else min(right, 0)
    ring = _Ring(rank, world, layout, n_q, n_k, off, left, right)
    out, lse = _RingAttention.apply(q, k, v, ring, group, scale_f, softcap_f)
    return (out, lse) if return_lse else out
