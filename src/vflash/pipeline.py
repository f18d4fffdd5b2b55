"""The one path of every public call: plan lookup, validate, dispatch, launch.

An entry point (vflash.api) passes its arguments in its vflash.call.Spec's order. A repeat
of a call's metadata and options runs the launch plan its first call recorded
(vflash.ops.plans), after the plan's own admission (the metadata values checked, a
caller's out apart from the inputs); any other call is validated into a vflash.call.Call
(vflash._validate), its kernel chosen (vflash.dispatch) and launched (vflash.ops), which
records the plan. Calls autograd records, and calls torch.compile traces, go through the
custom ops instead (vflash.library), which have plans of their own.
"""

from typing import Optional, Tuple

import torch

from vflash import _validate, dispatch, library
from vflash.call import ATTENTION, ATTENTION_KVCACHE, ATTENTION_VARLEN, MERGE_STATES, WRITE_KVCACHE, Spec
from vflash.ops import forward, plans
from vflash.ops.cache import write_kvcache_forward
from vflash.ops.combine import merge_states_forward

Tensor = torch.Tensor


def _keyed_lookup(spec: Spec):
    # (key, the plan recorded for it or None) as a function of the entry point's arguments
    key_of = plans.key_function(spec)

    def lookup(*args):
        key = key_of(*args)
        return key, plans.lookup(key)
    return lookup


_LOOKUP = {spec.name: _keyed_lookup(spec) for spec in (ATTENTION, ATTENTION_VARLEN, ATTENTION_KVCACHE)}
_SINKS_AT = {spec.name: spec.names.index("sinks") for spec in (ATTENTION, ATTENTION_VARLEN, ATTENTION_KVCACHE)}
_MERGE_KEY = plans.key_function(MERGE_STATES)
_WRITE_KEY = plans.key_function(WRITE_KVCACHE)


def attention(spec: Spec, args: tuple, autograd: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """(out, lse or None) of an attention entry point's call, in its layout's shapes (rows for a KV
    cache's dense q on the full path; the caller's out where given). autograd: a dense or packed call
    that autograd records or torch.compile traces, run by its custom op (vflash.library)."""
    if autograd:
        return library.attention(spec, args)
    key, plan = _LOOKUP[spec.name](*args)
    sinks = args[_SINKS_AT[spec.name]]
    # a plan serves no call whose full path refuses inputs that require grad (attention_with_kvcache's), nor
    # sinks whose values no call has checked since their last write (_validate.check_sinks)
    if plan is not None and not (torch.is_grad_enabled() and (
            args[0].requires_grad or args[1].requires_grad or args[2].requires_grad
            or (sinks is not None and sinks.requires_grad))) and (
            sinks is None or _validate.sinks_checked(sinks)) and (plan.admit is None or plan.admit(*args)):
        return plan(*args)
    call = _validate.call_of(spec, args)
    if call.q.data_ptr() != args[0].data_ptr():
        key = None  # validation copied q (strides that do not merge): a plan could not take the caller's q
    choice = dispatch.choose(call)
    check_tiles = None if call.layout is None else dispatch.metadata_tiles(call.batch, call.q.device)
    return forward(call, choice, check_tiles, plan_key=key, plan_inputs=spec.names)


def merge_states(args: tuple) -> Tuple[Tensor, Tensor]:
    key = _MERGE_KEY(*args)
    plan = plans.lookup(key)
    if plan is not None:
        return plan(*args)
    _validate.check_merge(*args)
    return merge_states_forward(*args, dispatch.merge_tiles(args[0].shape[-1], args[0].device), plan_key=key)


def write_kvcache(args: tuple) -> None:
    key = _WRITE_KEY(*args)
    plan = plans.lookup(key)
    if plan is not None and (plan.admit is None or plan.admit(*args)):
        plan(*args[:-1])
        return
    check = _validate.check_kvcache_write(*args)
    write_kvcache_forward(*args[:-1], tiles=dispatch.cache_write_tiles(), check_metadata=check, plan_key=key)
