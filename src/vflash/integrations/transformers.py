"""vflash inside Hugging Face transformers models.

    import vflash.integrations.transformers as vt
    name = vt.register()                     # "vf_attention"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)
    # or: model.set_attn_implementation(name)

`register()` adds an attention function (`AttentionInterface`) and its mask function
(`AttentionMaskInterface`) under one name. The name holds no "flash" (transformers
treats any implementation name containing "flash" as FlashAttention, and an
"org/repo" one as a hub kernel to download).

What each call becomes:
- no padding: `vflash.attention` on the model's [B, H, S, D] tensors (GQA without
  repeating K/V; causal bottom-right, so decode steps with a KV cache see the whole
  cache);
- a padded batch (a 2D attention mask with a zero): its tokens unpadded into one
  `vflash.attention_varlen` call and padded back (padded query rows come out zero);
- packed sequences: the `cu_seq_lens_q/k`, `max_length_q/k` kwargs straight to
  `attention_varlen`, or the sequences of rows whose `position_ids` restart (found by
  transformers without a cache, i.e. in training; the mask function turns them into
  varlen metadata once a forward). Under torch.compile transformers builds its mask
  function inside the traced forward, where it cannot be inspected: compiled calls
  need the kwargs for packed rows (a device-side assert stops restarting position_ids
  without them), and the mask-pattern check below runs in eager calls only;
- `scaling`, `sliding_window` and `softcap` become vflash's scale, window and softcap
  (the window as transformers' own masks draw it: causal, a token sees itself and the
  `sliding_window - 1` before it; bidirectional, `sliding_window` on each side);
- `s_aux` (gpt-oss's per-head attention sinks) becomes vflash's `sinks`, in fp32 (a model
  in bf16 holds them in bf16: their fp32 copy is kept while the parameter is unchanged, so
  generation reads their values once, not every layer call).

What vflash does not do raises `NotImplementedError` naming the feature, never a
wrong result: attention dropout in training, an arbitrary (4D or additive) mask,
mask patterns other than causal / bidirectional / sliding-window / packed (chunked
attention, custom `or_mask_function` / `and_mask_function`), `output_attentions`.

Continuous batching (`model.generate_batch`, `transformers serve --continuous-batching`):
transformers switches the model's implementation X to "paged|X" and calls what is registered
under that name (5.17-5.22; `register()` registers `paged_attention_forward` there), or calls X
with its paged cache (5.23 on). A batch with prefill in it runs as one `attention_varlen` call a
layer on the keys the engine gathers from its cache; a decode-only batch reads the paged cache in
place, through its block table (`write_kvcache` then `attention_with_kvcache`); the batch's
metadata is checked at its first layer only.
"""

import weakref
from typing import NamedTuple, Optional, Tuple

import torch

import vflash
from vflash._optional import require

NAME = "vf_attention"

# The parts of transformers' mask functions (masking_utils, by the name of the function
# that made them) the attention function reproduces from its arguments: causal or not
# (is_causal), the sliding window (sliding_window), padding (the 2D mask) and packed
# sequences (position_ids or cu_seq_lens).
_MASKS = {"causal_mask_function", "bidirectional_mask_function", "sliding_window_overlay",
          "sliding_window_bidirectional_overlay", "padding_mask_function", "packed_sequence_mask_function"}


def register(name: str = NAME) -> str:
    """Register vflash's attention and mask functions with transformers under `name`;
    returns it, for `attn_implementation=` or `model.set_attn_implementation(...)`."""
    if "flash" in name or "/" in name or ":" in name:
        raise ValueError(f"name {name!r}: transformers treats names containing 'flash' as FlashAttention and "
                         f"'org/repo' names as hub kernels; choose another")
    transformers = require("transformers", "vflash.integrations.transformers")
    transformers.AttentionInterface.register(name, attention_forward)
    transformers.AttentionMaskInterface.register(name, attention_mask)
    # continuous batching (generate_batch, `transformers serve --continuous-batching`) switches a model's
    # implementation X to "paged|X" and calls what is registered under that name
    transformers.AttentionInterface.register(f"paged|{name}", paged_attention_forward)
    _admit_to_continuous_batching(name)
    _admit_to_decode_path()
    _admit_to_serve()
    return name


