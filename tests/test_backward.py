"""vflash.attention's backward (vflash.library: custom ops over kernels/attention_bwd.py)
against PyTorch autograd of the explicit reference, through the interpreter on the CPU (or
the device VFLASH_TEST_DEVICE names): every forward option, the 3x rule of DESIGN.md
(error at most 3x the same-dtype PyTorch error plus a floor); bitwise-repeatable
gradients; the LSE's gradient; torch.library.opcheck of the four ops; torch.autograd.gradcheck
in fp32; torch.compile(fullgraph=True) of a block (dense and packed) forward and backward;
autocast."""

import pytest
import torch

import vflash
from _sm90 import needs_sm90
from vflash.library import attention_bwd, attention_fwd, attention_varlen_bwd, attention_varlen_fwd
from vflash.harness.oracle import compare
from vflash.reference import attention_explicit
from vflash.call import Call, Score

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, device, seed=0, layout="bhnd"):
    g = torch.Generator().manual_seed(seed)
    if layout == "bnhd":  # [B, N, H, D] storage seen as [B, H, N, D]
        q, k, v = (torch.randn(B, n, h, D, generator=g).transpose(1, 2) for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk)))
    else:
        q, k, v = (torch.randn(B, h, n, D, generator=g) for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk)))
    do = torch.randn(B, Hq, Nq, D, generator=g)
    return [t.to(dtype).to(device) for t in (q, k, v)], do.to(dtype).to(device)


