"""Launch pieces of the Gluon Hopper kernel (kernels/attention_fwd_hopper.py):
TMA descriptors, the kernel's arguments, and an ahead-of-time compile for sm_90
that needs no GPU (the CPU test suite uses it to prove the kernel builds)."""

import math
from functools import lru_cache
from typing import Callable, Optional, Tuple

import torch

from vflash.kernels import attention_fwd_hopper as hopper
from vflash.ops.scales import score_scales
_GL_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def grid(B: int, Hq: int, Nq: int, block_m: int, sms: int, causal: bool,
         ctas_per_sm: int = 1, dynamic: bool = False) -> Tuple[int, int, int]:
    """CTAs walk work tiles t = pid, pid + grid, ... (row block t % n_m of head
    t // n_m, n_m row blocks per head).

    Without a right edge every tile costs the same: one CTA per SM (persistent),
    so each CTA's K/V ring runs on from one tile into the next.

    With one (causal), a head's row blocks differ in cost. A stride that shares a
    factor with n_m pins each CTA to some row blocks (132 CTAs, n_m = 4: one row
    block each, work 1:2:3:4; measured at D = 128 N = 512, 204 TFLOP/s against
    239 for one CTA per tile). The largest stride <= SMs that shares none cycles
    each CTA through every row block, balanced once each CTA walks n_m tiles or
    more (B * Hq >= stride; measured 246). Fewer heads than that: one CTA per
    work tile, handed out by the hardware as SMs free up (the static stride at
    D = 128 causal N = 16384 measured 419 against 551).

    One consumer warpgroup a CTA (block_m 64) puts two or three CTAs on an SM:
    "one per SM" above then reads ctas_per_sm.

    dynamic (the kernel's DYNAMIC: CTAs draw work tiles from a global counter):
    one CTA per SM slot whatever the mask, as without a right edge.

    Always three entries: a launch plan calls Triton's compiled launcher, which,
    unlike the JIT launch, does not pad a shorter grid."""
    n_m = (Nq + block_m - 1) // block_m
    work = B * Hq * n_m
    sms *= ctas_per_sm
    if not causal or dynamic:
        return (min(work, sms), 1, 1)
    stride = sms
    while math.gcd(stride, n_m) != 1:
        stride -= 1
    return (stride if B * Hq >= stride else work, 1, 1)


