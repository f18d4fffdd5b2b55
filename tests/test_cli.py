"""The command line: demo, env and check (exit codes and named failures)."""

import io
import json
import subprocess
import sys

import torch

from vflash.cli import main
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


def test_check_reports_a_crash_as_failure():
    def crashes(q, k, v, **kw):
        raise RuntimeError("illegal instruction")

    stream = io.StringIO()
    assert run_matrix([Case(Nq=4, Nk=4, D=16)], torch.device("cpu"), stream=stream, attention=crashes) == 1
    assert "raised RuntimeError: illegal instruction" in stream.getvalue()


def test_cpu_matrix_covers_the_features():
    names = " ".join(c.name for c in cpu_matrix())
    for word in ("fp16", "bf16", "fp32", "top_left", "window=", "softcap=", "bnhd", "sliced",
                 "H8/1", "stability", "fully masked", "D256", "D40"):
        assert word in names


def test_python_dash_m_help():
    r = subprocess.run([sys.executable, "-m", "vflash", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "check" in r.stdout
