"""vflash.attention_varlen against a per-sequence loop over the explicit fp64 reference,
through the interpreter on the CPU (or the device VFLASH_TEST_DEVICE names): the same rule
as the dense tests (max error <= 2x same-dtype PyTorch's + floor), -inf LSE exactly on rows
that see no key, every output element written, and bad metadata refused before launch."""

import pytest
import torch

import vflash
from _sm90 import needs_sm90, tile_variants
from vflash import dispatch
from vflash.harness.oracle import compare
from vflash.ops import attention_varlen_forward
from vflash.reference import attention_varlen_reference
from vflash.call import Call, Packed, Score
from vflash._validate import sequence_band

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _cu(lengths, device):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _inputs(lens_q, lens_k, hq, hkv, d, dtype, device, seed=0, packed_qkv=False):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    if packed_qkv:  # q, k, v as strided views of one [total, 3, H, D] buffer (self-attention)
        assert lens_q == lens_k and hq == hkv
        qkv = torch.randn(tq, 3, hq, d, generator=g).to(dtype).to(device)
        return qkv[:, 0], qkv[:, 1], qkv[:, 2]
    return (torch.randn(tq, hq, d, generator=g).to(dtype).to(device),
            torch.randn(tk, hkv, d, generator=g).to(dtype).to(device),
            torch.randn(tk, hkv, d, generator=g).to(dtype).to(device))


def _check(lens_q, lens_k, device, hq=4, hkv=2, d=16, dtype="fp16", packed_qkv=False, **opts):
    dt = DTYPES[dtype]
    q, k, v = _inputs(lens_q, lens_k, hq, hkv, d, dt, device, packed_qkv=packed_qkv)
    cq, ck = _cu(lens_q, device), _cu(lens_k, device)
    out, lse = vflash.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), return_lse=True, **opts)
    assert out.shape == q.shape and out.dtype == dt and lse.shape == (hq, sum(lens_q)) and lse.dtype == torch.float32
    ref_o, ref_l = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=torch.float64, **opts)
    same_o, _ = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=None, **opts)
    _, same_l = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=torch.float32, **opts)
    for verdict in (compare("out", out.cpu(), ref_o.cpu(), same_o.cpu(), dt),
                    compare("lse", lse.cpu(), ref_l.cpu(), same_l.cpu(), torch.float32)):
        assert verdict.passed, f"{verdict.what}: max err {verdict.max_err:.3e} > tol {verdict.tol:.3e} {verdict.note}"


# (query lengths, key lengths) per sequence: zero-length sequences, lengths around the
# interpreter's 32-row tiles, Nq != Nk both ways (chunked prefill: fewer queries than keys)
SELF = [5, 0, 33, 1, 31, 64]
CROSS = ([3, 7, 0, 40, 2], [10, 7, 4, 33, 0])


@pytest.mark.parametrize("opts", [dict(), dict(causal=True), dict(causal="top_left"), dict(window=(4, 2)),
                                  dict(window=(8, 0), causal=True), dict(softcap=5.0), dict(scale=0.3)],
                         ids=["full", "causal", "top_left", "window", "window+causal", "softcap", "scale"])
def test_self_attention_per_sequence(opts, device):
    _check(SELF, SELF, device, **opts)


@pytest.mark.parametrize("opts", [dict(), dict(causal=True), dict(causal="top_left"), dict(window=(5, 0))],
                         ids=["full", "causal", "top_left", "window"])
def test_nq_differs_from_nk_per_sequence(opts, device):
    # bottom-right alignment per sequence: sequence 0's 3 queries are its last 3 keys' rows;
    # a sequence with no keys gets zeros and -inf
    _check(*CROSS, device, **opts)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_dtypes(dtype, device):
    _check(SELF, SELF, device, dtype=dtype, causal=True)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)], ids=["mha", "gqa4", "mqa"])
def test_heads(hq, hkv, device):
    _check([9, 20], [12, 20], device, hq=hq, hkv=hkv, causal=True)


