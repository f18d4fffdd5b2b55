"""The public functions: their arguments, in their vflash.call.Spec's order, to the one
pipeline (vflash.pipeline), and their documentation. No checks and no math here."""

from typing import Optional, Tuple, Union

import torch

from vflash import pipeline
from vflash.call import ATTENTION, ATTENTION_KVCACHE, ATTENTION_VARLEN


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: Union[bool, str] = False,
    scale: Optional[float] = None,
    window: Optional[Tuple[int, int]] = None,
    softcap: Optional[float] = None,
    sinks: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact softmax attention, fused in one Triton kernel.

    Layouts of every entry point, and how to go from one to another: docs/layouts.md.

    Args:
        q: [B, Hq, Nq, D] queries. Any strides: a [B, N, H, D] tensor passes as
            ``x.transpose(1, 2)`` with no copy.
        k: [B, Hkv, Nk, D] keys, Hq % Hkv == 0 (GQA / MQA when Hkv < Hq).
        v: [B, Hkv, Nk, D_v] values (D_v may differ from D).
        causal: False; True or "bottom_right" (FlashAttention's alignment, right
            for KV caches); or "top_left" (SDPA's ``is_causal``). The two agree
            when Nq == Nk. For Nq = 2, Nk = 5 (x = visible)::

                bottom_right        top_left
                x x x x .           x . . . .
                x x x x x           x x . . .

        scale: multiplier of q·k; None means 1/sqrt(D).
        window: (left, right) sliding window, -1 for unbounded: query i sees key
            j when i + off - left <= j <= i + off + right, off = Nk - Nq (also
            without causal), or 0 under "top_left". Causal caps right at 0.
        softcap: s -> softcap * tanh(s / softcap) on the scaled scores before the
            softmax (Gemma 2 style); None for off.
        sinks: float32 [Hq], one learnable logit per query head added to every
            row's softmax denominator (an attention sink, gpt-oss's ``s_aux``);
            None for off. With s_ij the scaled (and capped) scores, the sink not
            capped: out_i = sum_j e^{s_ij} v_j / (e^{sink_h} + sum_j e^{s_ij}).
            A -inf entry is no sink for that head; NaN or +inf is refused. Its
            gradient flows when it requires grad (an nn.Parameter).
        q_descale, k_descale, v_descale: FP8 inputs' float32 descales
            (FlashAttention-3's names and convention): a real value is stored *
            descale. Each is a 0-d tensor (per tensor) or [B, Hkv] (per sequence and
            KV head; q's applies to the query heads of that KV head); None means 1.
            Positive and finite (checked on CPU tensors only). Only with FP8 inputs.
        out_dtype: the output's dtype: None for the inputs' (bfloat16 for FP8
            inputs), or with FP8 inputs torch.float16 / torch.bfloat16.
        return_lse: also return the natural-log log-sum-exp of the scaled (and
            capped) scores, [B, Hq, Nq] fp32, for merging partial results; with
            sinks, log(e^{sink_h} + sum_j e^{s_ij}).

    Returns:
        out [B, Hq, Nq, D_v] in the inputs' dtype (out_dtype), contiguous; or (out, lse).
        A query row that sees no key (fully masked, or Nk = 0) gets out = 0 and
        lse = -inf (with sinks: lse = sink_h).

    Parts merged by hand (vflash.merge_states) must carry no sink: compute each part
    with sinks=None, merge them, then add the sink once as one more part, whose
    output is 0 and whose LSE is the sink (docs/features.md, "Attention sinks").

    dtypes: float16, bfloat16, float32 (fp32 products); under torch.autocast, fp32
    inputs run in the autocast dtype. float8_e4m3fn (FP8, all three, forward only:
    no autograd, not under torch.compile): q.k in FP8 with fp32 sums, P rounded to
    e4m3 after its row max is scaled to 256, P.V in FP8 with fp32 sums (docs/features.md).
    Head dims 8..256, any multiple of 8; v's may differ from q's and k's (the output
    takes v's; forward only for now, on the portable kernel). CPU tensors run the
    same kernel through Triton's interpreter (slow; see README).
    Which kernel and tiles run: vflash.dispatch.

    Autograd: when q, k, v or sinks requires grad (or under torch.compile) the call goes
    through the `vflash::attention_fwd` custom op (vflash.library), whose backward
    is deterministic (bitwise the same gradients from run to run) and saves q, k, v,
    out and lse only: the sm_90 Gluon kernels on Hopper where vflash.dispatch.select_backward
    takes them, the portable Triton kernels elsewhere.
    """
    q, k, v = _autocast(q, k, v)
    autograd = _through_library(q, k, v, sinks)
    out, lse = pipeline.attention(ATTENTION, (q, k, v, causal, window, scale, softcap, sinks, q_descale, k_descale,
                                              v_descale, out_dtype, return_lse), autograd)
    return (out, lse) if return_lse else out


def _through_library(*inputs) -> bool:
    # The custom ops (vflash.library) serve calls autograd records and calls torch.compile traces.
    return torch.compiler.is_compiling() or (
        torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in inputs))


def _autocast(q, k, v):
    # SDPA's rule: under autocast, fp32 inputs run in the autocast dtype.
    dev = q.device if isinstance(q, torch.Tensor) else None
    if dev is not None and dev.type in ("cuda", "cpu") and torch.is_autocast_enabled(dev.type):
        dt = torch.get_autocast_dtype(dev.type)
        q, k, v = (t.to(dt) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t for t in (q, k, v))
    return q, k, v


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: Union[bool, str] = False,
    scale: Optional[float] = None,
    window: Optional[Tuple[int, int]] = None,
    softcap: Optional[float] = None,
    sinks: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    return_lse: bool = False,
    check_metadata: bool = True,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact attention over packed sequences of different lengths, in
    FlashAttention's `flash_attn_varlen_func` layout and argument order (docs/layouts.md).

    Args:
        q: [total_q, Hq, D], the batch's queries one sequence after another. Any strides.
        k: [total_k, Hkv, D] keys, Hq % Hkv == 0; v: [total_k, Hkv, D] values.
        cu_seqlens_q: int32 [B + 1], on q's device: sequence b's queries are rows
            cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (0 first, non-decreasing,
            total_q last; zero-length sequences allowed).
        cu_seqlens_k: int32 [B + 1], the same for k and v.
        max_seqlen_q, max_seqlen_k: the longest sequence's lengths (or more).
        causal, scale, window, softcap, sinks: as in `vflash.attention`, with the
            band rule applied to each sequence's own lengths (bottom-right alignment
            puts a sequence's last query on its last key).
        q_descale, k_descale, v_descale, out_dtype: FP8 inputs, as in
            `vflash.attention`; a [B, Hkv] descale's B is the sequence count.
        return_lse: also return the natural-log LSE, [Hq, total_q] fp32.
        check_metadata: check cu_seqlens' values against the packed lengths and
            max_seqlen before launching (one small kernel and one host sync for CUDA
            tensors). Turn off only in a loop whose metadata you have checked: wrong
            offsets then read out of bounds, and a max_seqlen below the longest
            sequence leaves its later rows unwritten. CPU tensors are always checked
            (as True): it costs nothing next to the interpreted kernel.

    Returns:
        out [total_q, Hq, D] in the inputs' dtype (out_dtype); or (out, lse). Rows that see
        no key (a sequence with no keys, say) get 0 and lse = -inf.

    On sm_90 the sm90 kernel takes it where the longest sequence is long enough
    (vflash.dispatch), else the portable Triton kernel; CPU tensors run that one
    through Triton's interpreter. Autocast and autograd as `vflash.attention`'s (custom ops,
    deterministic backward).
    """
    q, k, v = _autocast(q, k, v)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, scale, softcap,
            sinks, q_descale, k_descale, v_descale, out_dtype, return_lse, check_metadata)
    autograd = _through_library(q, k, v, sinks)
    out, lse = pipeline.attention(ATTENTION_VARLEN, args, autograd)
    return (out, lse) if return_lse else out


def merge_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results over disjoint key sets into the result
    over their union, exactly (fp32 arithmetic): the step of split-KV, cascade
    (shared-prefix) attention and ring attention. Each entry point's out and LSE
    as merge_states takes them: docs/layouts.md.

    Args:
        out_a, out_b: [..., D] outputs of one shape and dtype, e.g. [B, H, N, D] from
            `attention` or [total, H, D] from `attention_varlen`.
        lse_a, lse_b: [...] their natural-log LSEs, fp32 (as `return_lse` gives
            them; for varlen outputs pass lse.transpose(0, 1) to match [total, H]).

    Returns:
        (out [..., D] in the outputs' dtype, lse [...] fp32). A part whose lse is
        -inf (it saw no key) adds nothing, whatever its output holds; a row with
        both -inf gets out 0 and lse -inf. A part whose lse is +inf (its scores
        overflowed fp32) takes all the weight (both +inf: half each) and lse is
        +inf, never NaN. Repeats of a call's metadata (CUDA) launch the
        plan its first call recorded.
    """
    return pipeline.merge_states((out_a, lse_a, out_b, lse_b))


def write_kvcache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
    slot_mapping: torch.Tensor, *, k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None, check_metadata: bool = True,
) -> None:
    """Write new tokens' keys and values into a paged KV cache, in place, in one
    kernel (vLLM's `reshape_and_cache_flash`; layouts: docs/layouts.md).

    Args:
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], any block size >= 1 and any
            strides whose slots keep apart (no stride 0 or expand; as Tensor.copy_, a
            destination whose elements overlap is refused), k_cache's memory apart from
            v_cache's. A contiguous cache [B, max_len, Hkv, D] is the case
            block_size = max_len, slot = b * max_len + position.
        k_new, v_new: [T, Hkv, D], the cache's dtype; or float16 / bfloat16 into an FP8
            (float8_e4m3fn) cache pair, stored as saturate_e4m3(x / descale) (vLLM's FP8
            cache write: rounded to nearest even, clamped at +-448).
        slot_mapping: int32 or int64 [T]: token t goes to slot
            slot_mapping[t] = block_id * block_size + offset; -1 skips the token (padding).
        k_descale, v_descale: an FP8 cache's float32 descales, 0-d or [Hkv] (None: 1),
            the ones `attention_with_kvcache` then reads it with.
        check_metadata: check every slot is -1 or a distinct slot of the cache before
            the launch (one host sync for CUDA tensors). Unchecked, a slot outside the
            cache is skipped like -1 (never written out of bounds) and a slot given twice
            takes either token. Repeats of a call's metadata launch the plan its first
            call recorded (after the slots' check where it is on). CPU tensors are always
            checked (as True): it costs nothing next to the interpreted kernel.
    """
    pipeline.write_kvcache((k_cache, v_cache, k_new, v_new, slot_mapping, k_descale, v_descale, check_metadata))


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    block_table: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    causal: Union[bool, str] = True,
    scale: Optional[float] = None,
    window: Optional[Tuple[int, int]] = None,
    softcap: Optional[float] = None,
    sinks: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    num_splits: Optional[int] = None,
    batch_invariant: bool = False,
    return_lse: bool = False,
    check_metadata: bool = True,
    out: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of new queries against a KV cache (decode and chunked prefill), in
    FlashAttention's `flash_attn_with_kvcache` layout, not `attention`'s (docs/layouts.md).

    Args:
        q: [B, Nq, Hq, D] (the same Nq new queries per sequence), or packed
            [total_q, Hq, D] with `cu_seqlens_q` (int32 [B + 1]) and `max_seqlen_q`.
            `attention`'s [B, Hq, Nq, D] passes as q.transpose(1, 2). Against a one-head
            cache, dense q [B, Nq > 1, 1, D] is refused (`attention`'s decode query of Nq
            heads has that shape too): pass a one-head model's queries packed.
        k_cache, v_cache: contiguous [B, max_len, Hkv, D], or paged
            [num_pages, page_size, Hkv, D] with `block_table`; any page size >= 1,
            pages may be shared between sequences. q's dtype, or float8_e4m3fn (an FP8
            cache, half the bytes decode reads) with `k_descale` / `v_descale`.
            v_cache's head dim D_v may differ from D. A latent cache (MLA): v_cache =
            k_cache[..., :D_v], a view of the same memory, read once for both products; D
            then up to 576 and D_v up to 512 (DeepSeek's 512 + 64 with D_v 512), else 256.
        cache_seqlens: int32 [B], the valid keys of each sequence, the new queries'
            own keys included (written before the call, e.g. by `write_kvcache`).
        block_table: int32 [B, max_pages]: sequence b's key j is row j % page_size of
            page block_table[b, j // page_size].
        causal: True (or "bottom_right") or False: the queries are the last tokens
            of their sequence (bottom-right alignment); "top_left" is refused.
        scale, window, softcap, sinks: as in `vflash.attention`, per sequence; the sink
            enters once, at the merged result of a split sequence, never in a split's partial.
        k_descale, v_descale: an FP8 cache's float32 descales (a real value is stored *
            descale): 0-d (the cache's), [Hkv] (a KV head's) or [B, Hkv] (a sequence's KV
            head's); None means 1. The keys and values are read in FP8 and widened to q's
            dtype in registers (exact); `write_kvcache` with the same descales fills such a cache.
        num_splits: split-KV: each sequence's keys are split across this many programs
            and their partial results merged through their LSEs (deterministic: a
            fixed-order combine, the same bits from run to run). None picks it from
            how many (sequence, KV head) programs the batch has against the GPU's
            SMs and the cache's capacity; 1 turns splitting off.
        batch_invariant: fix the tiles and each split's length (512 keys, at most 32
            splits a sequence), so a sequence's output is bitwise the same whatever else
            is in the batch (its splits depend only on its own length). Not with
            num_splits.
        return_lse: also return the LSE, [B, Hq, Nq] (or [Hq, total_q] packed), fp32.
        check_metadata: check cache_seqlens against the cache's capacity, the pages
            each sequence uses and cu_seqlens_q before the launch (one small kernel and
            one host sync for CUDA tensors, so not inside a CUDA-graph capture); off
            only for metadata you have checked (a wrong page id reads out of bounds).
            CPU tensors are always checked (as True): it costs nothing next to the
            interpreted kernel.
        out: where to write the output (a serving engine's own buffer; saves the
            allocation): q's shape, dtype and device, unit stride in the head dim, [B, Nq]
            strides that merge for dense q, its memory apart from every input's.

    Returns:
        out in q's layout and dtype (the given `out` itself); or (out, lse). A query row that sees no key
        (more new queries than keys, say) gets 0 and lse = -inf (with sinks: its head's sink).

    Decode packs the query heads of a KV head into one program's rows (GQA packing),
    so each cache tile is read once per KV head, on the portable Triton kernel (CPU
    tensors through Triton's interpreter). Chunked prefill on sm_90 runs the Hopper
    kernel where the cache suits it (contiguous, or power-of-two pages of 16 rows or
    more; vflash.dispatch). No backward pass.
    """
    # cache_seqlens' values are not part of a plan's key: a generation loop's growing lengths keep one plan
    result, lse = pipeline.attention(ATTENTION_KVCACHE, (
        q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q, causal, window, scale, softcap,
        sinks, None, k_descale, v_descale, num_splits, batch_invariant, return_lse, check_metadata, out))
    return _kvcache_result(result if out is None else out, lse, q.shape, cu_seqlens_q is None, return_lse)


def _kvcache_result(out, lse, q_shape, dense_q: bool, return_lse: bool):
    # Packed rows back in q's layout: [B, Nq, Hq, D] and lse [B, Hq, Nq] for dense q.
    if dense_q:
        batch, n_q = q_shape[0], q_shape[1]
        if out.dim() == 3:  # the full path's rows (a plan allocates or takes out in q's layout)
            out = out.view(batch, n_q, out.shape[1], out.shape[2])
        if lse is not None:
            lse = lse.view(lse.shape[0], batch, n_q).transpose(0, 1).contiguous()
    return (out, lse) if return_lse else out
