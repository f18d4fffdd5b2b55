"""Issue 4 experiment: where the host time of a planned Hopper-kernel call goes. GPU only (sm_90).

Per-call host microseconds (CPU timer around many calls) for a tiny D = 128 shape:
  1. vflash.attention, planned repeat, portable kernel (D = 64 short) and Hopper kernel (D = 128);
  2. the plan's `prepare` alone (four TensorDescriptor objects);
  3. Triton's make_tensordesc_arg for the four descriptors (cuTensorMapEncodeTiled each);
  4. the plan's runner (CompiledKernel[grid]) with prepared descriptors;
  5. the same runner with make_tensordesc_arg memoized on (pointer, shape, strides): the most a
     descriptor cache inside vflash could save when a caller reuses its buffers;
  6. Triton 3.6's compiled C launcher called directly with the descriptors already encoded and
     expanded (cached on the pointers): the floor for a launch plan of our own. Its output is
     checked against the normal launch first.
"""

import sys

import torch

import vflash
from vflash.ops import plans

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from launch_overhead import per_call_us  # noqa: E402


class Rows(list):
    """Rows printed as they come: a crash in a later row keeps the earlier ones."""

    def append(self, row):
        super().append(row)
        print(f"{row[0]:>45}: {row[1]:7.1f} us per call (host)", flush=True)

    def __iadd__(self, rows):
        for row in rows:
            self.append(row)
        return self


def main():
    import triton.backends.nvidia.driver as drv

    rows = Rows()
    q64 = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
    rows.append(("planned repeat, portable kernel (D 64)", per_call_us(lambda: vflash.attention(q64, q64, q64))))
    q = torch.randn(1, 2, 16, 128, device="cuda", dtype=torch.float16)
    vflash.attention(q, q, q)
    rows.append(("planned repeat, Hopper kernel (D 128)", per_call_us(lambda: vflash.attention(q, q, q))))
    plan = [p for p in plans._plans.values() if p.prepare is not None][-1]
    out = torch.empty_like(q)
    rows.append(("  prepare (4 TensorDescriptor objects)", per_call_us(lambda: plan.prepare(q, q, q, out))))
    descs = plan.prepare(q, q, q, out)
    meta = getattr(plan.runner.__self__, "metadata", None) if hasattr(plan.runner, "__self__") else None
    tmeta = None
    for obj in (meta, getattr(plan.runner, "metadata", None)):
        if obj is not None and getattr(obj, "tensordesc_meta", None):
            tmeta = obj.tensordesc_meta
    if tmeta is None:
        # CompiledKernel[grid] returns a closure; find the CompiledKernel in it
        for cell in getattr(plan.runner, "__closure__", None) or ():
            md = getattr(cell.cell_contents, "metadata", None)
            if md is not None and getattr(md, "tensordesc_meta", None):
                tmeta = md.tensordesc_meta
    if tmeta:
        rows.append(("  make_tensordesc_arg x 4 (encode)",
                     per_call_us(lambda: [drv.make_tensordesc_arg(d, m) for d, m in zip(descs, tmeta)])))
    else:
        rows.append(("  make_tensordesc_arg x 4 (encode)", float("nan")))
    rows.append(("  runner with prepared descriptors",
                 per_call_us(lambda: plan.runner(*descs, out, *plan.tail))))
    real = drv.make_tensordesc_arg
    cache = {}

    def memo(arg, metadata):
        key = (arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), id(metadata))
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = real(arg, metadata)
        return hit
    drv.make_tensordesc_arg = memo
    try:
        rows.append(("  runner, encodes memoized", per_call_us(lambda: plan.runner(*descs, out, *plan.tail))))
        rows.append(("planned repeat, Hopper, encodes memoized", per_call_us(lambda: vflash.attention(q, q, q))))
    finally:
        drv.make_tensordesc_arg = real
    try:
        rows += raw_launch_rows(plan, q, out)
    except Exception as exc:  # Triton internals other than 3.6's: report and go on
        rows.append((f"  raw launcher: {type(exc).__name__}: {str(exc)[:60]}", float("nan")))
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
        rows.append(("SDPA flash", per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))))


def raw_launch_rows(plan, q, out):
    """Row 6: Triton 3.6 internals (CompiledKernel.run.launch wraps the C launcher and expands
    tensor descriptors per call; its closure holds the C function)."""
    import triton.backends.nvidia.driver as drv

    compiled = next(c.cell_contents for c in plan.runner.__closure__ if hasattr(c.cell_contents, "packed_metadata"))
    grid = next(c.cell_contents for c in plan.runner.__closure__ if isinstance(c.cell_contents, tuple))
    cells = dict(zip(compiled.run.launch.__code__.co_freevars, compiled.run.launch.__closure__))
    c_launch = cells["launcher"].cell_contents
    tmeta = compiled.metadata.tensordesc_meta
    run = compiled.run
    cache = {}

    def expanded(q, k, v, o):
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
        hit = cache.get(key)
        if hit is None:
            descs = plan.prepare(q, k, v, o)
            flat = []
            for d, m in zip(descs, tmeta):
                flat += drv.make_tensordesc_arg(d, m)
            hit = cache[key] = flat
        return hit

    stream = torch.cuda.current_stream().cuda_stream

    def launch(q, k, v, o):
        c_launch(grid[0], grid[1], grid[2], stream, compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                 None, None, compiled.packed_metadata, None, None, None, *expanded(q, k, v, o), o, *plan.tail)

    ref, _ = plan(q, q, q)
    out.fill_(float("nan"))
    launch(q, q, q, out)
    torch.cuda.synchronize()
    same = bool(torch.equal(out, ref))
    return [(f"  raw C launcher, descriptors cached (output equal: {same})", per_call_us(lambda: launch(q, q, q, out))),
            ("  ... plus out = torch.empty", per_call_us(lambda: launch(q, q, q, torch.empty_like(q))))]


if __name__ == "__main__":
    main()
