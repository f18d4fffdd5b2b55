"""Launchers: allocate outputs, choose tile configs, build the grid, call kernels."""

from vflash import _backend  # noqa: F401  (settles TRITON_INTERPRET before kernels import)
from vflash.ops.attention import attention_forward

__all__ = ["attention_forward"]
