"""The harness itself: bench (smoke), plot, memory, check exit codes, argument errors."""

import csv
import json
import os

import pytest
import torch

import vflash
from vflash.cli import main
from vflash.harness.bench import CSV_COLUMNS, Shape, attention_flops, time_calls_interleaved, visible_pairs
from vflash.reference import visible_mask
from _devices import needs_interpreter

FIXTURES = __file__.rsplit("/", 1)[0] + "/fixtures"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# CPU tensors run through Triton's interpreter, which some Triton / numpy pairs refuse (the GPU machine's)


@needs_interpreter
def test_smoke_bench_writes_documented_csv_and_environment(tmp_path, capsys):
    out = tmp_path / "smoke.csv"
    assert main(["bench", "--smoke", "--out", str(out)]) == 0
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == CSV_COLUMNS
        rows = list(reader)
    methods = {r["method"] for r in rows}
    assert methods == {"explicit_fp32", "explicit", "tiled", "vflash"}
    assert len(rows) == 4 * 4  # four tiny shapes x four methods
    for r in rows:
        assert r["status"] == "ok", r
        assert float(r["ms_median"]) > 0 and float(r["tflops"]) > 0 and int(r["reps"]) >= 1
        assert float(r["ms_p20"]) <= float(r["ms_median"]) <= float(r["ms_p80"])
        assert float(r["peak_mib"]) > 0
    env = json.loads((tmp_path / "smoke.env.json").read_text())
    assert {"date", "torch", "triton", "vflash", "gpu", "triton_interpreter", "commit", "gluon"} <= set(env)
    assert "[########################] 4/4" in capsys.readouterr().out


def test_interleaved_timing_takes_the_calls_in_turn():
    order = []
    calls = [(name, lambda name=name: order.append(name)) for name in ("a", "b", "c")]
    stats = time_calls_interleaved(calls, torch.device("cpu"))
    assert order == ["a", "b", "c"] * 3  # one repetition of each per round
    assert set(stats) == {"a", "b", "c"}
    for med, p20, p80, reps in stats.values():
        assert p20 <= med <= p80 and reps == 3


@needs_interpreter
def test_smoke_bench_interleaved_writes_every_method_and_says_so(tmp_path):
    out = tmp_path / "inter.csv"
    assert main(["bench", "--smoke", "--interleave", "--methods", "vflash,tiled", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert {r["method"] for r in rows} == {"vflash", "tiled"} and len(rows) == 2 * 4
    for r in rows:
        assert r["status"] == "ok", r
        assert float(r["ms_p20"]) <= float(r["ms_median"]) <= float(r["ms_p80"]) and int(r["reps"]) == 3
        assert float(r["peak_mib"]) > 0
    assert json.loads((tmp_path / "inter.env.json").read_text())["timing"] == "interleaved"


@needs_interpreter
def test_smoke_bench_memory_column_measures_the_output(tmp_path):
    # vflash allocates only its output: fp16 [1, 2, 40, 16] = 2560 bytes.
    out = tmp_path / "s.csv"
    main(["bench", "--smoke", "--methods", "vflash", "--out", str(out)])
    rows = list(csv.DictReader(open(out)))
    big = [r for r in rows if r["Nq"] == "40"]
    assert all(abs(float(r["peak_mib"]) * 2**20 - 2560) < 1 for r in big)


def test_bench_without_gpu_exits_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["bench", "--sweep", "article"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["bench", "--smoke", "--shape", "1,2,3"], ["six integers"]),
    (["bench", "--smoke", "--shape", "1,3,2,8,8,16"], ["multiple of Hkv"]),
    (["bench", "--smoke", "--methods", "vflash,magic"], ["unknown method", "magic"]),
    (["bench", "--smoke", "--dtype", "fp8"], ["unknown dtype", "fp8"]),
    (["plot", "/nonexistent.csv"], ["no such file"]),
    (["check", "--shape", "2,2,2,8,x,16"], ["six integers"]),
])
def test_argument_errors_are_clear(argv, words, tmp_path):
    with pytest.raises(SystemExit) as info:
        main(argv + (["--out", str(tmp_path / "o.csv")] if argv[0] == "bench" else []))
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("shape,causal", [("1,2,2,0,7,16", "false"), ("1,2,2,7,0,16", "true"),
                                          ("1,2,1,0,0,16", "top_left")])
