"""The public functions. Argument handling and documentation only; no math."""

from typing import Optional, Tuple, Union

import torch

from vflash import _validate, dispatch
from vflash.ops import attention_forward, attention_varlen_forward, mask_band, plans, sequence_band
from vflash.ops.cache import write_kvcache_forward
from vflash.ops.combine import merge_states_forward


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: Union[bool, str] = False,
    scale: Optional[float] = None,
    window: Optional[Tuple[int, int]] = None,
    softcap: Optional[float] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact softmax attention, fused in one Triton kernel.

    Args:
        q: [B, Hq, Nq, D] queries. Any strides: a [B, N, H, D] tensor passes as
            ``x.transpose(1, 2)`` with no copy.
        k: [B, Hkv, Nk, D] keys, Hq % Hkv == 0 (GQA / MQA when Hkv < Hq).
        v: [B, Hkv, Nk, D] values.
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
        return_lse: also return the natural-log log-sum-exp of the scaled (and
            capped) scores, [B, Hq, Nq] fp32, for merging partial results.

    Returns:
        out [B, Hq, Nq, D] in the inputs' dtype, contiguous; or (out, lse).
        A query row that sees no key (fully masked, or Nk = 0) gets out = 0 and
        lse = -inf.

    dtypes: float16, bfloat16, float32 (fp32 products). Head dims 8..256, any
    multiple of 8. CPU tensors run the same kernel through Triton's interpreter
    (slow; see README). Which kernel and tiles run: vflash.dispatch. No
    backward pass yet: inputs that require grad are refused while autograd is
    recording.
    """
    # Repeated calls with the same metadata and options skip straight to the launch
    # recorded by the first one (vflash.ops.plans); everything else is checked here.
    key = plans.plan_key(q, k, v, causal, scale, window, softcap, return_lse)
    plan = plans.lookup(key, q, k, v)
    if plan is not None:
        out, lse = plan(q, k, v)
        return (out, lse) if return_lse else out
    _validate.check_qkv(q, k, v)
    causal_mode = _validate.resolve_causal(causal)
    window_lr = _validate.check_window(window)
    scale_f = _validate.check_scale(scale, q.shape[-1])
    softcap_f = _validate.check_softcap(softcap)
    return_lse = _validate.check_flag("return_lse", return_lse)
    _validate.check_no_grad(q, k, v)
    band = mask_band(q.shape[2], k.shape[2], causal_mode, window_lr)
    choice = dispatch.select(dispatch.problem_of(q, k, v, None, band))
    out, lse = attention_forward(q, k, v, band=band, scale=scale_f, softcap=softcap_f, return_lse=return_lse,
                                 tiles=choice.tiles, plan_key=key)
    return (out, lse) if return_lse else out


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
    return_lse: bool = False,
    check_metadata: bool = True,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact attention over packed sequences of different lengths, in
    FlashAttention's `flash_attn_varlen_func` layout and argument order.

    Args:
        q: [total_q, Hq, D], the batch's queries one sequence after another. Any strides.
        k: [total_k, Hkv, D] keys, Hq % Hkv == 0; v: [total_k, Hkv, D] values.
        cu_seqlens_q: int32 [B + 1], on q's device: sequence b's queries are rows
            cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (0 first, non-decreasing,
            total_q last; zero-length sequences allowed).
        cu_seqlens_k: int32 [B + 1], the same for k and v.
        max_seqlen_q, max_seqlen_k: the longest sequence's lengths (or more).
        causal, scale, window, softcap: as in `vflash.attention`, with the band
            rule applied to each sequence's own lengths (bottom-right alignment
            puts a sequence's last query on its last key).
        return_lse: also return the natural-log LSE, [Hq, total_q] fp32.
        check_metadata: check cu_seqlens' values against the packed lengths and
            max_seqlen before launching (one host sync for CUDA tensors). Turn off
            only in a loop whose metadata you have checked: wrong offsets then
            read out of bounds, and a max_seqlen below the longest sequence
            leaves its later rows unwritten.

    Returns:
        out [total_q, Hq, D] in the inputs' dtype; or (out, lse). Rows that see
        no key (a sequence with no keys, say) get 0 and lse = -inf.

    Runs the portable Triton kernel (no sm_90 varlen path yet); CPU tensors run
    it through Triton's interpreter. No backward pass yet.
    """
    batch = _validate.check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   _validate.check_flag("check_metadata", check_metadata))
    causal_mode = _validate.resolve_causal(causal)
    window_lr = _validate.check_window(window)
    scale_f = _validate.check_scale(scale, q.shape[-1])
    softcap_f = _validate.check_softcap(softcap)
    return_lse = _validate.check_flag("return_lse", return_lse)
    _validate.check_no_grad(q, k, v)
    band = sequence_band(causal_mode, window_lr)
    choice = dispatch.select(dispatch.varlen_problem_of(q, k, batch, max_seqlen_q, max_seqlen_k, band))
    out, lse = attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, band=band,
                                        top_left=causal_mode == "top_left", scale=scale_f, softcap=softcap_f,
                                        return_lse=return_lse, tiles=choice.tiles)
    return (out, lse) if return_lse else out


def merge_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results over disjoint key sets into the result
    over their union, exactly (fp32 arithmetic): the step of split-KV, cascade
    (shared-prefix) attention and ring attention.

    Args:
        out_a, out_b: [..., D] outputs of one shape and dtype, e.g. [B, H, N, D] from
            `attention` or [total, H, D] from `attention_varlen`.
        lse_a, lse_b: [...] their natural-log LSEs, fp32 (as `return_lse` gives
            them; for varlen outputs pass lse.transpose(0, 1) to match [total, H]).

    Returns:
        (out [..., D] in the outputs' dtype, lse [...] fp32). A part whose lse is
        -inf (it saw no key) adds nothing, whatever its output holds; a row with
        both -inf gets out 0 and lse -inf.
    """
    _validate.check_merge(out_a, lse_a, out_b, lse_b)
    return merge_states_forward(out_a, lse_a, out_b, lse_b, dispatch.merge_tiles(out_a.shape[-1], out_a.device))


def write_kvcache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
    slot_mapping: torch.Tensor, *, check_metadata: bool = True,
) -> None:
    """Write new tokens' keys and values into a paged KV cache, in place, in one
    kernel (vLLM's `reshape_and_cache_flash`).

    Args:
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], any block size >= 1 and any
            strides. A contiguous cache [B, max_len, Hkv, D] is the case
            block_size = max_len, slot = b * max_len + position.
        k_new, v_new: [T, Hkv, D], the cache's dtype.
        slot_mapping: int32 or int64 [T]: token t goes to slot
            slot_mapping[t] = block_id * block_size + offset; -1 skips the token (padding).
        check_metadata: check every slot is -1 or a distinct slot of the cache before
            the launch (one host sync for CUDA tensors); off only for slots you have
            checked (an out-of-range slot would write out of bounds).
    """
    _validate.check_kvcache_write(k_cache, v_cache, k_new, v_new, slot_mapping,
                                  _validate.check_flag("check_metadata", check_metadata))
    write_kvcache_forward(k_cache, v_cache, k_new, v_new, slot_mapping, dispatch.cache_write_tiles())
