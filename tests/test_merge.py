"""vflash.merge_states: against the formula in fp64 (reference/merge.py), and the property it
exists for: attention over keys split in two, merged, equals attention over all the keys (held
to the dense oracle's rule). -inf rows, garbage in empty parts, shapes, strides, dtypes, errors."""

import pytest
import torch
import triton
import triton.language as tl

import vflash
from vflash.harness.oracle import compare
from vflash.kernels.combine import fold_splits
from vflash.reference import attention_explicit, attention_varlen_reference, merge_states_reference
from vflash.call import Call, Score

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _parts(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    oa, ob = (torch.randn(*shape, generator=g).to(dtype).to(device) for _ in range(2))
    la, lb = (4 * torch.randn(*shape[:-1], generator=g).to(device) for _ in range(2))
    flat_a, flat_b = la.view(-1), lb.view(-1)
    flat_a[0] = float("-inf")  # a part that saw no key, holding garbage
    oa.view(-1, shape[-1])[0] = float("nan")
    flat_b[1] = float("-inf")
    flat_a[2] = flat_b[2] = float("-inf")  # neither part saw a key
    flat_a[3], flat_b[3] = 80.0, -80.0  # far apart: one part's weight underflows
    return oa, la, ob, lb


@pytest.mark.parametrize("shape", [(2, 3, 7, 16), (9, 2, 40), (5, 256), (1, 1, 4, 8)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_matches_the_formula(shape, dtype, device):
    oa, la, ob, lb = _parts(shape, DTYPES[dtype], device)
    out, lse = vflash.merge_states(oa, la, ob, lb)
    assert out.shape == oa.shape and out.dtype == oa.dtype and lse.shape == la.shape and lse.dtype == torch.float32
    ref_o, ref_l = merge_states_reference(oa, la, ob, lb)
    assert torch.equal(torch.isneginf(lse).cpu(), torch.isneginf(ref_l).cpu())
    assert torch.isfinite(out).all()
    fin = torch.isfinite(ref_l)
    assert (lse.double() - ref_l)[fin].abs().max().item() < 1e-5
    # fp32 arithmetic, rounded once to the output dtype
    ulp = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-22}[DTYPES[dtype]]
    assert (out.double() - ref_o).abs().max().item() <= ulp * max(1.0, ref_o.abs().max().item())
    assert not out.view(-1, shape[-1])[2].any()  # both parts empty: zeros


def test_strided_inputs(device):
    oa, la, ob, lb = _parts((2, 7, 3, 16), torch.float16, device)  # [B, N, H, D] ...
    args = (oa.transpose(1, 2), la.transpose(1, 2), ob.transpose(1, 2), lb.transpose(1, 2))  # ... as [B, H, N, D]
    out, lse = vflash.merge_states(*args)
    ref_o, ref_l = merge_states_reference(*args)
    assert (out.double() - ref_o).abs().max().item() < 1e-2 and out.is_contiguous()


@pytest.mark.parametrize("opts", [dict(), dict(causal=True), dict(causal="top_left"), dict(window=(20, 3)),
                                  dict(softcap=10.0, causal=True)],
                         ids=["full", "causal", "top_left", "window", "softcap+causal"])
def test_split_keys_merge_to_full_attention(opts, device):
    # Keys split at 45 of 100. Each part runs through the launcher with the full call's band,
    # its offset shifted by the part's first key (the per-call band ring attention takes per
    # step); the merged parts are attention over all keys, held to the dense oracle's rule.
    from vflash import dispatch
    from vflash.ops import attention_forward
    from vflash._validate import sequence_band
    from vflash.call import Band
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 60, 32, generator=g).half().to(device)
    k, v = (torch.randn(2, 2, 100, 32, generator=g).half().to(device) for _ in range(2))
    ref, ref_lse = attention_explicit(q, k, v, compute_dtype=torch.float64, **opts)
    same, _ = attention_explicit(q, k, v, compute_dtype=None, **opts)
    mode = {False: None, True: "bottom_right"}.get(opts.get("causal", False), opts.get("causal"))
    edges = sequence_band(mode, opts.get("window") or (-1, -1))
    off = 0 if mode == "top_left" else 100 - 60
    parts = []
    for start, stop in ((0, 45), (45, 100)):
        kp, vp = k[:, :, start:stop], v[:, :, start:stop]
        band = Band(off - start, edges.left, edges.right)
        choice = dispatch.select(dispatch.problem_of(Call(q, kp, vp, None, band, Score(1.0), False)))
        parts.append(attention_forward(q, kp, vp, band=band, score=Score(32 ** -0.5, opts.get("softcap")),
                                       return_lse=True, tiles=choice.tiles, kernel=choice.kernel))
    (a, la), (b, lb) = parts
    out, lse = vflash.merge_states(a, la, b, lb)
    verdict = compare("out", out.cpu(), ref.cpu(), same.cpu(), torch.float16)
    assert verdict.passed, f"max err {verdict.max_err:.3e} > tol {verdict.tol:.3e} {verdict.note}"
    assert torch.equal(torch.isneginf(lse).cpu(), torch.isneginf(ref_lse).cpu())
    fin = torch.isfinite(ref_lse)
    assert (lse.double() - ref_lse)[fin].abs().max().item() < 1e-4


def test_varlen_outputs_merge_through_a_transposed_lse(device):
    # attention_varlen's lse is [Hq, total_q]: merged as lse.transpose(0, 1) beside out [total_q, Hq, D]
    g = torch.Generator().manual_seed(2)
    lens = [7, 0, 12]
    cu = torch.tensor([0, 7, 7, 19], dtype=torch.int32, device=device)
    q = torch.randn(19, 2, 16, generator=g).to(device)
    k1, v1, k2, v2 = (torch.randn(19, 2, 16, generator=g).to(device) for _ in range(4))
    a, la = vflash.attention_varlen(q, k1, v1, cu, cu, 12, 12, return_lse=True)
    b, lb = vflash.attention_varlen(q, k2, v2, cu, cu, 12, 12, return_lse=True)
    out, lse = vflash.merge_states(a, la.transpose(0, 1), b, lb.transpose(0, 1))
    # the same as attention over each sequence's keys from both sets, concatenated per sequence
    ck = torch.tensor([0, 14, 14, 38], dtype=torch.int32, device=device)
    kk = torch.cat([k1[0:7], k2[0:7], k1[7:19], k2[7:19]])
    vv = torch.cat([v1[0:7], v2[0:7], v1[7:19], v2[7:19]])
    ref, ref_lse = attention_varlen_reference(q, kk, vv, cu, ck, compute_dtype=torch.float64)
    assert (out.double() - ref).abs().max().item() < 1e-5 and len(lens) == 3
    assert (lse.transpose(0, 1).double() - ref_lse).abs().max().item() < 1e-5


@pytest.mark.parametrize("change,error,match", [
    (lambda oa, la, ob, lb: dict(out_a=oa.tolist()), TypeError, "out_a must be a torch.Tensor, got list"),
    (lambda oa, la, ob, lb: dict(out_b=ob[..., :8]), ValueError, "one shape"),
    (lambda oa, la, ob, lb: dict(out_b=ob.float()), TypeError, "share one of"),
    (lambda oa, la, ob, lb: dict(lse_a=la[..., :2]), ValueError, "lse_a must have the outputs' leading shape"),
    (lambda oa, la, ob, lb: dict(lse_b=lb.double()), TypeError, "lse_b must be float32"),
    (lambda oa, la, ob, lb: dict(lse_b=lb.to("meta")), ValueError, "on one device"),
    (lambda oa, la, ob, lb: dict(out_a=oa.int(), out_b=ob.int()), TypeError, "share one of"),
])
def test_bad_input_is_refused(change, error, match, device):
    oa, la, ob, lb = _parts((2, 3, 5, 16), torch.float16, device)
    args = dict(out_a=oa, lse_a=la, out_b=ob, lse_b=lb)
    args.update(change(oa, la, ob, lb))
    with pytest.raises(error, match=match):
        vflash.merge_states(**args)


@triton.jit
def _fold_kernel(O_PART, LSE_PART, OUT, LSE, stride_ps, stride_pm, stride_ph, stride_ls, stride_lh, n_rows, num_splits,
                 ROWS: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 SPLIT_CHUNK: tl.constexpr):
    # one program: every (row, head) pair of the partials a merged row
    r = tl.arange(0, ROWS)
    row, head = r // HEADS, r % HEADS
    ok = row < n_rows
    offs = row * stride_pm + head * stride_ph
    lse_offs = head * stride_lh + row
    out, lse = fold_splits(O_PART + offs, LSE_PART + lse_offs, stride_ps, stride_ls, 1, num_splits, ok, 0.0, ROWS,
                           HEAD_DIM, HEAD_DIM_PAD, SPLIT_CHUNK, False)
    d = tl.arange(0, HEAD_DIM_PAD)
    tl.store(OUT + offs[:, None] + d[None, :], out, mask=ok[:, None] & (d[None, :] < HEAD_DIM))
    tl.store(LSE + lse_offs, lse, mask=ok)


def _fold(o_part, lse_part, split_chunk=16):
    # split-KV's merge (kernels/combine.py:fold_splits, what each row tile's last split runs inside
    # attention_kvcache_kernel) alone over partials [splits, rows, H, D] / [splits, H, rows]
    from vflash.ops import launch as launches
    splits, rows, heads, d = o_part.shape
    out = torch.empty(rows, heads, d, dtype=torch.float32, device=o_part.device)
    lse = torch.empty(heads, rows, dtype=torch.float32, device=o_part.device)
    args = (o_part, lse_part, out, lse, *o_part.stride()[:3], *lse_part.stride()[:2], rows, splits)
    constexprs = dict(ROWS=1 << (rows * heads - 1).bit_length(), HEADS=heads, HEAD_DIM=d,
                      HEAD_DIM_PAD=max(16, 1 << (d - 1).bit_length()), SPLIT_CHUNK=split_chunk)
    launches.run(launches.KernelLaunch(_fold_kernel, (1, 1, 1), args, constexprs, dict(num_warps=4), ()),
                 o_part.device)
    return out, lse


def test_a_plus_inf_lse_takes_all_the_weight(device):
    # a part whose scores overflowed (lse +inf) outweighs any finite part, both +inf share the row half
    # each, and the merged LSE is +inf: never NaN (merge_states' documented result)
    g = torch.Generator().manual_seed(3)
    inf = float("inf")
    out_a, out_b = (torch.randn(2, 5, 32, generator=g).to(device) for _ in range(2))
    lse_a = torch.tensor([[inf, 0.0, inf, -inf, 1.0]] * 2, device=device)
    lse_b = torch.tensor([[2.0, inf, inf, inf, -inf]] * 2, device=device)
    out, lse = vflash.merge_states(out_a, lse_a, out_b, lse_b)
    assert torch.equal(lse[:, :4], torch.full((2, 4), inf, device=device)) and torch.isfinite(lse[:, 4]).all()
    assert torch.equal(out[:, 0], out_a[:, 0]) and torch.equal(out[:, 1], out_b[:, 1])
    assert torch.allclose(out[:, 2], (out_a[:, 2] + out_b[:, 2]) / 2)
    assert torch.equal(out[:, 3], out_b[:, 3]) and torch.equal(out[:, 4], out_a[:, 4])


@pytest.mark.parametrize("splits", [1, 5, 16, 17, 64, 150])  # one chunk, a chunk's edge, many chunks
def test_split_merge_matches_the_lse_formula(splits, device):
    # the merge folds any number of splits, -inf (empty) ones included, to the logsumexp merge in fp64
    g = torch.Generator().manual_seed(splits)
    rows, heads, d = 3, 2, 40
    o_part = torch.randn(splits, rows, heads, d, generator=g)
    lse_part = 3 * torch.randn(splits, heads, rows, generator=g)
    lse_part[::3] = float("-inf")  # every third split saw no key
    o_part[::3] = 0.0  # and wrote a zero partial (as the split kernel's empty splits do)
    lse_part[:, 0, 0] = float("-inf")  # a row no split saw
    out, lse = _fold(o_part.to(device), lse_part.to(device))
    l64 = lse_part.double()
    ref_lse = torch.logsumexp(l64, 0)  # [H, rows]
    w = torch.exp(l64 - torch.where(ref_lse.isinf(), 0.0, ref_lse)).nan_to_num(0.0)  # [splits, H, rows]
    ref = (torch.where(w[..., None] > 0, o_part.double().transpose(1, 2), 0.0) * w[..., None]).sum(0).transpose(0, 1)
    torch.testing.assert_close(out.cpu().double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=1e-5, rtol=1e-5)
    assert out[0, 0].eq(0).all() and lse[0, 0] == float("-inf")


def test_split_merge_ignores_trailing_empty_splits_bitwise(device):
    # batch-invariance's premise: a row's result is the same bits whatever number of empty splits
    # (-inf, a zero partial: what the split kernel writes for them) follow its own, within its chunk and
    # past it
    g = torch.Generator().manual_seed(1)
    o_part = torch.randn(20, 2, 2, 16, generator=g)
    lse_part = torch.randn(20, 2, 2, generator=g)
    alone = _fold(o_part.to(device), lse_part.to(device))
    for total in (40, 64, 130):
        o_more = torch.cat([o_part, torch.zeros(total - 20, 2, 2, 16)])
        lse_more = torch.cat([lse_part, torch.full((total - 20, 2, 2), float("-inf"))])
        more = _fold(o_more.to(device), lse_more.to(device))
        assert torch.equal(more[0], alone[0]) and torch.equal(more[1], alone[1]), total


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans record compiled GPU launches")
def test_gpu_repeats_launch_a_recorded_plan():
    # the first call of a metadata key records its launch; repeats with other values run the plan and
    # give the full path's bits; an LSE whose rows need a copy ([total, H] of varlen's [H, total]) is
    # merged right and never planned (a plan reads the caller's tensors themselves)
    from vflash.ops import plans
    plans.clear()
    dev = torch.device("cuda")
    for seed in (0, 1, 2):
        parts = _parts((4, 8, 3, 128), torch.bfloat16, dev, seed=seed)
        out, lse = vflash.merge_states(*parts)
        assert len(plans._plans) == 1
        plans.clear()
        full = vflash.merge_states(*parts)
        assert torch.equal(out, full[0]) and torch.equal(lse, full[1])
        vflash.merge_states(*parts)  # recorded again for the next seed's planned call
    oa, la, ob, lb = _parts((6, 4, 64), torch.float16, dev)
    la_t, lb_t = la.t().contiguous().t(), lb.t().contiguous().t()  # [6, 4] views of [4, 6] storage
    for _ in range(2):
        out, lse = vflash.merge_states(oa, la_t, ob, lb_t)
        ref_o, ref_l = merge_states_reference(oa, la_t, ob, lb_t)
        fin = torch.isfinite(ref_l)
        assert torch.allclose(out.double()[fin], ref_o[fin], atol=2e-3, rtol=2e-3)
    assert len(plans._plans) == 1
