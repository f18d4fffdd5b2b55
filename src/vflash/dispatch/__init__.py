"""Dispatch: which kernel and tiles a call runs, chosen once per call.

`choose(call)` (a vflash.call.Call) returns a `Choice` (kernel, tiles, why), through
`select(problem_of(call))` or, against a KV cache, `select_kvcache`. Every table it reads
is in `tables.py` with a line of reason per entry, the rules in `rules.py`, the
whole account in `docs/dispatch.md`. `VFLASH_KERNEL=portable|sm90` (or
`select`'s `kernel`) forces a kernel; a forced kernel that cannot take the call
raises ValueError saying why.
"""

from vflash.dispatch.rules import (DTYPES, FORCED, KERNELS, REGISTRY, Choice, Kernel, Problem, backward_tiles,
                                   cache_write_tiles, choose, merge_tiles, metadata_tiles, mla_refusal, problem_of,
                                   refusal, select, select_backward, select_kvcache, sm90_backward_refusal,
                                   sm90_refusal)

__all__ = ["DTYPES", "FORCED", "KERNELS", "REGISTRY", "Choice", "Kernel", "Problem", "backward_tiles",
           "cache_write_tiles", "choose", "merge_tiles", "metadata_tiles", "mla_refusal", "problem_of", "refusal", "select",
           "select_backward", "select_kvcache", "sm90_backward_refusal", "sm90_refusal"]