def _grads(fn, q, k, v, do, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(do.to(dtype))
    return [t.grad for t in leaves]


def _assert_grads(got, ref, same, dtype, what=""):
    # dq, dk, dv each against fp64 autograd of the explicit reference, within 3x the error of the same
    # computation in `dtype` (`same`)
    for name, g, r, s in zip(("dq", "dk", "dv"), got, ref, same):
        verdict = compare(name, g.cpu(), r.cpu(), s.cpu(), dtype, factor=3.0)
        assert verdict.passed, f"{what}{name}: max err {verdict.max_err:.3e} > tol {verdict.tol:.3e} {verdict.note}"


def _check(B, Hq, Hkv, Nq, Nk, D, dtype, device, layout="bhnd", **opts):
    (q, k, v), do = _inputs(B, Hq, Hkv, Nq, Nk, D, DT[dtype], device, layout=layout)
    got = _grads(lambda a, b, c: vflash.attention(a, b, c, **opts), q, k, v, do, DT[dtype])
    ref = _grads(lambda a, b, c: attention_explicit(a, b, c, compute_dtype=torch.float64, **opts), q, k, v, do,
                 torch.float64)
    same = _grads(lambda a, b, c: attention_explicit(a, b, c, compute_dtype=None, **opts), q, k, v, do, DT[dtype])
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == DT[dtype]
    _assert_grads(got, ref, same, DT[dtype])


@pytest.mark.parametrize("causal", [False, "bottom_right", "top_left"])
@pytest.mark.parametrize("nq,nk", [(33, 33), (20, 45), (45, 20)])
def test_gradients_match_the_reference(causal, nq, nk, device):
    # Nq != Nk both ways: with causal, some rows (45 queries on 20 keys) see no key at all
    _check(1, 2, 2, nq, nk, 16, "fp32", device, causal=causal)


@pytest.mark.parametrize("opts", [dict(window=(5, 3)), dict(causal=True, window=(7, 0)), dict(softcap=2.0),
                                  dict(scale=0.7, causal=True, softcap=4.0)],
                         ids=["window", "causal-window", "softcap", "scale-causal-softcap"])
def test_gradients_of_the_band_and_softcap(opts, device):
    _check(1, 2, 1, 30, 38, 16, "fp32", device, **opts)


@pytest.mark.parametrize("hq,hkv", [(4, 2), (6, 1), (3, 3)], ids=["gqa2", "mqa6", "mha"])
def test_gqa_gradients_sum_over_the_group(hq, hkv, device):
    _check(2, hq, hkv, 19, 27, 8, "fp32", device, causal=True)


@pytest.mark.parametrize("d", [24, 40, 72])
def test_odd_head_dims_and_strides(d, device):
    _check(1, 2, 1, 21, 17, d, "fp32", device, layout="bnhd", causal=True)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_gradients(dtype, device):
    _check(1, 4, 2, 40, 40, 32, dtype, device, causal=True)


def test_fully_masked_rows_get_zero_gradients_never_nan(device):
    (q, k, v), do = _inputs(1, 2, 2, 30, 10, 16, torch.float32, device)
    dq, dk, dv = _grads(lambda a, b, c: vflash.attention(a, b, c, causal=True), q, k, v, do, torch.float32)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert torch.equal(dq[:, :, :20], torch.zeros_like(dq[:, :, :20]))  # rows 0..19 see no key (bottom-right)
    assert dq[:, :, 20:].abs().sum() > 0


def test_lse_gradient(device):
    # a loss on out and lse: the lse's gradient enters the kernels as P * dlse
    (q, k, v), do = _inputs(1, 2, 1, 17, 23, 16, torch.float32, device)
    w = torch.randn(1, 2, 17, generator=torch.Generator().manual_seed(3)).to(device)

    def loss(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out, lse = fn(*leaves)
        ((out * do.to(dtype)).sum() + (lse * w.to(dtype)).sum()).backward()
        return [t.grad for t in leaves]
    got = loss(lambda a, b, c: vflash.attention(a, b, c, causal=True, return_lse=True), torch.float32)
    ref = loss(lambda a, b, c: attention_explicit(a, b, c, causal=True, compute_dtype=torch.float64), torch.float64)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.double(), r, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
def test_backward_is_bitwise_repeatable(device):
    (q, k, v), do = _inputs(1, 4, 2, 37, 41, 16, torch.bfloat16, device, seed=5)
    first = _grads(lambda a, b, c: vflash.attention(a, b, c, causal=True), q, k, v, do, torch.bfloat16)
    for _ in range(19):
        again = _grads(lambda a, b, c: vflash.attention(a, b, c, causal=True), q, k, v, do, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_opcheck(device):
    (q, k, v), _ = _inputs(1, 2, 1, 9, 12, 16, torch.float32, device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(attention_fwd, (q, k, v, 3, -1, 0, 0.25, None, None),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def _packed(lens_q, lens_k, hq, hkv, d, dtype, device, seed=3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(dtype).to(device)
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g).to(dtype).to(device) for _ in range(2))
    cq, ck = (torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32, device=device)
              for n in (lens_q, lens_k))
    return q, k, v, cq, ck


def test_opcheck_of_the_backward_and_varlen_ops(device):
    # the backward op on its own, and the packed forward and backward ops (zero-length sequence included)
    (q, k, v), do = _inputs(1, 2, 1, 9, 12, 16, torch.float32, device)
    out, lse = attention_fwd(q, k, v, 3, -1, 0, 0.25, None, None)
    torch.library.opcheck(attention_bwd, (do, None, q, k, v, out, lse, 3, -1, 0, 0.25, None, None),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    q, k, v, cq, ck = _packed([5, 0, 11], [7, 3, 11], 2, 1, 16, torch.float32, device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(attention_varlen_fwd, (q, k, v, cq, ck, 11, 11, -1, 0, False, 0.25, None, None),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    out, lse = attention_varlen_fwd(*(t.detach() for t in (q, k, v)), cq, ck, 11, 11, -1, 0, False, 0.25, None, None)
    torch.library.opcheck(attention_varlen_bwd, (torch.randn_like(out), None, q.detach(), k.detach(), v.detach(),
                                                 out, lse, cq, ck, 11, 11, -1, 0, False, 0.25, None, None),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.slow
def test_gradcheck_in_fp32(device):
    # torch.autograd.gradcheck (every Jacobian entry by finite differences against the backward) in fp32, the
    # widest dtype vflash takes: GQA 2 / 1, Nq != Nk, a causal window and softcap, tiny (each entry costs two
    # forward calls); eps and tolerances sized for fp32 (fast_mode's random projections let a dq 1.2x too
    # large through at these tolerances)
    (q, k, v), _ = _inputs(1, 2, 1, 2, 3, 8, torch.float32, device, seed=7)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fn = lambda a, b, c: vflash.attention(a, b, c, causal=True, window=(1, -1), softcap=2.0)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-3, atol=1e-3, rtol=5e-3)


@pytest.mark.slow
def test_gradcheck_of_packed_sequences_in_fp32(device):
    q, k, v, cq, ck = _packed([2, 0, 1], [1, 1, 2], 1, 1, 8, torch.float32, device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fn = lambda a, b, c: vflash.attention_varlen(a, b, c, cq, ck, 2, 2, causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-3, atol=1e-3, rtol=5e-3)


class _Block(torch.nn.Module):
    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x):
        B, N, d = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = vflash.attention(q, k, v, causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, N, d))


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_torch_compile_fullgraph_forward_and_backward(backend, device):
    torch.manual_seed(0)
    block = _Block().to(device)
    x = torch.randn(2, 24, 32, device=device)
    eager = block(x)
    eager.sum().backward()
    want = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, eager)
    for p, g in zip(block.parameters(), want):
        torch.testing.assert_close(p.grad, g)


def test_autocast_runs_in_the_autocast_dtype(device):
    (q, k, v), _ = _inputs(1, 2, 2, 16, 16, 16, torch.float32, device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = vflash.attention(q, k, v)
    assert out.dtype == torch.bfloat16
    q, k, v, cq, ck = _packed([5, 0, 11], [7, 3, 11], 2, 1, 16, torch.float32, device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        packed = vflash.attention_varlen(q, k, v, cq, ck, 11, 11, causal=True)
    assert packed.dtype == torch.bfloat16
    want = vflash.attention_varlen(*(t.bfloat16() for t in (q, k, v)), cq, ck, 11, 11, causal=True)
    assert torch.equal(packed, want)


class _PackedBlock(_Block):
    # the block over packed sequences (cu_seqlens a buffer), metadata checked (the default)
    def __init__(self, lens, d=32, heads=2):
        super().__init__(d, heads)
        self.longest = max(lens)
        self.register_buffer("cu", torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32))

    def forward(self, x):
        T, d = x.shape
        q, k, v = self.qkv(x).view(T, 3, self.heads, d // self.heads).unbind(1)
        y = vflash.attention_varlen(q, k, v, self.cu, self.cu, self.longest, self.longest, causal=True)
        return self.proj(y.reshape(T, d))


def test_torch_compile_fullgraph_of_packed_sequences_checks_metadata_at_run_time(device):
    # a traced call cannot read cu_seqlens: the custom op checks them when the graph runs, so fullgraph holds
    # with the default check_metadata=True and bad offsets are still refused
    torch.manual_seed(0)
    block = _PackedBlock([7, 0, 12]).to(device)
    x = torch.randn(19, 32, device=device)
    eager = block(x)
    eager.sum().backward()
    want = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, eager)
    for p, g in zip(block.parameters(), want):
        torch.testing.assert_close(p.grad, g)
    block.cu.copy_(torch.tensor([0, 9, 4, 19], dtype=torch.int32))  # decreasing: sequence 1 ends before it starts
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        compiled(x)


@pytest.mark.parametrize("causal", [False, True, "top_left"])
def test_varlen_gradients_match_the_per_sequence_reference(causal, device):
    # zero-length sequences, more queries than keys and the reverse, tile edges (16-row tiles on the CPU)
    from vflash.reference import attention_varlen_reference
    lens_q, lens_k = [5, 0, 17, 33, 2], [9, 4, 17, 20, 0]
    g = torch.Generator().manual_seed(11)
    q = torch.randn(sum(lens_q), 4, 16, generator=g).to(device)
    k, v = (torch.randn(sum(lens_k), 2, 16, generator=g).to(device) for _ in range(2))
    do = torch.randn(sum(lens_q), 4, 16, generator=g).to(device)
    cq, ck = (torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32, device=device)
              for n in (lens_q, lens_k))
    opts = dict(causal=causal, window=(6, -1) if causal is True else None, softcap=3.0 if causal is False else None)
    got = _grads(lambda a, b, c: vflash.attention_varlen(a, b, c, cq, ck, max(lens_q), max(lens_k), **opts),
                 q, k, v, do, torch.float32)
    ref = _grads(lambda a, b, c: attention_varlen_reference(a, b, c, cq, ck, compute_dtype=torch.float64, **opts),
                 q, k, v, do, torch.float64)
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,n,hq,hkv", [(True, 8192, 4, 1), (False, 4097, 8, 2), (True, 16384, 2, 2)])
def test_long_sequence_gradients_on_the_gpu(causal, n, hq, hkv):
    _check(1, hq, hkv, n, n, 128, "bf16", torch.device("cuda"), causal=causal)


@pytest.mark.gpu
def test_backward_is_bitwise_repeatable_on_the_gpu():
    dev = torch.device("cuda")
    (q, k, v), do = _inputs(2, 16, 4, 2048, 2048, 128, torch.bfloat16, dev, seed=7)
    first = _grads(lambda a, b, c: vflash.attention(a, b, c, causal=True), q, k, v, do, torch.bfloat16)
    for _ in range(19):
        again = _grads(lambda a, b, c: vflash.attention(a, b, c, causal=True), q, k, v, do, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.gpu
def test_a_training_step_captures_in_a_cuda_graph():
    torch.manual_seed(0)
    block = _Block(d=256, heads=4).cuda().to(torch.bfloat16)
    x = torch.randn(2, 512, 256, device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.SGD(block.parameters(), lr=0.0)  # lr 0: replays see the same weights
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up (compiles, allocator) outside the capture
            opt.zero_grad(set_to_none=False)
            block(x).float().square().mean().backward()
    torch.cuda.current_stream().wait_stream(stream)
    want = [p.grad.clone() for p in block.parameters()]
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        loss = block(x).float().square().mean()
        loss.backward()
    graph.replay()
    torch.cuda.synchronize()
    for p, w in zip(block.parameters(), want):  # the linear layers' cuBLAS kernels need not repeat bitwise
        torch.testing.assert_close(p.grad, w)


# The sm_90 backward kernels (kernels/attention_bwd_sm90.py): compiled on the CPU; on an sm_90 GPU run
# directly on the forward's LSE and delta at the dispatch's tiles and others, and through autograd where
# the dispatch takes them, each against fp64 autograd of the explicit reference.
SM90_BWD_CASES = {
    "plain": (1, 4, 2, 300, 300, 128, dict()),
    "causal": (1, 4, 2, 300, 300, 128, dict(causal=True)),
    "causal_gqa_nq_lt_nk": (2, 4, 1, 200, 333, 64, dict(causal=True)),
    "rows_without_keys": (1, 2, 1, 333, 120, 128, dict(causal=True)),  # bottom-right: the first rows see none
    "window_softcap": (1, 2, 2, 130, 257, 64, dict(window=(64, 32), softcap=20.0)),
    "long_causal": (1, 2, 2, 2048, 2048, 128, dict(causal=True)),
    "top_left": (1, 2, 1, 200, 300, 128, dict(causal="top_left")),
    "left_window_only": (1, 2, 2, 250, 250, 64, dict(window=(40, -1))),
    "fp16_softcap": (1, 2, 2, 190, 190, 128, dict(softcap=10.0), torch.float16),
}
# (dQ block_m x block_n, dK / dV block_m x block_n): the defaults, then one consumer a CTA, then 128-wide tiles,
# then three consumers a CTA
SM90_BWD_TILES = [((128, 64), (64, 128)), ((64, 64), (64, 64)), ((128, 128), (128, 128)), ((192, 64), (64, 192))]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["dq", "dkdv"])
@pytest.mark.parametrize("d,causal,softcap,consumers", [(128, True, False, 2), (64, False, True, 2),
                                                         (64, True, False, 3)])
def test_hopper_backward_kernels_compile_for_sm90(kernel, d, causal, softcap, consumers):
    from vflash.ops import sm90_bwd
    from vflash.call import Band
    if not sm90_bwd.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    band = Band(0, -1, 0 if causal else -1)
    if kernel == "dq":
        compiled = sm90_bwd.compile_dq_sm90(d, torch.bfloat16, 64 * consumers, 64, band=band, softcap=softcap)
    else:
        compiled = sm90_bwd.compile_dkdv_sm90(d, torch.bfloat16, 64, 64 * consumers, band=band, softcap=softcap)
    assert "wgmma" in compiled.asm["ptx"] and "cp.async.bulk.tensor" in compiled.asm["ptx"]


@needs_sm90
@pytest.mark.parametrize("tiles", SM90_BWD_TILES, ids=lambda t: f"dq{t[0][0]}x{t[0][1]}-dkdv{t[1][0]}x{t[1][1]}")
@pytest.mark.parametrize("case", sorted(SM90_BWD_CASES))
def test_gpu_hopper_backward_kernels_match_the_reference(case, tiles):
    # dQ and dK / dV from the sm_90 kernels, each against fp64 autograd of the explicit reference (3x rule)
    from vflash.ops import sm90_bwd
    from vflash._validate import mask_band
    from vflash.ops import launch as launches
    B, Hq, Hkv, Nq, Nk, D, opts, *dtype = SM90_BWD_CASES[case]
    dtype = dtype[0] if dtype else torch.bfloat16
    (q, k, v), do = _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, torch.device("cuda"), seed=3)
    out, lse = vflash.attention(q, k, v, return_lse=True, **opts)
    delta = (do.float() * out.float()).sum(-1)
    causal = {True: "bottom_right", False: None}.get(opts.get("causal", False), opts.get("causal"))
    band = mask_band(Nq, Nk, causal, opts.get("window", (-1, -1)))
    got = [torch.full_like(t, float("nan")) for t in (q, k, v)]  # every row must be written
    (dq_m, dq_n), (kv_m, kv_n) = tiles
    launches.run(sm90_bwd.dq_launch(q, k, v, do, lse, delta, got[0], band, Score(D ** -0.5, opts.get("softcap")), dq_m,
                                      dq_n), q.device)
    launches.run(sm90_bwd.dkdv_launch(q, k, v, do, lse, delta, got[1], got[2], band,
                                      Score(D ** -0.5, opts.get("softcap")), kv_m, kv_n), q.device)
    ref = _grads(lambda a, b, c: attention_explicit(a, b, c, compute_dtype=torch.float64, **opts), q, k, v, do,
                 torch.float64)
    same = _grads(lambda a, b, c: attention_explicit(a, b, c, compute_dtype=None, **opts), q, k, v, do, dtype)
    _assert_grads(got, ref, same, dtype)


@needs_sm90
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,D,layout,opts", [
    (2, 8, 2, 1100, 1100, 128, "bnhd", dict(causal=True)),
    (1, 4, 4, 2100, 2500, 64, "bhnd", dict(window=(100, 50), softcap=15.0)),
    (1, 6, 1, 1100, 1300, 128, "bnhd", dict(causal="top_left")),
    (1, 2, 2, 4096, 4096, 64, "bhnd", dict()),
    (1, 4, 2, 1100, 1300, 256, "bhnd", dict(causal=True)),
    (2, 4, 4, 520, 512, 256, "bnhd", dict()),
    (2, 8, 2, 600, 700, 64, "bnhd", dict(causal=True)),
], ids=["gqa_causal_bnhd", "window_softcap_d64", "mqa_top_left", "long_d64", "gqa_causal_d256", "short_d256",
        "short_d64"])
def test_gpu_autograd_takes_the_sm90_backward_and_matches_the_reference(B, Hq, Hkv, Nq, Nk, D, layout, opts):
    from vflash import dispatch
    from vflash._validate import mask_band
    (q, k, v), _ = _inputs(B, Hq, Hkv, Nq, Nk, D, torch.bfloat16, torch.device("cuda"), layout=layout)
    causal = {True: "bottom_right", False: None}.get(opts.get("causal", False), opts.get("causal"))
    band = mask_band(Nq, Nk, causal, opts.get("window", (-1, -1)))
    choice = dispatch.select_backward(dispatch.problem_of(Call(q, k, v, None, band, Score(1.0), False)))
    assert choice.kernel == "sm90", choice.why
    _check(B, Hq, Hkv, Nq, Nk, D, "bf16", torch.device("cuda"), layout=layout, **opts)


@pytest.mark.slow
@pytest.mark.parametrize("kernel,kw", [("dq", dict(head_dim=128)), ("dkdv", dict(head_dim=128)),
                                       ("dkdv", dict(head_dim=128, varlen=True)),
                                       ("dq", dict(head_dim=128, varlen=True))],
                         ids=["dq", "dkdv", "dkdv_varlen", "dq_varlen"])
def test_hopper_backward_wgmma_is_not_serialized(kernel, kw):
    # ptxas serializes every wgmma of a kernel (info C7514) when other instructions read an
    # accumulator while its products are in flight: correct, and several times slower; a
    # restructuring of the pipelines can cause it (a cross-tile dK / dV pipeline did)
    import os
    import subprocess
    import tempfile
    from vflash.ops import sm90_bwd
    from vflash.call import Band
    if not sm90_bwd.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    from triton.backends.nvidia.compiler import get_ptxas
    ptxas = get_ptxas(90).path  # the ptxas this Triton assembles sm_90 with
    compile_sm90 = sm90_bwd.compile_dq_sm90 if kernel == "dq" else sm90_bwd.compile_dkdv_sm90
    ptx = compile_sm90(band=Band(0, -1, 0), **kw).asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(ptx)
        run = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k.o")],
                             capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Compiling entry function" in run.stderr and "C7514" not in run.stderr, run.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("outputs,causal", [("dk", True), ("dv", False)])
def test_hopper_dkdv_kernel_compiles_for_one_gradient_at_d256(outputs, causal):
    from vflash.ops import sm90_bwd
    from vflash.call import Band
    if not sm90_bwd.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    compiled = sm90_bwd.compile_dkdv_sm90(256, torch.bfloat16, 32, 128, band=Band(0, -1, 0 if causal else -1),
                                            outputs=outputs)
    ptx = compiled.asm["ptx"]
    both = sm90_bwd.compile_dkdv_sm90(256, torch.bfloat16, 32, 128, band=Band(0, -1, 0 if causal else -1)).asm["ptx"]
    # fewer products a tile pair (no dV, or no dP^T and dK) and half the gradient stores of both gradients' kernel
    assert 0 < ptx.count("wgmma.mma_async") < both.count("wgmma.mma_async")
    store = "cp.async.bulk.tensor.4d.global.shared"
    assert 2 * ptx.count(store) == both.count(store) > 0


@needs_sm90
@pytest.mark.parametrize("case", ["plain", "causal_gqa", "window_softcap", "rows_without_keys"])
def test_gpu_hopper_backward_at_d256_takes_dk_and_dv_apart(case):
    # D 256 through ops.attention_backward with the dispatch table's sm90 tiles: dQ 128 x 32, dK and
    # dV from two launches of the dK / dV kernel (dkdv_apart), against fp64 autograd of the explicit
    # reference
    from vflash.dispatch import tables
    from vflash._validate import mask_band
    from vflash.ops.attention_bwd import attention_backward
    B, Hq, Hkv, Nq, Nk, opts = {"plain": (1, 2, 2, 300, 300, dict()),
                                "causal_gqa": (2, 4, 1, 200, 333, dict(causal=True)),
                                "window_softcap": (1, 2, 2, 130, 257, dict(window=(64, 32), softcap=20.0)),
                                "rows_without_keys": (1, 2, 1, 333, 120, dict(causal=True))}[case]
    (q, k, v), do = _inputs(B, Hq, Hkv, Nq, Nk, 256, torch.bfloat16, torch.device("cuda"), seed=5)
    out, lse = vflash.attention(q, k, v, return_lse=True, **opts)
    causal = {True: "bottom_right", False: None}.get(opts.get("causal", False), opts.get("causal"))
    band = mask_band(Nq, Nk, causal, opts.get("window", (-1, -1)))
    tiles = tables.SM90_BACKWARD[256]
    assert tiles.dkdv_apart
    got = attention_backward(do, q, k, v, out, lse, band=band, score=Score(256 ** -0.5, opts.get("softcap")),
                             tiles=tiles, kernel="sm90")[:3]
    ref = _grads(lambda a, b, c: attention_explicit(a, b, c, compute_dtype=torch.float64, **opts), q, k, v, do,
                 torch.float64)
    same = _grads(lambda a, b, c: attention_explicit(a, b, c, compute_dtype=None, **opts), q, k, v, do,
                  torch.bfloat16)
    _assert_grads(got, ref, same, torch.bfloat16)


# Packed sequences through the sm_90 kernels (ops.attention_backward with kernel="sm90"):
# (query lengths, key lengths, Hq, Hkv, D, options); empty sequences, lengths around 64-row slabs and
# 64 / 128-key tiles, Nq != Nk both ways
SM90_VARLEN_BWD_CASES = {
    "causal_d128": ([130, 0, 1, 64, 65, 300], [130, 5, 1, 64, 65, 300], 4, 2, 128, dict(causal=True)),
    "top_left_d64": ([70, 200, 3], [140, 90, 3], 4, 1, 64, dict(causal="top_left")),
    "full_d128": ([100, 257], [33, 129], 2, 2, 128, dict()),
    "window_softcap_d64": ([190, 64], [190, 64], 4, 4, 64, dict(window=(50, 20), softcap=15.0)),
    "causal_d256": ([90, 33, 160], [120, 33, 100], 2, 1, 256, dict(causal=True)),
}


def _varlen_tile_sets(d):
    # the dispatch table's tiles (D 256: dK and dV apart) and one consumer a CTA (D 64 also three
    # dK / dV consumers)
    from vflash.dispatch import tables
    from vflash.ops.tiles import BackwardLaunch as L
    table = tables.SM90_BACKWARD[d]
    if d == 256:
        return [table]
    sets = [table, table._replace(dkdv=table.dkdv._replace(block_n=64), dq=table.dq._replace(block_m=64))]
    if d == 64:
        sets.append(table._replace(dkdv=L(64, 192, 4, 2)))
    return sets


def _packed_backward(lens_q, lens_k, hq, hkv, d, opts, dev, tiles, poison=False):
    # the forward (vflash.attention_varlen) and the sm90 backward on packed inputs; poison: the
    # second sequence's first K / V rows inf and its first Q / dO rows NaN (the first sequence's
    # gradients must not see them)
    from vflash._validate import sequence_band
    from vflash.ops.attention_bwd import attention_backward
    g = torch.Generator().manual_seed(9)
    q, do = (torch.randn(sum(lens_q), hq, d, generator=g).to(torch.bfloat16).to(dev) for _ in range(2))
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g).to(torch.bfloat16).to(dev) for _ in range(2))
    cq, ck = (torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32, device=dev)
              for n in (lens_q, lens_k))
    if poison:
        k[lens_k[0]:lens_k[0] + 2] = float("inf")
        v[lens_k[0]:lens_k[0] + 2] = float("inf")
        q[lens_q[0]:lens_q[0] + 2] = float("nan")
        do[lens_q[0]:lens_q[0] + 2] = float("nan")
    out, lse = vflash.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), return_lse=True, **opts)
    causal = {True: "bottom_right", False: None}.get(opts.get("causal", False), opts.get("causal"))
    band = sequence_band(causal, opts.get("window", (-1, -1)))
    got = attention_backward(do, q, k, v, out, lse, band=band, score=Score(d ** -0.5, opts.get("softcap")),
                             tiles=tiles, kernel="sm90",
                             varlen=(cq, ck, max(lens_q), max(lens_k), causal == "top_left"))[:3]
    return got, (q, k, v, do, cq, ck)


