"""Launchers of the Gluon Hopper backward kernels (kernels/attention_bwd_hopper.py):
dQ and dK / dV, their descriptors, grids and arguments, and ahead-of-time compiles for
sm_90 that need no GPU. ops/attention_bwd.py launches them where vflash.dispatch.select_backward
picks the sm90 kernels."""

import torch

from vflash.kernels import attention_bwd_hopper as kernels
from vflash.ops.band import Band
from vflash.ops.hopper import CONSUMER_REGS as CONSUMER_REGS_FWD
from vflash.ops.hopper import CONSUMER_ROWS, _block_shapes, describers, desc_signature
from vflash.ops.launch import KernelLaunch, Slot
from vflash.ops.scales import score_scales

HAVE_GLUON = kernels.HAVE_GLUON
STAGES = 2  # the ring's depth unless a launch says otherwise
# One CTA an SM (its shared memory): each consumer warpgroup's registers a thread by consumer count (the
# forward's one-CTA shares), the producer what is left.
CONSUMER_REGS = {1: 240, 2: CONSUMER_REGS_FWD[(2, 1)], 3: CONSUMER_REGS_FWD[(3, 1)]}
SMEM_BYTES = 227 * 1024  # an sm_90 CTA's shared memory


def smem_bytes(head_dim: int, own: int, streamed: int, stages: int = STAGES, itemsize: int = 2) -> int:
    """Either kernel's shared memory: the CTA's own rows of two tensors (dQ: Q and dO; dK / dV: K and V)
    and `stages` tiles of the two it streams."""
    return (2 * own + 2 * stages * streamed) * head_dim * itemsize


def _check(q, k, lse, delta, own: int, streamed: int, stages: int):
    # what the kernels assume of their tiles and inputs (the dispatch's tables and the backward's
    # launcher keep to it; a direct call gets a ValueError, not a failed compile)
    B, Hq, Nq, D = q.shape
    if own not in (CONSUMER_ROWS, 2 * CONSUMER_ROWS, 3 * CONSUMER_ROWS) or smem_bytes(D, own, streamed,
                                                                            stages) > SMEM_BYTES:
        raise ValueError(f"the sm90 backward kernels take 64, 128 or 192 rows a CTA in {SMEM_BYTES} bytes of shared "
                         f"memory, not {own} x {streamed} ({stages} stages) at D {D}")
    if D not in (16, 32, 64, 128, 256) or Hq % k.shape[1] != 0:
        raise ValueError(f"the sm90 backward kernels take head dims 16-256 in powers of two and whole GQA groups, "
                         f"not D {D}, {Hq} / {k.shape[1]} heads")
    for name, t in (("lse", lse), ("delta", delta)):
        if t.shape != (B, Hq, Nq) or not t.is_contiguous() or t.dtype != torch.float32:
            raise ValueError(f"{name} must be contiguous fp32 [B, Hq, Nq] = {[B, Hq, Nq]}, got {list(t.shape)}")


