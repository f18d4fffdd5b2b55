"""The command line: demo, env and check (exit codes and named failures), usage errors, help texts."""

import argparse
import io
import json
import subprocess
import sys

import pytest
import torch

from vflash.cli import CPU_MAX_SIZE, build_parser, main
from vflash.harness.cases import Case
from vflash.harness.check import cpu_matrix, run_matrix


def test_demo_prints_equal_results(capsys):
    assert main(["demo"]) == 0
    text = capsys.readouterr().out
    for block in (1, 2, 6):
        assert f"block={block}" in text
    assert "0.363083" in text


def test_env_json(capsys):
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"vflash", "torch", "triton", "triton_interpreter", "cuda_available"} <= set(info)


def test_check_names_a_broken_kernel_and_counts_it():
    import vflash

    def off_by_a_bit(q, k, v, **kw):
        out, lse = vflash.attention(q, k, v, **kw)
        out = out.clone()
        out[..., -1, 0] += 0.05  # one element of the last row
        return out, lse

    cases = [Case(Nq=20, Nk=20, D=16), Case(Nq=9, Nk=9, D=16, causal=True)]
    stream = io.StringIO()
    failed = run_matrix(cases, torch.device("cpu"), stream=stream, attention=off_by_a_bit)
    text = stream.getvalue()
    assert failed == 2
    assert "FAIL  fp16 B1 H2/2 N20x20 D16 causal=False" in text
    assert text.strip().endswith("0 passed, 2 failed")


def test_check_reports_a_forced_kernels_refusals_apart(monkeypatch):
    # a forced kernel that cannot take a case: "REFUSED" with the dispatch's reason, neither a pass nor a
    # failure; a run with nothing but refusals checked nothing and fails
    from vflash.dispatch import rules
    monkeypatch.setattr(rules, "FORCED", "sm90")  # the CPU runs the interpreter, which sm90 refuses
    stream = io.StringIO()
    failed = run_matrix([Case(Nq=20, Nk=20, D=16)], torch.device("cpu"), stream=stream)
    text = stream.getvalue()
    assert "REFUSED fp16 B1 H2/2 N20x20 D16" in text and "the sm90 kernel cannot take this call" in text
    assert text.strip().endswith("0 passed, 0 failed, 1 refused by the forced kernel") and failed == 1
    monkeypatch.setattr(rules, "FORCED", "portable")
    stream = io.StringIO()
    assert run_matrix([Case(Nq=20, Nk=20, D=16)], torch.device("cpu"), stream=stream) == 0
    assert stream.getvalue().strip().endswith("1 passed, 0 failed")


def test_check_reports_a_crash_as_failure():
    def crashes(q, k, v, **kw):
        raise RuntimeError("illegal instruction")

    stream = io.StringIO()
    assert run_matrix([Case(Nq=4, Nk=4, D=16)], torch.device("cpu"), stream=stream, attention=crashes) == 1
    assert "raised RuntimeError: illegal instruction" in stream.getvalue()


def test_cpu_matrix_covers_the_features():
    names = " ".join(c.name for c in cpu_matrix())
    for word in ("fp16", "bf16", "fp32", "top_left", "window=", "softcap=", "bnhd", "sliced",
                 "H8/1", "stability", "fully masked", "D256", "D40", "varlen[", "chunked", "kvcache[", "splits=",
                 "grad ", "batch-invariant", "merge ", "write_kvcache "):
        assert word in names
    sinks = [c.name for c in cpu_matrix() if "sinks" in c.name]  # every path, and its gradient
    for word in ("varlen[", "kvcache[", "splits=", "batch-invariant", "grad ", "fully masked"):
        assert any(word in name for name in sinks), word
    fp8 = [c.name for c in cpu_matrix() if "fp8" in c.name]  # inputs dense and packed, caches split and not
    for word in ("fp8 B", "varlen[", "fp8-cache(tensor)", "fp8-cache(head)", "fp8-cache(seq)", "splits=",
                 "batch-invariant", "descale=none", "out=fp16"):
        assert any(word in name for name in fp8), word