def _per_sequence_reference(q, k, v, do, cq, ck, opts, first_only=False):
    # fp64 autograd of the explicit reference and the same in bf16, one sequence at a time
    from vflash.reference import attention_varlen_reference
    n = 1 if first_only else cq.numel() - 1
    cq, ck = cq[:n + 1], ck[:n + 1]
    q, do = q[:int(cq[-1])], do[:int(cq[-1])]
    k, v = k[:int(ck[-1])], v[:int(ck[-1])]

    def fn(a, b, c, compute_dtype):
        return attention_varlen_reference(a, b, c, cq, ck, compute_dtype=compute_dtype, **opts)[0]
    ref = _grads(lambda a, b, c: fn(a, b, c, torch.float64), q, k, v, do, torch.float64)
    same = _grads(lambda a, b, c: fn(a, b, c, None), q, k, v, do, torch.bfloat16)
    return ref, same, (int(cq[-1]), int(ck[-1]))


@needs_sm90
@pytest.mark.parametrize("case", sorted(SM90_VARLEN_BWD_CASES))
def test_gpu_hopper_varlen_backward_matches_the_per_sequence_reference(case):
    lens_q, lens_k, hq, hkv, d, opts = SM90_VARLEN_BWD_CASES[case]
    dev = torch.device("cuda")
    for tiles in _varlen_tile_sets(d):
        got, (q, k, v, do, cq, ck) = _packed_backward(lens_q, lens_k, hq, hkv, d, opts, dev, tiles)
        ref, same, _ = _per_sequence_reference(q, k, v, do, cq, ck, opts)
        _assert_grads(got, ref, same, torch.bfloat16, f"{tiles} ")


