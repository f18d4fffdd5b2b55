"""Launcher of the Gluon Hopper dQ kernel (kernels/attention_bwd_hopper.py): its
descriptors, grid and arguments, and an ahead-of-time compile for sm_90 that needs
no GPU. Not dispatched yet: the portable backward (ops/attention_bwd.py) serves
every call; this launch is for the GPU tests and benchmarks/experiments/bwd_hopper.py."""

import torch

from vflash.kernels import attention_bwd_hopper as kernels
from vflash.ops.band import Band
from vflash.ops.hopper import CONSUMER_ROWS, _GL_DTYPES, _block_shapes, _shared_layout, describers
from vflash.ops.launch import KernelLaunch, Slot
from vflash.ops.scales import score_scales

HAVE_GLUON = kernels.HAVE_GLUON
STAGES = 2
# One CTA an SM (its shared memory): each consumer warpgroup 240 registers a thread, the producer what is left.
CONSUMER_REGS = 240
SMEM_BYTES = 227 * 1024  # an sm_90 CTA's shared memory


def smem_bytes(head_dim: int, block_m: int, block_n: int, itemsize: int = 2) -> int:
    """The dQ kernel's shared memory: each consumer's Q and dO rows, STAGES K and V tiles."""
    return (2 * block_m + 2 * STAGES * block_n) * head_dim * itemsize


def _constexprs(head_dim: int, block_m: int, block_n: int, band: Band, softcap: bool) -> dict:
    return dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=STAGES, HAS_LEFT=band.has_left,
                HAS_RIGHT=band.has_right, SOFTCAP=softcap, CONSUMER_REGS=CONSUMER_REGS)


def dq_launch(q, k, v, do, lse, delta, dq, band: Band, scale: float, softcap, block_m: int = 128,
              block_n: int = 64) -> KernelLaunch:
    """attention_bwd_dq_hopper_kernel over dense [B, H, N, D] tensors (TMA-ready: ops.hopper.tma_ready):
    dq [B, Hq, Nq, D] from q, k, v, do, the forward's lse and delta = rowsum(do * out) [B, Hq, Nq] fp32."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if block_m not in (CONSUMER_ROWS, 2 * CONSUMER_ROWS) or smem_bytes(D, block_m, block_n) > SMEM_BYTES:
        raise ValueError(f"the sm90 dQ kernel takes 64 or 128 rows in {SMEM_BYTES} bytes of shared memory, not "
                         f"{block_m} x {block_n} at D {D}")
    rows, keys = describers(block_n, D, q.dtype)
    qk_scale, softcap_in, softcap_out = score_scales(scale, softcap)
    args = (rows(q), keys(k), keys(v), rows(do), rows(dq), lse, delta,
            B, Hq, Hq // Hkv, Nq, Nk, band.off, band.left, band.right, qk_scale, scale, softcap_in, softcap_out)
    grid = (B * Hq * -(-Nq // block_m), 1, 1)
    slots = (Slot(0, "q", rows), Slot(1, "k", keys), Slot(2, "v", keys), Slot(3, "do", rows), Slot(4, "dq", rows),
             Slot(5, "lse"), Slot(6, "delta"))
    return KernelLaunch(kernels.attention_bwd_dq_hopper_kernel, grid, args,
                        _constexprs(D, block_m, block_n, band, softcap is not None), dict(num_warps=4), slots)


def compile_dq_sm90(head_dim: int, dtype: torch.dtype = torch.bfloat16, block_m: int = 128, block_n: int = 64, *,
                    band: Band = Band(0, -1, 0), softcap: bool = False):
    """Compile the dQ kernel for sm_90 without a GPU; returns Triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    rows, keys = _block_shapes(block_n, head_dim)
    name = _GL_DTYPES[dtype]

    def desc(block):
        return f"tensordesc<{name}[{', '.join(map(str, block))}],{_shared_layout(tuple(block), dtype)!r}>"
    signature = {"q_desc": desc(rows), "k_desc": desc(keys), "v_desc": desc(keys), "do_desc": desc(rows),
                 "dq_desc": desc(rows), "LSE": "*fp32", "DELTA": "*fp32",
                 "batch": "i32", "n_heads_q": "i32", "kv_group": "i32", "n_q": "i32", "n_k": "i32", "off": "i32",
                 "left": "i32", "right": "i32", "qk_scale": "fp32", "sm_scale": "fp32", "softcap_in": "fp32",
                 "softcap_out": "fp32"}
    constexprs = _constexprs(head_dim, block_m, block_n, band, softcap)
    signature.update({k: "constexpr" for k in constexprs})
    return triton.compile(GluonASTSource(kernels.attention_bwd_dq_hopper_kernel, signature, constexprs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