@pytest.mark.parametrize("d", [8, 24, 64])
def test_head_dims(d, device):
    _check([9, 20], [12, 20], device, d=d)


def test_strided_views_of_a_packed_qkv_buffer(device):
    _check(SELF, SELF, device, hq=2, hkv=2, packed_qkv=True, causal=True)


def test_every_element_is_written(device):
    lens = [5, 0, 33, 1]
    q, k, v = _inputs(lens, lens, 2, 2, 16, torch.float16, device)
    cq = _cu(lens, device)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=device)
    lse = torch.full((2, q.shape[0]), float("nan"), device=device)
    band = sequence_band("bottom_right", (-1, -1))
    choice = dispatch.choose(Call(q, k, v, Packed(cq, cq, 33, 33, False, False), band, Score(0.25), True))
    attention_varlen_forward(q, k, v, cq, cq, 33, band=band, top_left=False, score=Score(0.25, None),
                             return_lse=True, tiles=choice.tiles, kernel=choice.kernel, out=out, lse=lse)
    assert not out.isnan().any() and not lse.isnan().any()


def test_empty_inputs(device):
    q, k, v = _inputs([0, 0], [3, 4], 2, 2, 16, torch.float16, device)
    out, lse = vflash.attention_varlen(q, k, v, _cu([0, 0], device), _cu([3, 4], device), 0, 4, return_lse=True)
    assert out.shape == (0, 2, 16) and lse.shape == (2, 0)
    q, k, v = _inputs([3, 4], [0, 0], 2, 2, 16, torch.float16, device)
    out, lse = vflash.attention_varlen(q, k, v, _cu([3, 4], device), _cu([0, 0], device), 4, 0, return_lse=True)
    assert torch.equal(out.cpu(), torch.zeros(7, 2, 16, dtype=torch.float16)) and torch.isneginf(lse).all()


def test_check_metadata_off_gives_the_same_result(device):
    q, k, v = _inputs(SELF, SELF, 2, 2, 16, torch.float16, device)
    cu = _cu(SELF, device)
    a = vflash.attention_varlen(q, k, v, cu, cu, 64, 64, causal=True)
    b = vflash.attention_varlen(q, k, v, cu, cu, 64, 64, causal=True, check_metadata=False)
    assert torch.equal(a, b)


def _bad(device):
    q, k, v = _inputs([3, 4], [3, 4], 2, 2, 16, torch.float16, device)
    return q, k, v, _cu([3, 4], device)