def _admit_to_decode_path() -> None:
    """Continuous batching's decode path (a decode-only batch handed the paged cache's block table instead of each
    request's keys gathered) is offered to FlashAttention 2 / 3 on CUDA only: `ensure_decode_fast_path_is_available`
    turns it off (max_blocks_per_request = 0) for any other implementation. The narrowest change that admits
    vflash: for vflash's names that function keeps the path, on any device, where the model's attention types all
    take block tables (5.23 on: the allocators say; 5.17-5.22: the cache turns the path off itself for sliding
    layers). `attention_forward` then reads the paged cache in place (`_decode_in_place`). An upstream hook (an
    attention function declaring that it takes a block table) would make it unnecessary."""
    try:
        from transformers.generation.continuous_batching import initialization
    except ImportError:
        return
    original = getattr(initialization, "ensure_decode_fast_path_is_available", None)
    if original is None or getattr(original, "_vflash", False):
        return

    def ensure_decode_fast_path_is_available(config, cb_config, *args, **kwargs):
        implementation = getattr(config, "_attn_implementation", None) or ""
        if implementation.removeprefix("paged|") not in _CB_NAMES:
            return original(config, cb_config, *args, **kwargs)
        allocators = getattr(initialization, "ATTN_TYPE_TO_ALLOCATOR", None)
        types = getattr(initialization, "group_layers_by_attn_type", None)
        if allocators is not None and types is not None and not all(
                allocators[t].supports_block_table for t in types(config)):
            cb_config.max_blocks_per_request = 0
    ensure_decode_fast_path_is_available._vflash = True
    initialization.ensure_decode_fast_path_is_available = ensure_decode_fast_path_is_available


def _admit_to_serve() -> None:
    """`transformers serve` (its `serving` extra installed) validates `--attn-implementation` against a fixed set
    (eager, sdpa, flash_attention_2 / 3, flex_attention) or a hub kernel. The narrowest change that admits
    vflash: its model manager's validation sees "sdpa" in place of a vflash name, for that check only; the
    model is still loaded with vflash's. The server must run in a process that called register():
    `python -m vflash.integrations.transformers serve ...` (the `transformers serve` command line, after
    register()) does. An upstream hook (a check against transformers' AttentionInterface) would make this
    unnecessary."""
    try:
        from transformers.cli.serving import model_manager
    except ImportError:  # no serving extra: nothing to admit
        return
    manager = getattr(model_manager, "ModelManager", None)
    original = getattr(manager, "_validate_args", None)
    if original is None or getattr(original, "_vflash", False):
        return

    def _validate_args(self):
        implementation = self.attn_implementation
        if implementation not in _CB_NAMES:
            return original(self)
        self.attn_implementation = "sdpa"
        try:
            return original(self)
        finally:
            self.attn_implementation = implementation
    _validate_args._vflash = True
    manager._validate_args = _validate_args


_CB_NAMES: set = set()  # the names register() made, which continuous batching takes as FlashAttention's


def _admit_to_continuous_batching(name: str) -> None:
    """transformers 5.23 on: continuous batching no longer calls "paged|X"; the model's own implementation gets
    the paged cache (its update fills `k_cache` / `v_cache` / `block_table` into the kwargs for a decode-only
    batch), and the engine refuses every implementation but "sdpa", "paged|eager" and FlashAttention's. The
    narrowest change that admits vflash: the engine's own test, `is_flash_attention_requested` as its modules
    imported it, also answers yes for vflash's names (asked without a FlashAttention version), so the engine
    builds no 4D mask and passes the packed rows' cu_seq_lens, as it does for FlashAttention (its block-table
    decode path asks for versions 2 / 3: `_admit_to_decode_path`). Nothing outside continuous batching sees the
    change. An upstream hook (an attention function declaring that it
    takes the paged cache's kwargs) would make it unnecessary."""
    _CB_NAMES.add(name)
    try:
        from transformers.generation.continuous_batching import continuous_api
    except ImportError:
        return
    if "paged|sdpa" in _attention_functions():
        return  # 5.17-5.22: the engine calls "paged|<name>", registered above
    import importlib
    for module_name in ("continuous_api", "cache", "initialization"):
        module = importlib.import_module(f"transformers.generation.continuous_batching.{module_name}")
        original = getattr(module, "is_flash_attention_requested", None)
        if original is None or getattr(original, "_vflash", False):
            continue

        def is_flash(config=None, requested_attention_implementation=None, version=None, _original=original):
            implementation = (requested_attention_implementation if config is None
                              else getattr(config, "_attn_implementation", None))
            if version is None and implementation in _CB_NAMES:
                return True
            return _original(config=config, requested_attention_implementation=requested_attention_implementation,
                             version=version)
        is_flash._vflash = True
        module.is_flash_attention_requested = is_flash
    del continuous_api