def test_check_accepts_empty_sequences(shape, causal, capsys):
    assert main(["check", "--shape", shape, "--causal", causal]) == 0
    out = capsys.readouterr().out
    nq, nk = shape.split(",")[3:5]
    assert f"N{nq}x{nk}" in out and out.strip().endswith("1 passed, 0 failed")


def test_bench_shape_accepts_empty_sequences():
    assert Shape.parse("1,2,2,0,9,16", causal=True) == Shape(1, 2, 2, 0, 9, 16, True)
    for bad in ("0,2,2,4,4,16", "1,0,2,4,4,16", "1,2,0,4,4,16", "1,2,2,4,4,0"):
        with pytest.raises(ValueError, match="must be >= 1"):
            Shape.parse(bad, causal=False)


def test_argparse_rejects_bad_causal(capsys):
    with pytest.raises(SystemExit) as info:
        main(["check", "--shape", "1,2,2,8,8,16", "--causal", "maybe"])
    assert info.value.code == 2
    assert "top_left" in capsys.readouterr().err


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_bench_fixture(tmp_path):
    pytest.importorskip("matplotlib")  # the bench extra
    assert main(["plot", f"{FIXTURES}/bench_fixture.csv", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"bench_fixture_{k}.png" for k in ("latency", "memory", "ratio", "tflops")]
    assert all(_is_png(p) and p.stat().st_size > 10_000 for p in tmp_path.iterdir())


def test_plot_memory_fixture(tmp_path):
    pytest.importorskip("matplotlib")  # the bench extra
    assert main(["plot", f"{FIXTURES}/memory_fixture.csv", "--out", str(tmp_path)]) == 0
    assert _is_png(tmp_path / "memory_fixture_peak_memory.png")


def test_plot_rejects_other_csv(tmp_path):
    pytest.importorskip("matplotlib")  # the bench extra
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="neither"):
        main(["plot", str(p), "--out", str(tmp_path)])


@needs_interpreter
def test_memory_lab_on_cpu(tmp_path, capsys):
    out = tmp_path / "m.csv"
    assert main(["memory", "--device", "cpu", "--sizes", "32,64", "--out", str(out)]) == 0
    rows = {(r["method"], int(r["S"])): float(r["peak_mib"]) for r in csv.DictReader(open(out))}
    out_bytes = lambda s: 28 * s * 128 * 2  # noqa: E731  bf16 output
    for s in (32, 64):
        assert abs(rows[("vflash", s)] * 2**20 - out_bytes(s)) < 1  # the output and nothing else
        # materialised holds at least the bf16 [1, 28, S, S] scores on top of the output
        assert rows[("materialised", s)] * 2**20 >= out_bytes(s) + 28 * s * s * 2


def test_check_custom_shape_passes(capsys):
    assert main(["check", "--shape", "1,4,2,37,70,24", "--dtype", "bf16", "--causal", "bottom_right",
                 "--window", "9,-1", "--layout", "bnhd"]) == 0
    assert capsys.readouterr().out.strip().endswith("1 passed, 0 failed")


