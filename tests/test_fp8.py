"""FP8 (e4m3) inputs with FlashAttention-3's descales: every option against the fp64 oracle on the dequantized
inputs, with the explicit FP8 pipeline as the yardstick (max error and RMSE within twice its own plus the floor:
vflash.harness.cases.Fp8Case); the kernels' e4m3 rounding against torch's conversion; every element written;
the descales read per call, not baked into a plan; and the bad inputs, refused before any launch. FP8 KV
caches: attention_with_kvcache on them (KVCacheCase's fp8: the oracle on the dequantized cache, the yardstick
explicit attention in q's dtype on it), and write_kvcache quantizing into them bit for bit as vLLM's write."""

import pytest
import torch
import triton
import triton.language as tl

import vflash
from vflash import _backend
from vflash.call import Band, Score
from vflash.dispatch import tables
from vflash.harness import lab
from vflash.harness.cases import Fp8Case, KVCacheCase
from vflash.harness.serving import shuffled_table
from vflash.kernels.tile import to_e4m3
from vflash.ops.attention import attention_forward
from vflash.ops.tiles import PortableTiles
from vflash.reference import attention_explicit
from vflash.reference.paged import attention_with_kvcache_reference
from vflash.reference.fp8 import dequantize, quantize
from vflash.reference.fp8 import to_e4m3 as e4m3_of
from _devices import needs_interpreter

E4M3 = torch.float8_e4m3fn
# the tests of CPU tensors whatever VFLASH_TEST_DEVICE says: they need an interpreter that runs here


@triton.jit
def _round_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, to_e4m3(tl.load(X + offs), True))


@needs_interpreter
def test_the_kernels_e4m3_rounding_is_torchs_on_every_value_tie_and_saturation():
    # every finite e4m3 value, the midpoints between neighbours (ties: to even), past the largest (saturated
    # at 448, where the interpreter's own conversion gives 256 for 500), carries (1.9375 -> 2, where it gives
    # 1.0), subnormals and random values of every scale
    values = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
    values = values[torch.isfinite(values)].sort().values
    g = torch.Generator().manual_seed(0)
    x = torch.cat([values, (values[1:] + values[:-1]) / 2,
                   torch.tensor([449.0, 464.0, 480.0, 500.0, 1e4, -500.0, 1.9375, -1.9375, 2.0**-10, 1.5 * 2.0**-9]),
                   *(torch.randn(4096, generator=g) * s for s in (1e-3, 0.05, 1.0, 30.0, 300.0))])
    n = triton.next_power_of_2(x.numel())
    x = torch.cat([x, torch.zeros(n - x.numel())])
    got = torch.empty_like(x)
    _backend.launcher(_round_kernel, x.device)[(1,)](x, got, N=n)  # the interpreter: x is on the CPU
    want = x.clamp(-448, 448).to(E4M3).float()
    assert torch.equal(got, want)


