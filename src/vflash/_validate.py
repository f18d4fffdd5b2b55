"""Checks on user input, in one place, before the work is launched. Values too many to
bring to the host are checked on their device: the KV-cache metadata by a small kernel of
its own (kernels/metadata.py), a long slot_mapping by a few PyTorch ops.

Every failure is a ValueError or TypeError that names the argument, says what
was expected and what came, and how to fix it. Messages never print tensor
contents.
"""

import math
import numbers
import weakref
from typing import Optional, Tuple, Union

import torch

from vflash import dispatch
from vflash._backend import interpreted, interpreter_refusal
from vflash.call import (ATTENTION, ATTENTION_KVCACHE, ATTENTION_VARLEN, Band, Cache, Call, Packed, Score, Spec,
                         v_in_k_cache)
from vflash.ops import plans

SUPPORTED_DTYPES = dispatch.DTYPES  # the input dtypes some kernel family takes (vflash.dispatch.REGISTRY)
FP8_DTYPES = (torch.float8_e4m3fn,)  # FP8 inputs (forward only, attention and attention_varlen)
# the dtypes of the entry points that take no FP8 (merge_states, write_kvcache)
_PLAIN_DTYPE_NAMES = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES if d not in FP8_DTYPES)
_DTYPE_NAMES = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
CAUSAL_MODES = ("top_left", "bottom_right")
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256
# Against a latent KV cache (v_cache a view of k_cache's first columns: MLA's 512 + 64), q's and k's head dim
# may reach 576 and v's 512
MAX_LATENT_HEAD_DIM, MAX_LATENT_V_HEAD_DIM = 576, 512
_LATENT = ("; against a latent cache (v_cache = k_cache[..., :D_v], a view: MLA) up to "
           f"{MAX_LATENT_HEAD_DIM} for q and k and {MAX_LATENT_V_HEAD_DIM} for v")
MAX_GRID_YZ = 65535  # CUDA's limit on a launch grid's 2nd and 3rd dimensions: q heads, batch
_INT32_MAX = 2**31 - 1

CausalArg = Union[bool, str]


_REPR_MAX = 40  # longest repr of a short scalar or string a message quotes


def _type_name(x) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__.split('.')[0]}.{t.__name__}"


def _describe(x) -> str:
    """What `x` is, for an error message: its type, and its shape or length for
    containers, never its contents. Only a short scalar or string is quoted."""
    if isinstance(x, torch.Tensor):
        return f"tensor(shape={tuple(x.shape)}, dtype={x.dtype}, device={x.device})"
    if x is None or isinstance(x, (bool, numbers.Number, str)):
        text = repr(x) if not isinstance(x, int) or x.bit_length() < 64 else f"<int of {x.bit_length()} bits>"
        if len(text) > _REPR_MAX:
            text = text[:_REPR_MAX - 5] + "...'" if isinstance(x, str) else f"<{len(text)} characters>"
        return f"{_type_name(x)} {text}"
    shape = getattr(x, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape):
        dtype = getattr(x, "dtype", None)
        return f"{_type_name(x)} of shape {shape}" + (f" and dtype {dtype}" if dtype is not None else "")
    try:
        return f"{_type_name(x)} of length {len(x)}"
    except Exception:  # not sized
        return _type_name(x)


def _as_tensor_hint(x) -> str:
    """How to turn a list or an array into the tensor that was expected."""
    if type(x).__module__.split(".")[0] == "numpy" and hasattr(x, "shape"):
        return "; convert it with torch.from_numpy(x)"
    if isinstance(x, (list, tuple)):
        return "; convert it with torch.tensor(x)"
    return ""


def _check_tensor(name: str, t, ndim: int, layout: str, hint: str = "") -> None:
    # One attention input: a dense tensor of a supported dtype and the layout's rank.
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_describe(t)}{_as_tensor_hint(t)}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}{hint}")
    if t.dtype not in SUPPORTED_DTYPES:
        fp8 = ("; FP8 inputs are e4m3 (torch.float8_e4m3fn, FlashAttention-3's), with descales"
               if t.dtype.is_floating_point and t.dtype.itemsize == 1 else "")
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {_DTYPE_NAMES}{fp8}")
    if t.layout is not torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")


def _check_tensors(q, k, v, ndim: int, layout: str, kv_layout: str, hint: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, ndim, layout, hint)
    if not (q.dtype == k.dtype == v.dtype):
        fp8 = (" (FP8: all three float8_e4m3fn, each with its descale)"
               if any(t.dtype in FP8_DTYPES for t in (q, k, v)) else "")
        raise TypeError(f"q, k and v must share one dtype{fp8}, got q {q.dtype}, k {k.dtype}, v {v.dtype}; "
                        f"cast them with .to(dtype)")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must have the same shape {kv_layout} but for the head dim (v's may differ), "
                         f"got k {tuple(k.shape)} and v {tuple(v.shape)}")


def _check_heads_and_device(q, Hq: int, Hkv: int, D: int, Dk: int, Dv: Optional[int] = None,
                            latent: Optional[bool] = None) -> None:
    # Dv: v's head dim, which may differ from q's and k's (D); each a multiple of 8 in [8, 256], or against a
    # latent KV cache (`latent` True; None: not a KV-cache call) up to 576 and 512
    max_d, max_dv = (MAX_LATENT_HEAD_DIM, MAX_LATENT_V_HEAD_DIM) if latent else (MAX_HEAD_DIM, MAX_HEAD_DIM)
    note = _LATENT if latent is False else ""
    if Dk != D:
        raise ValueError(f"head dims differ: q has {D}, k has {Dk}")
    if Dv is not None and not (MIN_HEAD_DIM <= Dv <= max_dv and Dv % 8 == 0):
        raise ValueError(f"v's head dim must be a multiple of 8 between {MIN_HEAD_DIM} and {max_dv}{note}, "
                         f"got {Dv}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}) for GQA/MQA")
    if Hq > MAX_GRID_YZ:
        raise ValueError(f"q heads ({Hq}) exceed {MAX_GRID_YZ}, the most one launch covers")
    if not (MIN_HEAD_DIM <= D <= max_d and D % 8 == 0):
        raise ValueError(f"head_dim must be a multiple of 8 between {MIN_HEAD_DIM} and {max_d}{note}, got {D}")
    _check_device(q.device, "q is a CPU tensor")


