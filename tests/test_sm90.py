"""The Gluon sm90 kernel: it builds for sm_90 with the installed Triton (no GPU
needed), the launcher only hands it tensors TMA can address, and on an H200 it
matches the fp64 oracle on every head dim and feature it serves."""

import itertools
import re

import pytest
import torch
from _sm90 import needs_sm90

from vflash.harness.cases import Case
from vflash.dispatch import tables
from vflash.kernels import attention_fwd_sm90 as sm90_kernels
from vflash.ops import attention as ops
from vflash.ops import sm90, tma
from vflash._validate import mask_band
from vflash.call import Band
from vflash.ops.tiles import CONSUMER_REGS, CONSUMER_ROWS, Sm90Tiles
from vflash.call import Score

needs_gluon = pytest.mark.skipif(not sm90_kernels.HAVE_GLUON, reason="this Triton has no Gluon")


@pytest.mark.slow
@needs_gluon
def test_kernel_compiles_for_sm90(tmp_path, monkeypatch):
    # Gluon does not run under the interpreter, but it compiles for sm_90 on any
    # machine: in this process, since vflash leaves Triton's mode alone; ptxas
    # (shipped with Triton) turns the PTX into a cubin.
    import re
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    variants = [
        # three consumers taking turns, P carried in fp32
        dict(head_dim=64, tiles=Sm90Tiles(192, 128, 2, pingpong=True, p_fp32=True), right_edge=True),
        dict(head_dim=128, dtype=torch.bfloat16, left_edge=True, softcap=True, lse=False,
             tiles=Sm90Tiles(128, 128, 2, q_buffers=2, late_pv_wait=True, lazy_rescale=True)),
        dict(head_dim=256, tiles=Sm90Tiles(128, 64, 2)),
        # one consumer, two or three CTAs an SM (SM90_SHORT_CAUSAL, SM90_FEW_TILES): a
        # half or a third of the register file each
        dict(head_dim=128, tiles=Sm90Tiles(64, 64, 2, q_buffers=2, ctas_per_sm=2), right_edge=True),
        dict(head_dim=64, tiles=Sm90Tiles(64, 128, 2, q_buffers=2, p_fp32=True, lazy_rescale=True, ctas_per_sm=2),
             right_edge=True),
        dict(head_dim=64, tiles=Sm90Tiles(64, 64, 2, q_buffers=2, p_fp32=True, lazy_rescale=True, ctas_per_sm=3),
             right_edge=True),
        # work tiles drawn from a counter: one atomic add a tile, in the producer only
        dict(head_dim=128, tiles=Sm90Tiles(128, 128, 2, dynamic=True), right_edge=True),
        # packed sequences (IS_VARLEN): cu_seqlens loads, and the masked store of a slab that
        # crosses a sequence's end beside the TMA store
        dict(head_dim=128, tiles=Sm90Tiles(128, 128, 2, dynamic=True), right_edge=True, varlen=True),
        dict(head_dim=64, tiles=Sm90Tiles(192, 128, 2, q_buffers=2, pingpong=True, lazy_rescale=True),
             varlen=True, top_left=True, left_edge=True, softcap=True),
        # keys from a KV cache: paged (16-row copies, the table read per copy) and contiguous
        dict(head_dim=128, tiles=Sm90Tiles(128, 128, 2, dynamic=True), right_edge=True, varlen=True,
             kv_cache=True, page_size=16),
        dict(head_dim=64, tiles=Sm90Tiles(192, 128, 2, q_buffers=2), varlen=True, kv_cache=True),
        # attention sinks: each consumer reads its head's sink for its rows' finish (dense, and a paged cache)
        dict(head_dim=64, tiles=Sm90Tiles(128, 128, 2), right_edge=True, sinks=True),
        dict(head_dim=128, tiles=Sm90Tiles(128, 128, 2, dynamic=True), right_edge=True, varlen=True,
             kv_cache=True, page_size=16, sinks=True),
    ]
    for kw in variants:
        k = sm90.compile_sm90(**kw)
        t = kw["tiles"]
        ptx = k.asm["ptx"]
        assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor.4d" in ptx, kw
        # the consumers' register share, as the table gives it for their count and CTAs an SM,
        # and the thread cap that shares the file between the CTAs
        regs = CONSUMER_REGS[(t.block_m // CONSUMER_ROWS, t.ctas_per_sm)]
        assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{regs};", ptx), kw
        if t.ctas_per_sm > 1:
            assert re.search(rf"\.maxnreg {sm90.launch_options(64, t.ctas_per_sm)['maxnreg']}\b", ptx), kw
        assert ("atom.global" in ptx) == t.dynamic, kw
        # the output goes out by TMA; varlen adds the masked pointer store beside it
        assert "cp.async.bulk.tensor.4d.global.shared" in ptx, kw
        if kw.get("page_size"):  # 128-key tiles in eight 16-row copies each, or one for a run of pages, K and V
            assert ptx.count("cp.async.bulk.tensor.4d.shared") >= 18, kw
        if kw.get("varlen"):
            dense = sm90.compile_sm90(**dict(kw, varlen=False, top_left=False, kv_cache=False,
                                               page_size=0)).asm["ptx"]
            assert ptx.count("st.global") > dense.count("st.global"), kw
        if kw.get("sinks"):  # one more global load than the same build without: the head's sink
            plain = sm90.compile_sm90(**dict(kw, sinks=False)).asm["ptx"]
            assert ptx.count("ld.global") > plain.count("ld.global"), kw
        assert len(k.asm["cubin"]) > 0, kw


@pytest.mark.slow
@needs_gluon
def test_fp8_build_compiles_for_sm90(tmp_path, monkeypatch):
    # e4m3 q, k, v: both products are e4m3 wgmmas (K 32) from shared memory (P through a shared buffer, V's
    # tiles keys-contiguous), the descales read per work tile, the bf16 output stored through pointers (no
    # TMA store: the e4m3 Q buffer cannot stage it)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    for kw in (dict(head_dim=128, tiles=Sm90Tiles(128, 128, 2, q_buffers=2)),
               dict(head_dim=128, head_dim_v=64, tiles=Sm90Tiles(128, 128, 2, q_buffers=2)),
               dict(head_dim=128, tiles=Sm90Tiles(128, 128, 2, q_buffers=2, p_shared=True)),
               dict(head_dim=64, tiles=Sm90Tiles(128, 128, 2, dynamic=True), right_edge=True, varlen=True)):
        ptx = sm90.compile_sm90(dtype=torch.float8_e4m3fn, **kw).asm["ptx"]
        assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3", ptx), kw
        assert "cp.async.bulk.tensor.4d.global.shared" not in ptx and "st.global" in ptx, kw
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx, kw  # P rounded to e4m3
        # P from registers: PV wgmmas with a four-register A operand; P_SHARED: P's stores to shared memory
        register_a = re.search(r"wgmma\.mma_async[^\n]*e4m3\.e4m3 \{[^}]*\}, \{%r\d+,%r\d+,%r\d+,%r\d+\}", ptx)
        assert bool(register_a) != kw["tiles"].p_shared, kw


@pytest.mark.slow
@needs_gluon
def test_a_v_head_dim_of_its_own_compiles_for_sm90(tmp_path, monkeypatch):
    # v (and the output) narrower than q / k: the PV wgmma's N is v's width, the output through pointers (the Q
    # buffer is q's width), dense and packed; q / k of 192 columns in three 64-column parts (three TMA copies
    # each, 12 k-steps a QK product)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    for kw in (dict(head_dim=128, head_dim_v=64, tiles=Sm90Tiles(128, 128, 2, q_buffers=2)),
               dict(head_dim=256, head_dim_v=128, tiles=Sm90Tiles(128, 64, 2, dynamic=True), right_edge=True,
                    varlen=True),
               dict(head_dim=192, head_dim_v=128, tiles=Sm90Tiles(128, 128, 2), right_edge=True)):
        ptx = sm90.compile_sm90(**kw).asm["ptx"]
        widths = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx))
        assert widths == {str(kw["tiles"].block_n), str(kw["head_dim_v"])}, (kw, widths)
        assert "cp.async.bulk.tensor.4d.global.shared" not in ptx and "st.global" in ptx, kw
        if kw["head_dim"] == 192:  # Q's and K's parts: per work tile 2 consumers x 3 Q copies, per key tile 3 + V's
            assert ptx.count("cp.async.bulk.tensor.4d.shared") >= 2 * 3 + 3 + 1, kw


