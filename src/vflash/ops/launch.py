"""One kernel launch, described by its argument builder, run on the tensors'
device, and recorded as a launch plan for later calls.

A launcher's argument builder returns a `KernelLaunch`: the kernel, grid,
positional arguments in signature order, constexprs, compile options, and the
`Slot`s, the arguments that change from call to call (data pointers, TMA
descriptors, a fresh counter). Everything else is fixed by the call's metadata,
which is what a launch plan's key holds, so a plan replays the launch with only
the slots rebuilt from the new call's tensors.

Slots name their tensor in the launch's own vocabulary: the plan's inputs (for
attention "q", "k", "v") and its allocations ("out", "lse", "tile_counter"),
so a varlen kernel's "cu_seqlens_q" or a decode kernel's "block_table" is one
more name, not a new launch path.
"""

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from vflash import _backend
from vflash.ops import plans
from vflash.ops.direct_launch import direct_launch


class Slot(NamedTuple):
    param: Union[str, int]  # the kernel parameter it fills, by name (KernelLaunch resolves it to its index)
    name: str  # the tensor it takes: a plan input or allocation
    describe: Optional[Callable[[torch.Tensor], Any]] = None  # tensor -> its TMA descriptor; None: a pointer

    @property
    def position(self) -> int:
        """The parameter's index in the kernel's signature (once KernelLaunch has resolved the name)."""
        return self.param


def given_slots(**tensors) -> Tuple[Slot, ...]:
    """The slots of the optional tensors that are given, each filling the kernel parameter of its name in
    capitals (a None one is a constexpr argument, which no plan rebinds)."""
    return tuple(Slot(name.upper(), name) for name, t in tensors.items() if t is not None)


class Alloc(NamedTuple):
    """An output a plan allocates per call."""
    name: str
    shape: Tuple[int, ...]
    dtype: torch.dtype
    zero: bool = False  # zero-filled (a counter), else uninitialised


@dataclass
class KernelLaunch:
    kernel: Any  # a @triton.jit or @gluon.jit function
    grid: Tuple[int, int, int]  # always three entries: the compiled launcher does not pad a shorter grid
    args: tuple  # positional parameters in signature order, with this call's tensors or descriptors
    constexprs: Dict[str, Any]
    options: Dict[str, Any]  # num_warps, num_stages, maxnreg, ...
    slots: Tuple[Slot, ...]

    def __post_init__(self):
        # a slot names its parameter; its index comes from the kernel's own signature, never by hand
        names = self.kernel.arg_names
        self.slots = tuple(s._replace(param=names.index(s.param)) if isinstance(s.param, str) else s
                           for s in self.slots)

    def params(self) -> list:
        """Every kernel parameter in signature order, constexprs included (what a
        compiled launcher takes)."""
        names = self.kernel.arg_names
        return list(self.args) + [self.constexprs[name] for name in names[len(self.args):]]


def run(launch: KernelLaunch, device: torch.device):
    """Launch on `device`: compiled for a CUDA device (made current for the
    launch), through Triton's interpreter for CPU tensors. Returns what Triton's
    launch returns (its CompiledKernel, for a compiled launch)."""
    if _backend.interpreted(device):
        return _backend.launcher(launch.kernel, device)[launch.grid](*launch.args, **launch.constexprs)
    other_gpu = device.index != torch.cuda.current_device()
    with torch.cuda.device(device) if other_gpu else contextlib.nullcontext():
        return launch.kernel[launch.grid](*launch.args, **launch.constexprs, **launch.options)


def bind(launch: KernelLaunch, compiled, order: Sequence[str], device_index: int) -> Optional[Callable]:
    """`launch` (just run as `compiled`) as a function of the tensors named `order`
    (its slots' sources): the direct C launch where it applies, else Triton's runner
    with the slots filled in; None for a Triton whose launch returns no CompiledKernel."""
    try:
        runner = compiled[launch.grid]
    except (TypeError, AttributeError):
        return None
    slots = launch.slots
    sources = [order.index(s.name) for s in slots]
    params = launch.params()
    for s in slots:  # rebuilt every call: the plan keeps none of the recording call's tensors alive
        params[s.position] = None

    def fallback(*tensors):  # Triton's own launcher, with this call's slots filled in
        p = list(params)
        for slot, src in zip(slots, sources):
            t = tensors[src]
            p[slot.position] = t if slot.describe is None else slot.describe(t)
        runner(*p)
    return direct_launch(compiled, launch.grid, params, launch.slots, sources, device_index, fallback) or fallback