def _check_device(device: torch.device, on_cpu: str) -> None:
    """CUDA, or the CPU where this Triton's interpreter runs (`on_cpu` starts the message)."""
    if device.type != "cuda":
        if device.type != "cpu":
            raise ValueError(f"tensors on {device.type} are not supported; use CUDA or CPU tensors")
        refusal = interpreter_refusal()  # CPU tensors run through Triton's interpreter
        if refusal is not None:
            raise ValueError(f"{on_cpu}, and {refusal}")


def _check_span(name: str, n: int, D: int, stride_n: int, stride_d: int, what: str) -> None:
    # Offsets inside one (sequence, head) slice are 32-bit in the kernel.
    extent = (n - 1) * stride_n + (D - 1) * stride_d
    if extent > _INT32_MAX:
        raise ValueError(f"{name}'s {what} ({extent} elements within one head) exceeds "
                         f"2**31 - 1; split the sequence or make the tensor contiguous")


def _check_int(name: str, x, low: int, what: str = "") -> int:
    """An int argument of at least `low`: a TypeError for another type (bool included), a ValueError
    for an int below `low` or past int32. `what` follows the rule in both messages."""
    rule = f"{name} must be an int >= {low}{what}"
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{rule}, got {_describe(x)}")
    if x < low:
        raise ValueError(f"{rule}, got {_describe(x)}")
    if x > _INT32_MAX:
        raise ValueError(f"{name} ({x if x.bit_length() <= 256 else _describe(x)}) exceeds 2**31 - 1")
    return int(x)


def _check_index_tensor(name: str, t, ndim: int, shape: str) -> None:
    # An int32 metadata tensor: a TypeError for another type or dtype, a ValueError for another rank.
    rule = f"{name} must be an int32 tensor {shape}"
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        raise TypeError(f"{rule}, got {_describe(t)}{_as_tensor_hint(t)}")
    if t.dim() != ndim:
        raise ValueError(f"{rule}, got {_describe(t)}")


def check_qkv(q, k, v) -> None:
    """Validate q [B, Hq, Nq, D], k/v [B, Hkv, Nk, D]."""
    # Runs on every call: the common case goes through a handful of cheap tests.
    _check_tensors(q, k, v, 4, "[batch, heads, seq_len, head_dim]", "[B, Hkv, Nk, D]",
                   "; a [batch, seq_len, heads, head_dim] tensor can be passed as x.transpose(1, 2)")
    B, Hq, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if Bk != B:
        raise ValueError(f"batch sizes differ: q has {B}, k and v have {Bk}")
    if B > MAX_GRID_YZ:
        raise ValueError(f"batch size {B} exceeds {MAX_GRID_YZ}, the most one launch covers; split the batch "
                         f"into chunks of at most {MAX_GRID_YZ}")
    _check_heads_and_device(q, Hq, Hkv, D, Dk, v.shape[3])
    for name, t, n in (("q", q, Nq), ("k", k, Nk), ("v", v, Nk)):
        _check_span(name, n, t.shape[3], t.stride(2), t.stride(3), "sequence span")


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> int:
    """Validate packed q [total_q, Hq, D], k/v [total_k, Hkv, D] and their int32
    cu_seqlens [B + 1]; returns B. The offsets' values are checked next to the launch
    (vflash.ops.metadata.check_offsets)."""
    _check_tensors(q, k, v, 3, "[total_q, heads, head_dim] (packed sequences)", "[total_k, Hkv, D]", "")
    total_q, Hq, D = q.shape
    total_k, Hkv, Dk = k.shape
    _check_heads_and_device(q, Hq, Hkv, D, Dk, v.shape[2])
    n = None
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be an int32 torch.Tensor [batch + 1], got {_describe(cu)}"
                            f"{_as_tensor_hint(cu)}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {cu.dtype}; convert it with .to(torch.int32)")
        if cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{name} must be 1-D [batch + 1] with batch >= 1, got shape {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name} must be on q's device ({q.device}), got {cu.device}")
        if cu.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous; pass {name}.contiguous()")
        if n is not None and cu.numel() != n:
            raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length [batch + 1], got "
                             f"{n} and {cu.numel()}")
        n = cu.numel()
    batch = n - 1
    if batch > MAX_GRID_YZ:
        raise ValueError(f"{batch} sequences exceed {MAX_GRID_YZ}, the most one launch covers; split the batch")
    for name, x in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        _check_int(name, x, 0)
    if total_q > _INT32_MAX or total_k > _INT32_MAX:
        raise ValueError(f"packed lengths must fit int32, got total_q {total_q}, total_k {total_k}")
    for name, t, m in (("q", q, max_seqlen_q), ("k", k, max_seqlen_k), ("v", v, max_seqlen_k)):
        _check_span(name, m, t.shape[2], t.stride(0), t.stride(2), "longest sequence's span")
    return batch