def test_grid_persistence_and_stride():
    # Three entries always: launch plans index grid[0..2] (an H200 run failed on (x,)).
    assert sm90.grid(2, 8, 1000, 128, 132, right_edge=False) == (128, 1, 1)  # 2 * 8 * 8 work tiles
    assert sm90.grid(4, 16, 4096, 128, 132, right_edge=False) == (132, 1, 1)
    assert sm90.grid(4, 16, 4096, 128, 132, right_edge=True) == (4 * 16 * 32, 1, 1)  # 64 heads < 131
    assert sm90.grid(1, 2, 1000, 192, 132, right_edge=True) == (2 * 6, 1, 1)  # three consumers: 192 rows
    # Causal with enough heads: persistent, a stride coprime with the row blocks per head.
    assert sm90.grid(32, 16, 512, 128, 132, right_edge=True) == (131, 1, 1)  # 4 row blocks
    assert sm90.grid(32, 16, 512, 128, 133, right_edge=True) == (133, 1, 1)  # 133 = 7 * 19 shares nothing with 4
    assert sm90.grid(64, 4, 640, 128, 130, right_edge=True) == (129, 1, 1)  # 5 row blocks: 130 shares 5
    assert sm90.grid(3, 64, 66 * 128, 128, 132, right_edge=True) == (131, 1, 1)  # 66 row blocks
    assert sm90.grid(1, 129, 640, 128, 130, right_edge=True) == (129, 1, 1)  # heads == stride: each CTA sees 5 tiles
    assert sm90.grid(1, 128, 640, 128, 130, right_edge=True) == (128 * 5, 1, 1)  # fewer heads: one CTA per tile
    # One consumer a CTA (64 rows): two or three CTAs an SM.
    assert sm90.grid(2, 4, 4096, 64, 132, right_edge=False, ctas_per_sm=2) == (264, 1, 1)  # 512 work tiles
    assert sm90.grid(32, 16, 512, 64, 132, right_edge=True, ctas_per_sm=2) == (263, 1, 1)  # 8 row blocks: <= 264
    assert sm90.grid(2, 4, 4096, 64, 132, right_edge=False, ctas_per_sm=3) == (396, 1, 1)
    assert sm90.grid(32, 16, 512, 64, 132, right_edge=True, ctas_per_sm=3) == (395, 1, 1)  # 396 shares 2 with 8
    # Work tiles drawn from a counter: one CTA an SM slot, whatever the mask.
    assert sm90.grid(4, 16, 4096, 128, 132, right_edge=True, dynamic=True) == (132, 1, 1)
    assert sm90.grid(1, 1, 256, 128, 132, right_edge=True, dynamic=True) == (2, 1, 1)
    assert sm90.launch_options(64, 2) == dict(num_warps=4, maxnreg=128)
    assert sm90.launch_options(128) == dict(num_warps=4)
    assert sm90.launch_options(64, 3) == dict(num_warps=4, maxnreg=80)  # 85 a thread, down to 8s


