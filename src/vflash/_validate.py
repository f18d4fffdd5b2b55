"""Checks on user input, in one place, before anything is launched.

Every failure is a ValueError or TypeError that names the argument, says what
was expected and what came, and how to fix it. Messages never print tensor
contents.
"""

import math
import numbers
from typing import Optional, Tuple, Union

import torch

from vflash._backend import interpreter_refusal

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CAUSAL_MODES = ("top_left", "bottom_right")
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256
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


def check_qkv(q, k, v) -> None:
    """Validate q [B, Hq, Nq, D], k/v [B, Hkv, Nk, D]."""
    # Runs on every call: the common case goes through a handful of cheap tests.
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {_describe(t)}{_as_tensor_hint(t)}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D [batch, heads, seq_len, head_dim], got shape {tuple(t.shape)}; "
                f"a [batch, seq_len, heads, head_dim] tensor can be passed as x.transpose(1, 2)")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.layout is not torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}; "
                        f"cast them with .to(dtype)")
    device = q.device
    if not (device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    B, Hq, Nq, D = q.shape
    k_shape = k.shape
    if k_shape != v.shape:
        raise ValueError(f"k and v must have the same shape [B, Hkv, Nk, D], got k {tuple(k_shape)} "
                         f"and v {tuple(v.shape)}")
    Bk, Hkv, Nk, Dk = k_shape
    if Bk != B:
        raise ValueError(f"batch sizes differ: q has {B}, k and v have {Bk}")
    if Dk != D:
        raise ValueError(f"head dims differ: q has {D}, k and v have {Dk}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}) for GQA/MQA")
    if B > MAX_GRID_YZ:
        raise ValueError(f"batch size {B} exceeds {MAX_GRID_YZ}, the most one launch covers; split the batch "
                         f"into chunks of at most {MAX_GRID_YZ}")
    if Hq > MAX_GRID_YZ:
        raise ValueError(f"q heads ({Hq}) exceed {MAX_GRID_YZ}, the most one launch covers")
    if not (MIN_HEAD_DIM <= D <= MAX_HEAD_DIM and D % 8 == 0):
        raise ValueError(f"head_dim must be a multiple of 8 between {MIN_HEAD_DIM} and {MAX_HEAD_DIM}, "
                         f"got {D}")
    for name, t, n in (("q", q, Nq), ("k", k, Nk), ("v", v, Nk)):
        # Offsets inside one (batch, head) slice are 32-bit in the kernel.
        _, _, stride_n, stride_d = t.stride()
        extent = (n - 1) * stride_n + (D - 1) * stride_d
        if extent > _INT32_MAX:
            raise ValueError(f"{name}'s sequence span ({extent} elements within one head) exceeds "
                             f"2**31 - 1; split the sequence or make the tensor contiguous")
    if device.type != "cuda":
        if device.type != "cpu":
            raise ValueError(f"tensors on {device.type} are not supported; use CUDA or CPU tensors")
        refusal = interpreter_refusal()  # CPU tensors run through Triton's interpreter
        if refusal is not None:
            raise ValueError(f"q is a CPU tensor, and {refusal}")


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
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right), got {_describe(window)}")
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


def check_no_grad(q, k, v) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError(
            "vflash.attention has no backward pass yet, and q/k/v require grad; call it under "
            "torch.no_grad() / torch.inference_mode(), or pass detached tensors")
