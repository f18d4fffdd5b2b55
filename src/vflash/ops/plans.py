"""Launch plans: the host-side fast path for repeated calls.

What a call validates, which tiles it picks and how Triton specialises the kernel
depend only on the inputs' metadata (shapes, strides, dtypes, devices, 16-byte
alignment of the data pointers) and the options. The first call with a given
metadata key goes the whole way (validation, launcher, Triton's JIT dispatch) and
records a plan: the compiled kernel bound to its grid, with every launch argument
except the five data pointers. A later call with the same key allocates the
outputs and launches the plan directly.

The key holds each option's type beside its value, so an argument that validation
refuses (causal=1, window=(1.0, 2)) never matches a plan recorded for an accepted
equal value (True, (1, 2)). Calls that would be refused for grad reasons, and the
interpreter, never use plans.
"""

from typing import Callable, Dict, Hashable, Optional, Tuple

import torch

from vflash._backend import interpreting

MAX_PLANS = 4096  # distinct (metadata, options) keys kept; the table is cleared when full

_plans: Dict[Hashable, "LaunchPlan"] = {}

# A plan exists only once CUDA is initialized, so its lookup may read the current
# device without torch.cuda.current_device()'s lazy-init check (~0.5 us a call).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


class LaunchPlan:
    """A recorded launch: call with (q, k, v) of the key's metadata.

    launch(q, k, v, out, lse) runs the kernel; a call without LSE passes out in
    lse's place (the kernel does not store it). With `counter`, launch takes a
    sixth argument, a fresh int32 zero: the work-tile counter of a kernel that
    draws its tiles dynamically."""

    __slots__ = ("launch", "device_index", "out_shape", "lse_shape", "counter")

    def __init__(self, launch: Callable, device_index: int, out_shape: Tuple[int, ...],
                 lse_shape: Optional[Tuple[int, ...]], counter: bool = False):
        self.launch = launch
        self.device_index = device_index
        self.out_shape = out_shape
        self.lse_shape = lse_shape
        self.counter = counter

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        # The key fixes q's dtype and device: they are out's.
        out = q.new_empty(self.out_shape)
        lse = None if self.lse_shape is None else q.new_empty(self.lse_shape, dtype=torch.float32)
        if self.counter:
            self.launch(q, k, v, out, out if lse is None else lse, q.new_zeros(1, dtype=torch.int32))
        else:
            self.launch(q, k, v, out, out if lse is None else lse)
        return out, lse


def plan_key(q, k, v, causal, scale, window, softcap, return_lse) -> Optional[Hashable]:
    """The call's metadata key, or None where plans do not apply. An option that
    cannot be hashed leaves the key unhashable; lookup and record skip it (hashing
    here as well would cost every call a second hash of the key)."""
    if interpreting():
        return None
    try:
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


def lookup(key: Optional[Hashable], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[LaunchPlan]:
    """The plan recorded for key, if it may run now."""
    if key is None:
        return None
    try:
        plan = _plans.get(key)
    except TypeError:  # an unhashable option: the full path decides
        return None
    if plan is None:
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
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