def launch_options(block_m: int, ctas_per_sm: int = 1) -> dict:
    """The kernel's launch (and compile) options: four producer warps, and with
    more than one CTA an SM a register cap of the CTA's share of the file, in
    multiples of 8 (two CTAs of one consumer: 128 a thread; setmaxnreg then gives
    the consumer CONSUMER_REGS[(1, 2)], the producer the rest)."""
    threads = (block_m // hopper.CONSUMER_ROWS + 1) * 128
    if ctas_per_sm == 1:
        return dict(num_warps=4)
    return dict(num_warps=4, maxnreg=65536 // (ctas_per_sm * threads) // 8 * 8)


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, block_m: int) -> bool:
    """The kernel can take this call: every tensor suits TMA, and the work-tile
    count fits the kernel's int32 tile index (and a grid's x dimension)."""
    B, Hq, Nq = q.shape[0], q.shape[1], q.shape[2]
    return B * Hq * ((Nq + block_m - 1) // block_m) < 2**31 and all(map(tma_ready, (q, k, v, out)))


def tma_ready(t: torch.Tensor) -> bool:
    """TMA can address t: 16-byte aligned base and strides, unit last stride."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s * size % 16 == 0 for s in t.stride()[:-1]))


def _block_shapes(block_n: int, head_dim: int):
    # Q and O move in one consumer warpgroup's rows; K and V in block_n keys.
    return [1, 1, hopper.CONSUMER_ROWS, head_dim], [1, 1, block_n, head_dim]


@lru_cache(maxsize=None)
def _shared_layout(block: Tuple[int, ...], dtype: torch.dtype):
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float16 if dtype == torch.float16 else gl.bfloat16)


@lru_cache(maxsize=None)
def tma_descriptors(block_n: int) -> Callable:
    """A function (q, k, v, out) -> their 4-D TMA descriptors over [B, H, N, D].

    The descriptors are filled in directly rather than through the dataclass's
    checks (26 us for four on a CPU core, per call): `fits` has already checked
    what they check, and a launch plan only replays calls whose key fixes the
    shapes, strides and 16-byte alignment."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def make(t, block, layout):
        d = object.__new__(TensorDescriptor)
        d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = (
            t, t.shape, t.stride(), block, layout, "zero")
        return d

    blocks = {}  # (head dim, dtype) -> (rows, rows layout, keys, keys layout)

    def prepare(q, k, v, out):
        b = blocks.get((q.shape[-1], q.dtype))
        if b is None:
            rows, keys = _block_shapes(block_n, q.shape[-1])
            b = blocks[(q.shape[-1], q.dtype)] = (rows, _shared_layout(tuple(rows), q.dtype),
                                                  keys, _shared_layout(tuple(keys), q.dtype))
        rows, rows_layout, keys, keys_layout = b
        return (make(q, rows, rows_layout), make(k, keys, keys_layout), make(v, keys, keys_layout),
                make(out, rows, rows_layout))
    return prepare


def kernel_args(descs, lse: Optional[torch.Tensor], B, Hq, Hkv, Nq, Nk, D, off, left, right, scale, softcap,
                block_m, block_n, stages, q_buffers, pingpong=False, p_fp32=False, late_pv_wait=False,
                lazy_rescale=False, ctas_per_sm=1, dynamic=False):
    """(positional args, constexpr kwargs) of attention_fwd_hopper_kernel."""
    args = (
        *descs, lse if lse is not None else descs[3].base,
        # DYNAMIC's work-tile counter: one int32 zero, fresh each launch (a shared
        # one would race between streams and across CUDA graph replays).
        descs[3].base.new_zeros(1, dtype=torch.int32) if dynamic else None,
        B, Hq, Hq // Hkv, Nq, Nk,
        off, left, right,
        *score_scales(scale, softcap),
    )
    return args, _constexprs(D, block_m, block_n, stages, q_buffers, left >= 0, right >= 0, softcap is not None,
                             lse is not None, pingpong, p_fp32, late_pv_wait, lazy_rescale, ctas_per_sm, dynamic)


def _constexprs(head_dim, block_m, block_n, stages, q_buffers, has_left, has_right, softcap, store_lse,
                pingpong, p_fp32, late_pv_wait, lazy_rescale, ctas_per_sm, dynamic) -> dict:
    """attention_fwd_hopper_kernel's constexpr arguments, for the launch and for
    compile_sm90 alike: causal tiles run longest first (REVERSE_M), and the
    consumer count and CTAs an SM set the consumers' register budget."""
    return dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, HAS_LEFT=has_left,
                HAS_RIGHT=has_right, SOFTCAP=softcap, STORE_LSE=store_lse, REVERSE_M=has_right,
                CONSUMER_REGS=hopper.CONSUMER_REGS[(block_m // hopper.CONSUMER_ROWS, ctas_per_sm)], Q_BUFFERS=q_buffers,
                PINGPONG=pingpong, P_FP32=p_fp32, LATE_PV_WAIT=late_pv_wait,
                LAZY_RESCALE=lazy_rescale, DYNAMIC=dynamic)


def compile_sm90(head_dim: int, dtype: torch.dtype = torch.float16, *, block_m: int = 128, block_n: int = 128,
                 stages: int = 2, q_buffers: int = 1, causal: bool = False, window_left: bool = False,
                 softcap: bool = False, lse: bool = True, pingpong: bool = False, p_fp32: bool = False,
                 late_pv_wait: bool = False, lazy_rescale: bool = False, ctas_per_sm: int = 1,
                 dynamic: bool = False):
    """Compile the kernel for sm_90 without a GPU; returns Triton's CompiledKernel
    (its .asm holds the TTGIR, PTX and cubin). Must run with the interpreter off:
    Gluon code does not run under it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    rows, keys = _block_shapes(block_n, head_dim)
    name = _GL_DTYPES[dtype]

    def desc(block):
        return f"tensordesc<{name}[{', '.join(map(str, block))}],{_shared_layout(tuple(block), dtype)!r}>"
    fn = hopper.attention_fwd_hopper_kernel
    signature = {"q_desc": desc(rows), "k_desc": desc(keys), "v_desc": desc(keys), "o_desc": desc(rows),
                 "LSE": "*fp32", "tile_counter": "*i32" if dynamic else "constexpr", "batch": "i32",
                 "n_heads_q": "i32", "kv_group": "i32", "n_q": "i32", "n_k": "i32", "off": "i32", "left": "i32",
                 "right": "i32",
                 "qk_scale": "fp32", "softcap_in": "fp32", "softcap_out": "fp32"}
    constexprs = _constexprs(head_dim, block_m, block_n, stages, q_buffers, window_left, causal, softcap, lse,
                             pingpong, p_fp32, late_pv_wait, lazy_rescale, ctas_per_sm, dynamic)
    signature.update({k: "constexpr" for k in constexprs})
    if not dynamic:
        constexprs = dict(constexprs, tile_counter=None)
    return triton.compile(GluonASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=launch_options(block_m, ctas_per_sm))