def _attention_functions() -> dict:
    # the names transformers' AttentionInterface maps, its own and registered ones
    from transformers import AttentionInterface
    return AttentionInterface._global_mapping


class PackedSequences(NamedTuple):
    """What `attention_mask` hands the attention function for packed sequences (rows whose
    position_ids restart, found by transformers): the sequences as varlen metadata."""
    cu_seqlens: torch.Tensor  # int32 [n + 1] over the flattened [B * S] tokens
    max_seqlen: int


def _factories():
    # transformers' mask factories by the definition site of what they return.
    from transformers import masking_utils as mu

    made = {"and_masks": mu.and_masks(), "or_masks": mu.or_masks(),
            "causal_mask_function": mu.causal_mask_function,
            "bidirectional_mask_function": mu.bidirectional_mask_function}
    for name in ("sliding_window_overlay", "sliding_window_bidirectional_overlay", "padding_mask_function",
                 "packed_sequence_mask_function", "blockwise_overlay"):
        if hasattr(mu, name):
            made[name] = getattr(mu, name)(1)
    if hasattr(mu, "chunked_overlay"):
        made["chunked_overlay"] = mu.chunked_overlay(1, None)
    if hasattr(mu, "remap_positions_for_packed_sequence"):  # 5.23 on: packed rows' positions, per sequence
        made["remap_positions_for_packed_sequence"] = mu.remap_positions_for_packed_sequence(
            mu.causal_mask_function, None)
    return {_where(f): name for name, f in made.items()}


def _where(fn):
    # A function's definition site: closures of one factory share it, and torch.compile
    # traces a code object's file and line (not its __qualname__, nor a code-keyed dict).
    return fn.__code__.co_filename, fn.__code__.co_firstlineno


_FACTORIES = {}


def _factory(fn) -> str:
    # The factory that made the mask function fn ("custom" for any other function).
    if not _FACTORIES:
        _FACTORIES.update(_factories())
    return _FACTORIES.get(_where(fn), "custom")


def _mask_parts(fn, combine=None):
    # (combinator, factory name, function) for the parts of a transformers mask function:
    # and_masks / or_masks keep theirs in the closure; a part is named by the factory
    # that made it.
    owner = _factory(fn)
    if owner == "remap_positions_for_packed_sequence":  # the wrapped function on each sequence's own positions,
        # which packed sequences (and_masks' packed_sequence_mask_function part) already mean
        inner = next(c.cell_contents for c in fn.__closure__ if callable(c.cell_contents))
        return _mask_parts(inner, combine)
    if owner in ("and_masks", "or_masks"):
        parts = next(c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, tuple))
        return [leaf for part in parts for leaf in _mask_parts(part, combine if owner == "and_masks" else owner)]
    return [(combine, owner, fn)]