def check_merge(out_a, lse_a, out_b, lse_b) -> None:
    """Validate two partial results: outputs [..., D] of one shape and dtype, their
    LSEs [...] (the outputs' leading shape) fp32, all on one device."""
    for name, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {_describe(t)}{_as_tensor_hint(t)}")
        if t.layout is not torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if out_a.dim() < 1:
        raise ValueError("out_a must be [..., head_dim], got a 0-d tensor")
    if out_a.shape != out_b.shape:
        raise ValueError(f"out_a and out_b must have one shape, got {tuple(out_a.shape)} and {tuple(out_b.shape)}")
    check_no_fp8("merge_states", out_a=out_a, out_b=out_b)
    if out_a.dtype not in SUPPORTED_DTYPES or out_a.dtype != out_b.dtype:
        raise TypeError(f"out_a and out_b must share one of {_PLAIN_DTYPE_NAMES}, got out_a {out_a.dtype}, "
                        f"out_b {out_b.dtype}")
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if lse.shape != out_a.shape[:-1]:
            raise ValueError(f"{name} must have the outputs' leading shape {tuple(out_a.shape[:-1])}, got "
                             f"{tuple(lse.shape)}")
        if lse.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (vflash returns LSE in fp32), got {lse.dtype}")
    devices = {t.device for t in (out_a, lse_a, out_b, lse_b)}
    if len(devices) != 1:
        raise ValueError(f"out_a, lse_a, out_b and lse_b must be on one device, got {sorted(map(str, devices))}")
    _check_device(out_a.device, "out_a is a CPU tensor")
    if lse_a.numel() > _INT32_MAX:
        raise ValueError(f"{lse_a.numel()} rows exceed 2**31 - 1; merge in parts")


def check_kvcache_attention(q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q):
    """Validate attention against a KV cache. q [B, Nq, Hq, D], or packed [total_q, Hq, D]
    with cu_seqlens_q int32 [B + 1] and max_seqlen_q; the cache contiguous
    [B, max_len, Hkv, D] (block_table None) or paged [pages, page_size, Hkv, D] with an
    int32 block_table [B, max_pages]; cache_seqlens int32 [B]. Returns B. The values are
    checked next to the launch (vflash.ops.metadata.check_cache)."""
    packed = cu_seqlens_q is not None
    _check_tensor("q", q, 3 if packed else 4, "[total_q, heads, head_dim] (packed, with cu_seqlens_q)" if packed
                  else "[batch, seq_len, heads, head_dim]")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, 4, "[pages or batch, rows, Hkv, D]")
    if q.dtype in FP8_DTYPES:
        raise TypeError(f"attention_with_kvcache takes a float16 / bfloat16 q (FP8 caches hold the keys and "
                        f"values), got q {q.dtype}")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (q.dtype, *FP8_DTYPES):
        raise TypeError(f"the caches must share q's dtype, or both be float8_e4m3fn (an FP8 cache, with "
                        f"k_descale / v_descale) beside a float16 / bfloat16 q; got q {q.dtype}, k_cache "
                        f"{k_cache.dtype}, v_cache {v_cache.dtype}")
    if k_cache.dtype in FP8_DTYPES and q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"an FP8 cache takes a float16 / bfloat16 q, got q {q.dtype}")
    if k_cache.shape[:-1] != v_cache.shape[:-1]:
        raise ValueError(f"k_cache and v_cache must have one shape but for the head dim (v's may differ), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    Hq, D = q.shape[-2], q.shape[-1]
    _, rows, Hkv, Dk = k_cache.shape
    if not packed:
        _check_dense_q_layout(q, Hkv)
    _check_heads_and_device(q, Hq, Hkv, D, Dk, v_cache.shape[3], latent=v_in_k_cache(k_cache, v_cache))
    if rows < 1:
        raise ValueError(f"k_cache's second dim (the page size, or a contiguous cache's length) must be at least 1, "
                         f"got shape {tuple(k_cache.shape)}")
    _check_index_tensor("cache_seqlens", cache_seqlens, 1, "[batch]")
    batch = cache_seqlens.numel()
    if batch < 1 or batch > MAX_GRID_YZ:
        raise ValueError(f"cache_seqlens must hold 1 to {MAX_GRID_YZ} sequences, got {batch}")
    if cache_seqlens.stride(0) != 1 and batch > 1:  # the kernels read sequence b's length at offset b
        raise ValueError("cache_seqlens must be contiguous; pass cache_seqlens.contiguous()")
    tensors = [("cache_seqlens", cache_seqlens)]
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(f"a contiguous cache [batch, max_len, Hkv, D] must have one row per sequence: "
                             f"{k_cache.shape[0]} for {batch} sequences in cache_seqlens")
        capacity = rows
    else:
        _check_index_tensor("block_table", block_table, 2, "[batch, max_pages]")
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table has {block_table.shape[0]} rows for {batch} sequences in cache_seqlens")
        if block_table.stride(1) != 1 and block_table.shape[1] > 1:
            raise ValueError("block_table's rows must be contiguous; pass block_table.contiguous()")
        capacity = block_table.shape[1] * rows
        tensors.append(("block_table", block_table))
    if packed:
        _check_index_tensor("cu_seqlens_q", cu_seqlens_q, 1, "[batch + 1]")
        if cu_seqlens_q.numel() != batch + 1:
            raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.numel()} entries for {batch} sequences (batch + 1)")
        if cu_seqlens_q.stride(0) != 1:
            raise ValueError("cu_seqlens_q must be contiguous; pass cu_seqlens_q.contiguous()")
        _check_int("max_seqlen_q", max_seqlen_q, 0, " with cu_seqlens_q")
        tensors.append(("cu_seqlens_q", cu_seqlens_q))
    else:
        if max_seqlen_q is not None:
            raise ValueError("max_seqlen_q goes with packed queries (cu_seqlens_q); q [B, Nq, Hq, D] gives Nq")
        if q.shape[0] != batch:
            raise ValueError(f"q holds {q.shape[0]} sequences, cache_seqlens {batch}")
    for name, t in tensors:
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")
    if capacity > _INT32_MAX:
        raise ValueError(f"a sequence's cache capacity ({capacity} rows) exceeds 2**31 - 1")
    return batch


