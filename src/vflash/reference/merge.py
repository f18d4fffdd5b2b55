"""Merging two partial attention results, written from the formula in PyTorch: the
oracle for `vflash.merge_states`."""

from typing import Tuple

import torch


def merge_states_reference(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
                           dtype: torch.dtype = torch.float64) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out [..., D], lse [...]) in `dtype`: lse = log(e^lse_a + e^lse_b), out the two
    outputs weighted by e^(lse_x - lse). A part with lse -inf adds nothing; a row with
    both -inf gets out 0 and lse -inf."""
    la, lb = lse_a.to(dtype), lse_b.to(dtype)
    lse = torch.logaddexp(la, lb)
    none = torch.isneginf(lse)
    safe = torch.where(none, torch.zeros_like(lse), lse)
    wa = torch.where(torch.isneginf(la), torch.zeros_like(la), torch.exp(la - safe))
    wb = torch.where(torch.isneginf(lb), torch.zeros_like(lb), torch.exp(lb - safe))
    oa = torch.where(torch.isneginf(la)[..., None], torch.zeros((), dtype=dtype), out_a.to(dtype))
    ob = torch.where(torch.isneginf(lb)[..., None], torch.zeros((), dtype=dtype), out_b.to(dtype))
    return wa[..., None] * oa + wb[..., None] * ob, lse
