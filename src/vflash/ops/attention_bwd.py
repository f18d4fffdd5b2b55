"""Launcher of the attention backward: delta (kernels/attention_bwd.py), then the dK/dV
and dQ kernels, portable (kernels/attention_bwd.py) or sm_90 (ops/sm90_bwd.py), as
vflash.dispatch.select_backward chose. Inputs come from vflash.library, whose forward
saved q, k, v, out and lse."""

from typing import Hashable, Optional, Tuple

import torch

from vflash import _backend
from vflash.kernels.attention_bwd import (attention_bwd_delta_kernel, attention_bwd_dkdv_kernel,
                                          attention_bwd_dq_kernel, sink_grad_kernel)
from vflash.ops import sm90_bwd
from vflash.ops import launch as launches
from vflash.ops.attention import packed_strides
from vflash.call import Band, Score
from vflash.ops.launch import Alloc, KernelLaunch, Slot
from vflash.ops.scales import score_scales
from vflash.ops.tiles import BackwardTiles, head_dim_pad
from vflash.ops.tma import tma_ready


# A backward plan's inputs, in the order vflash.library's backward ops pass them (dlse may be None;
# varlen adds cu_seqlens_q and cu_seqlens_k; then the sinks, None without)
PLAN_INPUTS = ("do", "dlse", "q", "k", "v", "out", "lse")
SINK_PARTS = 1024  # sink_grad_kernel's parts a step