_LAYOUTS = ("attention_with_kvcache takes dense q as [B, Nq, Hq, D] (FlashAttention's layout), not "
            "vflash.attention's [B, Hq, Nq, D] (SDPA's)")


def _check_dense_q_layout(q, Hkv: int) -> None:
    """Dense q [B, Nq, Hq, D] where vflash.attention's [B, Hq, Nq, D] would be misread. With a one-head
    cache, q [B, n, 1, D] (n > 1) is n new queries of one head, or attention's decode query of n heads:
    MQA accepts both, and the second gives wrong numbers, so it is refused (a one-head model's queries
    pass unambiguously packed). A head count that is not a multiple of the cache's, where q.shape[1]
    is, names the same mix-up."""
    _, n_q, h_q, _ = q.shape
    if Hkv == 1 and h_q == 1 and n_q > 1:
        raise ValueError(f"q {tuple(q.shape)} against a one-head cache is ambiguous: {n_q} new queries of 1 head, "
                         f"or a decode query of {n_q} heads in the wrong layout. {_LAYOUTS}: pass q.transpose(1, 2) "
                         f"for the latter. A one-head model passes its queries packed: q [total_q, 1, D] with "
                         f"cu_seqlens_q and max_seqlen_q (docs/layouts.md)")
    if Hkv > 1 and h_q % Hkv and n_q % Hkv == 0:
        raise ValueError(f"q heads ({h_q}, q.shape[2]) must be a multiple of k/v heads ({Hkv}) for GQA/MQA; "
                         f"q.shape[1] ({n_q}) is one. {_LAYOUTS}: if q is in the latter, pass q.transpose(1, 2) "
                         f"(docs/layouts.md)")


KVCACHE_OUT_APART = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "cu_seqlens_q")


def check_kvcache_out(out, inputs) -> Tuple[int, ...]:
    """attention_with_kvcache's out=: q's shape (with v's head dim), dtype and device, unit stride in the
    head dim, its memory apart from every input's (inputs: KVCACHE_OUT_APART's tensors, None where
    absent; the split merge re-reads q after other programs have written out). Returns out's
    and the inputs' byte extents (kvcache_out_overlap's, for a plan's guard)."""
    q, v_cache = inputs[0], inputs[2]
    shape = (*q.shape[:-1], v_cache.shape[-1])
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor of q's shape, got {_describe(out)}")
    if tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must have q's shape with v's head dim, q's dtype and device ({shape}, {q.dtype}, "
                         f"{q.device}), got {tuple(out.shape)}, {out.dtype}, {out.device}")
    if out.layout is not torch.strided or (out.stride(-1) != 1 and out.shape[-1] > 1):
        raise ValueError("out must be strided with a unit stride in the head dim; pass a contiguous tensor")
    if out.requires_grad:
        raise ValueError("out requires grad: attention_with_kvcache has no backward pass to write it under")
    if not _elements_apart(out):
        raise ValueError("out's elements overlap each other (a stride 0, an expand); pass a contiguous tensor")
    extents = (_byte_extent(out),) + tuple(0 if t is None else _byte_extent(t) for t in inputs)
    name = kvcache_out_overlap(out, inputs, extents)
    if name is not None:
        raise ValueError(f"out overlaps {name}'s memory; pass a tensor of its own")
    return extents


def kvcache_out_overlap(out, inputs, extents) -> Optional[str]:
    """The name (KVCACHE_OUT_APART's) of the first of `inputs` whose bytes overlap out's, or
    None. extents: out's and the inputs' byte extents (check_kvcache_out's: fixed by their
    metadata, so a launch plan's guard keeps them)."""
    start = out.data_ptr()
    end = start + extents[0]
    for name, t, size in zip(KVCACHE_OUT_APART, inputs, extents[1:]):
        if t is not None and size:
            other = t.data_ptr()
            if start < other + size and other < end:
                return name
    return None


def _byte_extent(t: torch.Tensor) -> int:
    # bytes from a tensor's first element to past its last one; 0 for no elements
    if t.numel() == 0:
        return 0
    if t.is_contiguous():  # the common case, without the Python sum
        return t.numel() * t.element_size()
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def _elements_apart(t: torch.Tensor) -> bool:
    """No two elements of t share memory (see _strides_apart)."""
    return t.is_contiguous() or _strides_apart(t.shape, t.stride())


def _strides_apart(shape, strides) -> bool:
    """No two elements of a layout share memory: each dim (by increasing stride) steps past all the
    smaller dims' elements (sufficient, and what any dense or sliced layout meets)."""
    if 0 in shape:
        return True
    reach = 0  # the largest offset the smaller dims reach
    for s, n in sorted((s, n) for n, s in zip(shape, strides) if n > 1):
        if s <= reach:
            return False
        reach += (n - 1) * s
    return True