def test_tma_ready_needs_aligned_strides_and_unit_last_stride():
    x = torch.randn(2, 4, 10, 64, dtype=torch.float16)
    assert tma.tma_ready(x)
    assert tma.tma_ready(x.transpose(1, 2))  # [B, N, H, D] view: strides stay multiples of 8 elements
    assert tma.tma_ready(x[..., :56])  # a sliced view keeps 128-byte rows
    assert not tma.tma_ready(torch.randn(2, 4, 10, 60, dtype=torch.float16))  # 120-byte rows
    assert not tma.tma_ready(x.transpose(2, 3))  # last stride not 1
    shifted = torch.randn(x.numel() + 1, dtype=torch.float16)[1:].view(2, 4, 10, 64)
    assert not tma.tma_ready(shifted)  # base 2 bytes off 16


@needs_gluon
def test_descriptors_equal_the_checked_constructor():
    # prepare() fills TensorDescriptor's fields directly (its checks cost ~20 us a
    # call); the result must be what the checked constructor makes.
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    q = torch.randn(2, 8, 300, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 300, 2, 128, dtype=torch.bfloat16).transpose(1, 2)
    out = torch.empty(2, 8, 300, 128, dtype=torch.bfloat16)
    rows_of, keys_of = tma.describers(64, 128, torch.bfloat16)
    got = (rows_of(q), keys_of(k), keys_of(k), rows_of(out))
    rows, keys = [1, 1, 64, 128], [1, 1, 64, 128]
    for d, t, block in zip(got, (q, k, k, out), (rows, keys, keys, rows)):
        layout = tma.shared_layout(tuple(block), torch.bfloat16)
        assert d == TensorDescriptor(t, t.shape, t.stride(), block, layout)