@needs_sm90
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_hopper_varlen_backward_never_sees_the_next_sequences_values(d):
    # TMA loads rows past a sequence's end from the next sequence: the kernels zero them in the
    # ring tiles that cross the end and store a crossing slab's own rows alone (the dK / dV
    # producer's LSE / delta rows past the end masked as the dQ consumers' are)
    from vflash.dispatch import tables
    lens = [100, 70]
    tiles = tables.SM90_BACKWARD[d]
    got, (q, k, v, do, cq, ck) = _packed_backward(lens, lens, 4, 2, d, dict(causal=True), torch.device("cuda"),
                                                  tiles, poison=True)
    ref, same, (nq, nk) = _per_sequence_reference(q, k, v, do, cq, ck, dict(causal=True), first_only=True)
    first = (got[0][:nq], got[1][:nk], got[2][:nk])
    for name, g in zip(("dq", "dk", "dv"), first):
        assert g.isfinite().all(), name
    _assert_grads(first, ref, same, torch.bfloat16)


@pytest.mark.parametrize("kernel", ["dq", "dkdv"])
def test_hopper_backward_kernels_compile_for_packed_sequences(kernel):
    from vflash.ops import sm90_bwd
    from vflash.call import Band
    if not sm90_bwd.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    compile_sm90 = sm90_bwd.compile_dq_sm90 if kernel == "dq" else sm90_bwd.compile_dkdv_sm90
    ptx = compile_sm90(128, torch.bfloat16, band=Band(0, -1, 0), varlen=True).asm["ptx"]
    dense = compile_sm90(128, torch.bfloat16, band=Band(0, -1, 0)).asm["ptx"]
    # the crossing slab's pointer stores and the tail zeroing's shared-memory stores exist only in the varlen build
    assert "st.global" in ptx and "st.global" not in dense
    assert ptx.count("st.shared") > dense.count("st.shared")