def _share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one dtype may share an element: their byte extents overlap, unless they
    are two slices of one layout that keep apart, e.g. k = kv[:, 0] and v = kv[:, 1] of a cache
    [pages, 2, page_size, H, D] (FlashInfer's), whose extents interleave while their elements do not:
    the pair is then the layout [2, *shape] with the pointers' distance as the new dim's stride."""
    size_a, size_b = _byte_extent(a), _byte_extent(b)
    start_a, start_b = a.data_ptr(), b.data_ptr()
    if not (size_a and size_b and start_a < start_b + size_b and start_b < start_a + size_a):
        return False
    distance = abs(start_b - start_a)
    if a.shape != b.shape or a.stride() != b.stride() or distance % a.element_size():
        return True
    return not _strides_apart((2, *a.shape), (distance // a.element_size(), *a.stride()))


def _check_caches_apart(k_cache, v_cache) -> None:
    """write_kvcache's destinations: no slot shares memory with another (as Tensor.copy_ refuses an
    overlapping destination), in either cache or across the two; else a token's write lands in
    another slot, or the two tokens' writes race.
    A launch plan's repeat (vflash.ops.plans) skips this check: aliasing within a cache is a
    property of its shape and strides, which the plan's key holds, so the call that recorded the
    plan checked it. The two caches' overlap also depends on their data pointers, which the key
    does not hold; a repeat does not check it again: the check costs microseconds of Python, as
    much as a decode step's whole planned write (1.2-1.7 us), and a serving loop writes into the
    caches it allocated once, which the call that recorded the plan saw. A repeat given
    overlapping caches garbles them but stays in their memory: the kernel writes only their slots."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not _elements_apart(cache):
            raise ValueError(f"{name}'s slots overlap each other (strides {cache.stride()} for shape "
                             f"{tuple(cache.shape)}: a stride 0, an expand, or an as_strided view whose pages "
                             f"share memory), so a write would land in another slot; pass a cache of its own "
                             f"memory, e.g. a contiguous one")
    if _share_memory(k_cache, v_cache):
        raise ValueError("k_cache and v_cache share memory, so a key's write would land on a value; pass caches "
                         "apart (separate tensors, or disjoint slices of one buffer such as kv[:, 0] and kv[:, 1])")