def _packed(seq_ids: torch.Tensor) -> PackedSequences:
    # transformers' packed_sequence_mask [B, S] (a sequence index a token, per row) -> varlen
    # metadata of every row's sequences, in order (one host sync a forward, not a layer).
    B, S = seq_ids.shape
    flat = (seq_ids + torch.arange(B, device=seq_ids.device)[:, None] * S).flatten()
    first = torch.ones_like(flat, dtype=torch.bool)
    first[1:] = flat[1:] != flat[:-1]
    bounds = torch.cat([torch.nonzero(first).flatten(), flat.new_tensor([B * S])]).to(torch.int32)
    return PackedSequences(bounds, int(torch.diff(bounds).max()))


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                   mask_function=None, attention_mask: Optional[torch.Tensor] = None, **kwargs):
    """The mask transformers hands the attention function: the 2D padding mask [B, kv_length]
    (bool, True = a token), PackedSequences for packed rows, or None when nothing is padded
    (FlashAttention's convention). Raises for mask patterns the attention function cannot
    reproduce."""
    if torch.compiler.is_compiling():
        # transformers builds the mask function inside the traced forward, where its parts
        # cannot be inspected: the pattern check runs eagerly only, and the attention
        # function asserts on the device that rows are not packed (see attention_forward)
        return None if attention_mask is None else attention_mask[:, -kv_length:].bool()
    packed = None
    if mask_function is not None:
        for combine, leaf, fn in _mask_parts(mask_function):
            if leaf not in _MASKS or combine == "or_masks":
                raise NotImplementedError(
                    f"vflash: the mask pattern {leaf!r}{' (or_masks)' if combine == 'or_masks' else ''} is not "
                    f"supported (causal, bidirectional, sliding window, padding and packed sequences are)")
            if leaf == "packed_sequence_mask_function":
                packed = _packed(fn.__closure__[0].cell_contents)
    if attention_mask is None:
        return packed
    if attention_mask.dim() != 2:
        raise NotImplementedError(f"vflash: a {attention_mask.dim()}D attention mask is not supported (a 2D padding "
                                  f"mask is)")
    attention_mask = attention_mask[:, -kv_length:].bool()
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def _band(is_causal: bool, sliding_window: Optional[int]):
    # transformers' masks: causal, key j visible from query i when i - sliding_window < j <= i;
    # bidirectional, when |i - j| <= sliding_window (masking_utils' overlays)
    window = None
    if sliding_window is not None:
        window = (sliding_window - 1, 0) if is_causal else (sliding_window, sliding_window)
    return ("bottom_right" if is_causal else False), window


# fp32 copies of sinks parameters held in another dtype: id -> (weak reference, version, copy)
_SINKS_FP32: dict = {}


