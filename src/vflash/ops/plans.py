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

from typing import Callable, Dict, Hashable, Optional, Sequence, Tuple

import torch

from vflash._backend import interpreting

MAX_PLANS = 4096  # distinct (metadata, options) keys kept; the table is cleared when full

_plans: Dict[Hashable, "LaunchPlan"] = {}


class LaunchPlan:
    """A recorded launch: call with (q, k, v) of the key's metadata."""

    __slots__ = ("runner", "device", "device_index", "dtype", "out_shape", "lse_shape", "tail", "prepare")

    def __init__(self, runner: Callable, device: torch.device, dtype: torch.dtype,
                 out_shape: Tuple[int, ...], lse_shape: Optional[Tuple[int, ...]], tail: Sequence,
                 prepare: Optional[Callable] = None):
        # prepare(q, k, v, out) -> the kernel's first four arguments (TMA
        # descriptors for the Hopper kernel); None passes the tensors.
        self.runner = runner
        self.prepare = prepare
        self.device = device
        self.device_index = device.index
        self.dtype = dtype
        self.out_shape = out_shape
        self.lse_shape = lse_shape
        self.tail = tuple(tail)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        args = (q, k, v, out) if self.prepare is None else self.prepare(q, k, v, out)
        if self.lse_shape is None:
            self.runner(*args, out, *self.tail)
            return out, None
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        self.runner(*args, lse, *self.tail)
        return out, lse


def plan_key(q, k, v, causal, scale, window, softcap, return_lse) -> Optional[Hashable]:
    """The call's metadata key, or None where plans do not apply."""
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
        hash(key)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, odd options: the full path decides
        return None
    return key


def lookup(key: Optional[Hashable], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[LaunchPlan]:
    """The plan recorded for key, if it may run now."""
    plan = _plans.get(key) if key is not None else None
    if plan is None:
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None  # the full path refuses this call
    if torch.cuda.current_device() != plan.device_index:
        return None  # the full path switches devices around its launch
    return plan


def record(key: Hashable, plan: LaunchPlan) -> None:
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def clear() -> None:
    _plans.clear()
