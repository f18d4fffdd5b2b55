"""A launch plan's direct call into the C launcher that Triton compiled for a kernel.

`CompiledKernel[grid](*args)` spends more host time in Python than in its C
launcher: driver and knobs lookups, the scratch-allocator closure, and for every
TMA descriptor argument one cuTensorMapEncodeTiled per call. Measured on the H200
host (`benchmarks/results/2026-11-29-h200-s5-host`, Triton 3.6): a planned repeat of the
sm90 kernel 45 us, its C launcher with the descriptors already encoded 7.6 us.

A launch plan fixes everything but its slots (vflash.ops.launch.Slot), so it
can call the C launcher itself:

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

from typing import Callable, Optional, Sequence

import torch

# Encoded descriptors cached per plan and slot (q, k, v, out): enough for a
# model's layers to share one plan (one q, k, v buffer each) without evictions;
# a descriptor with its launcher arguments is a few hundred bytes.
DESCRIPTORS_PER_SLOT = 64

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


def direct_launch(compiled, grid: Sequence[int], params: Sequence, slots: Sequence, sources: Sequence[int],
                  device_index: int, fallback: Callable) -> Optional[Callable]:
    """A function (*tensors) -> None that launches `compiled` on the current
    stream, or None where `compiled` does not have the layout this module knows.

    `params` holds every kernel parameter in signature order (constexprs
    included) as the first launch passed them; `slots` (vflash.ops.launch.Slot)
    are the ones rebuilt per call, slot i from tensors[sources[i]]: its data
    pointer, or with `describe` its TMA descriptor. `fallback(*tensors)` is
    Triton's own launch, used while a launch hook is set."""
    found = c_launcher(compiled)
    if found is None or current_raw_stream is None:
        return None
    launch, run, meta = found
    described = sorted((s.position, i) for i, s in enumerate(slots) if s.describe is not None)
    if len(described) != len(meta or ()):
        return None  # every descriptor parameter must be a slot (the C launcher expands each)
    meta_of = {pos: meta[j] for j, (pos, _) in enumerate(described)}

    # The launcher's argument list, written out as the source of one function:
    # fixed values in runs (splatted tuples), a slot as its pointer or its cached
    # descriptor expansion. One generated call costs what a hand-written one does.
    env = dict(c=launch, stream_of=current_raw_stream, device=device_index, fallback=fallback, hooks_set=_hook_check(),
               head=(grid[0], grid[1], grid[2]),
               rest=(compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                     compiled.packed_metadata, None, None, None))
    slot_at = {s.position: (i, s) for i, s in enumerate(slots)}
    parts, run_values = [], []
    for pos, value in enumerate(params):
        if pos not in slot_at:
            run_values.append(value)
            continue
        if run_values:
            env[f"r{pos}"] = tuple(run_values)
            parts.append(f"*r{pos}")
            run_values = []
        i, s = slot_at[pos]
        if s.describe is None:
            parts.append(f"t{sources[i]}.data_ptr()")
        else:
            env[f"d{pos}"] = _descriptor_cache(s.describe, meta_of[pos])
            parts.append(f"*d{pos}(t{sources[i]})")
    if run_values:
        env["r_end"] = tuple(run_values)
        parts.append("*r_end")
    names = "".join(f"t{i}, " for i in range(max(sources, default=-1) + 1))
    source = (f"def launch_direct({names}*more):\n"
              f"    if hooks_set():\n"
              f"        return fallback({names}*more)\n"
              f"    c(*head, stream_of(device), *rest, {', '.join(parts)})\n")
    exec(compile(source, "<vflash direct launch>", "exec"), env)
    return env["launch_direct"]


def _hook_check() -> Callable[[], bool]:
    """A function telling whether a launch hook (a profiler's) is set now."""
    from triton import knobs
    runtime = knobs.runtime

    def hooks_set() -> bool:
        # Triton 3.6 keeps each hook as a HookChain (empty unless a profiler adds
        # to it); a plain function may also be assigned.
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        return not ((enter is None or getattr(enter, "calls", None) == [])
                    and (leave is None or getattr(leave, "calls", None) == []))
    return hooks_set


def _descriptor_cache(describe: Callable, meta) -> Callable:
    """tensor -> its descriptor's launcher arguments [CUtensorMap, *shape, *strides],
    encoded once per data pointer (the plan key fixes everything else)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    cache = {}

    def expand(t):
        ptr = t.data_ptr()
        hit = cache.get(ptr)
        if hit is None:
            if len(cache) >= DESCRIPTORS_PER_SLOT:
                cache.clear()
            hit = cache[ptr] = make_tensordesc_arg(describe(t), meta)
        return hit
    return expand