def test_check_fails_and_names_case_with_a_broken_kernel(monkeypatch, capsys, tmp_path):
    real = vflash.attention

    def broken(q, k, v, **kw):  # drops the last key
        return real(q, k[:, :, :-1], v[:, :, :-1], **kw)

    monkeypatch.setattr(vflash, "attention", broken)
    log = tmp_path / "check.log"
    assert main(["check", "--shape", "1,2,2,30,30,16", "--log", str(log)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  fp16 B1 H2/2 N30x30 D16 causal=False" in out
    assert out.strip().endswith("0 passed, 1 failed")
    text = log.read_text()
    assert json.loads(text.splitlines()[0])["vflash"] == vflash.__version__
    assert "FAIL" in text


def test_check_cpu_matrix_header(monkeypatch, capsys):
    from vflash.harness import check
    monkeypatch.setattr(check, "cpu_matrix", lambda: check.reference_checks()[:2])
    assert main(["check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "reduced CPU matrix through the Triton interpreter" in out and "2 passed, 0 failed" in out


@pytest.mark.parametrize("nq,nk", [(5, 5), (3, 7), (7, 3), (1, 1), (64, 65)])
def test_flop_count_matches_mask(nq, nk):
    assert visible_pairs(nq, nk, True) == int(visible_mask(nq, nk, True).sum())
    assert visible_pairs(nq, nk, False) == nq * nk
    assert attention_flops(Shape(2, 3, 1, nq, nk, 8, True)) == 4 * 8 * 2 * 3 * int(visible_mask(nq, nk, True).sum())


def test_cli_help_for_every_subcommand(capsys):
    for cmd in ("check", "bench", "plot", "memory", "demo", "env"):
        with pytest.raises(SystemExit) as info:
            main([cmd, "--help"])
        assert info.value.code == 0
        assert cmd in capsys.readouterr().out


def test_plot_decode_csv(tmp_path):
    pytest.importorskip("matplotlib")  # the bench extra
    # the committed H200 decode sweep: GB/s against KV length and against batch
    csv_path = os.path.join(ROOT, "benchmarks", "results", "2026-12-02-h200-s18-serving", "decode.csv")
    assert main(["plot", csv_path, "--out", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == ["decode_decode_by_batch.png", "decode_decode_by_kv.png"]


@needs_interpreter
@pytest.mark.slow
@pytest.mark.parametrize("mode,factor", [("bwd", 2.5), ("fwd_bwd", 3.5)])
def test_smoke_bench_times_the_backward(tmp_path, mode, factor):
    out = tmp_path / f"{mode}.csv"
    assert main(["bench", "--smoke", "--mode", mode, "--methods", "explicit,vflash", "--out", str(out)]) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["method"] for r in rows} == {"explicit", "vflash"} and {r["mode"] for r in rows} == {mode}
    for r in rows:
        assert r["status"] == "ok", r
        shape = Shape(int(r["B"]), int(r["Hq"]), int(r["Hkv"]), int(r["Nq"]), int(r["Nk"]), int(r["D"]),
                      r["causal"] == "True")
        tflops = attention_flops(shape) * factor / (float(r["ms_median"]) * 1e-3) / 1e12
        assert float(r["tflops"]) == pytest.approx(tflops, rel=1e-6)


@needs_interpreter
def test_merge_and_cache_write_cases_pass_and_catch_a_wrong_op(monkeypatch):
    # the check's merge case (attention over split keys, a causal part that some queries see none of) and
    # cache-write case pass, and each fails when its op is wrong: a merge that drops one part's weight, a
    # write that lands one token in the wrong slot
    from vflash.harness.cases import CacheWriteCase, MergeCase
    cpu = torch.device("cpu")
    merge, write = MergeCase(40, 15, causal=True, D=16), CacheWriteCase(12, 4, page=8, Hkv=1, D=16, pad_every=4)
    assert all(v.passed for v in merge.run(cpu)) and all(v.passed for v in write.run(cpu))
    real_merge, real_write = vflash.merge_states, vflash.write_kvcache
    monkeypatch.setattr(vflash, "merge_states", lambda oa, la, ob, lb: real_merge(oa, la, ob, lb - 0.5))
    monkeypatch.setattr(vflash, "write_kvcache",
                        lambda kc, vc, k, v, s, **kw: real_write(kc, vc, k, v, torch.where(s == s.max(), s - 1, s),
                                                                 check_metadata=False))
    assert not merge.run(cpu)[0].passed
    assert not all(v.passed for v in write.run(cpu))