def test_python_dash_m_help():
    r = subprocess.run([sys.executable, "-m", "vflash", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "check" in r.stdout


# --- usage errors, help texts, and the CPU memory lab's limits ---


@pytest.fixture
def no_matrix(monkeypatch):
    """Empty check matrices: a usage error that slips through runs nothing and returns 0."""
    from vflash.harness import check
    monkeypatch.setattr(check, "cpu_matrix", lambda: [])
    monkeypatch.setattr(check, "gpu_matrix", lambda: [])


@pytest.mark.parametrize("option", [["--window", "4,4"], ["--dtype", "bf16"], ["--causal", "false"],
                                    ["--softcap", "5"], ["--scale", "0.3"], ["--layout", "bnhd"]],
                         ids=lambda o: o[0])
def test_check_shape_options_without_shape_are_usage_errors(option, no_matrix, capsys):
    with pytest.raises(SystemExit) as info:
        main(["check", "--device", "cpu"] + option)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert option[0] in err and "only with --shape" in err


def test_check_one_fp8_shape_runs_the_fp8_rule(capsys):
    assert main(["check", "--device", "cpu", "--shape", "1,2,1,20,30,16", "--dtype", "fp8", "--causal", "true"]) == 0
    out = capsys.readouterr().out
    assert "fp8 B1 N20x30" in out and "rmse" in out and "1 passed, 0 failed" in out
    with pytest.raises(SystemExit) as info:
        main(["check", "--device", "cpu", "--shape", "1,2,1,20,30,16", "--dtype", "fp8", "--layout", "bnhd"])
    assert info.value.code == 2


def test_check_without_shape_options_still_runs_the_matrix(no_matrix, capsys):
    assert main(["check", "--device", "cpu"]) == 0
    assert "0 passed, 0 failed" in capsys.readouterr().out


@pytest.mark.parametrize("argv,words", [
    (["--smoke", "--causal"], ["--causal", "only with --shape"]),
    (["--smoke", "--sweep", "article"], ["--sweep", "--smoke"]),
    (["--smoke", "--shape", "1,2,2,8,8,16", "--sweep", "fa"], ["--sweep", "--shape"]),
    (["--sweep", "decode", "--mode", "bwd"], ["--sweep decode", "--mode"]),
])
def test_bench_options_that_do_not_combine_are_usage_errors(argv, words, monkeypatch, capsys, tmp_path):
    from vflash.harness import bench
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: None)
    with pytest.raises(SystemExit) as info:
        main(["bench", "--out", str(tmp_path / "b.csv")] + argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err


@pytest.fixture
def fake_lab(monkeypatch):
    """The memory lab replaced by a recorder: a refusal that slips through costs nothing."""
    from vflash.harness import memlab
    calls = []
    monkeypatch.setattr(memlab, "run_memory_lab", lambda device, sizes, out, printer: calls.append(list(sizes)))
    return calls


def test_memory_refuses_slow_cpu_sizes_unless_forced(fake_lab, capsys, tmp_path):
    argv = ["memory", "--device", "cpu", "--sizes", f"64,{2 * CPU_MAX_SIZE}", "--out", str(tmp_path / "m.csv")]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and fake_lab == []
    err = capsys.readouterr().err
    assert str(CPU_MAX_SIZE) in err and "--force" in err and str(2 * CPU_MAX_SIZE) in err
    assert main(argv + ["--force"]) == 0
    assert fake_lab == [[64, 2 * CPU_MAX_SIZE]]
    assert main(argv[:4] + [str(CPU_MAX_SIZE), "--out", str(tmp_path / "m.csv")]) == 0  # the limit itself runs
    assert fake_lab[-1] == [CPU_MAX_SIZE]


@pytest.mark.parametrize("sizes", ["64,x", "0", "64,-8", ""])
def test_memory_bad_sizes_are_usage_errors(sizes, fake_lab, capsys):
    with pytest.raises(SystemExit) as info:
        main(["memory", "--device", "cpu", "--sizes", sizes])
    assert info.value.code == 2 and "positive integers" in capsys.readouterr().err and fake_lab == []


def test_memory_lab_prints_each_size_as_it_goes(monkeypatch, tmp_path):
    from vflash.harness import memlab
    events = []

    def method(name):
        def run(q, k, v):
            events.append(("run", name, q.shape[2]))
            return torch.zeros(4)
        return run

    monkeypatch.setattr(memlab, "METHODS", {n: method(n) for n in ("materialised", "vflash", "sdpa")})
    memlab.run_memory_lab(torch.device("cpu"), [8, 16], str(tmp_path / "m.csv"),
                          printer=lambda text, end="\n": events.append(("print", text + end)), H=2, D=8)
    runs = [i for i, e in enumerate(events) if e[0] == "run"]
    assert len(runs) == 6
    printed = lambda lo, hi: "".join(e[1] for e in events[lo:hi] if e[0] == "print")  # noqa: E731
    # The size shows before its first method runs, each method's figure before the next one starts,
    # and the size's line is finished before the next size starts.
    assert "S=     8" in printed(0, runs[0])
    assert "materialised" in printed(runs[0], runs[1]) and "vflash" in printed(runs[1], runs[2])
    assert printed(runs[2], runs[3]).endswith("MiB\nS=    16") and "sdpa" in printed(runs[2], runs[3])
    lines = printed(0, len(events)).splitlines()
    assert len(lines) == 2 and all(n in lines[1] for n in ("S=    16", "materialised", "vflash", "sdpa"))


def _subcommands():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub, sub.choices


def test_every_subcommand_and_option_has_help():
    sub, parsers = _subcommands()
    assert {"check", "bench", "plot", "memory", "demo", "env"} <= set(parsers)
    listed = {a.dest: a.help for a in sub._choices_actions}
    for name, p in parsers.items():
        assert listed.get(name), f"{name} has no help line in `vflash --help`"
        assert p.description, f"`vflash {name} --help` has no description"
        for action in p._actions:
            assert action.help and action.help.strip(), f"vflash {name} {action.option_strings or action.dest}"