def _sinks(s_aux: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # s_aux [Hq] in fp32: itself, a copy autograd records (it requires grad), or a kept copy while the
    # parameter is unchanged (vflash reads a sinks tensor's values once per write, not per call)
    if s_aux is None or s_aux.dtype == torch.float32:
        return s_aux
    if torch.compiler.is_compiling() or (s_aux.requires_grad and torch.is_grad_enabled()):
        return s_aux.float()
    kept = _SINKS_FP32.get(id(s_aux))
    if kept is not None and kept[0]() is s_aux and kept[1] == s_aux._version:
        return kept[2]
    if len(_SINKS_FP32) > 1024:
        _SINKS_FP32.clear()
    copy = s_aux.detach().float()
    _SINKS_FP32[id(s_aux)] = (weakref.ref(s_aux), s_aux._version, copy)
    return copy


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention function: query [B, Hq, Sq, D], key / value [B, Hkv, Sk, D]
    (the cache included during generation), attention_mask from `attention_mask` above.
    Returns (out [B, Sq, Hq, D], None)."""
    if dropout:
        raise NotImplementedError(f"vflash: attention dropout ({dropout}) is not supported; train with "
                                  f"attention_dropout=0 or another attention implementation")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("vflash: output_attentions is not supported (the weights are never formed)")
    if isinstance(attention_mask, PackedSequences):
        cu = attention_mask.cu_seqlens
        kwargs = dict(kwargs, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=attention_mask.max_seqlen,
                      max_length_k=attention_mask.max_seqlen)
        attention_mask = None
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.dtype != torch.bool):
        raise NotImplementedError(f"vflash: an arbitrary attention mask ({attention_mask.dim()}D "
                                  f"{attention_mask.dtype}) is not supported; register() installs the mask "
                                  f"function that gives a 2D padding mask")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal, window = _band(bool(causal), sliding_window)
    opts = dict(causal=causal, scale=scaling, window=window, softcap=softcap, sinks=_sinks(kwargs.get("s_aux")))
    B, Hq, Sq, D = query.shape
    Dv = value.shape[-1]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    pos = kwargs.get("position_ids")
    if torch.compiler.is_compiling() and attention_mask is None and cu_q is None and pos is not None and Sq > 1:
        torch._assert_async((torch.diff(pos, dim=-1) == 1).all(),
                            "vflash: packed sequences (restarting position_ids) under torch.compile: pass "
                            "cu_seq_lens_q/k and max_length_q/k (DataCollatorWithFlattening(return_flash_attn_kwargs="
                            "True) does)")
    if kwargs.get("block_table") is not None and kwargs.get("k_cache") is not None:
        # continuous batching's decode-only batch (5.23 on): the paged cache, read in place
        return _decode_in_place(module, query, key, value, kwargs["k_cache"], kwargs["v_cache"],
                                kwargs["block_table"], cu_k, opts), None
    if attention_mask is None and cu_q is None:
        return vflash.attention(query, key, value, **opts).transpose(1, 2), None
    q = query.transpose(1, 2).reshape(B * Sq, Hq, D)
    if attention_mask is None:  # packed: [1, total, H, D] rows straight through
        k = key.transpose(1, 2).reshape(-1, key.shape[1], D)
        v = value.transpose(1, 2).reshape(-1, value.shape[1], Dv)
        check, padding = True, None
        if "read_index" in kwargs:  # continuous batching: the batch's metadata checked once, not once a layer
            check, padding = _per_batch(cu_q, cu_k, compute=lambda: _padding(cu_q, cu_k, q.shape[0], k.shape[0]))
        cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
        max_q, max_k = int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
        if padding is not None:
            cu_q, cu_k, max_q, max_k = _cover_padding(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k, padding)
        out = vflash.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, check_metadata=check, **opts)
        return out.view(B, Sq, Hq, Dv), None
    return _padded(query, key, value, attention_mask, opts), None


def _padding(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int) -> Optional[Tuple[int, int]]:
    """The rows past a continuous batch's last request, (q's, k's), or None where there are none. The engine pads a
    batch to a CUDA-graph size (use_cuda_graph, or compile): its packed q and k / v then hold rows past
    cu_seq_lens' last entries that belong to no request. Inside a capture the rows vary from replay to replay and
    nothing may be read to the host: every row of q and k may be padding."""
    if _capturing():
        return total_q, total_k
    last_q, last_k = (int(x) for x in torch.stack([cu_q[-1], cu_k[-1]]).tolist())
    return None if (last_q, last_k) == (total_q, total_k) else (total_q - last_q, total_k - last_k)


def _cover_padding(cu_q, cu_k, total_q: int, total_k: int, max_q: int, max_k: int, padding: Tuple[int, int]):
    # vflash's varlen metadata rule wants every packed row in a sequence (the backward writes every row of dq, dk,
    # dv): the padding rows become one more sequence, which ends at the packed lengths (its queries attend its own
    # keys, and its output rows are the engine's to drop). On the device, without a host read: capturable.
    pad = torch.nn.functional.pad
    return (pad(cu_q, (0, 1), value=total_q), pad(cu_k, (0, 1), value=total_k), max(max_q, padding[0]),
            max(max_k, padding[1]))


def _padded(query, key, value, mask, opts):
    # Unpad (transformers' _upad_input convention: a cache longer than the mask is cut to
    # it; queries are the last Sq positions of each row), one varlen call, pad back.
    B, Hq, Sq, D = query.shape
    Dv = value.shape[-1]
    key, value = key[:, :, :mask.shape[1]], value[:, :, :mask.shape[1]]
    Sk, Hkv = key.shape[2], key.shape[1]
    lengths_k = mask.sum(1, dtype=torch.int32)
    idx_k = torch.nonzero(mask.flatten()).flatten()
    k = key.transpose(1, 2).reshape(B * Sk, Hkv, D).index_select(0, idx_k)
    v = value.transpose(1, 2).reshape(B * Sk, Hkv, Dv).index_select(0, idx_k)
    q_mask = mask[:, -Sq:]
    lengths_q = q_mask.sum(1, dtype=torch.int32)
    idx_q = torch.nonzero(q_mask.flatten()).flatten()
    q = query.transpose(1, 2).reshape(B * Sq, Hq, D).index_select(0, idx_q)
    max_q, max_k = (int(x) for x in torch.stack([lengths_q.max(), lengths_k.max()]).tolist())
    out = vflash.attention_varlen(q, k, v, _cu_seqlens(lengths_q), _cu_seqlens(lengths_k), max_q, max_k, **opts)
    full = out.new_zeros(B * Sq, Hq, Dv).index_copy(0, idx_q, out)
    return full.view(B, Sq, Hq, Dv)


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask=None, **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' continuous-batching attention ("paged|<name>", 5.17-5.22): a batch's new tokens packed,
    query [1, Hq, total_q, D], key / value [1, Hkv, total_q, D], with the engine's paged cache (`cache`), its
    `read_index` / `write_index` and the batch's `cu_seq_lens_q` / `cu_seq_lens_k` (a dict by layer type where
    sliding and full layers mix) and their maxima (`max_seqlen_q` / `_k`). The cache's update writes the new keys
    and hands back each sequence's keys, cached and new, packed (transformers gathers them through read_index);
    then `attention_forward`'s packed path, as 5.23 on call it: one `vflash.attention_varlen` call, bottom-right
    (a request's new tokens are its last), the layer's sliding window and sinks, the batch's metadata checked
    once. A decode-only batch comes with a `block_table` instead: the layer's cache read in place
    (`_decode_in_place`). Returns (out [1, total_q, Hq, D_v], None)."""
    cache = kwargs.pop("cache", None)
    if cache is None:
        raise ValueError("vflash: the paged attention was called without transformers' paged cache; it serves "
                         "continuous batching (generate_batch, transformers serve), not a plain forward")
    window = getattr(module, "sliding_window", None)
    layer_type = "sliding_attention" if window else "full_attention"
    cu_k, max_k = kwargs["cu_seq_lens_k"], kwargs["max_seqlen_k"]
    if isinstance(cu_k, dict):
        cu_k, max_k = cu_k[layer_type], max_k[layer_type]
    block_table = kwargs.get("block_table")
    if block_table is not None:  # a decode-only batch: its group's cache and table, as 5.23 on hand them over
        group, index = cache.layer_index_to_group_indices[module.layer_idx]
        shape = (-1, cache.block_size, cache.num_key_value_heads, cache.head_dim)
        kwargs.update(block_table=block_table[group], k_cache=cache.key_cache[index].view(shape),
                      v_cache=cache.value_cache[index].view(shape), cu_seq_lens_k=cu_k, sliding_window=window)
        return attention_forward(module, query, key, value, None, **kwargs)
    k, v = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                        read_index=kwargs["read_index"], write_index=kwargs["write_index"])
    kwargs.update(cu_seq_lens_k=cu_k, max_length_q=kwargs["max_seqlen_q"], max_length_k=max_k,
                  sliding_window=window)
    return attention_forward(module, query, k.transpose(0, 1)[None], v.transpose(0, 1)[None], None, **kwargs)


