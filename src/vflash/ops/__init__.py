"""Launchers: allocate outputs, build each kernel's arguments and grid, launch, record plans."""

from vflash.ops.attention import attention_forward, attention_kvcache_forward, attention_varlen_forward
from vflash.ops.band import Band, mask_band, sequence_band

__all__ = ["Band", "attention_forward", "attention_kvcache_forward", "attention_varlen_forward", "mask_band",
           "sequence_band"]