@pytest.mark.parametrize("change,error,match", [
    (lambda q, k, v, cu: dict(cu_seqlens_q=cu.long()), TypeError, "cu_seqlens_q must be int32"),
    (lambda q, k, v, cu: dict(cu_seqlens_k=[0, 3, 7]), TypeError, "cu_seqlens_k must be an int32 torch.Tensor"),
    (lambda q, k, v, cu: dict(cu_seqlens_q=cu[:1]), ValueError, r"1-D \[batch \+ 1\] with batch >= 1"),
    (lambda q, k, v, cu: dict(cu_seqlens_k=torch.tensor([0, 7], dtype=torch.int32, device=cu.device)), ValueError,
     "the same length"),
    (lambda q, k, v, cu: dict(cu_seqlens_q=cu + 1), ValueError, r"cu_seqlens_q\[0\] must be 0"),
    (lambda q, k, v, cu: dict(cu_seqlens_q=torch.tensor([0, 4, 3], dtype=torch.int32, device=cu.device)),
     ValueError, "non-decreasing: sequence 1 runs from 4 to 3"),
    (lambda q, k, v, cu: dict(cu_seqlens_k=torch.tensor([0, 3, 6], dtype=torch.int32, device=cu.device)),
     ValueError, r"cu_seqlens_k\[-1\] must be the packed length of k and v \(7\)"),
    (lambda q, k, v, cu: dict(max_seqlen_q=3), ValueError, "sequence 1 has 4 rows .* more than max_seqlen_q = 3"),
    (lambda q, k, v, cu: dict(max_seqlen_k=-1), ValueError, "max_seqlen_k must be an int >= 0"),
    (lambda q, k, v, cu: dict(max_seqlen_q=4.0), TypeError, "max_seqlen_q must be an int"),
    (lambda q, k, v, cu: dict(q=q[None]), ValueError, r"q must be 3-D \[total_q, heads, head_dim\]"),
    (lambda q, k, v, cu: dict(v=v[:6]), ValueError, "k and v must have the same shape"),
    (lambda q, k, v, cu: dict(k=k[:, :, :8], v=v[:, :, :8]), ValueError, "head dims differ"),
    (lambda q, k, v, cu: dict(q=q.float()), TypeError, "share one dtype"),
    (lambda q, k, v, cu: dict(cu_seqlens_q=torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=cu.device)[::2]),
     ValueError, "contiguous"),
    (lambda q, k, v, cu: dict(check_metadata=1), TypeError, "check_metadata"),
    (lambda q, k, v, cu: dict(cu_seqlens_k=cu.to("meta")), ValueError, "cu_seqlens_k must be on q's device"),
    (lambda q, k, v, cu: dict(max_seqlen_k=True), TypeError, "max_seqlen_k must be an int >= 0"),
])
def test_bad_metadata_is_refused_before_launch(change, error, match, device):
    q, k, v, cu = _bad(device)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=4, max_seqlen_k=4)
    args.update(change(q, k, v, cu))
    with pytest.raises(error, match=match):
        vflash.attention_varlen(**args)


@pytest.mark.parametrize("offsets_q,offsets_k,flags", [
    ([0, 3, 7], [0, 3, 7], [0, 0]), ([0, 3, 7], [0, 1, 7], [0, 0]), ([0, 3, 7], [0, 0, 7], [0, 1]),
    ([0, 5, 7], [0, 3, 7], [1, 0]), ([0, 3, 7], [0, 3, 8], [0, 1]), ([0, 3, 7], [0, 3, 2], [0, 1]),
    ([2, 3, 7], [0, 3, 7], [1, 0]), ([0, 3, 7], [0, 7, 7], [0, 1]), ([0, -2**31, 7], [0, 2**31 - 1, 7], [1, 1]),
])
def test_the_device_check_flags_each_offsets_tensor(offsets_q, offsets_k, flags, device):
    # cu_seqlens_q and cu_seqlens_k flagged apart (totals 7 and 7, longest 4 and 6): from 0, in order, steps
    # within the longest, to the total
    from vflash.dispatch import tables
    from vflash.ops.metadata import sequence_metadata_flags
    cu_q, cu_k = (torch.tensor(x, dtype=torch.int32, device=device) for x in (offsets_q, offsets_k))
    for block_seq in (1, 4):
        got = sequence_metadata_flags(2, tables.METADATA._replace(block_seq=block_seq), cu_seqlens_q=cu_q,
                                      cu_seqlens_k=cu_k, total_q=7, max_seqlen_q=4, total_k=7, max_seqlen_k=6)
        assert got == [0, 0] + flags


def test_dispatch_refuses_a_forced_sm90_where_it_cannot_run(device):
    # on the CPU (the interpreter), and anywhere for short rows or tensors TMA cannot address
    q, k, v, cu = _bad(device)
    band = sequence_band(None, (-1, -1))
    packed = Packed(cu, cu, 4, 4, False, False)
    odd = k.transpose(0, 1).contiguous().transpose(0, 1)[:, :, 1:]  # a head dim's unit stride, an odd base
    p = dispatch.problem_of(Call(q, odd, odd, packed, band, Score(0.5), False))  # unfit for TMA
    assert p.varlen and not p.tma_ok and dispatch.select(p).kernel == "portable"
    with pytest.raises(ValueError, match="sm90 kernel cannot take this call"):
        dispatch.select(p, kernel="sm90")
    p = dispatch.problem_of(Call(q, k, v, packed, band, Score(0.5), False))
    assert p.tma_ok and dispatch.select(p).kernel == "portable"  # the interpreter, or 4 rows: too short


