"""Launch plans: the host-side fast path for repeated calls.

What a call validates, which tiles it picks and how Triton specialises the kernel
depend only on the inputs' metadata (shapes, strides, dtypes, devices, 16-byte
alignment of the data pointers) and the options. The first call with a given
metadata key goes the whole way (validation, dispatch, launcher, Triton's JIT
dispatch) and records a plan (`vflash.ops.launch.record`): the compiled kernel
bound to its grid, with every launch argument but the per-call slots. A later
call with the same key allocates the outputs and launches the plan directly.

The key holds each option's type beside its value, so an argument that validation
refuses (causal=1, window=(1.0, 2)) never matches a plan recorded for an accepted
equal value (True, (1, 2)). Calls that would be refused for grad reasons, and
interpreted calls (CPU tensors), never use plans.
"""

from typing import Callable, Dict, Hashable, Optional, Sequence, Tuple

import torch

from vflash import _backend
from vflash.call import Spec

MAX_PLANS = 4096  # distinct (metadata, options) keys kept; the table is cleared when full

_plans: Dict[Hashable, "LaunchPlan"] = {}

# A plan exists only once CUDA is initialized, so its lookup may read the current
# device without torch.cuda.current_device()'s lazy-init check (~0.5 us a call).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


class LaunchPlan:
    """A recorded launch: call with the inputs of the key's metadata (for
    attention q, k, v); returns the outputs `picks` names (None where absent).

    launch(*inputs, *allocations, *scratch) runs the kernel; `allocs` are the
    outputs allocated per call (vflash.ops.launch.Alloc), zero-filled where asked
    (a work-tile counter); `scratch()`, where given, returns the call's scratch
    tensors (split-KV's, from vflash.ops.scratch: the current stream's pool). `admit`, where
    given, is what the caller runs on the call's arguments before the plan, beyond their
    metadata: the metadata's values checked (a ValueError naming the offender), and False where
    the full path must take the call instead (attention_with_kvcache: a caller's out that
    overlaps an input)."""

    __slots__ = ("launch", "device_index", "allocs", "picks", "scratch", "admit", "like_first")

    def __init__(self, launch: Callable, device_index: int, allocs: tuple, picks: Tuple[Optional[int], ...],
                 scratch: Optional[Callable[[], tuple]] = None, admit: Optional[Callable[..., bool]] = None):
        self.launch = launch
        self.device_index = device_index
        self.allocs = allocs
        self.picks = picks
        self.scratch = scratch
        self.admit = admit
        self.like_first: Optional[Tuple[bool, ...]] = None  # set by the first call

    def __call__(self, *inputs: torch.Tensor):
        # The key fixes the first input's device (every allocation's) and its shape, dtype and strides: an
        # allocation of exactly those (attention's out of a contiguous q) is torch.empty_like of it, which
        # parses fewer arguments than new_empty (about half its host time). Decided at the first call.
        first = inputs[0]
        like = self.like_first
        if like is None:
            like = self.like_first = tuple(_same_contiguous(a, first) for a in self.allocs)
        made = [torch.empty_like(first) if same else
                first.new_zeros(a.shape, dtype=a.dtype) if a.zero else first.new_empty(a.shape, dtype=a.dtype)
                for a, same in zip(self.allocs, like)]
        tensors = inputs + tuple(made) + (self.scratch() if self.scratch is not None else ())
        self.launch(*tensors)
        return tuple(None if i is None else tensors[i] for i in self.picks)


def _same_contiguous(alloc, t: torch.Tensor) -> bool:
    """Whether `alloc` (ops.launch.Alloc) is t's shape and dtype, uninitialised, with t in the
    contiguous layout new_empty would give (its strides exactly, size-1 dimensions included)."""
    if alloc.zero or alloc.dtype != t.dtype or tuple(alloc.shape) != tuple(t.shape):
        return False
    stride, strides = 1, []
    for n in reversed(t.shape):
        strides.append(stride)
        stride *= n
    return tuple(reversed(strides)) == t.stride()


def _planned(q: torch.Tensor) -> bool:
    """Plans record compiled launches: CUDA tensors, the interpreter not forced."""
    return q.is_cuda and not _backend.INTERPRET_ALL


def key_function(spec: Spec) -> Callable[..., Optional[Hashable]]:
    """The plan key of `spec`'s entry point as a function of its arguments in order (vflash.call.Spec):
    the entry's name, each tensor's metadata (None where absent), each option's type and value, or None
    where plans do not apply (the first tensor not a compiled CUDA launch's, a "flag" not a bool, an
    argument not what its kind says: the full path decides). An option that cannot be hashed leaves
    the key unhashable; lookup and record skip it (hashing here as well would cost every call a second
    hash of the key). Generated once per spec, as plain code: a repeat call's key costs what a
    hand-written one does."""
    params = spec.names
    first = params[0]
    lines = [f"def key({', '.join(params)}):", "    try:",
             f"        if not _planned({first}):", "            return None"]
    parts = [repr(spec.name)]
    for i, (name, kind) in enumerate(spec.params):
        if kind == "tensor":
            meta = (f"{name}.shape, {name}.stride(), {name}.dtype, {name}.device, {name}.data_ptr() & 15")
            parts.append(meta if i == 0 else f"None if {name} is None else ({meta})")
        elif kind == "option":
            parts.append(f"{name}.__class__, {name}")
        elif kind == "pair":
            parts.append(f"None if {name} is None else ({name}.__class__, *[(w.__class__, w) for w in {name}])")
        elif kind == "flag":
            lines += [f"        if {name}.__class__ is not bool:", "            return None"]
            parts.append(name)
        else:
            raise ValueError(f"{spec.name}: unknown argument kind {kind!r} of {name}")
    lines += [f"        return ({', '.join(parts)})",
              "    except (AttributeError, TypeError, RuntimeError):  # not tensors, odd options",
              "        return None"]
    made = {}
    exec("\n".join(lines), globals(), made)  # noqa: S102 (code made from the spec's names above)
    return made["key"]


def op_plan_key(op: str, tensors: Sequence[Optional[torch.Tensor]], options: tuple) -> Optional[Hashable]:
    """The key of an internal launch's plan (the metadata check's): `op`'s name, its tensors' metadata
    (None where an optional tensor is absent) and its options, each with its type."""
    try:
        if not _planned(tensors[0]):
            return None
        key = (op, *map(_meta, tensors), *((o.__class__, o) for o in options))
    except (AttributeError, TypeError, RuntimeError):  # not tensors, odd options: the full path decides
        return None
    return key


def _meta(t) -> Optional[tuple]:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def lookup(key: Optional[Hashable]) -> Optional[LaunchPlan]:
    """The plan recorded for key, if it may run now (a caller whose full path refuses inputs that
    require grad checks that before running it)."""
    if key is None:
        return None
    try:
        plan = _plans.get(key)
    except TypeError:  # an unhashable option: the full path decides
        return None
    if plan is None:
        return None
    if _current_device() != plan.device_index:
        return None  # the full path switches devices around its launch
    return plan


def record(key: Hashable, plan: LaunchPlan) -> None:
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    try:
        _plans[key] = plan
    except TypeError:  # unhashable key: this call's options are never planned
        pass


def clear() -> None:
    _plans.clear()