def record(key: Hashable, launch: KernelLaunch, compiled, inputs: Sequence[str], allocs: Sequence[Alloc],
           returns: Sequence[str], device_index: int,
           scratch: Optional[Tuple[Sequence[str], Callable[[], tuple]]] = None,
           admit: Optional[Callable[..., bool]] = None) -> None:
    """Record `launch` (just run as `compiled`) as the plan for `key`: the plan
    takes the tensors named `inputs`, allocates `allocs`, fetches `scratch` (names, and
    a function returning those tensors for this call: split-KV's pool), launches, and
    returns the tensors named `returns` (None for a name it does not have); `admit`:
    plans.LaunchPlan's."""
    record_sequence(key, [(launch, compiled)], inputs, allocs, returns, device_index, scratch, admit)


def record_sequence(key: Hashable, launched: Sequence[Tuple[KernelLaunch, Any]], inputs: Sequence[str],
                    allocs: Sequence[Alloc], returns: Sequence[str], device_index: int,
                    scratch: Optional[Tuple[Sequence[str], Callable[[], tuple]]] = None,
                    admit: Optional[Callable[..., bool]] = None) -> None:
    """record for several launches run in order on the same tensors (a kernel and the
    next step of its work, say); nothing is recorded if any of them cannot be bound."""
    names, fetch = scratch if scratch is not None else ((), None)
    order = list(inputs) + [a.name for a in allocs] + list(names)
    bound = [bind(launch, compiled, order, device_index) for launch, compiled in launched]
    if any(b is None for b in bound):
        return
    if len(bound) == 1:
        run_all = bound[0]
    else:
        def run_all(*tensors):
            for b in bound:
                b(*tensors)
    picks = tuple(order.index(name) if name in order else None for name in returns)
    plans.record(key, plans.LaunchPlan(run_all, device_index, tuple(allocs), picks, fetch, admit))


# --- a launch compiled for sm_90 without a GPU (the CPU compile tests, the lab's PTX fingerprints) ---

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32",
           torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv", torch.uint8: "u8"}


def compile_sm90_launch(launch: KernelLaunch):
    """A captured launch of a @triton.jit or @gluon.jit kernel compiled for sm_90 without a GPU, from its own
    arguments: Triton's CompiledKernel (its .asm holds 'ptx' and 'cubin'). Tensors
    become 16-byte-aligned pointers of their dtype, None a constexpr, an int of 1 a constant, other ints
    i32 (marked divisible by 16 where they are), floats fp32, a tuple's elements each so (at its path), a
    Gluon TMA descriptor its block and shared layout: the specializations Triton's JIT makes. The launch's
    num_warps, num_stages and maxnreg (the Gluon forward's register cap at two or three CTAs an SM) are the
    compile's options."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = launch.kernel
    gluon = getattr(fn, "is_gluon", lambda: False)()
    constexprs = dict(launch.constexprs)
    signature, attrs = {}, {}

    def specialize(path: tuple, arg):
        # (the argument's type, its constexpr value or None) at `path`, a tuple's elements each at its own path
        if isinstance(arg, tuple):
            return tuple(specialize(path + (j,), a) for j, a in enumerate(arg))
        if gluon and _is_descriptor(arg):
            return _descriptor_type(arg)
        if isinstance(arg, torch.Tensor):
            attrs[path] = [["tt.divisibility", 16]]
            return "*" + _DTYPES[arg.dtype]
        if isinstance(arg, float):
            return "fp32"
        if arg is None or arg == 1:
            constexprs[path] = arg
            return "constexpr"
        if arg % 16 == 0:
            attrs[path] = [["tt.divisibility", 16]]
        return "i32"

    for i, (name, arg) in enumerate(zip(fn.arg_names, launch.args)):
        signature[name] = specialize((i,), arg)
    for name in fn.arg_names[len(launch.args):]:
        signature[name] = "constexpr"
    opts = {k: v for k, v in launch.options.items() if k in ("num_warps", "num_stages", "maxnreg")}
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource
        source = GluonASTSource(fn, signature, constexprs, attrs)
    else:
        source = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=opts)


def _is_descriptor(arg) -> bool:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return isinstance(arg, TensorDescriptor)


def _descriptor_type(desc) -> str:
    # The type Triton's JIT gives a Gluon TensorDescriptor argument, from the
    # launch's own descriptor: its element type, block shape and the shared layout it carries.
    return f"tensordesc<{_DTYPES[desc.base.dtype]}[{', '.join(map(str, desc.block_shape))}],{desc.layout!r}>"
