"""Incremental peak memory of one call, on CUDA or on the CPU.

CUDA: the caching allocator's peak above what was allocated before the call.
CPU: PyTorch has no allocator statistics there, so a dispatch mode follows every
tensor an operator returns, by storage, until it is freed, and keeps the peak of
the live total. It sees tensors only (the Triton interpreter's own numpy
scratch is not counted), which is what the comparison is about.
"""

import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class _PeakTracker(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = {}  # storage data_ptr -> [nbytes, tensors alive on it]
        self.current = 0
        self.peak = 0

    def _release(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[ptr]
            self.current -= entry[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Storages the op was given: an output on one of them (a view, an in-place
        # result, `set_`) allocated nothing.
        given = set()
        for a in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(a, torch.Tensor):
                given.add(a.untyped_storage().data_ptr())
            elif isinstance(a, torch.UntypedStorage):
                given.add(a.data_ptr())
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr in self.live:
                    self.live[ptr][1] += 1
                elif ptr in given or storage.nbytes() == 0:
                    continue
                else:
                    self.live[ptr] = [storage.nbytes(), 1]
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                weakref.finalize(t, self._release, ptr)
        return out


def peak_mib(fn: Callable[[], object], device: torch.device) -> float:
    """Incremental peak memory (MiB) while `fn()` runs, its result included."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak / 2**20
    with _PeakTracker() as tracker:
        out = fn()
        del out
    return tracker.peak / 2**20