@pytest.mark.slow
@pytest.mark.parametrize("kernel,outputs,d,d_v,varlen,widths", [
    # D 256's tiles (32-row query tiles, 32-key dQ tiles): S^T / S and dP^T / dP 32 wide, dK and dQ over q's 192
    # columns padded to 256, dV over v's 128
    ("dkdv", "dk", 192, 128, False, {"32", "256"}),
    ("dkdv", "dv", 192, 128, False, {"32", "128"}),
    ("dq", None, 192, 128, False, {"32", "256"}),
    ("dkdv", "dk dv", 128, 64, True, {"64", "128"}),
    ("dq", None, 128, 64, True, {"64", "128"}),
], ids=["d192_v128_dk", "d192_v128_dv", "d192_v128_dq", "d128_v64_varlen_dkdv", "d128_v64_varlen_dq"])
def test_hopper_backward_kernels_compile_for_a_v_head_dim_of_its_own(kernel, outputs, d, d_v, varlen, widths):
    # every wgmma's N is a streamed tile's rows, q's (padded) tile columns or v's
    import re
    from vflash.ops import sm90_bwd
    from vflash.call import Band
    if not sm90_bwd.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    tiles = {192: ((128, 32), (32, 128)), 128: ((192, 64), (64, 128))}[d]
    if kernel == "dq":
        ptx = sm90_bwd.compile_dq_sm90(d, torch.bfloat16, *tiles[0], band=Band(0, -1, 0), varlen=varlen,
                                       head_dim_v=d_v).asm["ptx"]
    else:
        ptx = sm90_bwd.compile_dkdv_sm90(d, torch.bfloat16, *tiles[1], band=Band(0, -1, 0), outputs=outputs,
                                         varlen=varlen, head_dim_v=d_v).asm["ptx"]
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)) == widths
    assert "cp.async.bulk.tensor" in ptx


