"""vflash.attention against the fp64 oracle, through the Triton interpreter on
the CPU (or the device named by VFLASH_TEST_DEVICE). Each case claims:
max|out - ref| <= 2 * max|out_same_dtype_torch - ref| + floor, for out and lse,
with every value finite and -inf LSE exactly on the rows that see no key."""


import pytest
import torch
import triton
import triton.language as tl

import vflash
from vflash._backend import launcher
from vflash.harness.cases import Case, make_inputs, run_case
from vflash.harness.oracle import compare
from vflash.kernels.mask import key_range, key_tiles, masked_logits, row_tiles
from vflash.kernels.tile import cast
from vflash._validate import mask_band
from vflash.ops.attention import attention_forward
from vflash.ops.tiles import PortableTiles
from vflash.reference import attention_explicit
from vflash.reference.explicit import visible_mask
from vflash.call import Score
from _devices import needs_interpreter


def assert_case(case, device, attention=None):
    verdicts = run_case(case, device, attention)
    for v in verdicts:
        assert v.passed, f"{case.name}: {v.what} max err {v.max_err:.3e} > tol {v.tol:.3e} {v.note}"


EDGE_PAIRS = [(1, 1), (63, 64), (64, 65), (65, 63), (127, 129), (129, 127), (128, 128), (1, 129), (129, 1)]


@pytest.mark.parametrize("nq,nk", EDGE_PAIRS)
@pytest.mark.parametrize("causal", [False, True, "top_left", "bottom_right"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_dtypes_causal_modes_tile_edges(dtype, causal, nq, nk, device):
    assert_case(Case(Nq=nq, Nk=nk, D=64, dtype=dtype, causal=causal), device)


@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 4), (16, 2), (8, 1)], ids=["MHA", "GQA2", "GQA8", "MQA"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_gqa_mqa(dtype, causal, hq, hkv, device):
    assert_case(Case(B=2, Hq=hq, Hkv=hkv, Nq=40, Nk=70, D=32, dtype=dtype, causal=causal), device)


@pytest.mark.parametrize("d", [8, 16, 24, 40, 64, 80, 96, 112, 128, 192, 256])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_head_dims(dtype, d, device):
    assert_case(Case(Nq=65, Nk=97, D=d, dtype=dtype, causal=True), device)


@pytest.mark.parametrize("layout", ["bnhd", "sliced"])
@pytest.mark.parametrize("causal", [False, True])
def test_strided_views(layout, causal, device):
    assert_case(Case(B=2, Hq=4, Hkv=2, Nq=70, Nk=90, D=40, layout=layout, causal=causal), device)


def test_bnhd_view_is_not_copied_and_head_dim_stride_is_honoured(device):
    # [B, N, H, D] memory seen as [B, H, N, D]; and a view whose last dim is not
    # unit-stride. Both run as they are and match the contiguous result.
    g = torch.Generator().manual_seed(1)
    base = torch.randn(2, 50, 4, 32, generator=g).to(device, torch.float16)
    q = base.transpose(1, 2)
    assert not q.is_contiguous()
    kt = torch.randn(2, 4, 32, 50, generator=g).to(device, torch.float16)
    k = kt.transpose(2, 3)  # stride of the head dim is 50
    assert k.stride(3) == 50
    v = torch.randn(2, 4, 50, 32, generator=g).to(device, torch.float16)
    out = vflash.attention(q, k, v, causal=True)
    ref = vflash.attention(q.contiguous(), k.contiguous(), v, causal=True)
    assert torch.equal(out, ref)


WINDOWS = [(0, 0), (3, 0), (16, 8), (0, 20), (40, -1), (-1, 5), (200, 200)]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True, "top_left"])
@pytest.mark.parametrize("nq,nk", [(100, 100), (50, 130), (130, 50)])
def test_sliding_window(window, causal, nq, nk, device):
    assert_case(Case(Nq=nq, Nk=nk, D=32, window=window, causal=causal), device)