def check_kvcache_write(k_cache, v_cache, k_new, v_new, slot_mapping, k_descale, v_descale, check_metadata) -> bool:
    """Validate a paged cache [num_blocks, block_size, Hkv, D] pair (no two slots sharing memory),
    the new tokens [T, Hkv, D] and their slots [T] (int32 / int64); returns check_metadata, forced on
    under the interpreter (check_metadata_on). The slots' values are checked next to the launch
    (vflash.ops.cache.check_slots)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new),
                    ("slot_mapping", slot_mapping)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {_describe(t)}{_as_tensor_hint(t)}")
        if t.layout is not torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [num_blocks, block_size, Hkv, D], got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_new.dim() != 3 or k_new.shape != v_new.shape:
        raise ValueError(f"k_new and v_new must both be [tokens, Hkv, D], got {tuple(k_new.shape)} and "
                         f"{tuple(v_new.shape)}")
    check_no_fp8("write_kvcache", k_new=k_new, v_new=v_new)
    num_blocks, block_size, H, D = k_cache.shape
    if k_new.shape[1:] != (H, D):
        raise ValueError(f"k_new's heads and head dim {tuple(k_new.shape[1:])} must be the cache's {(H, D)}")
    fp8 = k_cache.dtype in FP8_DTYPES
    if fp8 and (v_cache.dtype != k_cache.dtype or k_new.dtype != v_new.dtype
                or k_new.dtype not in (torch.float16, torch.bfloat16)):
        raise TypeError(f"an FP8 cache pair (both float8_e4m3fn) takes float16 / bfloat16 new keys and values of "
                        f"one dtype, got k_cache {k_cache.dtype}, v_cache {v_cache.dtype}, k_new {k_new.dtype}, "
                        f"v_new {v_new.dtype}")
    _check_descales(("k_descale", "v_descale"), (k_descale, v_descale), fp8, f"caches; the caches are {k_cache.dtype}",
                    {(): "0-d", (H,): f"[Hkv] = [{H}] (a slot's sequence is not known here)"}, k_cache.device,
                    "the caches")
    if not fp8 and (len({k_cache.dtype, v_cache.dtype, k_new.dtype, v_new.dtype}) != 1
                    or k_cache.dtype not in SUPPORTED_DTYPES):
        raise TypeError(f"caches and new keys / values must share one of {_PLAIN_DTYPE_NAMES}, got k_cache "
                        f"{k_cache.dtype}, v_cache {v_cache.dtype}, k_new {k_new.dtype}, v_new {v_new.dtype}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be a 1-D int32 or int64 tensor [tokens], got {_describe(slot_mapping)}")
    if slot_mapping.dim() != 1:
        raise ValueError(f"slot_mapping must be a 1-D int32 or int64 tensor [tokens], got {_describe(slot_mapping)}")
    _check_caches_apart(k_cache, v_cache)
    if slot_mapping.numel() != k_new.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.numel()} entries for {k_new.shape[0]} tokens")
    if slot_mapping.stride(0) != 1 and slot_mapping.numel() > 1:
        raise ValueError("slot_mapping must be contiguous; pass slot_mapping.contiguous()")
    devices = {t.device for t in (k_cache, v_cache, k_new, v_new, slot_mapping)}
    if len(devices) != 1:
        raise ValueError(f"caches, new keys / values and slot_mapping must be on one device, got "
                         f"{sorted(map(str, devices))}")
    _check_device(k_cache.device, "the cache is on the CPU")
    if k_new.shape[0] > _INT32_MAX // 2:
        raise ValueError(f"{k_new.shape[0]} tokens in one call are too many; write them in parts")
    return check_metadata_on(check_flag("check_metadata", check_metadata), k_cache)


def resolve_causal(causal) -> Optional[str]:
    """False -> None; True / "bottom_right" -> "bottom_right"; "top_left" -> "top_left"."""
    if isinstance(causal, bool):
        return "bottom_right" if causal else None
    if isinstance(causal, str):
        if causal in CAUSAL_MODES:
            return causal
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {_describe(causal)}")
    raise TypeError(f"causal must be a bool or one of 'top_left', 'bottom_right', got {_describe(causal)}")


def check_window(window) -> Tuple[int, int]:
    """None -> (-1, -1); (left, right) ints >= -1, -1 meaning unbounded."""
    if window is None:
        return (-1, -1)
    if not isinstance(window, (tuple, list)):
        raise TypeError(f"window must be None or a pair (left, right), got {_describe(window)}")
    if len(window) != 2:
        raise ValueError(f"window must be None or a pair (left, right), got {_describe(window)}")
    out = []
    for side, w in zip(("left", "right"), window):
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"window {side} must be an int (-1 for unbounded), got {_describe(w)}")
        if w < -1:
            raise ValueError(f"window {side} must be >= 0, or -1 for unbounded, got {_describe(w)}")
        if w > _INT32_MAX // 2:
            raise ValueError(f"window {side} is too large (over {_INT32_MAX // 2}); use -1 for unbounded")
        out.append(int(w))
    return out[0], out[1]


def _positive_finite(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a positive real number or None, got {_describe(x)}")
    x = float(x)
    if not math.isfinite(x) or x <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {x}")
    return x


def check_scale(scale, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else _positive_finite("scale", scale)


def check_softcap(softcap) -> Optional[float]:
    return None if softcap is None else _positive_finite("softcap", softcap)


def check_flag(name: str, x) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"{name} must be a bool, got {_describe(x)}")
    return x


def check_metadata_on(check_metadata: bool, t) -> bool:
    """check_metadata (a bool, check_flag's), or True where `t`, the call's first tensor, runs through
    Triton's interpreter: there the check costs nothing next to the interpreted kernel, and a bad page
    id or offset read unchecked would reach outside the tensors in the Python process's own memory
    (a segfault, or garbage). Not where launch plans take the call's repeats (compiled CUDA launches;
    CPU tensors only where a test makes plans take them): a plan's repeat keeps check_metadata as
    given, and the call that records it does too."""
    return check_metadata or (isinstance(t, torch.Tensor) and interpreted(t.device) and not plans._planned(t))


MAX_SPLITS = 256


def check_num_splits(num_splits, batch_invariant) -> bool:
    """num_splits None or an int 1..MAX_SPLITS; batch_invariant a bool, not with num_splits
    (it picks the splits itself). Returns batch_invariant."""
    batch_invariant = check_flag("batch_invariant", batch_invariant)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
            raise TypeError(f"num_splits must be None or an int >= 1, got {_describe(num_splits)}")
        if num_splits < 1:
            raise ValueError(f"num_splits must be None or an int >= 1, got {_describe(num_splits)}")
        if num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits={num_splits} is above {MAX_SPLITS}")
    if num_splits is not None and batch_invariant:
        raise ValueError("batch_invariant=True picks the splits from each sequence's length; leave num_splits None")
    return batch_invariant


def check_no_grad(tensors, entry: str) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise ValueError(
            f"vflash.{entry} has no backward pass yet, and its inputs require grad; call it under "
            "torch.no_grad() / torch.inference_mode(), or pass detached tensors")


def mask_band(n_q: int, n_k: int, causal: Optional[str], window: Tuple[int, int]) -> Band:
    """Fold causal mode ("top_left", "bottom_right" or None), window and
    Nq != Nk into a Band.

    off = Nk - Nq (bottom-right alignment) unless the causal mode is "top_left".
    Causal attention caps right at 0. A side that hides no key from any row
    becomes unbounded, so the kernel neither masks nor bounds-checks for it (one
    decode query at the end of its keys is causal in name only)."""
    off = 0 if causal == "top_left" else n_k - n_q
    left, right = window
    if causal is not None:
        right = 0 if right < 0 else min(right, 0)
    if left >= n_q - 1 + off:  # row Nq-1, the one with the highest lower bound, still starts at key <= 0
        left = -1
    if right >= n_k - 1 - off:  # row 0, the one with the lowest upper bound, already ends at key >= Nk-1
        right = -1
    return Band(off, left, right)


def sequence_band(causal: Optional[str], window: Tuple[int, int]) -> Band:
    """The edges of a band whose offset each sequence takes from its own lengths
    (Nk - Nq, or 0 under "top_left"): off is 0 here and unused. Causal caps
    right at 0. No edge is folded away: whether it hides a key depends on the
    sequence."""
    left, right = window
    if causal is not None:
        right = 0 if right < 0 else min(right, 0)
    return Band(0, left, right)


# Sinks tensors whose values were found free of NaN and +inf: id -> (a weak reference, the version counter
# then). On a CUDA tensor the check costs a device sync, so it runs again only when the tensor was written
# since (an optimizer step bumps the version) or is another tensor (a dead reference never matches).
_SINKS_CHECKED: dict = {}
_SINKS_CHECKED_MAX = 1024


def check_sinks(sinks, heads_q: int, q: torch.Tensor) -> Optional[torch.Tensor]:
    """sinks None, or an fp32 [Hq] tensor (unit stride) on q's device with no NaN and no +inf (-inf: that
    head has no sink). The values are read where they can be: not while a CUDA graph is captured or
    torch.compile traces the call."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be None or a float32 torch.Tensor [Hq] (one logit per query head), got "
                        f"{_describe(sinks)}{_as_tensor_hint(sinks)}")
    if sinks.dtype != torch.float32:
        raise TypeError(f"sinks must be float32 (one logit per query head), got {sinks.dtype}; pass sinks.float()")
    if tuple(sinks.shape) != (heads_q,):
        raise ValueError(f"sinks must be [Hq] = [{heads_q}], one logit per query head, got shape "
                         f"{list(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"sinks is on {sinks.device}, q on {q.device}; pass them on one device")
    if heads_q > 1 and sinks.stride(0) != 1:
        raise ValueError(f"sinks must have unit stride, got stride {sinks.stride(0)}; pass sinks.contiguous()")
    checked = sinks.detach()
    if _values_readable(checked) and not sinks_checked(sinks):
        bad = torch.isnan(checked) | (checked == float("inf"))
        if bool(bad.any()):
            heads = bad.nonzero().flatten().tolist()
            raise ValueError(f"sinks holds NaN or +inf at heads {heads[:8]}{' ...' if len(heads) > 8 else ''}; "
                             "a finite logit, or -inf for no sink")
        if len(_SINKS_CHECKED) >= _SINKS_CHECKED_MAX:
            _SINKS_CHECKED.clear()
        _SINKS_CHECKED[id(sinks)] = (weakref.ref(sinks), sinks._version)
    return sinks


def sinks_checked(sinks: torch.Tensor) -> bool:
    """Whether check_sinks found these sinks' values good and nothing has written them since."""
    seen = _SINKS_CHECKED.get(id(sinks))
    return seen is not None and seen[0]() is sinks and seen[1] == sinks._version


def _values_readable(t: torch.Tensor) -> bool:
    # Reading a tensor's values on the host: not a fake tensor's (torch.compile's tracing) nor during a CUDA
    # graph's capture (a sync is not allowed there).
    if torch.compiler.is_compiling() or type(t).__name__ in ("FakeTensor", "FunctionalTensor"):
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def check_no_fp8(entry: str, **tensors) -> None:
    """A TypeError for FP8 tensors where `entry` takes none yet."""
    fp8 = [name for name, t in tensors.items() if isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES]
    if fp8:
        raise TypeError(f"{entry} takes no FP8 (float8_e4m3fn) tensors yet, got {', '.join(fp8)} in FP8; FP8 "
                        "inputs run through vflash.attention and vflash.attention_varlen")


def _check_descales(names, descales, fp8: bool, what: str, shapes: dict, device: torch.device, owner: str):
    """FP8 descales, `names` (each None, or a float32 tensor of one of `shapes`' keys, which the dict's
    values describe, on `device`, `owner`'s): where `fp8` is off (the tensors they would scale, `what`,
    are not FP8) none may be given. The values (positive and finite: the kernels fold q's and k's into the
    score's scale, which must stay positive) are read on CPU tensors only, where it costs nothing next to the
    interpreted kernel; on a GPU, a device sync a call would be."""
    if not fp8:
        given = [n for n, d in zip(names, descales) if d is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to FP8 (float8_e4m3fn) {what}")
        return
    shape_text = " or ".join(shapes.values())
    for name, d in zip(names, descales):
        if d is None:
            continue
        if not isinstance(d, torch.Tensor):
            raise TypeError(f"{name} must be None or a float32 torch.Tensor, {shape_text}, got "
                            f"{_describe(d)}{_as_tensor_hint(d)}")
        if d.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {d.dtype}; pass {name}.float()")
        if tuple(d.shape) not in shapes:
            raise ValueError(f"{name} must be {shape_text}, got shape {list(d.shape)}")
        if d.device != device:
            raise ValueError(f"{name} is on {d.device}, {owner} on {device}; pass them on one device")
        if interpreted(d.device) and _values_readable(d) and not bool(((d > 0) & torch.isfinite(d)).all()):
            raise ValueError(f"{name} must be positive and finite (a real value is stored * descale), got "
                             f"{d.flatten()[:8].tolist()}")


def check_descales(descales, q: torch.Tensor, batch: int, heads_kv: int):
    """FP8 inputs' (q_descale, k_descale, v_descale): each None, or float32 0-d or [B, Hkv] on q's device
    (_check_descales); with other inputs all None."""
    _check_descales(("q_descale", "k_descale", "v_descale"), descales, q.dtype in FP8_DTYPES,
                    f"inputs; q is {q.dtype}", {(): "0-d (one per tensor)", (batch, heads_kv):
                                                f"[B, Hkv] = [{batch}, {heads_kv}] (one per sequence and KV head)"},
                    q.device, "q")
    return descales


def check_cache_descales(descales, k_cache: torch.Tensor, batch: int):
    """An FP8 cache's (k_descale, v_descale): each None, or float32 0-d, [Hkv] or [B, Hkv] on the cache's
    device (_check_descales); a 16-bit cache takes none. Returns them as 0-d or [B, Hkv] (an [Hkv] one as a
    [1, Hkv] view broadcast over the batch: stride 0)."""
    heads = k_cache.shape[2]
    _check_descales(("k_descale", "v_descale"), descales, k_cache.dtype in FP8_DTYPES,
                    f"caches; the caches are {k_cache.dtype}",
                    {(): "0-d", (heads,): f"[Hkv] = [{heads}]", (batch, heads): f"[B, Hkv] = [{batch}, {heads}]"},
                    k_cache.device, "the caches")
    return tuple(d.view(1, heads).expand(batch, heads) if d is not None and d.dim() == 1 else d for d in descales)


def check_out_dtype(out_dtype, q: torch.Tensor) -> Optional[torch.dtype]:
    """The output dtype: FP8 inputs' bfloat16 (None) or float16; other inputs' own (None or the same)."""
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"out_dtype must be None or a torch.dtype, got {_describe(out_dtype)}")
    if q.dtype in FP8_DTYPES:
        if out_dtype not in (None, torch.bfloat16, torch.float16):
            raise ValueError(f"out_dtype for FP8 inputs must be torch.bfloat16 (the default) or torch.float16, "
                             f"got {out_dtype}")
        return out_dtype or torch.bfloat16
    if out_dtype not in (None, q.dtype):
        raise ValueError(f"out_dtype applies to FP8 inputs; the output of {q.dtype} inputs is {q.dtype} (got "
                         f"{out_dtype}): cast it after the call")
    return None


def check_score(scale, softcap, sinks, q: torch.Tensor, heads_q: int, descales=(None, None, None), batch: int = 0,
                heads_kv: int = 0) -> Score:
    """The score options every attention entry point shares, checked (vflash.call.Score)."""
    return Score(check_scale(scale, q.shape[-1]), check_softcap(softcap), check_sinks(sinks, heads_q, q),
                 *check_descales(descales, q, batch, heads_kv))


def attention_call(q, k, v, causal, window, scale, softcap, sinks, q_descale, k_descale, v_descale, out_dtype,
                   return_lse) -> Call:
    """vflash.attention's arguments (vflash.call.ATTENTION's order) as a Call: q [B, Hq, Nq, D],
    k / v [B, Hkv, Nk, D], the band folded from the lengths."""
    check_qkv(q, k, v)
    band = mask_band(q.shape[2], k.shape[2], resolve_causal(causal), check_window(window))
    score = check_score(scale, softcap, sinks, q, q.shape[1], (q_descale, k_descale, v_descale), q.shape[0],
                        k.shape[1])
    return Call(q, k, v, None, band, score, check_flag("return_lse", return_lse),
                out_dtype=check_out_dtype(out_dtype, q))


def varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, scale, softcap,
                sinks, q_descale, k_descale, v_descale, out_dtype, return_lse, check_metadata) -> Call:
    """vflash.attention_varlen's arguments (vflash.call.ATTENTION_VARLEN's order) as a Call of layout
    Packed (check_metadata forced on under the interpreter: check_metadata_on)."""
    check_metadata = check_metadata_on(check_flag("check_metadata", check_metadata), q)
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    causal_mode = resolve_causal(causal)
    layout = Packed(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal_mode == "top_left",
                    check_metadata)
    score = check_score(scale, softcap, sinks, q, q.shape[1], (q_descale, k_descale, v_descale),
                        cu_seqlens_q.numel() - 1, k.shape[1])
    return Call(q, k, v, layout, sequence_band(causal_mode, check_window(window)), score,
                check_flag("return_lse", return_lse), out_dtype=check_out_dtype(out_dtype, q))