def _decode_in_place(module, query, key, value, k_cache, v_cache, block_table, cu_k, opts) -> torch.Tensor:
    """A decode-only batch (one new token a request) on the engine's paged cache, read in place: the new keys and
    values written into their slots (`vflash.write_kvcache`), then `vflash.attention_with_kvcache` through the
    block table, with no gather. query [1, Hq, n, D], key / value [1, Hkv, n, D] (the new tokens); k_cache /
    v_cache [pages, page_size, Hkv, D]; block_table int32 [n, max_pages] (-1 past a request's pages and on the
    rows that pad the batch); cu_k [n + 1], each request's keys with its new one (a padding row's 0). Returns out
    [1, n, Hq, D_v]."""
    n = cu_k.numel() - 1
    if query.shape[2] != n or block_table.shape[0] != n:
        raise ValueError(f"vflash: a decode batch of {query.shape[2]} tokens with {n} sequences and "
                         f"{block_table.shape[0]} block-table rows: one token a sequence expected")
    check, (stride, table, slots, lengths) = _per_batch(block_table, cu_k, compute=lambda: _decode_metadata(
        block_table, cu_k, _page_stride(module, k_cache, v_cache), k_cache.shape[1]))
    k_cache, v_cache = _pages_apart(k_cache, v_cache, stride)
    vflash.write_kvcache(k_cache, v_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), slots,
                         check_metadata=check)
    out = vflash.attention_with_kvcache(query[0].transpose(0, 1)[:, None], k_cache, v_cache, lengths,
                                        block_table=table, check_metadata=check, **opts)
    return out.transpose(0, 1)