def test_hopper_backward_launchers_take_a_v_head_dim_of_its_own_and_refuse_what_they_cannot():
    # descriptors in v's own columns for v, dO (and dV); q's 192 in tiles of 256; a v wider than q's tiles, a dim
    # that is no multiple of 8, and packed dk / dv of two head dims that are not contiguous refused
    from vflash.ops import sm90_bwd
    from vflash.call import Band
    t = sm90_bwd._cpu_call(192, torch.bfloat16, False, False, 128)
    dkdv = sm90_bwd.dkdv_launch(t.q, t.k, t.v, t.do, t.lse, t.delta, torch.empty_like(t.k), torch.empty_like(t.v),
                                Band(0, -1, 0), Score(0.1), 32, 128, outputs="dv")
    blocks = {name: dkdv.args[i].block_shape[-1] for i, name in enumerate(("q", "k", "v", "do", "dk", "dv"))}
    assert blocks == dict(q=256, k=256, v=128, do=128, dk=256, dv=128)
    assert (dkdv.constexprs["HEAD_DIM"], dkdv.constexprs["HEAD_DIM_V"]) == (256, 128)
    assert (dkdv.constexprs["QK_COLS"], dkdv.constexprs["V_COLS"]) == (192, 128)
    dq = sm90_bwd.dq_launch(t.q, t.k, t.v, t.do, t.lse, t.delta, torch.empty_like(t.q), Band(0, -1, 0), Score(0.1),
                            128, 32)
    assert [dq.args[i].block_shape[-1] for i in range(5)] == [256, 256, 128, 128, 256]
    for d, d_v, words in ((128, 256, "no wider than q's"), (128, 60, "multiples of 8")):
        t = sm90_bwd._cpu_call(d, torch.bfloat16, False, False, d_v)
        with pytest.raises(ValueError, match=words):
            sm90_bwd.dq_launch(t.q, t.k, t.v, t.do, t.lse, t.delta, torch.empty_like(t.q), Band(0, -1, 0),
                               Score(0.1), 64, 64)
    t = sm90_bwd._cpu_call(128, torch.bfloat16, True, False, 64)
    dk = torch.empty(t.k.shape[0], t.k.shape[1], 256, dtype=t.k.dtype)[..., :128]
    with pytest.raises(ValueError, match="both contiguous"):
        sm90_bwd.dkdv_launch(t.q, t.k, t.v, t.do, t.lse, t.delta, dk, torch.empty_like(t.v), Band(0, -1, 0),
                             Score(0.1), 64, 128, varlen=t.varlen)


