"""A launch plan's direct call into the C launcher that Triton compiled for a kernel.

`CompiledKernel[grid](*args)` spends more host time in Python than in its C
launcher: driver and knobs lookups, the scratch-allocator closure, and for every
TMA descriptor argument one cuTensorMapEncodeTiled per call. Measured on the H200
host (`results/2026-11-29-h200-s5-host`, Triton 3.6): a planned repeat of the
Hopper kernel 45 us, its C launcher with the descriptors already encoded 7.6 us.

A launch plan fixes everything but the data pointers, so it can call the C
launcher itself:

- the stream comes from torch's current raw stream (what Triton's driver reads);
- pointers go in as integers (the plan key fixes their device);
- a TMA descriptor is a function of (pointer, shape, strides, block, dtype, swizzle)
  and the key fixes all but the pointer, so each encoded descriptor is cached on
  its tensor's pointer (a bounded table per plan and operand).

This leans on the internals of Triton 3.6's CUDA launcher (CudaLauncher's fields,
the C function's argument order, wrap_handle_tensordesc's closure). Any other
layout, a kernel that needs scratch memory, or a launch hook set (a profiler's)
at call time leaves the plan on Triton's own runner.
"""

from typing import Callable, Dict, List, Optional, Sequence

import torch

# Encoded descriptors cached per plan and operand (q, k, v, out): enough for a
# model's layers to share one plan (one q, k, v buffer each) without evictions;
# a descriptor with its launcher arguments is a few hundred bytes.
DESCRIPTORS_PER_OPERAND = 64

# torch's current CUDA stream as an integer handle (what Triton's driver reads);
# absent from CPU-only builds of torch.
current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

_CALL_ARGS = ("self", "gridX", "gridY", "gridZ", "stream", "function")  # CudaLauncher.__call__ in Triton 3.6


def c_launcher(compiled) -> Optional[tuple]:
    """(C launch function, CudaLauncher, tensordesc metadata or None) when
    `compiled` (a CompiledKernel whose handles are loaded) has Triton 3.6's
    launcher layout; None otherwise."""
    import triton

    if not triton.__version__.startswith("3.6."):
        return None
    run = getattr(compiled, "run", None)
    call = getattr(type(run), "__call__", None)
    code = getattr(call, "__code__", None)
    if (type(run).__name__ != "CudaLauncher" or code is None or code.co_argcount != len(_CALL_ARGS)
            or code.co_varnames[:len(_CALL_ARGS)] != _CALL_ARGS):
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    launch, meta = getattr(run, "launch", None), None
    if hasattr(launch, "__code__"):  # wrap_handle_tensordesc's closure around the C function
        cells = dict(zip(launch.__code__.co_freevars, launch.__closure__ or ()))
        if "launcher" not in cells or "tensordesc_meta" not in cells:
            return None
        launch, meta = cells["launcher"].cell_contents, cells["tensordesc_meta"].cell_contents
    if not callable(launch) or hasattr(launch, "__code__") or not hasattr(compiled, "packed_metadata"):
        return None  # the C function is expected here, not another Python layer
    return launch, run, meta


def direct_launch(compiled, grid: Sequence[int], tail: Sequence, device_index: int,
                  descriptors: Optional[Callable], fallback: Callable, counter: bool = False) -> Optional[Callable]:
    """A function (q, k, v, out, lse) -> None that launches `compiled` on the
    current stream with `tail` after the five data arguments, or None where
    `compiled` does not have the layout this module knows. `descriptors` (q, k,
    v, out) -> their TensorDescriptors, for a kernel that takes q, k, v and out
    as TMA descriptors; None for one that takes pointers. With `counter` (a
    descriptor kernel's work-tile counter) the function takes it as a sixth data
    argument. `fallback(q, k, v, out, lse[, counter])` is Triton's own launch,
    used while a launch hook is set."""
    found = c_launcher(compiled)
    if found is None or current_raw_stream is None:
        return None
    launch, run, meta = found
    if (descriptors is None) != (not meta) or (counter and descriptors is None):
        return None
    head = (grid[0], grid[1], grid[2])
    rest = (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
            compiled.packed_metadata, None, None, None)
    tail = tuple(tail)
    stream_of = current_raw_stream
    from triton import knobs
    runtime = knobs.runtime

    def hooks_set() -> bool:
        # Triton 3.6 keeps each hook as a HookChain (empty unless a profiler adds
        # to it); a plain function may also be assigned.
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        return not ((enter is None or getattr(enter, "calls", None) == [])
                    and (leave is None or getattr(leave, "calls", None) == []))

    if descriptors is None:
        def launch_pointers(q, k, v, out, lse):
            if hooks_set():
                return fallback(q, k, v, out, lse)
            launch(*head, stream_of(device_index), *rest,
                   q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), *tail)
        return launch_pointers

    from triton.backends.nvidia.driver import make_tensordesc_arg

    caches: List[Dict[int, list]] = [{} for _ in range(4)]

    def expanded(q, k, v, out) -> list:
        # One descriptor's launcher arguments: [CUtensorMap, *shape, *strides].
        tensors = (q, k, v, out)
        args, built = [], None
        for i, t in enumerate(tensors):
            ptr = t.data_ptr()
            hit = caches[i].get(ptr)
            if hit is None:
                built = built or descriptors(q, k, v, out)
                hit = make_tensordesc_arg(built[i], meta[i])
                if len(caches[i]) >= DESCRIPTORS_PER_OPERAND:
                    caches[i].clear()
                caches[i][ptr] = hit
            args += hit
        return args

    def launch_descriptors(q, k, v, out, lse):
        if hooks_set():
            return fallback(q, k, v, out, lse)
        launch(*head, stream_of(device_index), *rest, *expanded(q, k, v, out), lse.data_ptr(), *tail)

    def launch_descriptors_counted(q, k, v, out, lse, count):
        if hooks_set():
            return fallback(q, k, v, out, lse, count)
        launch(*head, stream_of(device_index), *rest, *expanded(q, k, v, out), lse.data_ptr(), count.data_ptr(),
               *tail)
    return launch_descriptors_counted if counter else launch_descriptors
