"""References that vflash's kernels are checked against. They share no code with
the kernels and never import them.

- `attention_explicit`: materialises scores (QK^T -> softmax -> PV). In fp32 or
  fp64 it is the oracle; in the inputs' dtype it is the "same-dtype PyTorch"
  error yardstick.
- `attention_tiled`: online softmax over Q/K/V tiles in PyTorch, any block sizes.
- `scalar`: the lesson's pure-Python online softmax, full vs online.
- `attention_varlen_reference`: packed sequences, one explicit call per sequence.
- `merge_states_reference`: two partial results merged from the formula.
- `write_kvcache_reference`: new tokens scattered into a paged cache, token by token.
- `attention_with_kvcache_reference`: each sequence's keys gathered from its pages, then explicit.
- `fp8`: FP8 inputs' dequantization (the oracle's inputs) and their explicit FP8 pipeline, the yardstick.
"""

from vflash.reference.explicit import attention_explicit, visible_mask
from vflash.reference.merge import merge_states_reference
from vflash.reference.paged import attention_with_kvcache_reference, write_kvcache_reference
from vflash.reference.scalar import full_attention, online_attention
from vflash.reference.tiled import attention_tiled
from vflash.reference.varlen import attention_varlen_reference

__all__ = ["attention_explicit", "attention_tiled", "attention_varlen_reference", "attention_with_kvcache_reference",
           "merge_states_reference", "visible_mask", "full_attention", "online_attention", "write_kvcache_reference"]