# a v head dim of its own: (B, Hq, Hkv, Nq, Nk, D, D_v, options)
SM90_BWD_V_CASES = {
    "d192_v128": (1, 4, 2, 300, 333, 192, 128, dict()),
    "d192_v128_causal_gqa": (2, 4, 1, 700, 700, 192, 128, dict(causal=True)),
    "d128_v64_window_softcap": (1, 2, 2, 250, 257, 128, 64, dict(window=(64, 32), softcap=20.0)),
    "d256_v128_rows_without_keys": (1, 2, 1, 333, 120, 256, 128, dict(causal=True)),
}


@needs_sm90
@pytest.mark.parametrize("case", sorted(SM90_BWD_V_CASES))
def test_gpu_hopper_backward_kernels_take_a_v_head_dim_of_its_own(case):
    # the dispatch's tiles for q's head dim (D 192: D 256's, dK and dV apart), each gradient against fp64 autograd
    # of the explicit reference (3x rule), every row written
    from vflash import dispatch
    from vflash.ops import sm90_bwd
    from vflash._validate import mask_band
    from vflash.ops import launch as launches
    B, Hq, Hkv, Nq, Nk, D, Dv, opts = SM90_BWD_V_CASES[case]
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(B, h, n, D, generator=g).to("cuda", torch.bfloat16) for h, n in ((Hq, Nq), (Hkv, Nk)))
    v = torch.randn(B, Hkv, Nk, Dv, generator=g).to("cuda", torch.bfloat16)
    do = torch.randn(B, Hq, Nq, Dv, generator=g).to("cuda", torch.bfloat16)
    out, lse = vflash.attention(q, k, v, return_lse=True, **opts)
    delta = (do.float() * out.float()).sum(-1)
    causal = {True: "bottom_right", False: None}.get(opts.get("causal", False), opts.get("causal"))
    band = mask_band(Nq, Nk, causal, opts.get("window", (-1, -1)))
    tiles = dispatch.select_backward(dispatch.problem_of(Call(q, k, v, None, band, Score(1.0), False)), "sm90").tiles
    got = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    score = Score(D ** -0.5, opts.get("softcap"))
    for outputs in (("dk", "dv") if tiles.dkdv_apart else ("dk dv",)):
        launches.run(sm90_bwd.dkdv_launch(q, k, v, do, lse, delta, got[1], got[2], band, score, tiles.dkdv.block_m,
                                          tiles.dkdv.block_n, outputs=outputs), q.device)
    launches.run(sm90_bwd.dq_launch(q, k, v, do, lse, delta, got[0], band, score, tiles.dq.block_m,
                                    tiles.dq.block_n), q.device)
    ref = _grads(lambda a, b, c: attention_explicit(a, b, c, compute_dtype=torch.float64, **opts), q, k, v, do,
                 torch.float64)
    same = _grads(lambda a, b, c: attention_explicit(a, b, c, compute_dtype=None, **opts), q, k, v, do,
                  torch.bfloat16)
    _assert_grads(got, ref, same, torch.bfloat16)


