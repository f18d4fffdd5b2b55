"""What one attention call is, as one value: the ground floor every layer above reads.

`vflash._validate` turns an entry point's raw arguments into a `Call` (its tensors, the
layout, the mask band, the score options, whether the LSE is returned), once per call;
`vflash.dispatch.problem_of(call)` reads the choice's inputs from it and the launchers
(`vflash.ops.attention.forward`) their arguments. The plan keys of repeat calls are made
from each entry point's `Spec`, its arguments in order (`vflash.ops.plans.key_function`),
and the custom ops' option arguments from the `Band` and `Score` fields
(`vflash.library`). A new score option is one `Score` field: the keys, the custom ops'
schemas and the launch plans follow from it.

The mask band every kernel takes: query row i sees key j when

    i + off - left <= j <= i + off + right        (left/right < 0: unbounded)

folded on the host from causal, window and the lengths (vflash._validate.mask_band; a
packed call's offset comes from each sequence's own lengths, kernels/seqlen.py).
"""

from typing import Callable, NamedTuple, Optional, Tuple, Union

import torch


class Band(NamedTuple):
    off: int  # the diagonal's key offset: Nk - Nq (bottom-right) or 0 (top-left)
    left: int  # keys a row sees left of its diagonal; < 0: unbounded
    right: int  # keys a row sees right of its diagonal; < 0: unbounded (0: causal)

    @property
    def has_left(self) -> bool:
        """Some row has keys hidden on its left (a sliding window's far edge)."""
        return self.left >= 0

    @property
    def has_right(self) -> bool:
        """Some row has keys hidden on its right (a causal diagonal or a window's near edge).
        Such rows differ in cost, which the kernels' schedules care about."""
        return self.right >= 0


class Score(NamedTuple):
    """How a q·k product becomes a softmax logit. Every field is a custom-op argument of the
    type annotated here (vflash.library builds the ops' schemas from them) and part of every
    plan key; the launchers derive the kernels' flags and scalars from it (ops/scales.py)."""
    scale: float  # multiplier of q·k
    softcap: Optional[float] = None  # s -> softcap * tanh(s / softcap); None: off
    # fp32 [Hq]: one more logit per query head in every row's softmax denominator (an attention sink,
    # gpt-oss's), never softcapped, with no value row; None: off
    sinks: Optional[torch.Tensor] = None
    # fp32 descales of FP8 (e4m3) inputs, each 0-d (the tensor's) or [B, Hkv] (a sequence's KV head's; q's
    # for the query heads of a KV head, FlashAttention-3's convention): a real value is stored * descale;
    # None: 1. q's and k's multiply the scores before the scale (and the softcap), v's the output.
    q_descale: Optional[torch.Tensor] = None
    k_descale: Optional[torch.Tensor] = None
    v_descale: Optional[torch.Tensor] = None


class Packed(NamedTuple):
    """Packed sequences (attention_varlen): q [total_q, Hq, D], k / v [total_k, Hkv, D]."""
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    top_left: bool  # each sequence's diagonal at its first key, not its last
    check_metadata: bool  # check cu_seqlens' values before the launch


class Cache(NamedTuple):
    """Queries against a KV cache (attention_with_kvcache): q as rows [total_q, Hq, D] (dense
    q's [B, Nq] merged, `q_shape` its own), k / v the caches, contiguous [B, max_len, Hkv, D]
    (block_table None) or paged [pages, page_size, Hkv, D]."""
    cache_seqlens: torch.Tensor
    block_table: Optional[torch.Tensor]
    cu_seqlens_q: Optional[torch.Tensor]  # None: max_seqlen_q rows a sequence, in order
    max_seqlen_q: int
    num_splits: Optional[int]
    batch_invariant: bool
    check_metadata: bool  # check the lengths, pages and offsets before the launch
    q_shape: Tuple[int, ...]  # the caller's q shape (its out's)
    # whether a caller's out (Call.out) still overlaps no input on a plan's repeat (the byte extents the
    # full check found; vflash._validate.check_kvcache_out); None without out
    out_guard: Optional[Callable[..., bool]] = None


Layout = Union[None, Packed, Cache]  # None: dense [B, H, N, D]