def attention_backward(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
    band: Band, score: Score, tiles: BackwardTiles, dlse: Optional[torch.Tensor] = None,
    varlen: Optional[tuple] = None, kernel: str = "portable", plan_key: Optional[Hashable] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks): the gradients in the inputs' dtype and layout, contiguous, and with score.sinks
    the sinks' (fp32 [Hq]; an empty fp32 tensor without), for do (any strides) and the
    forward's out and natural-log lse: dense q [B, Hq, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, D_v], out and
    do [B, Hq, Nq, D_v], lse [B, Hq, Nq]; or `varlen` (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    top_left) with packed q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, D_v], lse [Hq, total_q].
    The kernels take P = exp(S - lse) from the saved LSE, which holds the sink's term where there is one: sinks
    change nothing here. Deterministic: every output tile is written by one program, its sums in a fixed order.
    dlse (lse's shape): the loss's gradient with respect to lse too (its dS term is P * dlse).
    kernel "sm90" (TMA-ready q, k, v: dispatch.sm90_backward_refusal; dense or varlen) runs the Gluon
    dK/dV and dQ kernels with `tiles`; "portable" the Triton ones. plan_key (ops.plans.op_plan_key): the
    launches are recorded as that key's plan, where they took the inputs as they came."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=q.device)
    if q.numel() == 0 or k.numel() == 0:  # no key: out is 0, so delta is -dlse
        # out is 0, so delta = -dlse, and a row's LSE is the sink: its share of the softmax e^0 = 1 (0 where the
        # sink is -inf: none), so dsink_h = the sum of the head's dlse
        dsinks = lse.new_empty((0,), dtype=torch.float32)
        if score.sinks is not None:
            dsinks = torch.zeros(score.sinks.shape, dtype=torch.float32, device=q.device) if dlse is None else \
                torch.where(lse == float("-inf"), 0.0, dlse.float()).sum((0, 2) if varlen is None else (1,))
        return dq.zero_(), dk.zero_(), dv.zero_(), dsinks
    if varlen is None:
        B, Hq, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        strides = [t.stride() for t in (q, k, v, do, out)]
        rows_q, rows_k, cu, top_left = Nq, Nk, (None, None), False
        batches = B
    else:
        cu_q, cu_k, rows_q, rows_k, top_left = varlen
        (Nq, Hq, D), (Nk, Hkv) = q.shape, k.shape[:2]  # totals: n_q is LSE's head stride
        B = cu_q.numel() - 1
        strides = [packed_strides(t) for t in (q, k, v, do, out)]
        cu = (cu_q, cu_k)
        batches = 1  # packed_strides' batch stride is 0
    # delta = rowsum(dO * O) - dlse: lse's layout, [B, Hq, Nq] or [Hq, total_q] packed; rows a program:
    # dQ's block_m's power of two (arange's), a memory-bound row sum
    delta_rows = 1 << (tiles.dq.block_m.bit_length() - 1)
    delta_grid = (-(-Nq // delta_rows), Hq, batches)
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    given = (do, lse, dlse)
    lse = lse.float().contiguous()
    dlse = None if dlse is None else dlse.float().contiguous()
    out_strides = [t.stride() if varlen is None else packed_strides(t) for t in (dk, dv, dq)]
    qk_scale, softcap_in, softcap_out = score_scales(score)
    Dv = v.shape[-1]  # v's, out's and dO's head dim (MLA's 128 beside q's and k's 192, say)
    common = dict(HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad(D), HEAD_DIM_V=Dv, HEAD_DIM_V_PAD=head_dim_pad(Dv),
                  HAS_LEFT=band.has_left, HAS_RIGHT=band.has_right, SOFTCAP=score.softcap is not None,
                  EMULATE_BF16=_backend.emulates_bf16(q),
                  DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                  IS_VARLEN=varlen is not None, TOP_LEFT=top_left)
    scalars = ((band.off, band.left, band.right), (qk_scale, score.scale, softcap_in, softcap_out))
    names = ("q", "k", "v", "do", "lse", "delta")
    cu_names = () if varlen is None else ("cu_seqlens_q", "cu_seqlens_k")  # right after the outputs
    # with sinks: each delta program's part of its head's sink gradient, [Hq, batches * programs], then
    # sink_grad_kernel's sum of a head's parts in order
    sinks = score.sinks
    parts = torch.empty((Hq, batches * delta_grid[0]) if sinks is not None else (0,), dtype=torch.float32,
                        device=q.device)
    delta_launch = KernelLaunch(
        attention_bwd_delta_kernel, delta_grid,
        (out, do, dlse, delta, lse if sinks is not None else None, sinks, parts if sinks is not None else None,
         strides[4], strides[3], Hq, Nq),
        dict(HEAD_DIM=Dv, HEAD_DIM_PAD=head_dim_pad(Dv), BLOCK_M=delta_rows, HAS_DLSE=dlse is not None,
             HAS_SINK=sinks is not None),
        dict(num_warps=4), (Slot("O", "out"), Slot("DO", "do"), *([] if dlse is None else [Slot("DLSE", "dlse")]),
                            Slot("DELTA", "delta"),
                            *([] if sinks is None else [Slot("LSE", "lse"), Slot("SINKS", "sinks"),
                                                        Slot("SINK_PART", "sink_part")])))
    if kernel == "sm90":
        do = do if tma_ready(do) else do.contiguous()
        packed = None if varlen is None else (*cu, rows_q, rows_k, top_left)
        dkdv = [sm90_bwd.dkdv_launch(q, k, v, do, lse, delta, dk, dv, band, score, tiles.dkdv.block_m,
                                       tiles.dkdv.block_n, tiles.dkdv.num_stages, outputs, varlen=packed)
                for outputs in (("dk", "dv") if tiles.dkdv_apart else ("dk dv",))]
        dq_launch = sm90_bwd.dq_launch(q, k, v, do, lse, delta, dq, band, score, tiles.dq.block_m,
                                         tiles.dq.block_n, tiles.dq.num_stages, varlen=packed)
    else:
        dkdv = [KernelLaunch(
            attention_bwd_dkdv_kernel, (max(1, -(-rows_k // tiles.dkdv.block_n)), Hkv, B),
            (q, k, v, do, lse, delta, dk, dv, *cu, *strides[:4], *out_strides[:2], Hq, Nq, Nk, *scalars),
            dict(common, GROUP=Hq // Hkv, BLOCK_M=tiles.dkdv.block_m, BLOCK_N=tiles.dkdv.block_n),
            dict(num_warps=tiles.dkdv.num_warps, num_stages=tiles.dkdv.num_stages),
            tuple(Slot(i, n) for i, n in enumerate(names + ("dk", "dv") + cu_names)))]
        dq_launch = KernelLaunch(
            attention_bwd_dq_kernel, (max(1, -(-rows_q // tiles.dq.block_m)), Hq, B),
            (q, k, v, do, lse, delta, dq, *cu, *strides[:4], out_strides[2], Hq, Hq // Hkv, Nq, Nk, *scalars),
            dict(common, BLOCK_M=tiles.dq.block_m, BLOCK_N=tiles.dq.block_n),
            dict(num_warps=tiles.dq.num_warps, num_stages=tiles.dq.num_stages),
            tuple(Slot(i, n) for i, n in enumerate(names + ("dq",) + cu_names)))
    dsinks, sink_launch = _sink_grad_launch(sinks, parts)
    run = [(launch, launches.run(launch, q.device))
           for launch in (delta_launch, *dkdv, dq_launch) + ((sink_launch,) if sink_launch else ())]
    if plan_key is not None and all(a is b for a, b in zip(given, (do, lse, dlse))):
        allocs = (Alloc("dq", tuple(q.shape), q.dtype), Alloc("dk", tuple(k.shape), k.dtype),
                  Alloc("dv", tuple(v.shape), v.dtype), Alloc("delta", tuple(lse.shape), torch.float32),
                  Alloc("sink_part", tuple(parts.shape), torch.float32),
                  Alloc("dsinks", tuple(dsinks.shape), torch.float32))
        launches.record_sequence(plan_key, run, PLAN_INPUTS + cu_names + ("sinks",), allocs,
                                 ("dq", "dk", "dv", "dsinks"), q.device.index)
    return dq, dk, dv, dsinks


def _sink_grad_launch(sinks: Optional[torch.Tensor], parts: torch.Tensor):
    """(dsinks, its launch of sink_grad_kernel or None): fp32 [Hq], minus the sum of each head's parts (fp32
    [Hq, n], attention_bwd_delta_kernel's); an empty tensor and no launch without sinks."""
    if sinks is None:
        return parts.new_empty((0,)), None
    dsinks = torch.empty(sinks.shape, dtype=torch.float32, device=parts.device)
    launch = KernelLaunch(sink_grad_kernel, (sinks.shape[0], 1, 1), (parts, dsinks, parts.shape[1]),
                          dict(BLOCK=SINK_PARTS), dict(num_warps=4),
                          (Slot("SINK_PART", "sink_part"), Slot("DSINKS", "dsinks")))
    return dsinks, launch
