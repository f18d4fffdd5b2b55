"""Autograd and torch.compile for `vflash.attention` and `vflash.attention_varlen`:
torch.library custom ops, a forward and a backward for each.

`vflash::attention_fwd` (q, k, v and the folded band -> out, lse) and
`vflash::attention_bwd` (dout, dlse, q, k, v, out, lse -> dq, dk, dv), each with a
fake (meta) implementation, so `torch.compile(fullgraph=True)` traces them as single
nodes, and `register_autograd` linking the two: the forward saves q, k, v, out and
lse only. CPU tensors run the kernels through Triton's interpreter, as the rest of
vflash does. The kernels are chosen inside the ops (vflash.dispatch), so the traced
graph holds no launch details. Repeated calls (dense or packed) replay the launch plans
their first call recorded (keys from each op's arguments, vflash.ops.plans.key_function).

Each op's arguments are its tensors, then its layout's options, then the fields of
vflash.call.Score (their types from its annotations): the schemas, the plan keys, the
saved options and the backward's count of gradients all follow from those lists, so a
new score option changes no line here.
"""

import typing
from typing import Callable, Sequence, Tuple

import torch

from vflash import _validate, dispatch
from vflash.call import Band, Call, Packed, Score, Spec
from vflash.ops import forward, plans
from vflash.ops.attention_bwd import attention_backward

Tensor = torch.Tensor

# the score's fields, those with a default (None: off) keeping it, so callers may leave the later ones out
_SCORE = tuple((name, Score.__annotations__[name], *((Score._field_defaults[name],) if name in Score._field_defaults
                                                      else ())) for name in Score._fields)
_DENSE = (("off", int), ("left", int), ("right", int))
_PACKED = (("max_seqlen_q", int), ("max_seqlen_k", int), ("left", int), ("right", int), ("top_left", bool))
_GRADS = (("dout", Tensor), ("dlse", typing.Optional[Tensor]))
_SAVED = (("q", Tensor), ("k", Tensor), ("v", Tensor), ("out", Tensor), ("lse", Tensor))
_CU = (("cu_seqlens_q", Tensor), ("cu_seqlens_k", Tensor))


def _spec(name: str, params) -> Spec:
    return Spec(name, tuple((n, "tensor" if t in (Tensor, typing.Optional[Tensor]) else "option")
                            for n, t, *_ in params))


SPECS = {}  # each op's arguments as its plan key reads them (vflash.call.Spec)
_KEYS = {}  # each op's plan key function (vflash.ops.plans.key_function of its spec)


def _op(name: str, params, returns, impl: Callable) -> Callable:
    """The custom op vflash::`name` with `params` ((name, type) or (name, type, default) in order) calling
    impl(spec, *args)."""
    spec = SPECS[name] = _spec(name, params)
    _KEYS[name] = plans.key_function(spec)
    names = ", ".join(p[0] for p in params)
    signature = ", ".join(f"{p[0]}: {_type_text(p[1])}" + (f" = {p[2]!r}" if len(p) > 2 else "") for p in params)
    text = f"def {name}({signature}) -> {_type_text(returns)}:\n    return _impl(_spec, {names})\n"
    scope = {"typing": typing, "torch": torch, "_impl": impl, "_spec": spec}
    exec(text, scope)  # noqa: S102 (code made from the field lists above)
    fn = scope[name]
    fn.__doc__ = impl.__doc__
    fn.__module__ = __name__
    return torch.library.custom_op(f"vflash::{name}", mutates_args=())(fn)


def _type_text(t) -> str:
    if t is Tensor:
        return "torch.Tensor"
    return t.__name__ if isinstance(t, type) else repr(t)


def _key(spec: Spec, args: tuple):
    return _KEYS[spec.name](*args)


def _forward(spec: Spec, q, k, v, *options):
    """out [B, Hq, Nq, D] in q's dtype and lse [B, Hq, Nq] fp32 (inputs validated by vflash.api)."""
    args = (q, k, v, *options)
    key = _key(spec, args)
    plan = plans.lookup(key)  # inside the op: no autograd to refuse
    if plan is not None:
        return plan(*args)
    band, score = Band(*options[:3]), Score(*options[3:])
    call = Call(q, k, v, None, band, score, True)
    return forward(call, dispatch.choose(call), plan_key=key, plan_inputs=spec.names)