def kvcache_call(q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q, causal, window, scale,
                 softcap, sinks, q_descale, k_descale, v_descale, num_splits, batch_invariant, return_lse,
                 check_metadata, out) -> Call:
    """vflash.attention_with_kvcache's arguments (vflash.call.ATTENTION_KVCACHE's order) as a Call of
    layout Cache: dense q [B, Nq, Hq, D] (and out) as rows [B * Nq, Hq, D], views where the strides
    merge (else q a copy; out must merge)."""
    check_metadata = check_metadata_on(check_flag("check_metadata", check_metadata), q)
    check_kvcache_attention(q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q, max_seqlen_q)
    causal_mode = resolve_causal(causal)
    if causal_mode == "top_left":
        raise ValueError("causal='top_left' does not apply to a KV cache: the new queries are the last tokens of "
                         "their sequence (bottom-right alignment); pass causal=True")
    window = check_window(window)
    if q_descale is not None:
        raise ValueError("q_descale does not apply to attention_with_kvcache: q is float16 / bfloat16; an FP8 "
                         "cache takes k_descale and v_descale")
    score = check_score(scale, softcap, sinks, q, q.shape[-2])._replace(
        **dict(zip(("k_descale", "v_descale"), check_cache_descales((k_descale, v_descale), k_cache,
                                                                     cache_seqlens.numel()))))
    batch_invariant = check_num_splits(num_splits, batch_invariant)
    return_lse = check_flag("return_lse", return_lse)
    check_no_grad((q, k_cache, v_cache, sinks), "attention_with_kvcache")
    guard = None
    inputs = (q, k_cache, v_cache, cache_seqlens, block_table, cu_seqlens_q)  # KVCACHE_OUT_APART's
    if out is not None:
        # a plan's repeat checks out's overlap with the inputs again, their byte extents fixed by the key
        extents = check_kvcache_out(out, inputs)
        guard = lambda o, ins: kvcache_out_overlap(o, ins, extents) is None  # noqa: E731
    q_shape, rows = tuple(q.shape), q
    if cu_seqlens_q is None:  # [B, Nq, Hq, D] as rows, Nq a sequence (no cu_seqlens: the kernel counts them)
        max_seqlen_q = q.shape[1]
        rows = q.reshape(-1, q.shape[2], q.shape[3])
        if out is not None:
            try:
                out = out.view(-1, out.shape[2], out.shape[3])
            except RuntimeError:
                raise ValueError("out's [B, Nq] strides must merge into one row stride (as a view); "
                                 "pass a contiguous out") from None
    layout = Cache(cache_seqlens, block_table, cu_seqlens_q, int(max_seqlen_q), num_splits, batch_invariant,
                   check_metadata, q_shape, guard)
    return Call(rows, k_cache, v_cache, layout, sequence_band(causal_mode, window), score, return_lse, out)


def call_of(spec: Spec, args: tuple) -> Call:
    """An attention entry point's arguments, in its spec's order (vflash.call), as a validated Call."""
    if spec is ATTENTION:
        return attention_call(*args)
    if spec is ATTENTION_VARLEN:
        return varlen_call(*args)
    if spec is ATTENTION_KVCACHE:
        return kvcache_call(*args)
    raise ValueError(f"{spec.name} is not an attention entry point")
