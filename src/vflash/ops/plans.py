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
    tensors (split-KV's, from vflash.ops.scratch: the current stream's pool). `guard`, where
    given, is what the caller checks before running the plan on this call's tensors beyond
    their metadata (attention_with_kvcache: that a caller's out overlaps no input)."""

    __slots__ = ("launch", "device_index", "allocs", "picks", "scratch", "guard", "like_first")

    def __init__(self, launch: Callable, device_index: int, allocs: tuple, picks: Tuple[Optional[int], ...],
                 scratch: Optional[Callable[[], tuple]] = None, guard: Optional[Callable[..., bool]] = None):
        self.launch = launch
        self.device_index = device_index
        self.allocs = allocs
        self.picks = picks
        self.scratch = scratch
        self.guard = guard
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


def plan_key(q, k, v, causal, scale, window, softcap, return_lse) -> Optional[Hashable]:
    """The call's metadata key, or None where plans do not apply. An option that
    cannot be hashed leaves the key unhashable; lookup and record skip it (hashing
    here as well would cost every call a second hash of the key)."""
    try:
        if not _planned(q):
            return None
        if window is not None:
            window = (window.__class__, *[(w.__class__, w) for w in window])
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
               q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
               q.data_ptr() & 15, k.data_ptr() & 15, v.data_ptr() & 15,
               causal.__class__, causal, scale.__class__, scale, window, softcap.__class__, softcap,
               return_lse.__class__, return_lse)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, odd options: the full path decides
        return None
    return key


def _meta(t) -> Optional[tuple]:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def kvcache_plan_key(q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q, causal, scale,
                     window, softcap, num_splits, batch_invariant, return_lse,
                     check_metadata, out=None) -> Optional[Hashable]:
    """attention_with_kvcache's key: the tensors' metadata (not cache_seqlens' values:
    a generation loop's growing lengths keep one plan; a given out's, None without) and
    the options. A checked call's repeat runs the metadata's value check
    (vflash._validate.check_kvcache_metadata) before its plan."""
    try:
        if check_metadata.__class__ is not bool or not _planned(q):
            return None
        if window is not None:
            window = (window.__class__, *[(w.__class__, w) for w in window])
        key = ("kvcache", _meta(q), _meta(k_cache), _meta(v_cache), _meta(cache_seqlens), _meta(block_table),
               _meta(cu_seqlens_q), max_seqlen_q.__class__, max_seqlen_q, causal.__class__, causal,
               scale.__class__, scale, window, softcap.__class__, softcap, num_splits.__class__, num_splits,
               batch_invariant.__class__, batch_invariant, return_lse.__class__, return_lse, check_metadata,
               _meta(out))
    except (AttributeError, TypeError, RuntimeError):  # not tensors, odd options: the full path decides
        return None
    return key


def op_plan_key(op: str, tensors: Sequence[Optional[torch.Tensor]], options: tuple) -> Optional[Hashable]:
    """The key of a call of one of vflash.library's custom ops (already validated upstream): `op`'s
    name, its tensors' metadata (None where an optional tensor is absent) and its options, each
    with its type. The ops' plans serve the calls autograd records (training), which the API's
    plans leave to the full path."""
    try:
        if not _planned(tensors[0]):
            return None
        key = (op, *map(_meta, tensors), *((o.__class__, o) for o in options))
    except (AttributeError, TypeError, RuntimeError):  # not tensors, odd options: the full path decides
        return None
    return key


def lookup(key: Optional[Hashable], *inputs: torch.Tensor) -> Optional[LaunchPlan]:
    """The plan recorded for key, if it may run now."""
    if key is None:
        return None
    try:
        plan = _plans.get(key)
    except TypeError:  # an unhashable option: the full path decides
        return None
    if plan is None:
        return None
    if torch.is_grad_enabled():
        for t in inputs:
            if t.requires_grad:
                return None  # the full path refuses this call
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