# The sm_90 kernel's varlen path: (query lengths, key lengths, options). Zero-length
# sequences, lengths on and around the 64-row slabs and 128-key tiles (a slab that
# crosses a sequence's end is stored by pointer, others by TMA), Nq != Nk both ways,
# and the last sequence running to the end of the packed tensors.
SM90_SELF = [1, 0, 200, 64, 129, 1000, 63, 128]
SM90_CROSS = ([100, 0, 300, 7, 513], [900, 50, 300, 200, 513])
SM90_CASES = {
    "full": (SM90_SELF, SM90_SELF, dict()),
    "causal": (SM90_SELF, SM90_SELF, dict(causal=True)),
    "cross_causal": (*SM90_CROSS, dict(causal=True)),
    "cross_top_left": (*SM90_CROSS, dict(causal="top_left")),
    "cross_full_gqa": (*SM90_CROSS, dict(hkv=1)),
    "window_causal": (SM90_SELF, SM90_SELF, dict(window=(128, 0), causal=True)),
    "window_both": (*SM90_CROSS, dict(window=(64, 64))),
    "softcap_causal": (SM90_SELF, SM90_SELF, dict(softcap=20.0, causal=True)),
    # sequences with no keys (zeros, -inf) beside ones whose keys start at row 0 of k
    "no_keys_causal": ([64, 130, 5, 200], [0, 0, 300, 200], dict(causal=True)),
}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", list(SM90_CASES))
def test_gpu_hopper_varlen_matches_the_oracle(case, d):
    # The table's tiles for the head dim and mask, with DYNAMIC flipped and each Q-buffer
    # count; the output poisoned with NaN, so every row must be written by its own tile.
    lens_q, lens_k, opts = SM90_CASES[case]
    opts = dict(opts)
    hkv = opts.pop("hkv", 2)
    dev = torch.device("cuda")
    q, k, v = _inputs(lens_q, lens_k, 8, hkv, d, torch.bfloat16, dev, seed=d)
    cq, ck = _cu(lens_q, dev), _cu(lens_k, dev)
    mode = {True: "bottom_right"}.get(opts.get("causal"), opts.get("causal") or None)
    band = sequence_band(mode, opts.get("window", (-1, -1)))
    ref_o, ref_l = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=torch.float64, **opts)
    same_o, _ = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=None, **opts)
    _, same_l = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=torch.float32, **opts)
    for tiles in tile_variants(d, band.has_right):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((8, q.shape[0]), float("nan"), device=dev)
        attention_varlen_forward(q, k, v, cq, ck, max(lens_q), band=band, top_left=mode == "top_left",
                                 score=Score(d ** -0.5, opts.get("softcap")), return_lse=True, tiles=tiles,
                                 kernel="sm90", out=out, lse=lse)
        assert not out.isnan().any() and not lse.isnan().any(), tiles
        for verdict in (compare("out", out.cpu(), ref_o.cpu(), same_o.cpu(), torch.bfloat16),
                        compare("lse", lse.cpu(), ref_l.cpu(), same_l.cpu(), torch.float32)):
            assert verdict.passed, f"{tiles}: {verdict.what} max err {verdict.max_err:.3e} > {verdict.tol:.3e}"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_varlen_takes_the_sm90_kernel_for_long_sequences(causal):
    # the public call, dispatched: mixed lengths up to 2k at D 128, and autograd through it (the
    # sm90 backward kernels too), gradients against the per-sequence oracle
    lens = [2048, 0, 700, 1500, 33]
    dev = torch.device("cuda")
    q, k, v = _inputs(lens, lens, 8, 2, 128, torch.bfloat16, dev, seed=1)
    cu = _cu(lens, dev)
    band = sequence_band("bottom_right" if causal else None, (-1, -1))
    call = Call(q, k, v, Packed(cu, cu, 2048, 2048, False, False), band, Score(128 ** -0.5), True)
    assert dispatch.choose(call).kernel == "sm90"
    _check(lens, lens, dev, hq=8, hkv=2, d=128, dtype="bf16", causal=causal)
    assert dispatch.select_backward(dispatch.problem_of(call)).kernel == "sm90"
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(q)
    grads = []
    for compute_dtype, dtype in ((None, torch.bfloat16), (torch.float64, torch.float64), (None, None)):
        leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
        if dtype is None:  # vflash, dispatched
            out = vflash.attention_varlen(*leaves, cu, cu, 2048, 2048, causal=causal)
        else:
            out = attention_varlen_reference(*leaves, cu, cu, causal=causal, compute_dtype=compute_dtype)[0]
        out.backward(do.to(out.dtype))
        grads.append([t.grad for t in leaves])
    for name, s, r, g in zip(("dq", "dk", "dv"), *grads):
        verdict = compare(name, g.cpu(), r.cpu(), s.cpu(), torch.bfloat16, factor=3.0)
        assert verdict.passed, f"{name}: max err {verdict.max_err:.3e} > tol {verdict.tol:.3e} {verdict.note}"