class Call(NamedTuple):
    """One validated attention call: what dispatch and the launchers read."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    layout: Layout
    band: Band
    score: Score
    return_lse: bool
    out: Optional[torch.Tensor] = None  # where to write the output (else allocated)
    out_dtype: Optional[torch.dtype] = None  # the output's dtype; None: q's (FP8 inputs: set by validation)

    @property
    def dtype_out(self) -> torch.dtype:
        """The output's dtype."""
        return self.out_dtype or self.q.dtype

    @property
    def dense(self) -> bool:
        return self.layout is None

    @property
    def head_dim(self) -> int:
        """q's and k's head dim."""
        return self.q.shape[-1]

    @property
    def head_dim_v(self) -> int:
        """v's head dim (the output's)."""
        return self.v.shape[-1]

    @property
    def heads_q(self) -> int:
        return self.q.shape[1] if self.layout is None else self.q.shape[-2]

    @property
    def heads_kv(self) -> int:
        return self.k.shape[1] if self.layout is None else self.k.shape[-2]

    @property
    def batch(self) -> int:
        layout = self.layout
        if layout is None:
            return self.q.shape[0]
        if isinstance(layout, Packed):
            return layout.cu_seqlens_q.numel() - 1
        return layout.cache_seqlens.numel()

    @property
    def n_q(self) -> int:
        """Query rows of a sequence (the longest, packed)."""
        layout = self.layout
        return self.q.shape[2] if layout is None else layout.max_seqlen_q

    @property
    def n_k(self) -> int:
        """Keys of a sequence: the longest packed, a cache's capacity."""
        layout = self.layout
        if layout is None:
            return self.k.shape[2]
        if isinstance(layout, Packed):
            return layout.max_seqlen_k
        return self.k.shape[1] * (1 if layout.block_table is None else layout.block_table.shape[1])

    @property
    def v_in_k(self) -> bool:
        """A KV cache whose v_cache is a view of each k_cache row's first columns (MLA's latent cache)."""
        return isinstance(self.layout, Cache) and v_in_k_cache(self.k, self.v)

    @property
    def page_size(self) -> int:
        """A paged cache's rows a page; 0 for every other call."""
        layout = self.layout
        return self.k.shape[1] if isinstance(layout, Cache) and layout.block_table is not None else 0


def v_in_k_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether v_cache is k_cache[..., :D_v], a view of the same memory (MLA's latent cache: V is the first
    512 of each token's 576 cached values), which the KV-cache kernel reads once for both products."""
    return (v_cache.shape[-1] < k_cache.shape[-1] and v_cache.shape[:-1] == k_cache.shape[:-1]
            and v_cache.stride() == k_cache.stride() and v_cache.dtype == k_cache.dtype
            and v_cache.device == k_cache.device and v_cache.data_ptr() == k_cache.data_ptr())


# Each entry point's arguments in order, as the plan keys read them (vflash.ops.plans.key_function):
# "tensor" (its metadata: shape, strides, dtype, device, 16-byte alignment; None allowed), "option" (its
# type and value), "pair" (a tuple: its type and each item's type and value), "flag" (a bool, else the call
# takes no plan: its check runs on every call). The first argument is a tensor: its device decides whether
# plans apply.
class Spec(NamedTuple):
    name: str
    params: Tuple[Tuple[str, str], ...]

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(name for name, _ in self.params)


_SCORE_OPTIONS = tuple((name, "tensor" if Score.__annotations__[name] == Optional[torch.Tensor] else "option")
                       for name in Score._fields)

ATTENTION = Spec("attention", (("q", "tensor"), ("k", "tensor"), ("v", "tensor"), ("causal", "option"),
                               ("window", "pair"), *_SCORE_OPTIONS, ("out_dtype", "option"),
                               ("return_lse", "option")))
ATTENTION_VARLEN = Spec("attention_varlen", (
    ("q", "tensor"), ("k", "tensor"), ("v", "tensor"), ("cu_seqlens_q", "tensor"), ("cu_seqlens_k", "tensor"),
    ("max_seqlen_q", "option"), ("max_seqlen_k", "option"), ("causal", "option"), ("window", "pair"),
    *_SCORE_OPTIONS, ("out_dtype", "option"), ("return_lse", "option"), ("check_metadata", "flag")))
ATTENTION_KVCACHE = Spec("attention_with_kvcache", (
    ("q", "tensor"), ("k_cache", "tensor"), ("v_cache", "tensor"), ("cache_seqlens", "tensor"),
    ("block_table", "tensor"), ("cu_seqlens_q", "tensor"), ("max_seqlen_q", "option"), ("causal", "option"),
    ("window", "pair"), *_SCORE_OPTIONS, ("num_splits", "option"), ("batch_invariant", "option"),
    ("return_lse", "option"), ("check_metadata", "flag"), ("out", "tensor")))
MERGE_STATES = Spec("merge_states", (("out_a", "tensor"), ("lse_a", "tensor"), ("out_b", "tensor"),
                                     ("lse_b", "tensor")))
WRITE_KVCACHE = Spec("write_kvcache", (("k_cache", "tensor"), ("v_cache", "tensor"), ("k_new", "tensor"),
                                       ("v_new", "tensor"), ("slot_mapping", "tensor"), ("k_descale", "tensor"),
                                       ("v_descale", "tensor"), ("check_metadata", "flag")))