@needs_gluon
@pytest.mark.parametrize("dynamic", [False, True])
def test_build_follows_the_signature_and_declares_its_slots(dynamic):
    names = sm90_kernels.attention_fwd_sm90_kernel.arg_names
    q = torch.randn(3, 8, 100, 128, dtype=torch.float16)
    k = torch.randn(3, 2, 200, 128, dtype=torch.float16)
    out = torch.empty_like(q)
    counter = torch.zeros(1, dtype=torch.int32) if dynamic else None
    tiles = Sm90Tiles(128, 128, 2, q_buffers=2, dynamic=dynamic)
    launch = sm90.build(q, k, k, out, None, counter, Band(100, -1, 0), Score(0.125, None), tiles, 132)
    by_name = dict(zip(names, launch.params()))
    assert len(launch.params()) == len(names)
    assert by_name["LSE"] is out and by_name["kv_group"] == 4 and by_name["band"][0] == 100
    assert (by_name["tile_counter"] is counter) and launch.constexprs["DYNAMIC"] == dynamic
    assert by_name["batch"] == 3 and by_name["n_heads_q"] == 8 and by_name["q_desc"].base is q
    assert launch.constexprs["HAS_RIGHT"] and not launch.constexprs["HAS_LEFT"] and not launch.constexprs["STORE_LSE"]
    assert launch.constexprs["Q_BUFFERS"] == 2
    assert by_name["scales"][0] == pytest.approx(0.125 * 1.4426950408889634)
    # the per-call arguments: the four descriptors, LSE (out's pointer when there is none), the counter
    slots = [(s.position, s.name, s.describe is not None) for s in launch.slots]
    assert slots == [(0, "q", True), (1, "k", True), (2, "v", True), (3, "out", True), (4, "out", False)] + \
        ([(5, "tile_counter", False)] if dynamic else [])
    assert launch.grid == sm90.grid(3, 8, 100, 128, 132, True, 1, dynamic)


@needs_gluon
def test_varlen_build_covers_heads_first_views_and_declares_its_slots():
    # packed [total, H, D] tensors: descriptors over [1, H, total, D] views of the same
    # memory, the longest sequence's rows as n_q, the packed rows as LSE's head stride
    q = torch.randn(700, 8, 128, dtype=torch.float16)
    k = torch.randn(900, 2, 128, dtype=torch.float16)
    out, lse = torch.empty_like(q), torch.empty(8, 700)
    cu_q = torch.tensor([0, 300, 300, 700], dtype=torch.int32)
    cu_k = torch.tensor([0, 500, 600, 900], dtype=torch.int32)
    tiles = Sm90Tiles(128, 128, 2)
    launch = sm90.build(q, k, k, out, lse, None, Band(0, -1, 0), Score(0.125, None), tiles, 132,
                          varlen=(cu_q, cu_k, 400, True))
    names = sm90_kernels.attention_fwd_sm90_kernel.arg_names
    by_name = dict(zip(names, launch.params()))
    assert len(launch.params()) == len(names)
    qd = by_name["q_desc"]
    assert qd.shape == (1, 8, 700, 128) and qd.base.data_ptr() == q.data_ptr() and qd.strides[2] == 8 * 128
    assert by_name["k_desc"].shape == (1, 2, 900, 128) and by_name["o_desc"].base.data_ptr() == out.data_ptr()
    assert by_name["batch"] == 3 and by_name["n_q"] == 400 and by_name["total_q"] == 700
    assert by_name["o_strides"] == (8 * 128, 128) and by_name["Out"] is out
    assert by_name["cu_seqlens_q"] is cu_q and by_name["cu_seqlens_k"] is cu_k and by_name["LSE"] is lse
    assert launch.constexprs["IS_VARLEN"] and launch.constexprs["TOP_LEFT"]
    assert [(s.position, s.name) for s in launch.slots] == [(0, "q"), (1, "k"), (2, "v"), (3, "out"),
                                                            (6, "cu_seqlens_q"), (7, "cu_seqlens_k"), (8, "out"),
                                                            (4, "lse")]
    assert launch.slots[0].describe(q).shape == (1, 8, 700, 128)
    assert launch.grid == sm90.grid(3, 8, 400, 128, 132, True)


