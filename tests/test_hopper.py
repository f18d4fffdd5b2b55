"""The Gluon Hopper kernel: it builds for sm_90 with the installed Triton (no GPU
needed), the launcher only hands it tensors TMA can address, and on an H200 it
matches the fp64 oracle on every head dim and feature it serves."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from vflash.harness.cases import Case
from vflash.kernels import attention_fwd_hopper as hopper_kernels
from vflash.ops import attention as ops
from vflash.ops import hopper

needs_gluon = pytest.mark.skipif(not hopper_kernels.HAVE_GLUON, reason="this Triton has no Gluon")


@needs_gluon
def test_kernel_compiles_for_sm90(tmp_path):
    # Gluon does not run under the interpreter, so the compile runs in a child with
    # it off; ptxas (shipped with Triton) turns the PTX into a cubin.
    script = textwrap.dedent(r"""
        import re
        import torch
        from vflash.kernels import attention_fwd_hopper as hopper_kernels
        from vflash.ops import hopper
        variants = [
            # three consumers taking turns, P carried in fp32
            dict(head_dim=64, block_m=192, causal=True, pingpong=True, p_fp32=True),
            dict(head_dim=128, dtype=torch.bfloat16, window_left=True, softcap=True, lse=False, q_buffers=2,
                 late_pv_wait=True, lazy_rescale=True),
            dict(head_dim=256, block_n=64),
            # one consumer, two or three CTAs an SM (HOPPER_SHORT_CAUSAL, HOPPER_FEW_TILES): a
            # half or a third of the register file each
            dict(head_dim=128, block_m=64, block_n=64, causal=True, q_buffers=2, ctas_per_sm=2),
            dict(head_dim=64, block_m=64, causal=True, p_fp32=True, lazy_rescale=True, q_buffers=2, ctas_per_sm=2),
            dict(head_dim=64, block_m=64, block_n=64, causal=True, p_fp32=True, lazy_rescale=True, q_buffers=2,
                 ctas_per_sm=3),
            # work tiles drawn from a counter: one atomic add a tile, in the producer only
            dict(head_dim=128, causal=True, dynamic=True),
        ]
        for kw in variants:
            k = hopper.compile_sm90(**kw)
            ptx = k.asm["ptx"]
            assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor.4d" in ptx, kw
            # the consumers' register share, as the table gives it for their count and CTAs an SM,
            # and the thread cap that shares the file between the CTAs
            per_sm = kw.get("ctas_per_sm", 1)
            regs = hopper_kernels.CONSUMER_REGS[(kw.get("block_m", 128) // hopper_kernels.CONSUMER_ROWS, per_sm)]
            assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{regs};", ptx), kw
            if per_sm > 1:
                assert re.search(rf"\.maxnreg {hopper.launch_options(64, per_sm)['maxnreg']}\b", ptx), kw
            assert ("atom.global" in ptx) == kw.get("dynamic", False), kw
            assert len(k.asm["cubin"]) > 0, kw
            print("built", kw["head_dim"], k.metadata.shared)
    """)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("built") == 7


def test_grid_persistence_and_stride():
    # Three entries always: launch plans index grid[0..2] (an H200 run failed on (x,)).
    assert hopper.grid(2, 8, 1000, 128, 132, causal=False) == (128, 1, 1)  # 2 * 8 * 8 work tiles
    assert hopper.grid(4, 16, 4096, 128, 132, causal=False) == (132, 1, 1)
    assert hopper.grid(4, 16, 4096, 128, 132, causal=True) == (4 * 16 * 32, 1, 1)  # 64 heads < 131
    assert hopper.grid(1, 2, 1000, 192, 132, causal=True) == (2 * 6, 1, 1)  # three consumers: 192 rows
    # Causal with enough heads: persistent, a stride coprime with the row blocks per head.
    assert hopper.grid(32, 16, 512, 128, 132, causal=True) == (131, 1, 1)  # 4 row blocks
    assert hopper.grid(32, 16, 512, 128, 133, causal=True) == (133, 1, 1)  # 133 = 7 * 19 shares nothing with 4
    assert hopper.grid(64, 4, 640, 128, 130, causal=True) == (129, 1, 1)  # 5 row blocks: 130 shares 5
    assert hopper.grid(3, 64, 66 * 128, 128, 132, causal=True) == (131, 1, 1)  # 66 row blocks
    assert hopper.grid(1, 129, 640, 128, 130, causal=True) == (129, 1, 1)  # heads == stride: each CTA sees 5 tiles
    assert hopper.grid(1, 128, 640, 128, 130, causal=True) == (128 * 5, 1, 1)  # fewer heads: one CTA per tile
    # One consumer a CTA (64 rows): two or three CTAs an SM.
    assert hopper.grid(2, 4, 4096, 64, 132, causal=False, ctas_per_sm=2) == (264, 1, 1)  # 512 work tiles
    assert hopper.grid(32, 16, 512, 64, 132, causal=True, ctas_per_sm=2) == (263, 1, 1)  # 8 row blocks: <= 264
    assert hopper.grid(2, 4, 4096, 64, 132, causal=False, ctas_per_sm=3) == (396, 1, 1)
    assert hopper.grid(32, 16, 512, 64, 132, causal=True, ctas_per_sm=3) == (395, 1, 1)  # 396 shares 2 with 8
    # Work tiles drawn from a counter: one CTA an SM slot, whatever the mask.
    assert hopper.grid(4, 16, 4096, 128, 132, causal=True, dynamic=True) == (132, 1, 1)
    assert hopper.grid(1, 1, 256, 128, 132, causal=True, dynamic=True) == (2, 1, 1)
    assert hopper.launch_options(64, 2) == dict(num_warps=4, maxnreg=128)
    assert hopper.launch_options(128) == dict(num_warps=4)
    assert hopper.launch_options(64, 3) == dict(num_warps=4, maxnreg=80)  # 85 a thread, down to 8s
    # every tile table's (consumers, CTAs an SM) has a register share, which with the producer's
    # fits the CTA's cap
    tables = [*hopper_kernels.HOPPER_CONFIGS.values(), *hopper_kernels.HOPPER_FEW_TILES.values(),
              *(t for bands in hopper_kernels.HOPPER_SHORT_CAUSAL.values() for _, t in bands)]
    for t in tables:
        consumers = t.block_m // hopper_kernels.CONSUMER_ROWS
        cap = hopper.launch_options(t.block_m, t.ctas_per_sm).get("maxnreg", 65536 // ((consumers + 1) * 128))
        assert hopper_kernels.CONSUMER_REGS[(consumers, t.ctas_per_sm)] * consumers + 24 <= cap * (consumers + 1)


def test_tma_ready_needs_aligned_strides_and_unit_last_stride():
    x = torch.randn(2, 4, 10, 64, dtype=torch.float16)
    assert hopper.tma_ready(x)
    assert hopper.tma_ready(x.transpose(1, 2))  # [B, N, H, D] view: strides stay multiples of 8 elements
    assert hopper.tma_ready(x[..., :56])  # a sliced view keeps 128-byte rows
    assert not hopper.tma_ready(torch.randn(2, 4, 10, 60, dtype=torch.float16))  # 120-byte rows
    assert not hopper.tma_ready(x.transpose(2, 3))  # last stride not 1
    shifted = torch.randn(x.numel() + 1, dtype=torch.float16)[1:].view(2, 4, 10, 64)
    assert not hopper.tma_ready(shifted)  # base 2 bytes off 16


def test_fits_needs_tma_and_an_int32_tile_count():
    x = torch.randn(2, 4, 10, 64, dtype=torch.float16)
    assert hopper.fits(x, x, x, x, 128)
    assert not hopper.fits(x, x, x.transpose(2, 3), x, 128)
    big = torch.randn(1, 1, 1, 64, dtype=torch.float16).expand(65535, 65535, 1, 64)  # 65535^2 work tiles
    assert not hopper.fits(big, x, x, x, 128)


@needs_gluon
def test_descriptors_equal_the_checked_constructor():
    # prepare() fills TensorDescriptor's fields directly (its checks cost ~20 us a
    # call); the result must be what the checked constructor makes.
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    q = torch.randn(2, 8, 300, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 300, 2, 128, dtype=torch.bfloat16).transpose(1, 2)
    out = torch.empty(2, 8, 300, 128, dtype=torch.bfloat16)
    got = hopper.tma_descriptors(64)(q, k, k, out)
    rows, keys = [1, 1, 64, 128], [1, 1, 64, 128]
    for d, t, block in zip(got, (q, k, k, out), (rows, keys, keys, rows)):
        layout = hopper._shared_layout(tuple(block), torch.bfloat16)
        assert d == TensorDescriptor(t, t.shape, t.stride(), block, layout)


@needs_gluon
def test_kernel_args_follow_the_signature():
    names = hopper_kernels.attention_fwd_hopper_kernel.arg_names

    class Desc:
        base = torch.empty(1)
    descs = (Desc(), Desc(), Desc(), Desc())
    args, constexprs = hopper.kernel_args(descs, None, 3, 8, 2, 100, 200, 128, 100, -1, 0, 0.125, None, 128, 128,
                                         2, 2)
    by_name = dict(zip(names, args))
    assert len(args) + len(constexprs) == len(names)
    assert by_name["LSE"] is descs[3].base and by_name["kv_group"] == 4 and by_name["off"] == 100
    assert by_name["tile_counter"] is None and not constexprs["DYNAMIC"]  # a constexpr None unless DYNAMIC
    assert by_name["batch"] == 3 and by_name["n_heads_q"] == 8
    assert constexprs["HAS_RIGHT"] and not constexprs["HAS_LEFT"] and not constexprs["STORE_LSE"]
    assert constexprs["Q_BUFFERS"] == 2
    assert by_name["qk_scale"] == pytest.approx(0.125 * 1.4426950408889634)


def test_choose_config_takes_the_hopper_kernel_only_where_it_serves(monkeypatch):
    monkeypatch.setattr(ops, "interpreting", lambda: False)
    monkeypatch.setattr(ops, "_sm_count", lambda index: 132)
    monkeypatch.setattr(ops, "_is_hopper", lambda index: True)
    monkeypatch.setattr(hopper_kernels, "HAVE_GLUON", True)
    dev = torch.device("cuda", 0)
    for d, (min_plain, min_causal, min_waves) in hopper_kernels.HOPPER_USE.items():
        cfg = ops.choose_config(d, torch.float16, -1, max(min_plain, 4096), 32, dev, d)
        assert cfg.hopper and cfg.num_warps == 4 and cfg.block_m == hopper_kernels.HOPPER_CONFIGS[d].block_m
        assert ops.choose_config(d, torch.float16, -1, min_plain, 512, dev, d).hopper
        assert ops.choose_config(d, torch.float16, 0, min_causal, 512, dev, d).hopper
        if min_causal > 1:
            assert not ops.choose_config(d, torch.float16, 0, min_causal - 1, 512, dev, d).hopper  # short causal
        assert ops.choose_config(d, torch.float16, 0, 16384, 512, dev, d).q_buffers == \
            hopper_kernels.HOPPER_CONFIGS[d].q_buffers_causal
        assert cfg.q_buffers == hopper_kernels.HOPPER_CONFIGS[d].q_buffers
        tiles = hopper_kernels.HOPPER_CONFIGS[d]
        assert (cfg.pingpong, cfg.p_fp32, cfg.late_pv_wait, cfg.lazy_rescale) == (tiles.pingpong, False,
                                                                                  tiles.late_pv_wait,
                                                                                  tiles.lazy_rescale)
        causal_cfg = ops.choose_config(d, torch.float16, 0, 16384, 512, dev, d)
        assert (causal_cfg.p_fp32, causal_cfg.lazy_rescale) == (tiles.p_fp32_causal, tiles.lazy_rescale_causal)
        assert causal_cfg.dynamic == tiles.dynamic_causal and not cfg.dynamic  # never without a right edge
        if not min_waves:  # (grids this small take the few-tile tiles where a head dim has them)
            # no more work tiles than CTA slots: each CTA takes one either way, and no counter is allocated
            slots = 132 * tiles.ctas_per_sm
            fits = ops.choose_config(d, torch.float16, 0, 16384, slots * tiles.block_m // 16384, dev, d)
            over = ops.choose_config(d, torch.float16, 0, 16384, slots * tiles.block_m // 16384 + 1, dev, d)
            assert not fits.dynamic and over.dynamic == tiles.dynamic_causal
            assert dataclasses.replace(fits, dynamic=over.dynamic) == over
        if min_plain > 1:
            assert not ops.choose_config(d, torch.float16, -1, min_plain - 1, 512, dev, d).hopper
        if min_waves:  # a grid of too few waves: the one-consumer tiles, else the portable kernel
            block_m = hopper_kernels.HOPPER_CONFIGS[d].block_m
            few = ops.choose_config(d, torch.float16, -1, 2048, 16, dev, d)  # 176 tiles, 132 SMs
            if d in hopper_kernels.HOPPER_FEW_TILES:
                tiles_few = hopper_kernels.HOPPER_FEW_TILES[d]
                assert few.hopper and (few.block_m, few.block_n) == (tiles_few.block_m, tiles_few.block_n)
                assert few.ctas_per_sm == tiles_few.ctas_per_sm
            else:
                assert not few.hopper
            assert ops.choose_config(d, torch.float16, -1, 20 * block_m, 4 * 132 // 20 + 1, dev, d).block_m == block_m
        assert not ops.choose_config(d, torch.float32, -1, 4096, 32, dev, d).hopper  # fp32: portable kernel
    for d, bands in hopper_kernels.HOPPER_SHORT_CAUSAL.items():
        # causal: each band's tiles from the row after the band below it up to its longest, then
        # the main tiles; without a right edge the main tiles at any length
        assert [n for n, _ in bands] == sorted({n for n, _ in bands})
        shortest = max(hopper_kernels.HOPPER_USE[d][1], 1)
        for (longest, tiles), below in zip(bands, [shortest - 1] + [n for n, _ in bands]):
            for n_q in (below + 1, longest):
                short = ops.choose_config(d, torch.float16, 0, n_q, 512, dev, d)
                assert short == ops.hopper_tile_config(tiles, True), (d, n_q)
                assert (short.q_buffers, short.ctas_per_sm) == (tiles.q_buffers_causal, tiles.ctas_per_sm)
            plain = ops.choose_config(d, torch.float16, -1, longest, 512, dev, d)
            assert plain == ops.hopper_tile_config(hopper_kernels.HOPPER_CONFIGS[d], False)
        after = ops.choose_config(d, torch.float16, 0, bands[-1][0] + 1, 512, dev, d)
        assert after == ops.hopper_tile_config(hopper_kernels.HOPPER_CONFIGS[d], True)
    for d, tiles in hopper_kernels.HOPPER_FEW_TILES.items():
        assert hopper_kernels.HOPPER_USE[d][2]
        for right in (0, -1):  # too few main tiles, either mask, whatever the length: the few-tile tiles
            for n_q in (1024, 8192):
                few = ops.choose_config(d, torch.float16, right, n_q, 1, dev, d)
                assert few.hopper and (few.block_m, few.block_n, few.ctas_per_sm) == (tiles.block_m, tiles.block_n,
                                                                                      tiles.ctas_per_sm)
                assert few.q_buffers == (tiles.q_buffers_causal if right == 0 else tiles.q_buffers)
    assert not ops.choose_config(128, torch.float16, -1, 4096, 32, dev, 120).hopper  # padded head dim
    assert not ops.choose_config(16, torch.float16, -1, 4096, 32, dev, 16).hopper  # not in the table
    monkeypatch.setattr(ops, "_is_hopper", lambda index: False)
    assert not ops.choose_config(128, torch.float16, -1, 4096, 32, dev, 128).hopper


def _on_hopper() -> bool:
    return (torch.cuda.is_available() and hopper_kernels.HAVE_GLUON
            and torch.cuda.get_device_capability() == (9, 0))


def _hopper_cases():
    cases = []
    for d in sorted(hopper_kernels.HOPPER_CONFIGS):
        cases += [
            Case(B=2, Hq=4, Hkv=4, Nq=1, Nk=1, D=d),
            Case(B=2, Hq=4, Hkv=2, Nq=300, Nk=333, D=d, dtype="bf16"),
            Case(B=2, Hq=8, Hkv=2, Nq=777, Nk=777, D=d, layout="bnhd", causal=True),
            Case(B=1, Hq=4, Hkv=1, Nq=129, Nk=1037, D=d, causal=True),
            Case(B=1, Hq=4, Hkv=4, Nq=1037, Nk=129, D=d, causal="top_left"),
            Case(B=1, Hq=4, Hkv=4, Nq=1024, Nk=300, D=d, causal=True, tag="fully masked rows"),
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
    return cases


def _schedules(d):
    # Every Q-buffer count a head dim has room for, each with the launcher's
    # switches and with PINGPONG, P_FP32 and LATE_PV_WAIT, one at a time, flipped;
    # LAZY_RESCALE flipped with the table's Q buffers only (it touches no buffer).
    cfg = ops.hopper_config(d)
    base = (cfg.pingpong, cfg.p_fp32, cfg.late_pv_wait, cfg.lazy_rescale)
    flip = lambda k: tuple(not x if i == k else x for i, x in enumerate(base))  # noqa: E731
    table_qb = hopper_kernels.HOPPER_CONFIGS[d].q_buffers
    return ([(qb, *f) for qb in range(1, table_qb + 1) for f in [base, flip(0), flip(1), flip(2)]]
            + [(table_qb, *flip(3))])


def _assert_case_with(case, cfg):
    # The case through the launcher with the Hopper kernel's tiles and switches forced to cfg.
    def attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, return_lse=False):
        assert all(map(hopper.tma_ready, (q, k, v)))
        mode = {False: None, True: "bottom_right"}.get(causal, causal)
        return ops.attention_forward(q, k, v, causal=mode, scale=q.shape[-1] ** -0.5 if scale is None else scale,
                                     window=window or (-1, -1), softcap=softcap, return_lse=return_lse,
                                     config=cfg)
    for v in case.run(torch.device("cuda"), attention):
        assert v.passed, f"{case.name}: {v.what} max err {v.max_err:.3e} > tol {v.tol:.3e} {v.note}"


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU and Gluon")
@pytest.mark.parametrize("case,q_buffers,pingpong,p_fp32,late_pv_wait,lazy_rescale", [
    pytest.param(c, qb, pp, p32, late, lazy, id=f"{c.name.replace(' ', '_')}-q{qb}{'-pp' if pp else ''}"
                                                f"{'-p32' if p32 else ''}{'-late' if late else ''}"
                                                f"{'-lazy' if lazy else ''}")
    for c in _hopper_cases() for qb, pp, p32, late, lazy in _schedules(c.D)])
def test_gpu_hopper_kernel_matches_the_oracle(case, q_buffers, pingpong, p_fp32, late_pv_wait, lazy_rescale):
    _assert_case_with(case, dataclasses.replace(ops.hopper_config(case.D), q_buffers=q_buffers, pingpong=pingpong,
                                                p_fp32=p_fp32, late_pv_wait=late_pv_wait, lazy_rescale=lazy_rescale))


def _band_tiles(d):
    few = hopper_kernels.HOPPER_FEW_TILES.get(d)
    return [t for _, t in hopper_kernels.HOPPER_SHORT_CAUSAL.get(d, ())] + ([few] if few else [])


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU and Gluon")
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name.replace(" ", "_")) for c in _hopper_cases()
                                  if _band_tiles(c.D)])
def test_gpu_hopper_band_tiles_match_the_oracle(case):
    # HOPPER_SHORT_CAUSAL's bands' and HOPPER_FEW_TILES' tiles (one consumer and
    # two or three CTAs an SM; DYNAMIC where the band has it) on every case of the
    # head dim, whatever its mask, with the switches the launcher takes for a right
    # edge and for none, and with one Q buffer and with two: the kernel must be
    # right for any.
    for tiles in _band_tiles(case.D):
        for right_edge in (True, False):
            cfg = ops.hopper_tile_config(tiles, right_edge)
            for q_buffers in (1, 2):
                _assert_case_with(case, dataclasses.replace(cfg, q_buffers=q_buffers))


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU and Gluon")
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name.replace(" ", "_")) for c in _hopper_cases()])
def test_gpu_hopper_dynamic_tiles_match_the_oracle(case):
    # DYNAMIC (work tiles drawn from a counter) on every case, whatever its mask, with
    # the launcher's switches for a right edge and one and two Q buffers; each launch
    # takes a fresh counter, so a second run of a case is as right as the first.
    cfg = dataclasses.replace(ops.hopper_config(case.D, True), dynamic=True)
    for q_buffers in range(1, hopper_kernels.HOPPER_CONFIGS[case.D].q_buffers + 1):
        _assert_case_with(case, dataclasses.replace(cfg, q_buffers=q_buffers))

