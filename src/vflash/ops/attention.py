"""Launcher for the fused attention forward kernel.

Inputs are already validated (vflash._validate); this module turns the public
options into the kernel's single masking rule (off, left, right), picks a tile
configuration and launches.
"""

import contextlib
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Hashable, Optional, Tuple

import torch

from vflash._backend import interpreting
from vflash.ops import hopper as hopper_launch
from vflash.ops import plans
from vflash.ops.direct_launch import direct_launch
from vflash.ops.scales import score_scales
from vflash.kernels.attention_fwd import (
    GPU_CONFIGS,
    GPU_SHORT_CONFIGS,
    GPU_SPLIT_CONFIGS,
    INTERPRETER_CONFIG,
    SHORT_GRID_WAVES,
    attention_fwd_kernel,
)
from vflash.kernels import attention_fwd_hopper as hopper


@dataclass(frozen=True)
class TileConfig:
    """block_m query rows per program (two halves of block_m // 2 when split),
    block_n keys per inner step. hopper: run the Gluon sm_90 kernel
    (kernels/attention_fwd_hopper.py; num_stages is its K/V ring depth, num_warps
    4, its producer warps, q_buffers its Q buffers per consumer, pingpong whether
    its consumers take turns to issue their products, p_fp32 whether P goes from
    one iteration to the next in fp32, late_pv_wait whether the PV wait is kept
    after the softmax, lazy_rescale whether a row's reference max moves lazily and
    O's rescale is skipped where it is 1, ctas_per_sm the CTAs resident on an SM,
    dynamic whether CTAs draw work tiles from a global counter)
    instead of the portable Triton one."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    split: bool = False
    hopper: bool = False
    q_buffers: int = 1
    pingpong: bool = False
    p_fp32: bool = False
    late_pv_wait: bool = False
    lazy_rescale: bool = False
    ctas_per_sm: int = 1
    dynamic: bool = False


def mask_band(n_q: int, n_k: int, causal: Optional[str], window: Tuple[int, int]) -> Tuple[int, int, int]:
    """Fold causal mode, window and Nq != Nk into (off, left, right).

    Query i sees key j when i + off - left <= j <= i + off + right; a negative
    left/right is unbounded. off = Nk - Nq (bottom-right alignment) unless the
    causal mode is "top_left". Causal attention caps right at 0.

    A side that hides no key from any row becomes unbounded, so the kernel
    neither masks nor bounds-checks for it (one decode query at the end of its
    keys is causal in name only).
    """
    off = 0 if causal == "top_left" else n_k - n_q
    left, right = window
    if causal is not None:
        right = 0 if right < 0 else min(right, 0)
    if left >= n_q - 1 + off:  # row Nq-1, the one with the highest lower bound, still starts at key <= 0
        left = -1
    if right >= n_k - 1 - off:  # row 0, the one with the lowest upper bound, already ends at key >= Nk-1
        right = -1
    return off, left, right


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@lru_cache(maxsize=None)
def default_config(head_dim_pad: int, dtype: torch.dtype, variant: str = "plain") -> TileConfig:
    """The tuned tiles for a head dim: variant "plain", "split" or "short" (see
    kernels/attention_fwd.py); fp32, and variants a head dim lacks, get the plain ones."""
    if interpreting():
        return TileConfig(*INTERPRETER_CONFIG)
    if dtype == torch.float32:
        # fp32 tiles take twice the registers and shared memory of fp16 ones:
        # two stages of 64 x 128 fp32 K and V tiles are already 128 KiB.
        block_m, block_n, warps, stages, _ = GPU_CONFIGS[head_dim_pad]
        tile = 64 if head_dim_pad <= 128 else 32
        return TileConfig(min(block_m, tile), min(block_n, tile), 4, min(stages, 2))
    if variant == "split" and head_dim_pad in GPU_SPLIT_CONFIGS:
        return TileConfig(*GPU_SPLIT_CONFIGS[head_dim_pad])
    if variant == "short" and head_dim_pad in GPU_SHORT_CONFIGS:
        return TileConfig(*GPU_SHORT_CONFIGS[head_dim_pad][0])
    return TileConfig(*GPU_CONFIGS[head_dim_pad])


@lru_cache(maxsize=None)
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def hopper_config(head_dim: int, right_edge: bool = False, n_q: Optional[int] = None,
                  few_tiles: bool = False) -> TileConfig:
    """The Hopper kernel's tiles for a head dim (HOPPER_CONFIGS); HOPPER_FEW_TILES'
    with `few_tiles` (too few work tiles of the main height for HOPPER_USE's
    waves), else with a right mask edge (causal) those of HOPPER_SHORT_CAUSAL's
    first band that holds n_q. A right edge takes the tiles' Q buffers, P in fp32,
    lazy rescale and DYNAMIC for it."""
    t = hopper.HOPPER_CONFIGS[head_dim]
    if few_tiles and head_dim in hopper.HOPPER_FEW_TILES:
        t = hopper.HOPPER_FEW_TILES[head_dim]
    elif right_edge and n_q is not None:
        t = next((band for longest, band in hopper.HOPPER_SHORT_CAUSAL.get(head_dim, ()) if n_q <= longest), t)
    return hopper_tile_config(t, right_edge)


def hopper_tile_config(t: hopper.HopperTiles, right_edge: bool) -> TileConfig:
    """One table entry's tiles and switches, those for a right mask edge where it has one."""
    return TileConfig(t.block_m, t.block_n, 4, t.stages, hopper=True,
                      q_buffers=t.q_buffers_causal if right_edge else t.q_buffers,
                      pingpong=t.pingpong, p_fp32=t.p_fp32_causal and right_edge, late_pv_wait=t.late_pv_wait,
                      lazy_rescale=t.lazy_rescale_causal if right_edge else t.lazy_rescale,
                      ctas_per_sm=t.ctas_per_sm, dynamic=t.dynamic_causal and right_edge)


