"""vflash: exact FlashAttention in Python and Triton, with the proof beside it."""

from vflash.api import attention, attention_varlen, attention_with_kvcache, merge_states, write_kvcache

__version__ = "0.1.0"

__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "merge_states", "write_kvcache",
           "__version__"]
