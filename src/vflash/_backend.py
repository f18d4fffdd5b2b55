"""Where a call's Triton kernels run: compiled for its CUDA device, or through
Triton's interpreter for CPU tensors, chosen per call from the tensors' device.

`import vflash` changes no environment variable and no Triton setting: vflash's
kernels are decorated as ordinary compiled `@triton.jit` functions, and a CPU
call runs the interpreted form of the same function (`interpreted_form`),
inside `interpreter()`. Other Triton code in the process is untouched outside
an interpreted launch; during one, Triton's interpreter patches
`triton.language` for the launch's duration (as it always does), so do not
compile GPU kernels in another thread at that moment.

TRITON_INTERPRET set by the user before Triton is imported still means what
Triton says: every kernel, vflash's included, is decorated interpreted, and
CUDA tensors too run through the interpreter (INTERPRET_ALL).
"""

import contextlib
import functools
import os
import threading

import numpy as np
import torch

INTERPRET_ALL = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.lru_cache(maxsize=None)
def device_properties(device_index: int):
    """torch's properties of a CUDA device (capability, SM count), read once."""
    return torch.cuda.get_device_properties(device_index)


def interpreted(device: torch.device) -> bool:
    """True when a call on `device` runs through Triton's interpreter."""
    return INTERPRET_ALL or device.type != "cuda"


# Triton's interpreter keeps its grid position in one process-wide builder, so
# interpreted launches run one at a time.
_INTERPRETER_LOCK = threading.RLock()

_forms = {}  # id(JITFunction) -> its interpreted form (JITFunctions hash by their source's cache key)


def emulates_bf16(t: torch.Tensor) -> bool:
    """Whether the kernels on `t` do bf16 or FP8 by hand (their EMULATE_BF16, kernels/tile.py): bf16 under
    Triton's interpreter, whose numpy has no bf16 (wrong products, truncating conversions); FP8 (e4m3) there
    too (its fp32 -> e4m3 conversion is wrong) and on GPUs without FP8 products (before sm_89)."""
    if t.dtype == torch.float8_e4m3fn:
        props = None if interpreted(t.device) else device_properties(t.device.index)
        return props is None or (props.major, props.minor) < (8, 9)
    return t.dtype == torch.bfloat16 and interpreted(t.device)


def interpreted_form(fn):
    """The interpreted form of a `@triton.jit` function (itself if it already is one)."""
    from triton.runtime.interpreter import InterpretedFunction
    if isinstance(fn, InterpretedFunction):
        return fn
    form = _forms.get(id(fn))
    if form is None:
        form = _forms[id(fn)] = InterpretedFunction(fn.fn)
    return form


@contextlib.contextmanager
def interpreter():
    """The scope of an interpreted launch: a `@triton.jit` function called from
    interpreted code (vflash's helpers, and Triton's own library functions such
    as tl.sum, decorated compiled at import) runs its interpreted form; numpy's
    floating-point warnings (exp2 of -inf, masked lanes) stay inside; and every
    `triton.language` attribute the interpreter patches is put back on the way
    out. (Triton restores the patches of a launch, but not those of the device
    functions it calls, which would leave `tl.tensor`'s operators interpreted
    for every later compile in the process.)"""
    from triton.runtime import interpreter as triton_interpreter
    from triton.runtime.jit import JITFunction

    scope_type = getattr(triton_interpreter, "_LangPatchScope", None)
    missing = getattr(triton_interpreter, "_MISSING", None)
    with _INTERPRETER_LOCK:
        originals = {}  # (id(obj), name) -> (obj, name, value before the launch)
        compiled_call = JITFunction.__call__
        set_attr = scope_type.set_attr if scope_type is not None else None

        def recording_set_attr(scope, obj, name, value):
            originals.setdefault((id(obj), name), (obj, name, getattr(obj, name, missing)))
            set_attr(scope, obj, name, value)
        JITFunction.__call__ = lambda self, *args, **kwargs: interpreted_form(self)(*args, **kwargs)
        if set_attr is not None:
            scope_type.set_attr = recording_set_attr
        try:
            with np.errstate(all="ignore"):
                yield
        finally:
            JITFunction.__call__ = compiled_call
            if set_attr is not None:
                scope_type.set_attr = set_attr
            for obj, name, value in originals.values():
                if value is missing:
                    if name in vars(obj):
                        delattr(obj, name)
                else:
                    setattr(obj, name, value)


class _Interpreted:
    def __init__(self, fn):
        self.form = interpreted_form(fn)

    def __getitem__(self, grid):
        launch = self.form[grid]

        def run(*args, **kwargs):
            with interpreter():
                return launch(*args, **kwargs)
        return run


def interpreter_refusal():
    """Why this Triton's interpreter cannot run here, or None. Triton 3.6's
    interpreter turns a scalar's shape-(1,) array into an int with int(), which
    numpy 2.4 refuses (Triton 3.7 and later squeeze it first)."""
    import triton
    if triton.__version__.startswith("3.6.") and tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 4):
        return (f"Triton {triton.__version__}'s interpreter does not run with numpy {np.__version__}: "
                "install numpy<2.4 or a newer Triton to run CPU tensors")
    return None


def launcher(fn, device: torch.device):
    """`fn` as a call on `device` launches it: `launcher(fn, device)[grid](*args)`
    compiles for a CUDA device and interprets for CPU tensors."""
    if not interpreted(device):
        return fn
    refusal = interpreter_refusal()
    if refusal is not None:
        raise RuntimeError(refusal)
    return _Interpreted(fn)