CASES = [
    Fp8Case(),
    Fp8Case(B=2, Hq=4, Hkv=2, Nq=40, Nk=70, D=32, causal=True, descale="head"),
    Fp8Case(Nq=50, Nk=30, D=16, causal="top_left", window=(8, 2), tag="rows without keys"),
    Fp8Case(D=32, softcap=5.0, sinks=True, out_dtype="fp16", descale="none"),
    Fp8Case(Hq=4, Hkv=1, D=24, window=(5, 3), descale="head", out_dtype="fp16"),
    Fp8Case(Hq=4, Hkv=1, D=32, lens=((5, 9), (0, 3), (17, 17), (3, 0)), causal=True, descale="head", sinks=True),
    Fp8Case(Hq=2, Hkv=2, D=16, lens=((33, 20), (7, 40)), window=(6, 6), softcap=4.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name.replace(" ", "_"))
def test_fp8_matches_the_oracle_within_twice_the_fp8_pipeline(case, device):
    for verdict in case.run(device):
        assert verdict.passed, f"{verdict.what}: max {verdict.max_err:.3e} tol {verdict.tol:.3e} {verdict.note}"


def _inputs(device, B=2, Hq=4, Hkv=2, N=33, D=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    real = [torch.randn(B, h, N, D, generator=g) for h in (Hq, Hkv, Hkv)]
    descales = [(x.abs().amax() / 448).float() for x in real]
    stored = [quantize(x, d).to(device) for x, d in zip(real, descales)]
    return stored, [d.to(device) for d in descales]


def test_every_element_is_written(device):
    # outputs poisoned with NaN first: every row (those that see no key too) comes back finite
    (q, k, v), (qd, kd, vd) = _inputs(device, N=20)
    k, v = k[:, :, :12], v[:, :, :12]
    out = torch.full((2, 4, 20, 16), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((2, 4, 20), float("nan"), device=device)
    band = Band(12 - 20, -1, 0)  # causal, bottom-right: the first 8 rows see no key
    attention_forward(q, k, v, band=band, score=Score(0.25, None, None, qd, kd, vd), return_lse=True,
                      tiles=PortableTiles(16, 32, 4, 1), kernel="portable", out=out, lse=lse)  # an e4m3 dot: K >= 32
    assert torch.isfinite(out).all() and torch.equal(out[:, :, :8], torch.zeros_like(out[:, :, :8]))
    assert torch.isneginf(lse[:, :, :8]).all() and torch.isfinite(lse[:, :, 8:]).all()


def test_descales_are_read_each_call_and_scale_as_written(device, interpreted_plans):
    # the same tensors with other descale values (a repeat: the plan path) give the results of the new values:
    # v's descale scales the output, q's and k's the scores (here 2 x 0.5: the same scores)
    (q, k, v), (qd, kd, vd) = _inputs(device)
    first = vflash.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    again = vflash.attention(q, k, v, q_descale=qd * 2, k_descale=kd / 2, v_descale=vd * 4)
    torch.testing.assert_close(again.float(), first.float() * 4, atol=0, rtol=0)
    sharper = vflash.attention(q, k, v, q_descale=qd * 2, k_descale=kd, v_descale=vd)
    assert not torch.allclose(sharper.float(), first.float(), atol=1e-3)


def test_none_descales_mean_one(device):
    (q, k, v), _ = _inputs(device)
    ones = torch.ones((), device=device)
    torch.testing.assert_close(vflash.attention(q, k, v), vflash.attention(q, k, v, q_descale=ones, k_descale=ones,
                                                                           v_descale=ones), atol=0, rtol=0)


def test_the_output_dtype_is_bf16_by_default_and_fp16_on_request(device):
    (q, k, v), (qd, kd, vd) = _inputs(device)
    assert vflash.attention(q, k, v, q_descale=qd).dtype == torch.bfloat16
    out = vflash.attention(q, k, v, q_descale=qd, out_dtype=torch.float16)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


def test_dequantize_is_stored_times_descale():
    x = torch.tensor([1.0, -2.0, 448.0]).view(1, 1, 3, 1).to(E4M3)
    d = torch.tensor([[0.5]])
    assert torch.equal(dequantize(x, d), torch.tensor([0.5, -1.0, 224.0], dtype=torch.float64).view(1, 1, 3, 1))


@pytest.mark.parametrize("change,error,words", [
    (lambda q, k, v, d: (q.view(torch.uint8).view(torch.float8_e5m2), k, v, {}), TypeError, "e4m3"),
    (lambda q, k, v, d: (q, k.float().to(torch.bfloat16), v, {}), TypeError, "float8_e4m3fn"),
    (lambda q, k, v, d: (q, k, v, dict(q_descale=d.double())), TypeError, "float32"),
    (lambda q, k, v, d: (q, k, v, dict(k_descale=torch.ones(2, 4, device=d.device))), ValueError, "[B, Hkv] = [2, 2]"),
    (lambda q, k, v, d: (q, k, v, dict(v_descale=torch.ones(4, device=d.device))), ValueError, "0-d"),
    (lambda q, k, v, d: (q, k, v, dict(v_descale=torch.ones((), device="meta"))), ValueError, "one device"),
    (lambda q, k, v, d: (q, k, v, dict(q_descale=[1.0])), TypeError, "torch.Tensor"),
    (lambda q, k, v, d: (q, k, v, dict(out_dtype=torch.float32)), ValueError, "bfloat16"),
    (lambda q, k, v, d: (q, k, v, dict(out_dtype="bf16")), TypeError, "torch.dtype"),
])
def test_bad_fp8_inputs_are_refused(change, error, words, device):
    (q, k, v), (qd, _, _) = _inputs(device)
    q, k, v, kwargs = change(q, k, v, qd)
    with pytest.raises(error, match=None) as info:
        vflash.attention(q, k, v, **kwargs)
    assert words in str(info.value), str(info.value)


@needs_interpreter
def test_non_positive_descales_are_refused_on_cpu_tensors():
    (q, k, v), (qd, kd, vd) = _inputs(torch.device("cpu"))
    for bad in (torch.tensor(0.0), torch.tensor(-1.0), torch.tensor(float("inf"))):
        with pytest.raises(ValueError, match="positive and finite"):
            vflash.attention(q, k, v, k_descale=bad)


def test_descales_and_out_dtype_apply_to_fp8_only(device):
    q = torch.randn(1, 2, 8, 16, device=device)
    with pytest.raises(ValueError, match="apply to FP8"):
        vflash.attention(q, q, q, q_descale=torch.ones((), device=device))
    with pytest.raises(ValueError, match="out_dtype applies to FP8"):
        vflash.attention(q, q, q, out_dtype=torch.bfloat16)


def test_fp8_is_forward_only_and_not_taken_elsewhere_yet(device):
    (q, k, v), (qd, kd, vd) = _inputs(device)
    with pytest.raises(Exception, match="forward only"):  # torch.compile's wrapper of the TypeError
        torch.compile(lambda: vflash.attention(q, k, v, q_descale=qd), fullgraph=True)()
    rows = q.transpose(1, 2)  # [B, N, H, D]
    cache = k.transpose(1, 2)
    lens = torch.full((2,), 33, dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="float16 / bfloat16 q"):
        vflash.attention_with_kvcache(rows, cache, cache, lens)
    with pytest.raises(TypeError, match="merge_states takes no FP8"):
        vflash.merge_states(rows[0], torch.zeros(33, 4, device=device), rows[0], torch.zeros(33, 4, device=device))


KV_CASES = [
    KVCacheCase((1, 1, 1), (70, 1, 33), page=16, dtype="bf16", fp8="tensor", tag="decode"),
    KVCacheCase((1, 2), (90, 17), page=17, num_splits=3, dtype="bf16", fp8="head", tag="decode"),
    KVCacheCase((9, 0, 20), (40, 5, 20), page=16, window=(12, 0), fp8="seq", tag="chunked"),
    KVCacheCase((1, 3), (60, 30), page=8, Hq=8, Hkv=1, softcap=5.0, batch_invariant=True, fp8="seq", sinks=True,
                tag="MQA"),
]


@pytest.mark.parametrize("case", KV_CASES, ids=lambda c: c.name.replace(" ", "_"))
def test_fp8_cache_matches_the_oracle_on_the_dequantized_cache(case, device):
    for verdict in case.run(device):
        assert verdict.passed, f"{verdict.what}: max {verdict.max_err:.3e} tol {verdict.tol:.3e} {verdict.note}"


@pytest.mark.parametrize("page", [16, 64, 0])
def test_the_fp8_decode_tile_matches_the_reference(page, device):
    # tables.KVCACHE_DECODE_FP8's tile (128 keys a step in one masked loop, unsplit), which dispatch gives only a GPU's
    # unsplit calls, forced here: pages of 16 (eight a key tile), of 64 (two) and a contiguous cache (0); lengths
    # ending inside a tile, inside a page and on a tile's edge
    B, Hq, Hkv, D, width = 3, 8, 2, 128, 384
    stored, descales, deq = _fp8_contiguous_cache(torch.device("cpu"), B=B, n=width, Hkv=Hkv, D=D, seed=7)
    if page:  # sequence b's rows in its table's pages, shuffled over the pool
        table = shuffled_table(B, width // page, torch.device("cpu"))

        def paged(x):
            pool = torch.empty(B * width // page, page, Hkv, D, dtype=x.dtype)
            pool[table.long().flatten()] = x.reshape(B * width // page, page, Hkv, D)
            return pool
        caches, deq_caches, ref_table = [paged(x) for x in stored], [paged(x) for x in deq], table
    else:
        caches, deq_caches, table = stored, deq, None
        ref_table = torch.arange(B, dtype=torch.int32)[:, None]  # the reference's one page a sequence
    q = torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    seqlens = torch.tensor((300, 129, 256), dtype=torch.int32)
    cu = torch.arange(B + 1, dtype=torch.int32)
    tiles = tables.KVCACHE_DECODE_FP8[128]._replace(block_m=16, merge_rows=4, split_chunk=1, num_splits=1)
    scale = D ** -0.5
    out, lse = lab.attention_kvcache_forward(
        q.to(device), caches[0].to(device), caches[1].to(device), seqlens.to(device),
        None if table is None else table.to(device), cu.to(device), 1, band=Band(0, -1, 0),
        score=Score(scale, None, None, None, *(d.expand(B, Hkv).to(device) for d in descales)), return_lse=True,
        tiles=tiles)  # the launcher's descales: [B, Hkv] (the public layer's form of an [Hkv] one)
    ref, ref_lse = attention_with_kvcache_reference(q.double(), *deq_caches, seqlens, ref_table, cu, scale=scale,
                                                    compute_dtype=torch.float64)
    torch.testing.assert_close(out.double().cpu(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double().cpu(), ref_lse, atol=2e-3, rtol=2e-3)


def _fp8_contiguous_cache(device, B=2, n=40, Hkv=2, D=16, seed=3):
    g = torch.Generator().manual_seed(seed)
    real = [torch.randn(B, n, Hkv, D, generator=g) for _ in range(2)]
    descales = [x.abs().amax((0, 1, 3)) / 448 for x in real]  # [Hkv]
    stored = [e4m3_of(x / d[None, None, :, None]) for x, d in zip(real, descales)]
    deq = [s.double() * d.double()[None, None, :, None] for s, d in zip(stored, descales)]
    return [s.to(device) for s in stored], [d.to(device) for d in descales], deq


def test_fp8_contiguous_cache_is_attention_on_the_dequantized_cache(device):
    # a contiguous [B, max_len, Hkv, D] e4m3 cache, [Hkv] descales, two new queries a sequence
    (kc, vc), (kd, vd), (k_real, v_real) = _fp8_contiguous_cache(device)
    q = torch.randn(2, 2, 4, 16, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to(device)
    lens = torch.tensor([40, 23], dtype=torch.int32, device=device)
    out = vflash.attention_with_kvcache(q, kc, vc, lens, k_descale=kd, v_descale=vd)
    for b, n in enumerate(lens.tolist()):
        ref, _ = attention_explicit(q[b:b + 1].transpose(1, 2).double().cpu(),
                                    k_real[b:b + 1, :n].transpose(1, 2), v_real[b:b + 1, :n].transpose(1, 2),
                                    causal=True, compute_dtype=torch.float64)
        torch.testing.assert_close(out[b:b + 1].transpose(1, 2).double().cpu(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("power", [18, -30])
def test_fp8_cache_under_a_bf16_q_outside_fp16s_range_is_scale_invariant(power, device):
    # the products run in fp16 (q scaled into its range by a power of two): q times 2^power with the softmax
    # scale times 2^-power is the same call, bit for bit, where a plain fp16 q would overflow or flush to zero
    (kc, vc), (kd, vd), _ = _fp8_contiguous_cache(device)
    q = torch.randn(2, 2, 4, 16, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(device)
    lens = torch.tensor([40, 23], dtype=torch.int32, device=device)
    scale = 16 ** -0.5
    ref, ref_lse = vflash.attention_with_kvcache(q, kc, vc, lens, k_descale=kd, v_descale=vd, scale=scale,
                                                 return_lse=True)
    out, lse = vflash.attention_with_kvcache(q * 2.0 ** power, kc, vc, lens, k_descale=kd, v_descale=vd,
                                             scale=scale * 2.0 ** -power, return_lse=True)
    assert torch.isfinite(out).all()
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_write_kvcache_quantizes_as_vllm_bit_for_bit(device):
    # stored = saturate_e4m3(x / descale), round to nearest even: values past 448 x descale clamp to 448
    g = torch.Generator().manual_seed(5)
    kc = torch.zeros(4, 8, 2, 16, dtype=E4M3, device=device)
    vc = torch.zeros_like(kc)
    kn = (torch.randn(5, 2, 16, generator=g) * 3).bfloat16().to(device)
    vn = (torch.randn(5, 2, 16, generator=g) * 300).bfloat16().to(device)
    slots = torch.tensor([0, 9, -1, 31, 17], device=device)
    kd, vd = torch.tensor([0.5, 2.0], device=device), torch.tensor(0.25, device=device)
    vflash.write_kvcache(kc, vc, kn, vn, slots, k_descale=kd, v_descale=vd)
    assert (vn.float() / vd).abs().max() > 448  # some values saturate
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        block, row = divmod(slot, 8)
        want_k = e4m3_of(kn[t].float().cpu() / kd.cpu()[:, None])
        want_v = e4m3_of(vn[t].float().cpu() / vd.cpu())
        assert torch.equal(kc[block, row].cpu().view(torch.uint8), want_k.view(torch.uint8))
        assert torch.equal(vc[block, row].cpu().view(torch.uint8), want_v.view(torch.uint8))
    untouched = torch.ones(4 * 8, dtype=torch.bool)
    untouched[[0, 9, 31, 17]] = False
    assert (kc.view(32, -1)[untouched].float() == 0).all()


@pytest.mark.parametrize("change,error,words", [
    (dict(k_cache="bf16"), TypeError, "both be float8_e4m3fn"),
    (dict(k_descale=torch.ones(3)), ValueError, "[Hkv] = [2]"),
    (dict(k_descale=torch.ones(2, dtype=torch.float64)), TypeError, "float32"),
    (dict(q_fp8=True), TypeError, "float16 / bfloat16 q"),
])
def test_bad_fp8_cache_calls_are_refused(change, error, words, device):
    (kc, vc), (kd, vd), _ = _fp8_contiguous_cache(device)
    q = torch.randn(2, 1, 4, 16).to(torch.bfloat16).to(device)
    lens = torch.tensor([40, 23], dtype=torch.int32, device=device)
    kwargs = dict(k_descale=kd, v_descale=vd)
    if change.get("k_cache") == "bf16":
        kc = kc.float().to(torch.bfloat16)
    for name in ("k_descale",):
        if name in change:
            kwargs[name] = change[name].to(device)
    if change.get("q_fp8"):
        q = q.float().to(E4M3)
    with pytest.raises(error) as info:
        vflash.attention_with_kvcache(q, kc, vc, lens, **kwargs)
    assert words in str(info.value), str(info.value)


def test_cache_descales_apply_to_fp8_caches_only(device):
    kc = torch.randn(2, 8, 2, 16, device=device)
    q = torch.randn(2, 1, 4, 16, device=device)
    lens = torch.full((2,), 8, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="apply to FP8"):
        vflash.attention_with_kvcache(q, kc, kc, lens, k_descale=torch.ones((), device=device))
    with pytest.raises(ValueError, match="apply to FP8"):
        vflash.write_kvcache(kc, kc.clone(), kc[0], kc[0], torch.arange(8, device=device),
                             v_descale=torch.ones((), device=device))
