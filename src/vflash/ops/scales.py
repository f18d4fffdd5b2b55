"""The score scales both forward kernels take."""

from typing import Optional, Sequence, Tuple

import torch

from vflash.call import Score

LOG2E = 1.4426950408889634


def score_scales(score: Score) -> Tuple[float, float, float]:
    """(qk_scale, softcap_in, softcap_out): the scale with log2(e) folded in (the
    kernels use exp2), and for softcap the tanh's input scale, scale / cap, and its
    output scale, cap * log2(e) (1.0 and 1.0 without softcap)."""
    scale, softcap = score.scale, score.softcap
    if softcap is None:
        return scale * LOG2E, 1.0, 1.0
    return scale * LOG2E, scale / softcap, softcap * LOG2E


def descale_strides(descales: Sequence[Optional[torch.Tensor]]) -> Tuple[int, ...]:
    """FP8 descales' (batch, KV head) strides, each's in turn: 0, 0 for a 0-d one (or one not given: the kernel
    reads none)."""
    return tuple(s for d in descales for s in (d.stride() if d is not None and d.dim() == 2 else (0, 0)))