def _constexprs(head_dim: int, block_m: int, block_n: int, own: int, band: Band, softcap: bool,
                stages: int = STAGES) -> dict:
    # own: the CTA's own rows (dQ: block_m, dK / dV: block_n), 64 a consumer warpgroup
    return dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, HAS_LEFT=band.has_left,
                HAS_RIGHT=band.has_right, SOFTCAP=softcap, CONSUMER_REGS=CONSUMER_REGS[own // CONSUMER_ROWS])


def dq_launch(q, k, v, do, lse, delta, dq, band: Band, scale: float, softcap, block_m: int = 128,
              block_n: int = 64, stages: int = STAGES, reverse_m: bool = False) -> KernelLaunch:
    """attention_bwd_dq_hopper_kernel over dense [B, H, N, D] tensors (TMA-ready: ops.hopper.tma_ready):
    dq [B, Hq, Nq, D] from q, k, v, do, the forward's lse and delta = rowsum(do * out) [B, Hq, Nq] fp32.
    reverse_m: each head's row blocks launched last to first (under a right edge, longest first)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check(q, k, lse, delta, block_m, block_n, stages)
    rows, keys = describers(block_n, D, q.dtype)
    qk_scale, softcap_in, softcap_out = score_scales(scale, softcap)
    args = (rows(q), keys(k), keys(v), rows(do), rows(dq), lse, delta,
            B, Hq, Hq // Hkv, Nq, Nk, band.off, band.left, band.right, qk_scale, scale, softcap_in, softcap_out)
    grid = (B * Hq * -(-Nq // block_m), 1, 1)
    slots = (Slot(0, "q", rows), Slot(1, "k", keys), Slot(2, "v", keys), Slot(3, "do", rows), Slot(4, "dq", rows),
             Slot(5, "lse"), Slot(6, "delta"))
    constexprs = dict(_constexprs(D, block_m, block_n, block_m, band, softcap is not None, stages),
                      REVERSE_M=reverse_m)
    return KernelLaunch(kernels.attention_bwd_dq_hopper_kernel, grid, args, constexprs, dict(num_warps=4), slots)


def dkdv_launch(q, k, v, do, lse, delta, dk, dv, band: Band, scale: float, softcap, block_m: int = 64,
                block_n: int = 128, stages: int = STAGES, outputs: str = "dk dv") -> KernelLaunch:
    """attention_bwd_dkdv_hopper_kernel over dense [B, H, N, D] tensors (TMA-ready): dk, dv [B, Hkv, Nk, D]
    (summed over each KV head's query heads in order) from q, k, v, do, lse and delta [B, Hq, Nq] fp32.
    block_n keys a CTA (64 a consumer), block_m query rows a streamed tile. outputs: "dk dv", or "dk" or
    "dv" alone (one accumulator a consumer, where two do not fit in registers; the other is not written)."""
    if outputs not in ("dk dv", "dk", "dv"):
        raise ValueError(f"outputs must be 'dk dv', 'dk' or 'dv', not {outputs!r}")
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check(q, k, lse, delta, block_n, block_m, stages)
    rows, streamed = describers(block_m, D, q.dtype)
    qk_scale, softcap_in, softcap_out = score_scales(scale, softcap)
    args = (streamed(q), rows(k), rows(v), streamed(do), rows(dk), rows(dv), lse, delta,
            B, Hkv, Hq // Hkv, Nq, Nk, band.off, band.left, band.right, qk_scale, scale, softcap_in, softcap_out)
    grid = (B * Hkv * -(-Nk // block_n), 1, 1)
    slots = (Slot(0, "q", streamed), Slot(1, "k", rows), Slot(2, "v", rows), Slot(3, "do", streamed),
             Slot(4, "dk", rows), Slot(5, "dv", rows), Slot(6, "lse"), Slot(7, "delta"))
    constexprs = dict(_constexprs(D, block_m, block_n, block_n, band, softcap is not None, stages),
                      WANT_DK="dk" in outputs, WANT_DV="dv" in outputs)
    return KernelLaunch(kernels.attention_bwd_dkdv_hopper_kernel, grid, args, constexprs, dict(num_warps=4), slots)


def compile_dkdv_sm90(head_dim: int, dtype: torch.dtype = torch.bfloat16, block_m: int = 64, block_n: int = 128, *,
                      band: Band = Band(0, -1, 0), softcap: bool = False, outputs: str = "dk dv"):
    """Compile the dK / dV kernel for sm_90 without a GPU (outputs as dkdv_launch's); returns Triton's
    CompiledKernel."""
    rows, streamed = _block_shapes(block_m, head_dim)
    names = ("q_desc", "k_desc", "v_desc", "do_desc", "dk_desc", "dv_desc")
    blocks = (streamed, rows, rows, streamed, rows, rows)
    scalars = ("batch", "n_heads_kv", "kv_group", "n_q", "n_k", "off", "left", "right")
    return _compile(kernels.attention_bwd_dkdv_hopper_kernel, dict(zip(names, blocks)), scalars, head_dim, dtype,
                    block_m, block_n, block_n, band, softcap, dict(WANT_DK="dk" in outputs, WANT_DV="dv" in outputs))


def compile_dq_sm90(head_dim: int, dtype: torch.dtype = torch.bfloat16, block_m: int = 128, block_n: int = 64, *,
                    band: Band = Band(0, -1, 0), softcap: bool = False, reverse_m: bool = False):
    """Compile the dQ kernel for sm_90 without a GPU; returns Triton's CompiledKernel."""
    rows, keys = _block_shapes(block_n, head_dim)
    names = ("q_desc", "k_desc", "v_desc", "do_desc", "dq_desc")
    scalars = ("batch", "n_heads_q", "kv_group", "n_q", "n_k", "off", "left", "right")
    return _compile(kernels.attention_bwd_dq_hopper_kernel, dict(zip(names, (rows, keys, keys, rows, rows))), scalars,
                    head_dim, dtype, block_m, block_n, block_m, band, softcap, dict(REVERSE_M=reverse_m))


def _compile(fn, descs: dict, scalars, head_dim, dtype, block_m, block_n, own, band, softcap, extra=None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {k: desc_signature(b, dtype) for k, b in descs.items()}
    signature.update({"LSE": "*fp32", "DELTA": "*fp32", **{s: "i32" for s in scalars}, "qk_scale": "fp32",
                      "sm_scale": "fp32", "softcap_in": "fp32", "softcap_out": "fp32"})
    constexprs = dict(_constexprs(head_dim, block_m, block_n, own, band, softcap), **(extra or {}))
    signature.update({k: "constexpr" for k in constexprs})
    return triton.compile(GluonASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=4))