@needs_sm90
@pytest.mark.parametrize("d,d_v", [(192, 128), (128, 64)])
def test_gpu_forced_sm90_autograd_takes_a_v_head_dim_of_its_own_packed(d, d_v, monkeypatch):
    # attention_varlen's autograd with the sm90 kernels forced (forward and backward): sequences whose slabs cross
    # their ends (the pointer stores of dq, dk and dv, the last two of different head dims), against fp64
    from vflash import dispatch
    from vflash.reference import attention_varlen_reference
    monkeypatch.setattr(dispatch.rules, "FORCED", "sm90")
    g = torch.Generator().manual_seed(9)
    cu = torch.tensor([0, 300, 333, 1100], dtype=torch.int32, device="cuda")
    q = torch.randn(1100, 4, d, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(1100, 2, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(1100, 2, d_v, generator=g).to("cuda", torch.bfloat16)
    do = torch.randn(1100, 4, d_v, generator=g).to("cuda", torch.bfloat16)
    got = _grads(lambda a, b, c: vflash.attention_varlen(a, b, c, cu, cu, 767, 767, causal=True), q, k, v, do,
                 torch.bfloat16)
    ref = _grads(lambda a, b, c: attention_varlen_reference(a, b, c, cu, cu, causal=True, compute_dtype=torch.float64),
                 q, k, v, do, torch.float64)
    same = _grads(lambda a, b, c: attention_varlen_reference(a, b, c, cu, cu, causal=True, compute_dtype=None),
                  q, k, v, do, torch.bfloat16)
    _assert_grads(got, ref, same, torch.bfloat16)


def test_hopper_backward_launches_fill_every_parameter_and_refuse_bad_stats():
    from vflash.ops import sm90_bwd
    from vflash.call import Band
    if not sm90_bwd.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    q, do = torch.randn(2, 4, 300, 64, dtype=torch.bfloat16), torch.randn(2, 4, 300, 64, dtype=torch.bfloat16)
    k, v = torch.randn(2, 2, 200, 64, dtype=torch.bfloat16), torch.randn(2, 2, 200, 64, dtype=torch.bfloat16)
    lse, delta = torch.randn(2, 4, 300), torch.randn(2, 4, 300)
    band = Band(-100, -1, 0)
    dq = sm90_bwd.dq_launch(q, k, v, do, lse, delta, torch.empty_like(q), band, Score(0.125, None))
    dkdv = sm90_bwd.dkdv_launch(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v), band,
                                Score(0.125, None))
    for launch, kernel in ((dq, "attention_bwd_dq_sm90_kernel"), (dkdv, "attention_bwd_dkdv_sm90_kernel")):
        names = getattr(sm90_bwd.kernels, kernel).arg_names
        assert len(launch.params()) == len(names)
        by_name = dict(zip(names, launch.params()))
        assert by_name["kv_group"] == 2 and by_name["n_q"] == 300 and by_name["n_k"] == 200
    assert dq.grid == (2 * 4 * 3, 1, 1) and dkdv.grid == (2 * 2 * 2, 1, 1)
    with pytest.raises(ValueError, match="lse must be contiguous fp32"):
        sm90_bwd.dq_launch(q, k, v, do, lse.transpose(1, 2).contiguous(), delta, torch.empty_like(q), band,
                           Score(0.1, None))
    with pytest.raises(ValueError, match="shared memory"):
        sm90_bwd.dkdv_launch(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v), band, Score(0.1, None),
                               64, 256)  # four consumers
    with pytest.raises(ValueError, match="outputs must be"):
        sm90_bwd.dkdv_launch(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v), band, Score(0.1, None),
                               outputs="dq")
    assert sm90_bwd.dkdv_launch(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v), band,
                                Score(0.1, None), outputs="dv").constexprs["WANT_DK"] is False


def test_hopper_backward_varlen_launches_bind_the_packed_tensors():
    # packed q [total_q, Hq, D], k / v [total_k, Hkv, D], lse / delta [Hq, total_q]: the grid covers the
    # longest sequence, the pointer parameters are the packed outputs and cu_seqlens, the strides theirs
    from vflash.ops import sm90_bwd
    from vflash.call import Band
    if not sm90_bwd.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    q, do = torch.randn(300, 4, 64, dtype=torch.bfloat16), torch.randn(300, 4, 64, dtype=torch.bfloat16)
    k, v = torch.randn(250, 2, 64, dtype=torch.bfloat16), torch.randn(250, 2, 64, dtype=torch.bfloat16)
    lse, delta = torch.randn(4, 300), torch.randn(4, 300)
    cu_q, cu_k = torch.tensor([0, 100, 300], dtype=torch.int32), torch.tensor([0, 50, 250], dtype=torch.int32)
    varlen = (cu_q, cu_k, 200, 200, False)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    band = Band(0, -1, 0)
    dq_l = sm90_bwd.dq_launch(q, k, v, do, lse, delta, dq, band, Score(0.125, None), varlen=varlen)
    dkdv_l = sm90_bwd.dkdv_launch(q, k, v, do, lse, delta, dk, dv, band, Score(0.125, None), varlen=varlen)
    for launch, kernel in ((dq_l, "attention_bwd_dq_sm90_kernel"), (dkdv_l, "attention_bwd_dkdv_sm90_kernel")):
        names = getattr(sm90_bwd.kernels, kernel).arg_names
        assert len(launch.params()) == len(names)
        by_name = dict(zip(names, launch.params()))
        assert by_name["cu_seqlens_q"] is cu_q and by_name["cu_seqlens_k"] is cu_k and by_name["IS_VARLEN"]
        assert (by_name["n_q"], by_name["n_k"], by_name["total_q"]) == (200, 200, 300)
        assert by_name["out_stride_row"] == (4 * 64 if kernel.startswith("attention_bwd_dq") else 2 * 64)
        assert by_name["out_stride_head"] == 64 and by_name["batch"] == 2
        slots = {s.name: s.position for s in launch.slots}
        assert names[slots["cu_seqlens_q"]] == "cu_seqlens_q" and names[slots["lse"]] == "LSE"
    assert dict(zip(sm90_bwd.kernels.attention_bwd_dq_sm90_kernel.arg_names, dq_l.params()))["DQ"] is dq
    by_name = dict(zip(sm90_bwd.kernels.attention_bwd_dkdv_sm90_kernel.arg_names, dkdv_l.params()))
    assert by_name["DK"] is dk and by_name["DV"] is dv
    assert [s.position for s in dkdv_l.slots if s.name in ("dk", "dv")] == [4, 5, 10, 11]
    assert dq_l.grid == (2 * 4 * 2, 1, 1) and dkdv_l.grid == (2 * 2 * 2, 1, 1)  # cdiv(200, 128), cdiv(200, 128)
    with pytest.raises(ValueError, match=r"lse must be contiguous fp32 \[4, 300\]"):
        sm90_bwd.dq_launch(q, k, v, do, lse.t().contiguous(), delta, dq, band, Score(0.125, None), varlen=varlen)
