"""Paged KV caches in PyTorch: the oracle for `vflash.write_kvcache`."""

from typing import Tuple

import torch

from vflash.reference.explicit import attention_explicit


def write_kvcache_reference(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                            slot_mapping: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """New caches (copies): token t's [Hkv, D] rows at slot slot_mapping[t] of the
    cache [num_blocks, block_size, Hkv, D], i.e. block slot // block_size, offset
    slot % block_size; slot -1 skipped."""
    k_out, v_out = k_cache.clone(), v_cache.clone()
    block_size = k_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot == -1:
            continue
        k_out[slot // block_size, slot % block_size] = k_new[t]
        v_out[slot // block_size, slot % block_size] = v_new[t]
    return k_out, v_out


def attention_with_kvcache_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
    block_table: torch.Tensor, cu_seqlens_q: torch.Tensor, *, causal=True, scale=None, window=None, softcap=None,
    sinks=None, compute_dtype=torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed queries q [total_q, Hq, D] against a paged cache [pages, page_size, Hkv, D]:
    each sequence's keys gathered block by block through its block-table row, then explicit
    attention with the queries as the sequence's last tokens (bottom-right alignment).
    Returns (out [total_q, Hq, D], lse [Hq, total_q]) in `compute_dtype`."""
    page = k_cache.shape[1]
    cq, lens, table = cu_seqlens_q.tolist(), cache_seqlens.tolist(), block_table.tolist()
    dt = q.dtype if compute_dtype is None else compute_dtype
    out = torch.zeros((*q.shape[:-1], v_cache.shape[-1]), dtype=dt, device=q.device)  # v's head dim
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=dt, device=q.device)
    for b, n_k in enumerate(lens):
        q0, q1 = cq[b], cq[b + 1]
        if q1 == q0 or (n_k == 0 and sinks is None):
            continue
        pages = table[b][:(n_k + page - 1) // page]
        ids = torch.tensor(pages, dtype=torch.long, device=k_cache.device)
        k = k_cache[ids].flatten(0, 1)[:n_k]  # [n_k, Hkv, D]
        v = v_cache[ids].flatten(0, 1)[:n_k]
        o, l = attention_explicit(q[q0:q1].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                  causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks,
                                  compute_dtype=compute_dtype)
        out[q0:q1] = o[0].transpose(0, 1)
        lse[:, q0:q1] = l[0].to(dt)
    return out, lse