def _backward_op(spec: Spec, dout, dlse, q, k, v, out, lse, *options):
    """(dq, dk, dv) of the loss whose gradients with respect to out and lse are dout and
    dlse (None: lse unused). dlse enters as P * dlse in dS, i.e. delta - dlse."""
    tensors = (dout, dlse, q, k, v, out, lse)
    key = _key(spec, tensors + options)
    plan = plans.lookup(key)
    score = Score(*options[3:])
    if plan is not None:
        return plan(*tensors, score.sinks)
    call = Call(q, k, v, None, Band(*options[:3]), score, True)
    choice = dispatch.select_backward(dispatch.problem_of(call))
    return attention_backward(dout, q, k, v, out, lse, band=call.band, score=call.score, tiles=choice.tiles,
                              dlse=dlse, kernel=choice.kernel, plan_key=key)


def _packed_call(q, k, v, cu_seqlens_q, cu_seqlens_k, options: Sequence, check_metadata: bool) -> Call:
    max_seqlen_q, max_seqlen_k, left, right, top_left = options[:len(_PACKED)]
    layout = Packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, top_left, check_metadata)
    return Call(q, k, v, layout, Band(0, left, right), Score(*options[len(_PACKED):]), True)


def _varlen_forward(spec: Spec, q, k, v, cu_seqlens_q, cu_seqlens_k, *options):
    """Packed sequences: out [total_q, Hq, D] and lse [Hq, total_q] fp32 (inputs validated by vflash.api;
    check_metadata: cu_seqlens' values checked here, at run time, which a traced call cannot do)."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, *options)
    key = _key(spec, args)
    plan = plans.lookup(key)
    if plan is not None and (plan.admit is None or plan.admit(*args)):
        return plan(*args)
    call = _packed_call(q, k, v, cu_seqlens_q, cu_seqlens_k, options[:-1], options[-1])
    choice = dispatch.choose(call)
    return forward(call, choice, dispatch.metadata_tiles(call.batch, q.device), plan_key=key,
                   plan_inputs=spec.names)


def _varlen_backward(spec: Spec, dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *options):
    tensors = (dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    key = _key(spec, tensors + options)
    plan = plans.lookup(key)
    if plan is not None:
        return plan(*tensors, Score(*options[len(_PACKED):]).sinks)
    call = _packed_call(q, k, v, cu_seqlens_q, cu_seqlens_k, options, False)
    choice = dispatch.select_backward(dispatch.problem_of(call))
    layout = call.layout
    return attention_backward(dout, q, k, v, out, lse, band=call.band, score=call.score, tiles=choice.tiles,
                              dlse=dlse, kernel=choice.kernel,
                              varlen=(cu_seqlens_q, cu_seqlens_k, layout.max_seqlen_q, layout.max_seqlen_k,
                                      layout.top_left), plan_key=key)


_PAIR = Tuple[Tensor, Tensor]
_GRADIENTS = Tuple[Tensor, Tensor, Tensor, Tensor]  # dq, dk, dv and dsinks (empty without sinks)
_QKV = (("q", Tensor), ("k", Tensor), ("v", Tensor))
attention_fwd = _op("attention_fwd", _QKV + _DENSE + _SCORE, _PAIR, _forward)
attention_bwd = _op("attention_bwd", _GRADS + _SAVED + _DENSE + _SCORE, _GRADIENTS, _backward_op)
attention_varlen_fwd = _op("attention_varlen_fwd", _QKV + _CU + _PACKED + _SCORE + (("check_metadata", bool, False),),
                           _PAIR, _varlen_forward)
attention_varlen_bwd = _op("attention_varlen_bwd", _GRADS + _SAVED + _CU + _PACKED + _SCORE, _GRADIENTS,
                           _varlen_backward)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, *options):
    B, Hq, Nq = q.shape[:3]
    return q.new_empty((B, Hq, Nq, v.shape[-1])), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, *options):
    total_q, Hq = q.shape[:2]
    return q.new_empty((total_q, Hq, v.shape[-1])), q.new_empty((Hq, total_q), dtype=torch.float32)


def _gradients_fake(name: str):
    sinks_at = SPECS[name].names.index("sinks")

    def fake(dout, dlse, q, k, v, out, lse, *rest):
        sinks = (dout, dlse, q, k, v, out, lse, *rest)[sinks_at] if sinks_at < 7 + len(rest) else None
        return (torch.empty_like(q, memory_format=torch.contiguous_format),
                torch.empty_like(k, memory_format=torch.contiguous_format),
                torch.empty_like(v, memory_format=torch.contiguous_format),
                lse.new_empty((0,) if sinks is None else tuple(sinks.shape), dtype=torch.float32))
    return fake


attention_bwd.register_fake(_gradients_fake("attention_bwd"))
attention_varlen_bwd.register_fake(_gradients_fake("attention_varlen_bwd"))


def _autograd(name: str, forward_op, backward_op, saved_inputs: int, options: int) -> None:
    """Link a forward op (vflash::`name`) (its first `saved_inputs` arguments are tensors the backward takes after
    q, k, v, out, lse; then its `options`, the backward's own, then any it keeps to itself) to its
    backward op: gradients for q, k, v and sinks, None for every other argument."""
    sinks_at = SPECS[name].names.index("sinks")  # the forward's argument
    params = len(SPECS[name].names)

    def setup_context(ctx, inputs, output):
        # trailing arguments left at their defaults (None) may be left out of `inputs`
        inputs = tuple(inputs) + (None,) * (params - len(inputs))
        q, k, v = inputs[:3]
        sinks = inputs[sinks_at]
        ctx.save_for_backward(q, k, v, *output, *inputs[3:saved_inputs], sinks)  # sinks saved as a tensor
        ctx.options = tuple(None if i == sinks_at else x
                            for i, x in enumerate(inputs[saved_inputs:saved_inputs + options], saved_inputs))
        ctx.arguments = len(inputs)
        ctx.set_materialize_grads(False)  # an unused lse's gradient stays None: no zeros made or read

    def backward(ctx, dout, dlse):
        *saved, sinks = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(saved[3])
        options = tuple(sinks if i == sinks_at else x for i, x in enumerate(ctx.options, saved_inputs))
        dq, dk, dv, dsinks = backward_op(dout, dlse, *saved, *options)
        grads = [dq, dk, dv] + [None] * (ctx.arguments - 3)
        if sinks_at < len(ctx.needs_input_grad) and ctx.needs_input_grad[sinks_at]:
            grads[sinks_at] = dsinks
        return tuple(grads[:len(ctx.needs_input_grad)])

    forward_op.register_autograd(backward, setup_context=setup_context)


_autograd("attention_fwd", attention_fwd, attention_bwd, 3, len(_DENSE + _SCORE))
_autograd("attention_varlen_fwd", attention_varlen_fwd, attention_varlen_bwd, 5, len(_PACKED + _SCORE))


def attention(spec: Spec, args: tuple) -> Tuple[Tensor, Tensor]:
    """An entry point's dense or packed call (its arguments in `spec`'s order), validated, through its
    custom op: (out, lse)."""
    call = _validate.call_of(spec, args)
    if call.q.dtype in _validate.FP8_DTYPES:
        raise TypeError("FP8 inputs run forward only, outside autograd and torch.compile: call vflash.attention "
                        "on them under torch.no_grad() (inputs that do not require grad), outside the compiled region")
    layout = call.layout
    if layout is None:
        return attention_fwd(call.q, call.k, call.v, *call.band, *call.score)
    return attention_varlen_fwd(call.q, call.k, call.v, layout.cu_seqlens_q, layout.cu_seqlens_k,
                                layout.max_seqlen_q, layout.max_seqlen_k, call.band.left, call.band.right,
                                layout.top_left, *call.score, layout.check_metadata)
