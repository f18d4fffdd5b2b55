"""Where the Triton kernels run: the GPU, or the CPU through Triton's interpreter.

Triton picks compiled or interpreted kernels when `@triton.jit` decorates them,
from the environment variable TRITON_INTERPRET. This module must therefore be
imported before any module under `vflash.kernels`; `vflash.ops` does so.

- TRITON_INTERPRET set (to anything): respected as given.
- unset and no CUDA device: set to "1", so CPU tensors run the same kernels
  through the interpreter.
- unset with a CUDA device: kernels are compiled for the GPU; CPU tensors are
  then refused with a message saying how to switch the interpreter on.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402  (after the environment is settled)


def _read_interpret() -> bool:
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# Read once: vflash's kernels are decorated under this setting at import, and a
# later change of the environment does not change what they are.
_INTERPRET = _read_interpret()


def interpreting() -> bool:
    """True when vflash's Triton kernels run through the CPU interpreter."""
    return _INTERPRET
