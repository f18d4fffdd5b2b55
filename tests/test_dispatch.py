"""vflash.dispatch: the kernel and tiles a call gets, pinned on representative
shapes (an H200: sm_90, 132 SMs), the override, and the refusals."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from vflash import dispatch
from vflash.dispatch import Problem, select, tables
from vflash.dispatch import rules as select_module
from vflash.ops import sm90
from vflash.call import Band, Call, Score
from vflash.ops.tiles import CONSUMER_REGS, CONSUMER_ROWS, Sm90Tiles, KVCacheTiles, PortableTiles

CUDA = torch.device("cuda", 0)
H = torch.float16


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(select_module, "_sm90", lambda index: (True, 132))
    monkeypatch.setattr(select_module, "HAVE_GLUON", True)
    monkeypatch.setattr(select_module, "FORCED", None)


def problem(d, causal, n, bh, dtype=H, device=CUDA, tma=True, window_left=-1):
    return Problem(dtype, d, 1, bh, n, n, Band(0, window_left, 0 if causal else -1), device, tma)


@pytest.mark.parametrize("d,causal,n,bh,kernel,tiles", [
    # D = 128: the sm90 kernel at every length
    (128, False, 4096, 32, "sm90", Sm90Tiles(128, 128, 2, q_buffers=2, lazy_rescale=True)),
    (128, True, 16384, 32, "sm90", Sm90Tiles(128, 128, 2, q_buffers=1, dynamic=True)),
    (128, True, 512, 512, "sm90", Sm90Tiles(64, 64, 2, q_buffers=2, ctas_per_sm=2)),  # short causal band
    (128, True, 1024, 512, "sm90", Sm90Tiles(128, 128, 2, q_buffers=2, dynamic=True)),  # second band
    (128, True, 1024, 16, "sm90", Sm90Tiles(128, 128, 2, q_buffers=2)),  # 128 work tiles <= 132: static grid
    (128, True, 2049, 512, "sm90", Sm90Tiles(128, 128, 2, q_buffers=1, dynamic=True)),  # past the bands
    # D = 64: from N 512 (causal 1024), with enough waves of 192-row tiles, else the few-tile tiles
    (64, False, 4096, 32, "sm90", Sm90Tiles(192, 128, 2, q_buffers=2, pingpong=True, lazy_rescale=True)),
    (64, False, 2048, 16, "sm90", Sm90Tiles(64, 128, 2, q_buffers=2, lazy_rescale=True, ctas_per_sm=2)),
    (64, True, 2048, 16, "sm90", Sm90Tiles(64, 128, 2, q_buffers=2, p_fp32=True, lazy_rescale=True,
                                             ctas_per_sm=2)),
    (64, True, 1024, 512, "sm90", Sm90Tiles(64, 64, 2, q_buffers=2, p_fp32=True, lazy_rescale=True,
                                              ctas_per_sm=3, dynamic=True)),
    (64, True, 16384, 32, "sm90", Sm90Tiles(192, 128, 2, q_buffers=1, pingpong=True, p_fp32=True,
                                              lazy_rescale=True, dynamic=True)),
    (64, False, 256, 512, "portable", PortableTiles(128, 64, 8, 3)),  # under 512 rows: portable
    (64, True, 512, 512, "portable", PortableTiles(64, 64, 4, 3)),  # short causal, portable's short tiles
    # D = 256
    (256, True, 4096, 16, "sm90", Sm90Tiles(128, 64, 2, q_buffers=1, dynamic=True)),
    (256, False, 4096, 16, "sm90", Sm90Tiles(128, 64, 2, q_buffers=1)),
    # head dims without Hopper tiles: the portable kernel's, by padded head dim
    (96, False, 4096, 32, "portable", PortableTiles(256, 64, 8, 3, split=True)),  # 512 programs >= 132
    (96, False, 2048, 8, "portable", PortableTiles(128, 128, 8, 3)),  # 64 split programs < 132 SMs
    (32, True, 16384, 32, "portable", PortableTiles(128, 64, 8, 3)),
    (120, True, 16384, 16, "portable", PortableTiles(128, 128, 8, 3)),  # long causal: the plain tiles
    (120, True, 4096, 16, "portable", PortableTiles(64, 64, 4, 3)),  # 512 programs: under 4 waves
])
def test_select_pins_the_choice(h200, d, causal, n, bh, kernel, tiles):
    choice = select(problem(d, causal, n, bh))
    assert (choice.kernel, choice.tiles) == (kernel, tiles), choice.why
    assert choice.why.startswith(f"{kernel} kernel")


def test_select_fp32_cpu_and_no_tma_take_the_portable_kernel(h200, monkeypatch):
    assert select(problem(128, False, 4096, 32, dtype=torch.float32)).tiles == PortableTiles(64, 64, 4, 2)
    assert select(problem(256, False, 4096, 32, dtype=torch.float32)).tiles == PortableTiles(32, 32, 4, 2)
    cpu = select(problem(128, False, 4096, 32, device=torch.device("cpu")))
    assert cpu.tiles == tables.INTERPRETER and "interpreter" in cpu.why
    no_tma = select(problem(128, False, 4096, 32, tma=False))
    assert no_tma.kernel == "portable" and "TMA" in no_tma.why
    monkeypatch.setattr(select_module, "_sm90", lambda index: (False, 108))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "an A100")
    other = select(problem(128, False, 4096, 32))
    assert other.kernel == "portable" and "not sm_90" in other.why


def test_forced_kernels(h200, monkeypatch):
    # forced sm90 where dispatch would not take it (D = 64, N 256: not ahead there) runs it
    forced = select(problem(64, False, 256, 32), kernel="sm90")
    assert forced.kernel == "sm90" and "forced" in forced.why
    assert select(problem(128, False, 4096, 32), kernel="portable").tiles == PortableTiles(256, 64, 8, 3, split=True)
    for p, reason in [(problem(128, False, 4096, 32, dtype=torch.float32), "float16"),
                      (problem(128, False, 4096, 32, device=torch.device("cpu")), "interpreter"),
                      (problem(96, False, 4096, 32), "head dims"),
                      (problem(128, False, 4096, 32, tma=False), "TMA"),
                      (Problem(H, 128, 65535, 65535, 64 * 1024, 64, Band(0, -1, -1), CUDA, True), "int32")]:
        with pytest.raises(ValueError, match=reason):
            select(p, kernel="sm90")
    with pytest.raises(ValueError, match="one of portable, sm90"):
        select(problem(128, False, 4096, 32), kernel="cuda")
    monkeypatch.setattr(select_module, "FORCED", "portable")
    assert select(problem(128, False, 4096, 32)).kernel == "portable"


@pytest.mark.parametrize("d,causal,dq,dkdv", [(64, False, (192, 64), (64, 128)), (64, True, (192, 64), (64, 128)),
                                              (128, False, (192, 64), (64, 128)), (128, True, (192, 64), (64, 128)),
                                              (256, True, (128, 32), (32, 128))])
def test_select_backward_takes_the_sm90_kernels_on_dense_16bit_calls(h200, d, causal, dq, dkdv):
    choice = dispatch.select_backward(problem(d, causal, 4096, 32))
    assert choice.kernel == "sm90" and "SM90_BACKWARD" in choice.why, choice.why
    assert (choice.tiles.dq.block_m, choice.tiles.dq.block_n) == dq
    assert (choice.tiles.dkdv.block_m, choice.tiles.dkdv.block_n) == dkdv
    assert choice.tiles.dkdv_apart == (d == 256)  # two accumulators a consumer do not fit at D 256


def test_select_backward_refusals_and_forcing(h200, monkeypatch):
    # where the sm90 backward cannot run, the portable tables serve, and the reason is in `why`;
    # a forced sm90 raises with it
    for p, reason in [(problem(128, False, 4096, 32, dtype=torch.float32), "float16"),
                      (problem(128, False, 4096, 32, device=torch.device("cpu")), "interpreter"),
                      (problem(96, False, 4096, 32), "head dims"),
                      (problem(32, False, 4096, 32), "head dims"),
                      (problem(128, False, 4096, 32, tma=False), "TMA")]:
        choice = dispatch.select_backward(p)
        assert choice.kernel == "portable" and reason in choice.why, choice.why
        assert choice.tiles == dispatch.backward_tiles(p)
        with pytest.raises(ValueError, match=reason):
            dispatch.select_backward(p, kernel="sm90")
    # packed sequences take the same kernels and tiles as dense ones of their longest lengths
    varlen = dataclasses.replace(problem(128, True, 4096, 32), layout="packed")
    assert dispatch.select_backward(varlen) == dispatch.select_backward(problem(128, True, 4096, 32))
    short = dispatch.select_backward(problem(64, True, 256, 32))
    assert short.kernel == "portable" and "not ahead" in short.why, short.why
    assert dispatch.select_backward(problem(64, True, 256, 32), kernel="sm90").kernel == "sm90"
    assert dispatch.select_backward(problem(64, False, 512, 32)).kernel == "sm90"  # ahead from N 512 (session 35)
    assert dispatch.select_backward(problem(128, True, 512, 32)).kernel == "sm90"
    assert dispatch.select_backward(problem(128, True, 256, 32)).kernel == "portable"
    assert dispatch.select_backward(problem(256, True, 512, 32)).kernel == "sm90"  # ahead from N 512 (session 28)
    assert dispatch.select_backward(problem(256, False, 256, 32)).kernel == "portable"
    forced = dispatch.select_backward(problem(128, False, 4096, 32), kernel="portable")
    assert forced.kernel == "portable" and forced.tiles == tables.BACKWARD[128]
    with pytest.raises(ValueError, match="one of portable, sm90"):
        dispatch.select_backward(problem(128, False, 4096, 32), kernel="cuda")
    monkeypatch.setattr(select_module, "FORCED", "portable")
    assert dispatch.select_backward(problem(128, False, 4096, 32)).kernel == "portable"


def test_problem_of_reads_tma_fitness():
    x = torch.randn(2, 4, 10, 64, dtype=H)

    def problem(q, k, v, out=None):
        return dispatch.problem_of(Call(q, k, v, None, Band(0, -1, -1), Score(0.125), False, out))
    p = problem(x, x, x)
    assert (p.batch, p.heads_q, p.n_q, p.n_k, p.head_dim, p.tma_ok) == (2, 4, 10, 10, 64, True)
    shifted = torch.randn(x.numel() + 1, dtype=H)[1:].view(2, 4, 10, 64)
    assert not problem(x, shifted, x).tma_ok
    assert not problem(x, x, x, x.transpose(2, 3)).tma_ok


def test_every_table_entry_has_a_register_share():
    # every (consumers, CTAs an SM) of the Hopper tables has a consumer register share, which
    # with the producer's 24 fits the CTA's cap
    entries = [*tables.SM90.values(), *tables.SM90_FEW_TILES.values(),
               *(b.tiles for bands in tables.SM90_SHORT_CAUSAL.values() for b in bands)]
    for t in entries:
        consumers = t.block_m // CONSUMER_ROWS
        cap = sm90.launch_options(t.block_m, t.ctas_per_sm).get("maxnreg", 65536 // ((consumers + 1) * 128))
        assert CONSUMER_REGS[(consumers, t.ctas_per_sm)] * consumers + 24 <= cap * (consumers + 1)
    for d, bands in tables.SM90_SHORT_CAUSAL.items():
        assert [b.longest_n_q for b in bands] == sorted({b.longest_n_q for b in bands})
        assert (d, True) in tables.SM90 and tables.SM90_USE[d].min_n_q_right <= bands[0].longest_n_q


def test_env_override_is_read_and_checked(device):
    # an fp32 call on the suite's device: the sm90 kernel refuses it on a GPU (fp32) and on the
    # CPU (the interpreter), so the forced kernel must raise
    env = dict(os.environ, VFLASH_KERNEL="sm90")
    script = (f"import torch, vflash\nq = torch.randn(1, 1, 4, 16, device='{device.type}')\n"
              "try:\n    vflash.attention(q, q, q)\nexcept ValueError as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert "the sm90 kernel cannot take this call" in run.stdout, run.stderr[-2000:]


def kv_problem(batch, heads_q, n_q, capacity, dtype=torch.bfloat16, d=128):
    return Problem(dtype, d, batch, heads_q, n_q, capacity, Band(0, -1, 0), CUDA, False, layout="cache")


def decode_tiles(splits: int, chunk: int) -> KVCacheTiles:
    # decode's 16-row tiles; the merge over the 4 real rows, `chunk` splits a load; a split's few key tiles in
    # one masked loop
    return KVCacheTiles(16, 64, 4, 3, num_splits=splits, split_chunk=chunk, merge_rows=4, one_loop=splits > 1)


@pytest.mark.parametrize("batch,hq,hkv,n_q,capacity,kw,tiles", [
    # decode, Hq 32 / Hkv 8: 4 packed rows -> 16-row tiles; splits until one wave of the places the SMs' shared
    # memory holds (a 64-key three-stage program's two K/V buffers and 7 KiB: three an SM, 396 on 132 SMs; two,
    # 264, where splits would stream fewer than 16 key tiles), 32 at most; the merge over the 4 real rows, up to
    # 32 splits a load (16384 values / (4 x 128)), no more than the splits' power of two
    (1, 32, 8, 1, 8192, {}, decode_tiles(32, 32)),
    (1, 32, 8, 1, 1024, {}, decode_tiles(8, 8)),  # no split under 128 keys
    # 7 would make a second wave of 52
    (8, 32, 8, 1, 8192, {}, decode_tiles(6, 8)),
    (8, 32, 8, 1, 1024, {}, decode_tiles(4, 4)),  # 6 splits of 3 key tiles: two an SM
    (24, 32, 8, 1, 8192, {}, decode_tiles(2, 2)),
    (1, 32, 8, 1, 32768, {}, decode_tiles(32, 32)),  # 49 would fit the places
    (32, 32, 8, 1, 8192, {}, decode_tiles(1, 1)),
    # unsplit grids past a wave of three programs an SM (396 places): a ring one stage deeper (two an SM, 264)
    # where its last wave is fuller: B 64's 512 programs 1.29 three-stage waves, 1.94 four-stage ones; B 128's
    # 2.59 against 3.88 only for programs of 64 key tiles or more; B 48 (one wave of three-stage places) and
    # B 256 (past three waves) keep three stages
    (64, 32, 8, 1, 1024, {}, decode_tiles(1, 1)._replace(num_stages=4)),
    (128, 32, 8, 1, 8192, {}, decode_tiles(1, 1)._replace(num_stages=4)),
    (128, 32, 8, 1, 2048, {}, decode_tiles(1, 1)),
    (48, 32, 8, 1, 8192, {}, decode_tiles(1, 1)),
    (256, 32, 8, 1, 8192, {}, decode_tiles(1, 1)),
    # pages of 64 (a key tile within one page): two three-stage programs an SM already, so nothing to fill
    (64, 32, 8, 1, 8192, dict(page_size=64), decode_tiles(1, 1)),
    (128, 32, 8, 1, 32768, dict(page_size=64), decode_tiles(1, 1)),
    (64, 32, 8, 1, 8192, dict(page_size=16), decode_tiles(1, 1)._replace(num_stages=4)),
    # 24 splits of 22 key tiles, none empty
    (2, 32, 8, 1, 32868, {}, decode_tiles(24, 32)),
    # 11 splits (1500 // 128) would share 24 key tiles unevenly: 8 splits of 3
    (2, 32, 8, 1, 1500, {}, decode_tiles(8, 8)),
    (128, 32, 8, 1, 8192, dict(num_splits=3), decode_tiles(3, 4)),
    (128, 32, 8, 1, 8192, dict(num_splits=1), decode_tiles(1, 1)._replace(num_stages=4)),  # forced unsplit alike
    # a key tile a split at most
    (2, 32, 8, 1, 300, dict(num_splits=64), decode_tiles(5, 8)),
    # MQA, 16 heads: 16 rows a query; 4 new queries -> 64 rows, still the decode tiles
    (64, 16, 1, 4, 4096, {}, KVCacheTiles(64, 64, 4, 3, num_splits=4, split_chunk=2, merge_rows=64,
                                                  one_loop=True)),
    # chunked prefill: 128-row tiles of PORTABLE's, 32 queries x 4 heads
    (4, 32, 8, 512, 8192, {}, KVCacheTiles(128, 128, 8, 3, num_splits=1, split_chunk=1, merge_rows=128)),
    # batch-invariant: the decode tiles in 16-row blocks whatever the rows, 512 keys a split, the merge over the
    # whole tile
    (4, 32, 8, 512, 8192, dict(batch_invariant=True), KVCacheTiles(16, 64, 4, 3, num_splits=16, split_keys=512,
                                                                   split_chunk=8, merge_rows=16, one_loop=True)),
    # past 16k keys the grid's splits stop at the cap (each sequence takes min(32, its own cdiv(length, 512)))
    (1, 32, 8, 1, 40000, dict(batch_invariant=True), KVCacheTiles(16, 64, 4, 3, num_splits=32, split_keys=512,
                                                                  split_chunk=8, merge_rows=16, one_loop=True)),
])
def test_select_kvcache_pins_the_choice(h200, monkeypatch, batch, hq, hkv, n_q, capacity, kw, tiles):
    monkeypatch.setattr(select_module, "_sm_count", lambda p: 132)
    choice = dispatch.select_kvcache(kv_problem(batch, hq, n_q, capacity), hkv, **kw)
    assert choice.tiles == tiles, choice.why


@pytest.mark.parametrize("batch,hq,n_q,capacity,kw,fp8_tile", [
    (32, 32, 1, 8192, {}, True),  # unsplit: 128 keys in one masked loop
    (128, 32, 1, 8192, {}, True),  # unsplit past a wave: the FP8 tile, not KVCACHE_WAVES' deeper ring
    (128, 32, 1, 8192, dict(num_splits=1), True),  # forced unsplit alike
    (1, 32, 1, 8192, {}, False),  # split: the 16-bit tile and split count
    (8, 32, 1, 32768, {}, False),
    (128, 32, 1, 8192, dict(num_splits=3), False),
    (64, 16, 4, 4096, dict(num_splits=1), False),  # 64 rows a program: more than the FP8 tile was measured at
    (4, 32, 1, 8192, dict(batch_invariant=True), False),
])
def test_select_kvcache_takes_the_fp8_tile_unsplit(h200, monkeypatch, batch, hq, n_q, capacity, kw, fp8_tile):
    # an e4m3 cache: unsplit calls of decode's 16-row tiles take KVCACHE_DECODE_FP8's keys, warps, stages and one
    # loop; every other call (split, wider rows, batch-invariant) the 16-bit cache's choice, split count included
    monkeypatch.setattr(select_module, "_sm_count", lambda p: 132)
    hkv = 8 if hq == 32 else 1
    p = kv_problem(batch, hq, n_q, capacity)
    bf16 = dispatch.select_kvcache(p, hkv, **kw)
    fp8 = dispatch.select_kvcache(dataclasses.replace(p, kv_dtype=torch.float8_e4m3fn), hkv, **kw)
    if fp8_tile:
        t = tables.KVCACHE_DECODE_FP8[128]
        assert fp8.tiles == bf16.tiles._replace(block_n=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages,
                                                one_loop=t.one_loop), fp8.why
        assert fp8.tiles.num_splits == 1 and "KVCACHE_DECODE_FP8" in fp8.why
    else:
        assert fp8.tiles == bf16.tiles, fp8.why
        assert "KVCACHE_DECODE_FP8" not in fp8.why


@pytest.mark.parametrize("batch,capacity,splits", [
    # D 64: five programs an SM by shared memory (36 KiB), four by registers where the merge loads 32 splits
    # at once: B 4 KV 32k 16 splits (20 would make 640 programs, past a wave of 528)
    (4, 32768, 16),
    (4, 8192, 16),  # splits of 8 key tiles, under full_residency_tiles: four an SM, the merge's chunk 16
    (1, 32768, 32),  # 66 would fit four an SM: max_splits
    (8, 32768, 10),  # 640 programs, the merge's 16: five an SM
])
def test_select_kvcache_counts_the_wide_merge_registers(h200, monkeypatch, batch, capacity, splits):
    monkeypatch.setattr(select_module, "_sm_count", lambda p: 132)
    choice = dispatch.select_kvcache(kv_problem(batch, 32, 1, capacity, d=64), 8)
    assert choice.tiles.num_splits == splits, choice.why


@pytest.mark.parametrize("page,kw,kernel", [
    (16, {}, "sm90"), (0, {}, "sm90"), (256, {}, "sm90"),  # chunked prefill: the sm90 kernel's KV_CACHE build
    (17, {}, "portable"), (8, {}, "portable"),  # pages its copies cannot take
    (16, dict(num_splits=2), "portable"), (16, dict(batch_invariant=True), "portable"),
])
def test_select_kvcache_takes_sm90_for_chunked_prefill_where_it_fits(h200, monkeypatch, page, kw, kernel):
    monkeypatch.setattr(select_module, "_sm_count", lambda p: 132)
    p = dataclasses.replace(kv_problem(4, 32, 512, 8192), tma_ok=True)
    choice = dispatch.select_kvcache(p, 8, page_size=page, **kw)
    assert choice.kernel == kernel, choice.why
    if kernel == "sm90":  # the dense rule's tiles for the same rows
        assert choice.tiles == dispatch.select(p).tiles and "KV cache" in choice.why
    # decode (4 packed rows) stays on attention_kvcache_kernel
    assert dispatch.select_kvcache(dataclasses.replace(p, n_q=1), 8, page_size=page).kernel == "portable"


def test_every_registered_kernel_has_a_forward_builder_and_refusals():
    # Choice.kernel is the one name the launchers build from: each kernel dispatch can choose has a builder,
    # and the portable family takes any problem (select's fallback) while sm90 says why it cannot
    from vflash.ops import attention as launchers
    assert set(launchers._FORWARD) == set(dispatch.REGISTRY) == set(dispatch.KERNELS)
    p = problem(128, True, 4096, 32, device=torch.device("cpu"))
    assert dispatch.REGISTRY["portable"].forward_refusal(p) is None
    assert dispatch.REGISTRY["portable"].backward_refusal(p) is None
    assert "interpreter" in dispatch.REGISTRY["sm90"].forward_refusal(p)
    assert "interpreter" in dispatch.REGISTRY["sm90"].backward_refusal(p)


def test_the_registry_says_what_each_family_takes_as_data():
    # dtypes, layouts and score options are data the refusals read first: the sm90 family refuses fp32, a
    # backward against a KV cache and a score option it does not list, whatever its device rules say;
    # vflash._validate accepts the dtypes some family takes
    from vflash import _validate
    p = problem(128, True, 4096, 32)
    assert dispatch.refusal("sm90", dataclasses.replace(p, dtype=torch.float32)) == \
        "it takes float16 / bfloat16 / float8_e4m3fn, not torch.float32"
    assert dispatch.refusal("portable", dataclasses.replace(p, dtype=torch.float32)) is None
    cache = dataclasses.replace(p, layout="cache")
    assert "backward takes dense / packed calls, not cache" in dispatch.refusal("sm90", cache, backward=True)
    assert "not cache" in dispatch.refusal("portable", cache, backward=True)
    assert dispatch.refusal("portable", dataclasses.replace(p, options=("softcap",))) is None
    assert dispatch.refusal("portable", dataclasses.replace(p, options=("bias",))) == "it does not take bias"
    assert set(_validate.SUPPORTED_DTYPES) == {d for k in dispatch.REGISTRY.values() for d in k.dtypes}


def test_fp8_runs_the_sm90_build_dense_and_packed(h200, monkeypatch):
    # FP8 calls, dense or packed, take SM90_FP8's tiles; with "fp8" in tables.SM90_FORCED_ONLY they go to the
    # portable kernel, saying why, unless the sm90 kernel is forced
    fp8 = problem(128, False, 4096, 32, dtype=torch.float8_e4m3fn)
    packed = dataclasses.replace(fp8, layout="packed")
    for p in (fp8, packed):
        assert (dispatch.select(p).kernel, dispatch.select(p).tiles) == ("sm90", tables.SM90_FP8[(128, False)])
    monkeypatch.setattr(tables, "SM90_FORCED_ONLY", ("fp8",))
    unforced = dispatch.select(packed)
    assert unforced.kernel == "portable" and "fp8 build is taken where forced only" in unforced.why
    assert dispatch.select(packed, "sm90").tiles == tables.SM90_FP8[(128, False)]
    assert "not 96" in dispatch.refusal("sm90", problem(96, False, 4096, 32, dtype=torch.float8_e4m3fn))


def test_a_v_head_dim_of_its_own_runs_the_sm90_forward(h200, monkeypatch):
    # v narrower than q / k, a power of two, dense or packed: the sm90 forward takes it with q's head dim's tiles
    # (where forced only while "v head dim" is in tables.SM90_FORCED_ONLY); a wider v, one of no power of two and
    # a KV cache's go to the portable kernel, saying why
    p = dataclasses.replace(problem(128, True, 4096, 32), head_dim_v=64)
    assert dispatch.select(p).tiles == dispatch.select(problem(128, True, 4096, 32)).tiles
    monkeypatch.setattr(tables, "SM90_FORCED_ONLY", ("v head dim",))
    assert "forced only" in dispatch.select(p).why
    assert dispatch.select(p, "sm90").tiles == dispatch.select(problem(128, True, 4096, 32)).tiles
    for dv, layout, words in ((256, "dense", "from 16 to q's (128), not 256"), (96, "packed", "power of two"),
                              (64, "cache", "against a KV cache")):
        refused = dispatch.refusal("sm90", dataclasses.replace(p, head_dim_v=dv, layout=layout))
        assert refused is not None and words in refused, refused


def test_a_v_head_dim_of_its_own_runs_the_sm90_backward(h200, monkeypatch):
    # the sm90 backward takes what its forward takes (v a power of two no wider than q's; q's 192 beside one, on
    # D 256's tiles), where forced only while "v head dim" is in tables.SM90_FORCED_ONLY, and refuses the rest
    # saying why
    monkeypatch.setattr(tables, "SM90_FORCED_ONLY", ("v head dim",))
    p = dataclasses.replace(problem(128, True, 4096, 32), head_dim_v=64)
    unforced = dispatch.select_backward(p)
    assert unforced.kernel == "portable" and "forced only" in unforced.why
    assert dispatch.select_backward(p, "sm90").tiles == tables.SM90_BACKWARD[128]
    deepseek = dataclasses.replace(problem(192, True, 4096, 32), head_dim_v=128)
    assert dispatch.select_backward(deepseek, "sm90").tiles == tables.SM90_BACKWARD[256]
    monkeypatch.setattr(tables, "SM90_FORCED_ONLY", ())
    assert dispatch.select_backward(p).kernel == "sm90" and dispatch.select_backward(deepseek).kernel == "sm90"
    for refused_p, words in ((dataclasses.replace(p, head_dim_v=256), "from 16 to q's (128), not 256"),
                             (dataclasses.replace(p, head_dim_v=96), "power of two"),
                             (problem(192, True, 4096, 32), "only beside a v of its own"),
                             (dataclasses.replace(problem(96, True, 4096, 32), head_dim_v=64), "not 96")):
        choice = dispatch.select_backward(refused_p)
        assert choice.kernel == "portable" and words in choice.why, choice.why
        with pytest.raises(ValueError, match="sm90 backward cannot take"):
            dispatch.select_backward(refused_p, "sm90")


def test_problem_of_reads_the_layout_and_the_score_options():
    from vflash.call import Cache, Packed
    x = torch.randn(2, 4, 10, 64, dtype=H)
    assert dispatch.problem_of(Call(x, x, x, None, Band(0, -1, -1), Score(0.125), False)).options == ()
    p = dispatch.problem_of(Call(x, x, x, None, Band(0, -1, -1), Score(0.125, 30.0), False))
    assert (p.layout, p.options, p.varlen) == ("dense", ("softcap",), False)
    rows = x.view(-1, 10, 64)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    packed = Call(rows, rows, rows, Packed(cu, cu, 4, 4, False, False), Band(0, -1, -1), Score(0.125), False)
    assert (dispatch.problem_of(packed).layout, dispatch.problem_of(packed).batch) == ("packed", 2)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    kv = torch.randn(2, 16, 2, 64, dtype=H)  # contiguous caches [B, max_len, Hkv, D]: 16 keys a sequence
    cache = Call(rows, kv, kv, Cache(lens, None, cu, 4, None, False, False, tuple(rows.shape)), Band(0, -1, 0),
                 Score(0.125), False)
    p = dispatch.problem_of(cache)
    assert (p.layout, p.batch, p.n_q, p.n_k, p.varlen) == ("cache", 2, 4, 16, True)


def latent_problem(batch, heads_q, n_q, capacity, **kw):
    # an MLA decode call: q / k 576, v the cache's first 512 columns (a view), one KV head
    return dataclasses.replace(kv_problem(batch, heads_q, n_q, capacity, d=576), head_dim_v=512, v_in_k=True,
                               tma_ok=True, **kw)


def test_a_latent_cache_takes_the_sm90_mla_kernel_and_fills_a_wave(h200):
    # the MLA kernel with as many splits as fill one wave of 132 CTAs (each at least SM90_MLA_MIN_SPLIT_TILES
    # tiles), unforced as forced; the portable latent path where forced
    p = latent_problem(32, 16, 1, 8192)
    assert dispatch.select_kvcache(p, 1, page_size=64).kernel == "sm90"
    assert "KVCACHE_LATENT" in dispatch.select_kvcache(p, 1, kernel="portable").why
    forced = dispatch.select_kvcache(p, 1, kernel="sm90")
    assert forced.kernel == "sm90" and forced.tiles == tables.SM90_MLA._replace(num_splits=4), forced.why
    assert dispatch.select_kvcache(latent_problem(128, 128, 1, 8192), 1, kernel="sm90").tiles.num_splits == 1
    assert dispatch.select_kvcache(latent_problem(2, 16, 1, 300), 1, kernel="sm90").tiles.num_splits == 1
    assert dispatch.select_kvcache(p, 1, num_splits=7, kernel="sm90").tiles.num_splits == 7
    assert dispatch.select_kvcache(p, 1, page_size=16, kernel="portable").kernel == "portable"


@pytest.mark.parametrize("change,kw,words", [
    (dict(kv_dtype=torch.float8_e4m3fn), {}, "16-bit queries and caches"),
    (dict(options=("softcap",)), {}, "sinks, causal or no mask"),
    (dict(band=Band(0, 100, 0)), {}, "sinks, causal or no mask"),
    (dict(head_dim=320, head_dim_v=256), {}, "DeepSeek's latent cache"),
    ({}, dict(heads_k=2), "one KV head"),
    ({}, dict(batch_invariant=True), "batch-invariant"),
    ({}, dict(packed_q=True), "fixed count of new queries"),
    ({}, dict(page_size=8), "pages of a power of two from 16"),
], ids=["fp8_cache", "softcap", "window", "other_dims", "two_kv_heads", "batch_invariant", "packed_q", "page_8"])
def test_the_sm90_mla_kernel_refuses_what_it_cannot_take_and_says_why(h200, change, kw, words):
    p = dataclasses.replace(latent_problem(4, 16, 1, 4096), **change)
    kw = dict(kw)
    heads_k = kw.pop("heads_k", 1)
    assert words in dispatch.mla_refusal(p, heads_k, **kw)
    with pytest.raises(ValueError, match="sm90 kernel cannot take this call"):
        dispatch.select_kvcache(p, heads_k, **kw, kernel="sm90")
    assert dispatch.select_kvcache(p, heads_k, **kw).kernel == "portable"
