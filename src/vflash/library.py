"""Autograd and torch.compile for `vflash.attention` and `vflash.attention_varlen`:
torch.library custom ops, a forward and a backward for each.

`vflash::attention_fwd` (q, k, v and the folded band -> out, lse) and
`vflash::attention_bwd` (dout, dlse, q, k, v, out, lse -> dq, dk, dv), each with a
fake (meta) implementation, so `torch.compile(fullgraph=True)` traces them as single
nodes, and `register_autograd` linking the two: the forward saves q, k, v, out and
lse only. CPU tensors run the kernels through Triton's interpreter, as the rest of
vflash does. The kernels are chosen inside the ops (vflash.dispatch), so the traced
graph holds no launch details. Repeated calls (dense or packed) replay the launch plans
(vflash.ops.plans.op_plan_key) their first call recorded.
"""

from typing import Optional, Tuple

import torch

from vflash import _validate, dispatch
from vflash.ops import attention_forward, attention_varlen_forward
from vflash.ops import plans
from vflash.ops.attention_bwd import attention_backward
from vflash.ops.band import Band

Tensor = torch.Tensor


@torch.library.custom_op("vflash::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, off: int, left: int, right: int, scale: float,
                  softcap: Optional[float]) -> Tuple[Tensor, Tensor]:
    """out [B, Hq, Nq, D] in q's dtype and lse [B, Hq, Nq] fp32 (inputs validated by vflash.api)."""
    key = plans.op_plan_key("attention_fwd", (q, k, v), (off, left, right, scale, softcap))
    plan = plans.lookup(key)  # inside the op: no autograd to refuse
    if plan is not None:
        return plan(q, k, v)
    band = Band(off, left, right)
    choice = dispatch.select(dispatch.problem_of(q, k, v, None, band))
    return attention_forward(q, k, v, band=band, scale=scale, softcap=softcap, return_lse=True, tiles=choice.tiles,
                             kernel=choice.kernel, plan_key=key)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, off, left, right, scale, softcap):
    B, Hq, Nq, D = q.shape
    return q.new_empty((B, Hq, Nq, D)), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@torch.library.custom_op("vflash::attention_bwd", mutates_args=())
def attention_bwd(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  off: int, left: int, right: int, scale: float,
                  softcap: Optional[float]) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the loss whose gradients with respect to out and lse are dout and
    dlse (None: lse unused). dlse enters as P * dlse in dS, i.e. delta - dlse."""
    key = plans.op_plan_key("attention_bwd", (dout, dlse, q, k, v, out, lse), (off, left, right, scale, softcap))
    plan = plans.lookup(key)
    if plan is not None:
        return plan(dout, dlse, q, k, v, out, lse)
    band = Band(off, left, right)
    choice = dispatch.select_backward(dispatch.problem_of(q, k, v, None, band))
    return attention_backward(dout, q, k, v, out, lse, band=band, scale=scale, softcap=softcap, tiles=choice.tiles,
                              dlse=dlse, kernel=choice.kernel, plan_key=key)


@attention_bwd.register_fake
def _attention_bwd_fake(dout, dlse, q, k, v, out, lse, off, left, right, scale, softcap):
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    q, k, v, off, left, right, scale, softcap = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (off, left, right, scale, softcap)
    ctx.set_materialize_grads(False)  # an unused lse's gradient stays None: no zeros made or read


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_bwd(dout, dlse, q, k, v, out, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("vflash::attention_varlen_fwd", mutates_args=())
def attention_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         max_seqlen_q: int, max_seqlen_k: int, left: int, right: int, top_left: bool, scale: float,
                         softcap: Optional[float], check_metadata: bool = False) -> Tuple[Tensor, Tensor]:
    """Packed sequences: out [total_q, Hq, D] and lse [Hq, total_q] fp32 (inputs validated by vflash.api;
    check_metadata: cu_seqlens' values checked here, at run time, which a traced call cannot do)."""
    if check_metadata:
        _validate.check_varlen_offsets(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
    key = plans.op_plan_key("attention_varlen_fwd", (q, k, v, cu_seqlens_q, cu_seqlens_k),
                            (max_seqlen_q, max_seqlen_k, left, right, top_left, scale, softcap))
    plan = plans.lookup(key)
    if plan is not None:
        return plan(q, k, v, cu_seqlens_q, cu_seqlens_k)
    band = Band(0, left, right)
    choice = dispatch.select(dispatch.varlen_problem_of(q, cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k,
                                                        band, kv=(k, v)))
    return attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, band=band, top_left=top_left,
                                    scale=scale, softcap=softcap, return_lse=True, tiles=choice.tiles,
                                    kernel=choice.kernel, plan_key=key)


@attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, left, right,
                               top_left, scale, softcap, check_metadata=False):
    total_q, Hq, D = q.shape
    return q.new_empty((total_q, Hq, D)), q.new_empty((Hq, total_q), dtype=torch.float32)


@torch.library.custom_op("vflash::attention_varlen_bwd", mutates_args=())
def attention_varlen_bwd(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                         lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, left: int, right: int, top_left: bool, scale: float,
                         softcap: Optional[float]) -> Tuple[Tensor, Tensor, Tensor]:
    key = plans.op_plan_key("attention_varlen_bwd", (dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k),
                            (max_seqlen_q, max_seqlen_k, left, right, top_left, scale, softcap))
    plan = plans.lookup(key)
    if plan is not None:
        return plan(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    band = Band(0, left, right)
    problem = dispatch.varlen_problem_of(q, cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k, band, kv=(k, v))
    choice = dispatch.select_backward(problem)
    return attention_backward(dout, q, k, v, out, lse, band=band, scale=scale, softcap=softcap,
                              tiles=choice.tiles, dlse=dlse, kernel=choice.kernel,
                              varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, top_left), plan_key=key)


@attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(dout, dlse, q, k, v, out, lse, *rest):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _setup_varlen(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.options = tuple(options[:-1])  # the lengths, band, scale and softcap: all but check_metadata


def _backward_varlen(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_varlen_bwd(dout, dlse, q, k, v, out, lse, cu_q, cu_k, *ctx.options)
    return (dq, dk, dv) + (None,) * 10


attention_varlen_fwd.register_autograd(_backward_varlen, setup_context=_setup_varlen)