def _page_stride(module, k_cache, v_cache) -> int:
    """The stride S (in pages) of the block table's entries. 5.17-5.22 hand each layer's keys and values as tensors
    of their own: S = 1. 5.23 on hand views of one buffer in which a block holds, for each full-attention layer, its
    K page then its V page, so the V view is the K view one page on (K page p + 1 is V page p: aliased, and apart
    only as the allocator uses them), and a block's entry is its number times S = 2 x the full-attention layers."""
    if k_cache.untyped_storage().data_ptr() != v_cache.untyped_storage().data_ptr():
        return 1
    from transformers.generation.continuous_batching import cache as cb
    full = cb.group_layers_by_attn_type(module.config).get("full_attention", ())
    return cb.ATTN_TYPE_TO_ALLOCATOR["full_attention"].rows_per_token * len(full)


def _pages_apart(k_cache, v_cache, stride: int):
    """Page views of the layer's keys and values taken every `stride` pages (_page_stride), which do not overlap
    (vflash.write_kvcache refuses aliased caches); the table divides by the stride (_decode_metadata)."""
    if stride == 1:
        return k_cache, v_cache
    page = k_cache[0].numel()
    if stride < 2 or not k_cache.is_contiguous() or not v_cache.is_contiguous() or \
            v_cache.data_ptr() - k_cache.data_ptr() != page * k_cache.element_size():
        raise NotImplementedError("vflash: this transformers release's paged cache layout is not one vflash knows "
                                  "(a layer's V pages one page after its K pages); turn the decode path off with "
                                  "ContinuousBatchingConfig(max_blocks_per_request=0)")
    shape = (-(-k_cache.shape[0] // stride), *k_cache.shape[1:])
    strides = (stride * page, *k_cache.stride()[1:])
    return k_cache.as_strided(shape, strides), v_cache.as_strided(shape, strides)


def _decode_metadata(block_table: torch.Tensor, cu_k: torch.Tensor, stride: int, page_size: int):
    # (the stride, the table over the views taken every `stride` pages, each request's slot for its new token, its
    # keys with the new one): the batch's, computed at its first layer. The slot is page * page_size + the new token's row; a padding row (no key) or a missing page
    # writes nothing (-1). Entries that are not multiples of the stride would name pages the views skip: refused.
    if stride > 1:
        if not _capturing() and bool(((block_table >= 0) & (block_table % stride != 0)).any()):
            raise ValueError(f"vflash: the engine's block table holds entries that are not multiples of its "
                             f"{stride} pages a block")
        block_table = torch.where(block_table >= 0, block_table // stride, -1).to(block_table.dtype)
    lengths = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    position = (lengths - 1).clamp_min(0).to(torch.int64)
    page = block_table.gather(1, (position // page_size)[:, None]).squeeze(1).to(torch.int64)
    slots = torch.where((lengths > 0) & (page >= 0), page * page_size + position % page_size, -1)
    return stride, block_table, slots, lengths


_SEEN: dict = {}  # per batch: (data pointer, version) of its metadata tensors -> (the tensors, derived values)


def _per_batch(*tensors: torch.Tensor, compute=None):
    # (whether this batch's metadata is new, what `compute` derived from it the first time). A batch's layers
    # share its metadata tensors (a full layer's and a sliding one's cu_seqlens_k differ: each is seen once),
    # and the engine rewrites them in place for the next batch, which bumps their versions. So the check (a
    # kernel, and a host sync for CUDA tensors) runs once a batch, and never inside a CUDA-graph capture (whose
    # replays rerun no Python, on other values: there `compute` runs each time, so the graph records it). The
    # entries hold the tensors, so no other tensor takes their memory (and pointer) while they are here.
    key = tuple(x for t in tensors for x in (t.data_ptr(), t._version))
    if _capturing():  # what a capture records must come from its own tensors, not from the warm-up's
        return False, compute() if compute is not None else None
    if key in _SEEN:
        return False, _SEEN[key][1]
    if len(_SEEN) > 64:
        _SEEN.clear()
    value = compute() if compute is not None else None
    _SEEN[key] = (tensors, value)
    return True, value


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# `python -m vflash.integrations.transformers serve MODEL --attn-implementation vf_attention`
if __name__ == "__main__":
    import sys

    register()
    from transformers.cli.transformers import main as transformers_cli

    sys.exit(transformers_cli())
