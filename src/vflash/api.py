"""The public functions. Argument handling and documentation only; no math."""

from typing import Optional, Tuple, Union

import torch

from vflash import _validate, dispatch
from vflash.ops import attention_forward, mask_band, plans


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