@needs_gluon
@pytest.mark.parametrize("total", [4962, 700])
def test_fp8_varlen_descriptors_take_only_strides_tma_takes(total):
    # TMA refuses a descriptor with a stride that is no multiple of 16 bytes, even a unit dim's (the GPU
    # said "Failed to create tensor map descriptor" for FP8's V, keys contiguous, at 4962 packed rows):
    # every stride but the last, in bytes, and the base
    e4m3 = torch.float8_e4m3fn
    q = torch.randn(total, 8, 64).to(e4m3)
    k = torch.randn(total, 2, 64).to(e4m3)
    cu = torch.tensor([0, 1000, total], dtype=torch.int32)
    v = tma.sm90_e4m3_values(torch.randn(total, 2, 64).to(e4m3), cu, 128, run=False)  # the layout, not the copy
    out, lse = torch.empty(total, 8, 64, dtype=torch.bfloat16), torch.empty(8, total)
    score = Score(0.125, None, None, torch.ones(2, 2), torch.ones(()), None)
    launch = sm90.build(q, k, v, out, lse, None, Band(0, -1, 0), score, Sm90Tiles(128, 128, 2), 132,
                        varlen=(cu, cu, total - 1000, True))
    names = sm90_kernels.attention_fwd_sm90_kernel.arg_names
    descriptors = {n: a for n, a in zip(names, launch.params()) if hasattr(a, "strides")}
    assert {"q_desc", "k_desc", "v_desc", "o_desc"} <= set(descriptors)
    for name, d in descriptors.items():
        size = d.base.element_size()
        assert d.base.data_ptr() % 16 == 0 and d.strides[-1] == 1, name
        assert all(stride * size % 16 == 0 for stride in d.strides[:-1]), (name, d.strides)
    rows = -(-total // 128) * 128 + 2 * 128  # each sequence from a tile multiple (sm90_e4m3_values)
    assert descriptors["v_desc"].shape == (1, 2, 64, rows)  # [1, Hkv, D, rows]: keys last


def _operand_order(p):
    # the sm90 FP8 build's _p_operand: P [rows, N] in the score accumulator's order relabelled as the e4m3
    # operand (each 16-key group's columns reshaped and permuted, no value moved between threads)
    rows, n = p.shape
    return p.reshape(rows, n // 16, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(rows, n)


@pytest.mark.parametrize("shape", [(2, 3, 40, 64), (1, 2, 16, 32), (37, 2, 64), (16, 3, 128)])
def test_fp8_v_keys_contiguous_is_v_with_the_keys_last_and_zeros_past_them(shape, device):
    # the portable FP8 kernel's V (ops.tma.keys_contiguous, kernels/layout.py's copy without the permutation):
    # the same values in v's dims, keys contiguous and padded to 16 with zeros, the other strides TMA-ready;
    # dense [B, H, N, D] (keys 2) and packed [total, H, D] (keys 0), v strided too
    keys = 2 if len(shape) == 4 else 0
    v = (torch.rand(*shape[:-1], 2 * shape[-1]) + 0.5).to(torch.float8_e4m3fn).to(device)[..., ::2]  # strided
    copy = tma.keys_contiguous(v, keys)
    assert copy.shape == v.shape and tma.keys_ready(copy, keys) and torch.equal(copy.float(), v.float())
    n = shape[keys]
    padded = copy.transpose(keys, -1)  # [..., D, N]: the pad is the storage past N in each row
    whole = torch.as_strided(padded, padded.shape[:-1] + (-(-n // 16) * 16,), padded.stride())
    assert (whole[..., n:].float() == 0).all()
    with pytest.raises(ValueError, match="keys 2"):
        tma.keys_contiguous(v, 1)


def test_fp8_v_in_the_operand_order_makes_the_relabelled_p_v_exact(device):
    # dense V [B, H, N, D] -> keys contiguous, each 16-key group in E4M3_KEY_ORDER, zeros past N: the
    # relabelled P times that V is P.V (N 40: a part group, whose padded keys P's zeros meet)
    v = (torch.rand(1, 2, 40, 64) + 0.5).to(torch.float8_e4m3fn)
    copy = tma.sm90_e4m3_values(v.to(device)).cpu()
    assert tma.keys_ready(copy, 2) and copy.shape == (1, 2, 48, 64)
    p = torch.rand(8, 48)
    p[:, 40:] = 0  # keys past N: masked
    for h in range(2):
        assert torch.allclose(_operand_order(p) @ copy[0, h].float(), p[:, :40] @ v[0, h].float(), atol=1e-5)


@pytest.mark.parametrize("block_n", [16, 48, 64, 128])
def test_fp8_packed_v_starts_each_sequence_at_a_key_tile_multiple_with_zeros_between(block_n, device):
    # TMA takes V's innermost coordinate (a key, FP8's V keys-contiguous) only at 16-byte multiples, which
    # packed sequences' starts are not (the H100 stopped with an illegal instruction): the sm90 FP8 varlen build
    # reads sequence b's keys from the kernel's tile_aligned_start (written out here), in the operand order,
    # zeros past each end
    lens = [1000, 1, 0, 127, 128, 129, 3]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    v = (torch.rand(int(cu[-1]), 2, 64) + 0.5).to(torch.float8_e4m3fn)  # no zeros among the values
    copy = tma.sm90_e4m3_values(v.to(device), cu.to(device), block_n)
    assert tma.keys_ready(copy, 0)
    copy = copy.cpu()
    expected = torch.zeros(-(-int(cu[-1]) // block_n) * block_n + len(lens) * block_n, 2, 64)
    ends = []
    for b, n in enumerate(lens):
        start = -(-int(cu[b]) // block_n) * block_n + b * block_n
        assert start % block_n == 0 and all(start >= end for end in ends)  # no sequence's tiles overlap another's
        ends.append(start + -(-n // block_n) * block_n)
        for key in range(n):
            row = start + key // 16 * 16 + tma.E4M3_KEY_ORDER.index(key % 16)
            expected[row] = v[int(cu[b]) + key].float()
    assert torch.equal(copy.float(), expected)
    with pytest.raises(ValueError, match="multiples of 16"):
        tma.sm90_e4m3_values(v.to(device), cu.to(device), 40)


@needs_gluon
@pytest.mark.parametrize("page", [0, 16, 256])
def test_kv_cache_build_covers_the_cache_as_rows(page):
    # chunked prefill: packed queries with cu_seqlens_q, keys from the cache viewed as
    # [1, Hkv, rows, D] in copies of min(page, block_n) rows (paged) or block_n (contiguous)
    q = torch.randn(600, 8, 128, dtype=torch.bfloat16)
    if page:
        k = torch.randn(40, page, 2, 128, dtype=torch.bfloat16)
        table = torch.randint(0, 40, (3, 20), dtype=torch.int32)
    else:
        k, table = torch.randn(3, 1000, 2, 128, dtype=torch.bfloat16), None
    out, seqlens = torch.empty_like(q), torch.tensor([900, 10, 300], dtype=torch.int32)
    cu_q = torch.tensor([0, 500, 510, 600], dtype=torch.int32)
    tiles = Sm90Tiles(128, 128, 2)
    launch = sm90.build(q, k, k, out, None, None, Band(0, -1, 0), Score(0.125, None), tiles, 132,
                          varlen=(cu_q, None, 500, False), cache=(seqlens, table))
    names = sm90_kernels.attention_fwd_sm90_kernel.arg_names
    assert len(launch.params()) == len(names)
    by_name = dict(zip(names, launch.params()))
    rows = k.shape[0] * k.shape[1]
    assert by_name["k_desc"].shape == (1, 2, rows, 128) and by_name["k_desc"].base.data_ptr() == k.data_ptr()
    assert by_name["k_desc"].block_shape == [1, 1, min(page, 128) if page else 128, 128]
    runs = 0 < page < 128  # pages shorter than a tile: a run of them in one copy, blocks of the tile's rows
    for name in ("kt_desc", "vt_desc"):
        d = by_name[name]
        assert (d is None) != runs and (not runs or (d.block_shape == [1, 1, 128, 128] and d.shape == (1, 2, rows, 128)
                                                     and d.base.data_ptr() == k.data_ptr()))
    assert by_name["cache_seqlens"] is seqlens and by_name["block_table"] is table
    assert by_name["cu_seqlens_k"] is None and by_name["batch"] == 3 and by_name["kv_group"] == 4
    assert by_name["kv_seq_rows"] == (0 if page else 1000) and by_name["table_stride"] == (20 if page else 0)
    assert launch.constexprs["KV_CACHE"] and launch.constexprs["PAGE_SIZE"] == page
    names_by_slot = {s.position: s.name for s in launch.slots}
    assert names_by_slot[1] == "k_cache" and names_by_slot[9] == "cache_seqlens" and names_by_slot[2] == "v_cache"
    assert (names_by_slot.get(10) == "block_table") == bool(page)
    assert (names_by_slot.get(11), names_by_slot.get(12)) == (("k_cache", "v_cache") if runs else (None, None))
    assert tma.pages_fit(16, 128) and tma.pages_fit(256, 64) and not tma.pages_fit(17, 128)
    assert not tma.pages_fit(8, 128) and tma.cache_ready(k) and tma.cache_ready(k[:, ::2])
    assert not tma.cache_ready(k[:, : k.shape[1] // 2])  # rows of a page cut short: they do not merge
    if page:  # the launcher refuses what dispatch would not hand it
        odd = torch.randn(40, 17, 2, 128, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="power-of-two pages"):
            sm90.build(q, odd, odd, out, None, None, Band(0, -1, 0), Score(0.125, None), tiles, 132,
                         varlen=(cu_q, None, 500, False), cache=(seqlens, table))
        short = torch.randn(40, 2 * page, 2, 128, dtype=torch.bfloat16)[:, :page]  # pages spaced apart
        with pytest.raises(ValueError, match="merge into rows"):
            sm90.build(q, short, short, out, None, None, Band(0, -1, 0), Score(0.125, None), tiles, 132,
                         varlen=(cu_q, None, 500, False), cache=(seqlens, table))


def _sm90_cases():
    cases = []
    for d in sorted({d for d, _ in tables.SM90 if d & (d - 1) == 0}):  # 192 only beside a v of its own (below)
        cases += [
            Case(B=2, Hq=4, Hkv=4, Nq=1, Nk=1, D=d),
            Case(B=2, Hq=4, Hkv=2, Nq=300, Nk=333, D=d, dtype="bf16"),
            Case(B=2, Hq=8, Hkv=2, Nq=777, Nk=777, D=d, layout="bnhd", causal=True),
            Case(B=1, Hq=4, Hkv=1, Nq=129, Nk=1037, D=d, causal=True),
            Case(B=1, Hq=4, Hkv=4, Nq=1037, Nk=129, D=d, causal="top_left"),
            Case(B=1, Hq=4, Hkv=4, Nq=1024, Nk=300, D=d, causal=True, tag="fully masked rows"),
            Case(B=1, Hq=4, Hkv=4, Nq=1024, Nk=300, D=d, causal=True, sinks=True, tag="fully masked rows"),
            # Causal on a persistent grid (160 heads >= the coprime stride), with
            # work tiles that see no key among each CTA's tiles.
            Case(B=4, Hq=40, Hkv=8, Nq=512, Nk=200, D=d, causal=True, tag="persistent causal, empty tiles"),
            Case(B=2, Hq=4, Hkv=2, Nq=1000, Nk=1100, D=d, window=(128, 0)),
            Case(B=2, Hq=4, Hkv=2, Nq=1000, Nk=1100, D=d, window=(0, 0), causal=True),
            Case(B=2, Hq=4, Hkv=4, Nq=600, Nk=600, D=d, softcap=30.0, amplify=4.0, causal=True),
            Case(B=1, Hq=4, Hkv=4, Nq=4096, Nk=4096, D=d, dtype="bf16", amplify=4.0, tag="long"),
            # More work tiles than SMs: persistent CTAs carry the K/V ring and Q
            # buffers from one work tile to the next.
            Case(B=2, Hq=8, Hkv=2, Nq=2000, Nk=2100, D=d, tag="persistent"),
            Case(B=4, Hq=8, Hkv=8, Nq=1500, Nk=1500, D=d, window=(300, -1), dtype="bf16", tag="persistent"),
        ]
    for d, dv in ((192, 128), (128, 64), (256, 128)):  # a v head dim of its own (DeepSeek's 192 / 128)
        cases += [
            Case(B=2, Hq=4, Hkv=2, Nq=300, Nk=333, D=d, Dv=dv, dtype="bf16"),
            Case(B=2, Hq=8, Hkv=2, Nq=777, Nk=777, D=d, Dv=dv, causal=True),
            Case(B=1, Hq=4, Hkv=4, Nq=1024, Nk=300, D=d, Dv=dv, causal=True, sinks=True, tag="fully masked rows"),
            Case(B=2, Hq=8, Hkv=2, Nq=2000, Nk=2100, D=d, Dv=dv, tag="persistent"),
        ]
    return cases


def _schedules(d):
    # Every Q-buffer count a head dim has room for, each with the table's switches
    # (no right edge) and with PINGPONG, P_FP32 and LATE_PV_WAIT, one at a time,
    # flipped; LAZY_RESCALE flipped with the table's Q buffers only (it touches no buffer).
    t = tables.SM90[(d, False)]
    base = (t.pingpong, t.p_fp32, t.late_pv_wait, t.lazy_rescale)
    flip = lambda k: tuple(not x if i == k else x for i, x in enumerate(base))  # noqa: E731
    return ([(qb, *f) for qb in range(1, t.q_buffers + 1) for f in [base, flip(0), flip(1), flip(2)]]
            + [(t.q_buffers, *flip(3))])


def _assert_case_with(case, tiles):
    # The case through the launcher with the sm90 kernel's tiles and switches forced to `tiles`.
    def attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, sinks=None, return_lse=False):
        assert all(map(tma.tma_ready, (q, k, v)))
        mode = {False: None, True: "bottom_right"}.get(causal, causal)
        band = mask_band(q.shape[2], k.shape[2], mode, window or (-1, -1))
        score = Score(q.shape[-1] ** -0.5 if scale is None else scale, softcap, sinks)
        return ops.attention_forward(q, k, v, band=band, score=score, return_lse=return_lse, tiles=tiles, kernel="sm90")
    for v in case.run(torch.device("cuda"), attention):
        assert v.passed, f"{case.name}: {v.what} max err {v.max_err:.3e} > tol {v.tol:.3e} {v.note}"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case,q_buffers,pingpong,p_fp32,late_pv_wait,lazy_rescale", [
    pytest.param(c, qb, pp, p32, late, lazy, id=f"{c.name.replace(' ', '_')}-q{qb}{'-pp' if pp else ''}"
                                                f"{'-p32' if p32 else ''}{'-late' if late else ''}"
                                                f"{'-lazy' if lazy else ''}")
    for c in _sm90_cases() for qb, pp, p32, late, lazy in _schedules(c.D)])
def test_gpu_hopper_kernel_matches_the_oracle(case, q_buffers, pingpong, p_fp32, late_pv_wait, lazy_rescale):
    _assert_case_with(case, tables.SM90[(case.D, False)]._replace(
        q_buffers=q_buffers, pingpong=pingpong, p_fp32=p_fp32, late_pv_wait=late_pv_wait, lazy_rescale=lazy_rescale))


def _band_tiles(d):
    few = [t for (dim, _), t in tables.SM90_FEW_TILES.items() if dim == d]
    return [b.tiles for b in tables.SM90_SHORT_CAUSAL.get(d, ())] + few


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name.replace(" ", "_")) for c in _sm90_cases()
                                  if _band_tiles(c.D)])
def test_gpu_hopper_band_tiles_match_the_oracle(case):
    # SM90_SHORT_CAUSAL's bands' and SM90_FEW_TILES' tiles (one consumer and
    # two or three CTAs an SM; DYNAMIC where the band has it) on every case of the
    # head dim, whatever its mask, with one Q buffer and with two: the kernel must
    # be right for any.
    for tiles in _band_tiles(case.D):
        for q_buffers in (1, 2):
            _assert_case_with(case, tiles._replace(q_buffers=q_buffers))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name.replace(" ", "_")) for c in _sm90_cases()])
def test_gpu_hopper_dynamic_tiles_match_the_oracle(case):
    # DYNAMIC (work tiles drawn from a counter) on every case, whatever its mask, with
    # the launcher's switches for a right edge and one and two Q buffers; each launch
    # takes a fresh counter, so a second run of a case is as right as the first.
    tiles = tables.SM90[(case.D, True)]._replace(dynamic=True)
    for q_buffers in range(1, tables.SM90[(case.D, False)].q_buffers + 1):
        _assert_case_with(case, tiles._replace(q_buffers=q_buffers))

