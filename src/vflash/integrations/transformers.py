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
under that name; `register()` registers `paged_attention_forward` there too (below).
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
    _admit_to_serve()
    return name


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
    builds no 4D mask and passes the packed rows' cu_seq_lens, as it does for FlashAttention; its block-table
    decode path stays FlashAttention's own (it asks for versions 2 / 3 and their kernel). Nothing outside
    continuous batching sees the change. An upstream hook (an attention function declaring that it
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
    if attention_mask is None and cu_q is None:
        return vflash.attention(query, key, value, **opts).transpose(1, 2), None
    q = query.transpose(1, 2).reshape(B * Sq, Hq, D)
    if attention_mask is None:  # packed: [1, total, H, D] rows straight through
        k = key.transpose(1, 2).reshape(-1, key.shape[1], D)
        v = value.transpose(1, 2).reshape(-1, value.shape[1], Dv)
        # continuous batching (transformers 5.23 on: the engine's read / write indices beside the packed rows)
        # checks a batch's metadata once, not once a layer
        check = _first_sight(cu_q, cu_k) if "read_index" in kwargs else True
        out = vflash.attention_varlen(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32),
                                      int(kwargs["max_length_q"]), int(kwargs["max_length_k"]),
                                      check_metadata=check, **opts)
        return out.view(B, Sq, Hq, Dv), None
    return _padded(query, key, value, attention_mask, opts), None


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
    once. Returns (out [1, total_q, Hq, D_v], None)."""
    cache = kwargs.pop("cache", None)
    if cache is None:
        raise ValueError("vflash: the paged attention was called without transformers' paged cache; it serves "
                         "continuous batching (generate_batch, transformers serve), not a plain forward")
    window = getattr(module, "sliding_window", None)
    layer_type = "sliding_attention" if window else "full_attention"
    cu_k, max_k = kwargs["cu_seq_lens_k"], kwargs["max_seqlen_k"]
    if isinstance(cu_k, dict):
        cu_k, max_k = cu_k[layer_type], max_k[layer_type]
    k, v = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                        read_index=kwargs["read_index"], write_index=kwargs["write_index"])
    kwargs.update(cu_seq_lens_k=cu_k, max_length_q=kwargs["max_seqlen_q"], max_length_k=max_k,
                  sliding_window=window)
    return attention_forward(module, query, k.transpose(0, 1)[None], v.transpose(0, 1)[None], None, **kwargs)


_SEEN: dict = {}  # the batch metadata checked last, by (data pointer, version) of cu_seqlens_q and _k


def _first_sight(cu_q: torch.Tensor, cu_k: torch.Tensor) -> bool:
    # Whether this batch's metadata is new: a batch's layers share its cu_seqlens tensors (a full layer's and a
    # sliding one's cu_seqlens_k differ: each is checked once), and the engine rewrites them in place for the
    # next batch, which bumps their versions. So the check (a kernel, no host sync) runs once a batch. The
    # entries hold the tensors, so no other tensor takes their memory (and pointer) while they are here.
    key = (cu_q.data_ptr(), cu_q._version, cu_k.data_ptr(), cu_k._version)
    if key in _SEEN:
        return False
    if len(_SEEN) > 64:
        _SEEN.clear()
    _SEEN[key] = (cu_q, cu_k)
    return True


# `python -m vflash.integrations.transformers serve MODEL --attn-implementation vf_attention`
if __name__ == "__main__":
    import sys

    register()
    from transformers.cli.transformers import main as transformers_cli

    sys.exit(transformers_cli())