@pytest.mark.parametrize("softcap,amplify", [(1.0, 1.0), (5.0, 3.0), (50.0, 4.0)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_softcap(softcap, amplify, dtype, device):
    assert_case(Case(Nq=80, Nk=80, D=64, dtype=dtype, softcap=softcap, amplify=amplify, causal=True), device)


@pytest.mark.parametrize("scale", [0.01, 0.125, 2.0])
def test_explicit_scale(scale, device):
    assert_case(Case(Nq=50, Nk=60, D=64, scale=scale), device)


def test_scale_none_is_inverse_sqrt_head_dim(device):
    q, k, v = make_inputs(Case(Nq=20, Nk=20, D=64), device)
    assert torch.equal(vflash.attention(q, k, v), vflash.attention(q, k, v, scale=0.125))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_amplified_logits_stay_finite(dtype, device):
    # Q and K x4 at N = 513: logits in the hundreds; the running max must keep exp finite.
    assert_case(Case(Nq=513, Nk=513, D=64, dtype=dtype, amplify=4.0, causal=True), device)


def test_fully_masked_rows_give_zero_and_minus_inf(device):
    # Bottom-right causal with Nq > Nk: the first Nq - Nk rows see no key.
    q, k, v = make_inputs(Case(Nq=96, Nk=40, D=64), device)
    out, lse = vflash.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out[:, :, :56].float().cpu(), torch.zeros(1, 2, 56, 64))
    assert torch.isneginf(lse[:, :, :56]).all()
    assert torch.isfinite(lse[:, :, 56:]).all() and torch.isfinite(out).all()
    # A window that excludes every key for some rows does the same.
    out, lse = vflash.attention(q[:, :, :40], k, v, window=(-1, -1), causal="top_left", return_lse=True)
    assert torch.isfinite(lse).all()
    out, lse = vflash.attention(q, k, v, window=(0, 0), return_lse=True)  # off = -56
    assert torch.isneginf(lse[:, :, :56]).all() and torch.isfinite(lse[:, :, 56:]).all()
    assert torch.isfinite(out).all()
    assert_case(Case(Nq=96, Nk=40, D=64, window=(0, 0), tag="band left of keys"), device)


def test_lse_matches_reference_and_is_natural_log(device):
    q, k, v = make_inputs(Case(Nq=30, Nk=50, D=32, dtype="fp32"), device)
    _, lse = vflash.attention(q, k, v, return_lse=True)
    s = (q.double() @ k.double().transpose(-1, -2)) / 32 ** 0.5
    assert torch.allclose(lse.double().cpu(), torch.logsumexp(s, -1).cpu(), atol=1e-5, rtol=0)


def test_lse_merges_split_kv_exactly(device):
    # Two halves of the keys, merged through their LSEs, give the whole.
    q, k, v = make_inputs(Case(Nq=40, Nk=100, D=32, dtype="fp32"), device)
    o1, l1 = vflash.attention(q, k[:, :, :45], v[:, :, :45], return_lse=True)
    o2, l2 = vflash.attention(q, k[:, :, 45:], v[:, :, 45:], return_lse=True)
    o, l = vflash.attention(q, k, v, return_lse=True)
    lm = torch.logaddexp(l1, l2)
    merged = o1 * torch.exp(l1 - lm).unsqueeze(-1) + o2 * torch.exp(l2 - lm).unsqueeze(-1)
    assert torch.allclose(merged, o, atol=1e-5) and torch.allclose(lm, l, atol=1e-5)


@pytest.mark.parametrize("block_m,block_n,split", [(16, 16, False), (64, 64, False), (32, 16, True), (64, 32, True),
                                                   pytest.param(16, 64, False, marks=pytest.mark.slow),
                                                   pytest.param(64, 16, False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("opts", [dict(causal=True), dict(causal="top_left", window=(9, 0)),
                                  dict(window=(20, 13)), dict(window=(-1, 0)), dict()],
                         ids=["causal", "top_left+window", "window", "right0", "full"])
def test_tile_sizes_and_poisoned_outputs(block_m, block_n, split, opts, device):
    # Every tile split (masked / unmasked stretches) for several tile shapes; outputs
    # are filled with NaN first, so an element the kernel forgets stays NaN. Split
    # tiles carry block_m rows as two halves.
    case = Case(B=2, Hq=4, Hkv=2, Nq=77, Nk=131, D=32)
    q, k, v = make_inputs(case, device)
    out = torch.full((2, 4, 77, 32), float("nan"), dtype=q.dtype, device=device)
    lse = torch.full((2, 4, 77), float("nan"), dtype=torch.float32, device=device)
    from vflash._validate import check_window, resolve_causal
    band = mask_band(77, 131, resolve_causal(opts.get("causal", False)), check_window(opts.get("window")))
    attention_forward(q, k, v, band=band, score=Score(32 ** -0.5, None), return_lse=True,
                      tiles=PortableTiles(block_m, block_n, 4, 1, split), kernel="portable", out=out, lse=lse)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref_o, ref_l = attention_explicit(q, k, v, compute_dtype=torch.float64, **opts)
    same_o, _ = attention_explicit(q, k, v, compute_dtype=None, **opts)
    tol = 2 * (same_o.double() - ref_o).abs().max().item() + 2 ** -12
    assert (out.double() - ref_o).abs().max().item() <= tol
    fin = torch.isfinite(ref_l)
    assert torch.equal(torch.isneginf(lse), ~fin)
    assert (lse.double()[fin] - ref_l[fin]).abs().max().item() < 1e-4


def test_mask_band_folds_causal_into_window():
    assert mask_band(4, 10, "bottom_right", (-1, -1)) == (6, -1, 0)
    assert mask_band(4, 10, "top_left", (-1, -1)) == (0, -1, 0)
    assert mask_band(4, 10, None, (3, 2)) == (6, 3, 2)
    assert mask_band(4, 10, "bottom_right", (3, 2)) == (6, 3, 0)
    # Sides that hide nothing become unbounded: decode's single query, windows wider than the keys.
    assert mask_band(1, 10, "bottom_right", (-1, -1)) == (9, -1, -1)
    assert mask_band(4, 10, None, (9, 3)) == (6, -1, -1)
    assert mask_band(4, 10, None, (8, 2)) == (6, 8, 2)
    assert mask_band(4, 10, "top_left", (100, 5)) == (0, -1, 0)


@triton.jit
def _masked_logits_kernel(Out, start, n_k, off, left, right, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                          RELATIVE: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    offs_m = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    ptrs = Out + offs_m[:, None] * BLOCK_N + cols[None, :]
    qk = tl.load(ptrs)  # zeros
    if RELATIVE:  # as the sm90 kernel calls it: columns from the tile's first key, bounds shifted
        s = masked_logits(qk, offs_m, cols, n_k - start, off - start, left, right, 1.0, 1.0, True, HAS_LEFT,
                          HAS_RIGHT, False)
    else:
        s = masked_logits(qk, offs_m, start + cols, n_k, off, left, right, 1.0, 1.0, True, HAS_LEFT, HAS_RIGHT,
                          False)
    tl.store(ptrs, s)


@pytest.mark.parametrize("relative", [False, True])
def test_masked_logits_hides_exactly_the_keys_outside_the_band(relative, device):
    # Row i sees key j iff i + off - left <= j <= i + off + right and j < n_k (a
    # negative side unbounded); with key indices taken relative to the tile's first
    # key (the sm90 kernel's form) the tile must hide the same keys.
    rows, block_n = 16, 32
    for start, n_k, off, left, right in [(0, 20, 0, -1, 0), (32, 50, 10, -1, 0), (64, 70, 40, 5, 2),
                                         (32, 64, -20, 3, -1), (96, 100, 90, -1, -1), (0, 32, 7, 0, 0)]:
        out = torch.zeros(rows, block_n, device=device)
        launcher(_masked_logits_kernel, device)[(1,)](out, start, n_k, off, left, right, ROWS=rows, BLOCK_N=block_n,
                                    RELATIVE=relative, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0)
        out = out.cpu()
        i = torch.arange(rows)[:, None]
        j = start + torch.arange(block_n)[None, :]
        visible = (j < n_k).expand(rows, block_n)
        if left >= 0:
            visible = visible & (j >= i + off - left)
        if right >= 0:
            visible = visible & (j <= i + off + right)
        assert torch.equal(torch.isneginf(out), ~visible), (start, n_k, off, left, right)
        assert torch.equal(out[visible], torch.zeros(int(visible.sum())))


@triton.jit
def _row_tiles_kernel(Out, n_q, n_k, off, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      ROWS: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    # Program (row block, slice): the work tile's key range as the sm90 kernel's
    # _work_tile takes it, and the ROWS-row slice's own tiles within it.
    pid_m = tl.program_id(0)
    c = tl.program_id(1)
    start_m = pid_m * BLOCK_M
    lo, full_lo, full_hi, hi = key_range(start_m, n_k, off, left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    n_left, n_mid, n_tiles = key_tiles(lo, full_lo, full_hi, hi, BLOCK_N)
    c_left, c_mid, c_end = row_tiles(start_m + c * ROWS, lo, n_tiles, n_q, n_k, off, left, right, ROWS, BLOCK_N,
                                     HAS_LEFT, HAS_RIGHT)
    base = Out + (pid_m * tl.num_programs(1) + c) * 5
    tl.store(base, lo)
    tl.store(base + 1, n_tiles)
    tl.store(base + 2, c_left)
    tl.store(base + 3, c_mid)
    tl.store(base + 4, c_end)


@pytest.mark.parametrize("block_m,block_n", [(192, 128), (128, 64), (128, 128)])
def test_row_tiles_cover_every_visible_key_and_only_skip_hidden_ones(block_m, block_n, device):
    # A 64-row slice of a work tile (one Hopper consumer) walks key tiles
    # [0, c_end) of the tile's and skips the rest: every key its rows see must lie
    # in those tiles, the tiles it treats as unmasked must be visible to all its
    # rows, and it must stop no later than the tile. Checked against the API's
    # mask (reference.visible_mask), over both causal alignments, windows and
    # Nq != Nk.
    rows = 64
    for n_q, n_k, causal, window in [(777, 777, True, None), (129, 1037, True, None), (1037, 129, "top_left", None),
                                     (1000, 1100, True, (0, 0)), (1000, 1100, False, (128, 0)),
                                     (1024, 300, True, None), (300, 333, False, (40, 200)),
                                     (500, 700, "top_left", (300, -1)), (640, 640, False, (100, 100))]:
        mode = {True: "bottom_right", False: None}.get(causal, causal)
        off, left, right = mask_band(n_q, n_k, mode, window or (-1, -1))
        n_m = -(-n_q // block_m)
        out = torch.full((n_m, block_m // rows, 5), -7, dtype=torch.int32, device=device)
        launcher(_row_tiles_kernel, device)[(n_m, block_m // rows)](out, n_q, n_k, off, left, right, BLOCK_M=block_m,
                                                  BLOCK_N=block_n, ROWS=rows, HAS_LEFT=left >= 0,
                                                  HAS_RIGHT=right >= 0)
        out = out.cpu()
        visible = visible_mask(n_q, n_k, causal, window)
        for m in range(n_m):
            for c in range(block_m // rows):
                lo, n_tiles, c_left, c_mid, c_end = out[m, c].tolist()
                case = (n_q, n_k, causal, window, m, c)
                assert 0 <= c_left <= c_mid <= c_end <= n_tiles, case
                r0, r1 = m * block_m + c * rows, min(m * block_m + (c + 1) * rows, n_q)
                if r0 >= n_q:
                    assert c_end == 0, case
                    continue
                keys = visible[r0:r1].any(0).nonzero().flatten()
                assert bool(((keys >= lo) & (keys < lo + c_end * block_n)).all()), case
                for j in range(c_left, c_mid):
                    k0 = lo + j * block_n
                    assert k0 + block_n <= n_k and bool(visible[r0:r1, k0:k0 + block_n].all()), case


@pytest.mark.parametrize("nq,nk,causal,window", [
    (1, 100, True, None), (4, 10, False, (9, 3)), (4, 10, False, (8, 2)), (10, 4, "top_left", (2, 0)),
    (7, 7, False, (6, 6)), (7, 7, False, (5, 5))])
def test_window_folding_keeps_results(nq, nk, causal, window, device):
    # The folded (unmasked) launch computes what the explicit mask says.
    assert_case(Case(Nq=nq, Nk=nk, D=16, causal=causal, window=window, tag="fold"), device)


def test_empty_sequences(device):
    q = torch.randn(1, 2, 5, 16, device=device, dtype=torch.float16)
    k0 = torch.randn(1, 2, 0, 16, device=device, dtype=torch.float16)
    out, lse = vflash.attention(q, k0, k0, return_lse=True)
    assert torch.equal(out.cpu(), torch.zeros(1, 2, 5, 16, dtype=torch.float16))
    assert torch.isneginf(lse).all()
    out, lse = vflash.attention(q[:, :, :0], q, q, return_lse=True)
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)


def test_return_types(device):
    q, k, v = make_inputs(Case(Nq=8, Nk=8, D=16), device)
    out = vflash.attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    out2, lse = vflash.attention(q, k, v, return_lse=True)
    assert torch.equal(out, out2) and lse.shape == (1, 2, 8) and lse.dtype == torch.float32
    assert out.is_contiguous()


def test_import_leaves_the_environment_and_other_triton_code_alone(tmp_path):
    # No TRITON_INTERPRET set at import, CPU tensors still run (interpreted per call), and
    # afterwards Triton's own library functions and JITFunction calls are as Triton made them.
    from vflash._backend import interpreter_refusal
    if interpreter_refusal():
        pytest.skip(interpreter_refusal())
    import os
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent("""
        import os
        import torch
        import triton.language as tl
        from triton.runtime.jit import JITFunction
        call = JITFunction.__call__
        tensor_ops = {name: getattr(tl.tensor, name) for name in ("__add__", "__mul__", "__index__", "T")
                      if hasattr(tl.tensor, name)}
        builtins = {name: getattr(tl, name) for name in ("arange", "dot", "load", "where", "exp2")}
        import vflash
        assert "TRITON_INTERPRET" not in os.environ
        q = torch.randn(1, 1, 5, 16)
        out = vflash.attention(q, q, q)
        ref = torch.softmax(q @ q.transpose(-1, -2) / 4, -1) @ q
        assert (out - ref).abs().max() < 1e-5
        assert isinstance(tl.sum, JITFunction) and JITFunction.__call__ is call
        # the interpreter's patches of triton.language (a launch's and its device functions') are undone
        assert all(getattr(tl.tensor, name, None) is op for name, op in tensor_ops.items())
        assert not hasattr(tl.tensor, "__index__") or "__index__" in tensor_ops
        assert all(getattr(tl, name) is fn for name, fn in builtins.items())
        try:
            tl.sum(q, 0)
        except RuntimeError as e:
            assert "outside of the scope of a kernel" in str(e)
        else:
            raise AssertionError("a compiled jit function ran outside a kernel")
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_interpreter_warnings_stay_inside(device, recwarn):
    # exp2(-inf) and masked lanes raise numpy floating-point warnings inside the interpreter.
    import warnings
    warnings.simplefilter("always")
    q = torch.randn(1, 1, 9, 16, device=device)
    vflash.attention(q, q[:, :, :3], q[:, :, :3], causal="top_left", window=(1, 0), return_lse=True)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


# CPU tensors through this Triton's interpreter (the GPU machine's Triton 3.6 refuses its numpy)


@triton.jit
def _cast_kernel(X, Y, n, BLOCK: tl.constexpr, EMULATE_BF16: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Y + offs, cast(x, Y.dtype.element_ty, EMULATE_BF16), mask=offs < n)


@needs_interpreter
def test_interpreted_bf16_cast_rounds_to_nearest_even():
    # kernels/tile.py's cast under the interpreter gives torch's fp32 -> bf16 conversion bit for bit:
    # ties to even, carries into the exponent, overflow to inf, subnormals, NaN kept, zeros' signs kept
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, generator=g) * torch.logspace(-38, 38, 2048)
    ties = torch.tensor([1.00390625, 1.01171875, -1.00390625, 1.9960938, 3.3895e38, -3.3895e38, 3.4e38, 1e-40, -1e-41])
    x = torch.cat([x, ties, torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0])])
    y = torch.empty(x.numel(), dtype=torch.bfloat16)
    launcher(_cast_kernel, x.device)[(1,)](x, y, x.numel(), BLOCK=4096, EMULATE_BF16=True)
    want = x.to(torch.bfloat16)
    assert torch.equal(y.view(torch.int16)[~x.isnan()], want.view(torch.int16)[~x.isnan()])
    assert y[x.isnan()].isnan().all()


@needs_interpreter
def test_cpu_bf16_outputs_are_rounded_not_truncated():
    # the interpreter truncated fp32 -> bf16 (P and the output), shrinking outputs toward zero by ~0.45 %:
    # 26 of these 200 seeds failed the accuracy rule, seed 20 by 0.0082 against 0.0071
    failed = []
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 1, n, 16, generator=g).bfloat16() for n in (1, 4, 4))
        out = vflash.attention(q, k, v)
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
        same = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        verdict = compare("out", out, ref, same, torch.bfloat16)
        if not verdict.passed:
            failed.append(seed)
    assert failed == []