def _neighbour_inf_case(lens, d, dtype, device):
    # sequence 1's first K and V rows hold inf (and its second row NaN): rows of sequence 0
    # never see those keys, so its output must stay finite and right
    q, k, v = _inputs(lens, lens, 4, 2, d, dtype, device, seed=5)
    n0 = lens[0]
    k[n0], v[n0] = float("inf"), float("inf")
    k[n0 + 1], v[n0 + 1] = float("nan"), float("nan")
    cu = _cu(lens, device)
    ref, _ = attention_varlen_reference(q[:n0], k[:n0], v[:n0], cu[:2], cu[:2], causal=True,
                                        compute_dtype=torch.float64)
    same, _ = attention_varlen_reference(q[:n0], k[:n0], v[:n0], cu[:2], cu[:2], causal=True, compute_dtype=None)
    return q, k, v, cu, ref, same


def test_a_sequence_never_sees_the_next_ones_values(device):
    lens = [37, 20]
    q, k, v, cu, ref, same = _neighbour_inf_case(lens, 16, torch.float16, device)
    out = vflash.attention_varlen(q, k, v, cu, cu, 37, 37, causal=True)
    assert out[:37].isfinite().all()
    verdict = compare("out", out[:37].cpu(), ref.cpu(), same.cpu(), torch.float16)
    assert verdict.passed, f"max err {verdict.max_err:.3e} > tol {verdict.tol:.3e}"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_hopper_varlen_never_sees_the_next_sequences_values(d):
    # the sm_90 kernel loads keys past a sequence's end from the next sequence (TMA): its
    # consumers zero those V rows before the last PV product
    from vflash.dispatch import tables
    lens = [100, 70]
    dev = torch.device("cuda")
    q, k, v, cu, ref, same = _neighbour_inf_case(lens, d, torch.bfloat16, dev)
    band = sequence_band("bottom_right", (-1, -1))
    for causal_tiles in (False, True):
        tiles = tables.SM90[(d, causal_tiles)]
        out, _ = attention_varlen_forward(q, k, v, cu, cu, 100, band=band, top_left=False, score=Score(d ** -0.5, None),
                                          return_lse=True, tiles=tiles, kernel="sm90")
        assert out[:100].isfinite().all(), tiles
        verdict = compare("out", out[:100].cpu(), ref.cpu(), same.cpu(), torch.bfloat16)
        assert verdict.passed, f"{tiles}: max err {verdict.max_err:.3e} > tol {verdict.tol:.3e}"