def choose_config(head_dim_pad: int, dtype: torch.dtype, right: int, n_q: int, batch_heads: int,
                  device: torch.device, head_dim: Optional[int] = None) -> TileConfig:
    """Pick the kernel and tiles from the mask and the grid: `batch_heads` is the
    number of (batch, q head) pairs. The Hopper kernel serves fp16 / bf16 head
    dims in HOPPER_USE on sm_90, for the lengths and grids that table names (the
    caller checks the tensors suit TMA); grids too small for its main tiles take
    HOPPER_FEW_TILES' where the head dim has them."""
    plain = default_config(head_dim_pad, dtype)
    if interpreting() or dtype == torch.float32:
        return plain
    sms = _sm_count(device.index)
    use = hopper.HOPPER_USE.get(head_dim) if head_dim == head_dim_pad else None
    if use and hopper.HAVE_GLUON and n_q >= use[right >= 0] and _is_hopper(device.index):
        few = batch_heads * -(-n_q // hopper.HOPPER_CONFIGS[head_dim].block_m) < use[2] * sms
        if not few or head_dim in hopper.HOPPER_FEW_TILES:
            cfg = hopper_config(head_dim, right >= 0, n_q, few)
            if cfg.dynamic and batch_heads * -(-n_q // cfg.block_m) <= cfg.ctas_per_sm * sms:
                # a CTA for each work tile either way: the static grid, without the counter's allocation
                cfg = replace(cfg, dynamic=False)
            return cfg
    if right < 0:
        cfg = default_config(head_dim_pad, dtype, "split")
        if cfg.split and batch_heads * -(-n_q // cfg.block_m) >= sms:
            return cfg
    elif head_dim_pad in GPU_SHORT_CONFIGS:
        longest = GPU_SHORT_CONFIGS[head_dim_pad][1]
        if n_q <= longest or batch_heads * -(-n_q // plain.block_m) < SHORT_GRID_WAVES * sms:
            return default_config(head_dim_pad, dtype, "short")
    return plain


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    causal: Optional[str], scale: float, window: Tuple[int, int], softcap: Optional[float],
    return_lse: bool, config: Optional[TileConfig] = None,
    out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
    plan_key: Optional[Hashable] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """out [B, Hq, Nq, D] in q's dtype, lse [B, Hq, Nq] fp32 (or None).

    `out` (any strides) and `lse` (contiguous) may be passed preallocated, e.g.
    poisoned with NaN by tests that check every element is written. With a
    `plan_key` (vflash.ops.plans) the launch is recorded for later calls.
    """
    fresh_out = out is None
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if out is None:
        out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if Nk == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse

    off, left, right = mask_band(Nq, Nk, causal, window)
    # Plain integer arithmetic: triton.cdiv / next_power_of_2 are jit functions and
    # cost microseconds per host call.
    head_dim_pad = max(16, 1 << (D - 1).bit_length())
    cfg = config or choose_config(head_dim_pad, q.dtype, right, Nq, B * Hq, q.device, D)
    if cfg.hopper and not hopper_launch.fits(q, k, v, out, cfg.block_m):
        cfg = choose_config(head_dim_pad, q.dtype, right, Nq, B * Hq, q.device)
    # Triton launches on the current CUDA device: make it the tensors' device.
    on_other_gpu = q.device.type == "cuda" and q.device.index != torch.cuda.current_device()
    if cfg.hopper:
        kernel = hopper.attention_fwd_hopper_kernel
        grid = hopper_launch.grid(B, Hq, Nq, cfg.block_m, _sm_count(q.device.index), causal=right >= 0,
                                  ctas_per_sm=cfg.ctas_per_sm, dynamic=cfg.dynamic)
        prepare = hopper_launch.tma_descriptors(cfg.block_n)
        args, constexprs = hopper_launch.kernel_args(prepare(q, k, v, out), lse, B, Hq, Hkv, Nq, Nk, D, off,
                                                     left, right, scale, softcap, cfg.block_m, cfg.block_n,
                                                     cfg.num_stages, cfg.q_buffers, cfg.pingpong,
                                                     cfg.p_fp32, cfg.late_pv_wait, cfg.lazy_rescale,
                                                     cfg.ctas_per_sm, cfg.dynamic)
        options = hopper_launch.launch_options(cfg.block_m, cfg.ctas_per_sm)
    else:
        grid = ((Nq + cfg.block_m - 1) // cfg.block_m, Hq, B)
        kernel = attention_fwd_kernel
        prepare = None
        args, constexprs = _kernel_args(q, k, v, out, lse, Hq, Hkv, Nq, Nk, D, head_dim_pad, off, left, right,
                                        scale, softcap, cfg)
        options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    with torch.cuda.device(q.device) if on_other_gpu else contextlib.nullcontext():
        compiled = kernel[grid](*args, **constexprs, **options)
    if plan_key is not None and fresh_out and not on_other_gpu:
        _record_plan(plan_key, kernel, compiled, grid, args, constexprs, out, lse, prepare)
    return out, lse


def _record_plan(key, kernel, compiled, grid, args, constexprs, out, lse, prepare) -> None:
    # The compiled launcher takes every kernel parameter in signature order,
    # constexprs included; the first five (q, k, v, out, lse or their TMA
    # descriptors) change per call, and so does the Hopper kernel's work-tile
    # counter (the sixth) where it draws tiles dynamically.
    try:
        runner = compiled[grid]
    except (TypeError, AttributeError):  # a Triton whose launch returns no CompiledKernel
        return
    names = kernel.arg_names
    counter = bool(constexprs.get("DYNAMIC"))
    tail = list(args[6 if counter else 5:]) + [constexprs[name] for name in names[len(args):]]

    def launch(q, k, v, o, lse_or_out, *count):
        runner(*((q, k, v, o) if prepare is None else prepare(q, k, v, o)), lse_or_out, *count, *tail)
    fast = direct_launch(compiled, grid, tail, out.device.index, prepare, launch, counter)
    plans.record(key, plans.LaunchPlan(fast or launch, out.device.index, tuple(out.shape),
                                       None if lse is None else tuple(lse.shape), counter))


def _kernel_args(q, k, v, out, lse, Hq, Hkv, Nq, Nk, D, head_dim_pad, off, left, right, scale, softcap, cfg):
    """(positional args, constexpr kwargs) of attention_fwd_kernel, in signature order."""
    interp = interpreting()
    args = (
        q, k, v, out, lse if lse is not None else out,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        Hq, Hq // Hkv, Nq, Nk,
        off, left, right,
        *score_scales(scale, softcap),
    )
    constexprs = dict(
        HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT=cfg.split,
        HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, SOFTCAP=softcap is not None,
        STORE_LSE=lse is not None, REVERSE_M=right >= 0,
        # The interpreter's bf16 dot is wrong (numpy has no bf16); upcast there only.
        UPCAST_DOT=interp and q.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return args, constexprs
