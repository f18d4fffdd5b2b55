"""Launchers: allocate outputs, build each kernel's arguments and grid, launch, record plans."""

from vflash.ops.attention import attention_forward, attention_kvcache_forward, attention_varlen_forward, forward

__all__ = ["attention_forward", "attention_kvcache_forward", "attention_varlen_forward", "forward"]
