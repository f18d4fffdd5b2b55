"""sass_schedule.py on sm_90 builds compiled on the CPU with the ptxas that Triton ships
(moved from the library's tests)."""

import os
import subprocess
import sys

import pytest
import torch

from benchmarks.experiments import sass_schedule
from vflash.dispatch import tables
from vflash.harness import lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
needs_gluon = pytest.mark.skipif(not lab.HAVE_GLUON, reason="this Triton has no Gluon")


def _sass_check(variants: str) -> subprocess.CompletedProcess:
    # sass_schedule --check on the given variant dicts; asserts the check passed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]), TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, "-m", "benchmarks.experiments.sass_schedule", "--check",
                        "--variants", variants], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert r.returncode == 0 and "CHECK PASS" in r.stdout, r.stdout + r.stderr[-3000:]
    return r


@needs_gluon
def test_late_pv_wait_keeps_the_pv_wait_after_the_exponentials_in_the_sass():
    # LATE_PV_WAIT's whole point is a ptxas scheduling decision: compiled for sm_90
    # with the ptxas that Triton ships, every key-tile loop must wait for its PV
    # product only after its last MUFU.EX2 (lead h in docs/perf/log.md).
    r = _sass_check("[dict(head_dim=128, q_buffers=2, lse=False, late_pv_wait=True)]")
    assert r.stdout.count("after the exponentials") >= 2 and "before the exponentials" not in r.stdout, r.stdout


@needs_gluon
def test_p_carried_between_key_tiles_needs_no_byte_shuffles_in_the_sass():
    # The 16-bit P goes from one key tile to the next packed two to a 32-bit
    # register: carried as separate halves, ptxas paired them in the opposite order
    # to the PV product's operand and swapped each pair back with a PRMT (32 a key
    # tile at D = 64, 7 % of the loop). The build is the three-consumer D = 64 kernel
    # the launcher runs without a right mask edge.
    r = _sass_check("[dict(head_dim=64, table=True, lse=False)]")
    assert r.stdout.count(" 0 PRMT") >= 2 and "loop:" in r.stdout, r.stdout


def test_variants_are_read_without_eval():
    got = sass_schedule.parse_variants("[dict(head_dim=64, table=True), {'head_dim': 128, 'dtype': torch.bfloat16}]")
    assert got == [dict(head_dim=64, table=True), dict(head_dim=128, dtype=torch.bfloat16)]
    with pytest.raises(ValueError):
        sass_schedule.parse_variants("[__import__('os').system('true')]")


def test_variant_dicts_map_onto_compile_hopper_sm90(monkeypatch):
    calls = []
    monkeypatch.setattr(lab, "compile_sm90_forward", lambda head_dim, **kw: calls.append((head_dim, kw)))
    sass_schedule.compile_variant(dict(head_dim=256, block_n=64, causal=True, late_pv_wait=True, lse=False))
    sass_schedule.compile_variant(dict(head_dim=64, table=True, causal=True, q_buffers=2))
    (d0, kw0), (d1, kw1) = calls
    assert d0 == 256 and kw0["tiles"] == lab.Sm90Tiles(128, 64, 2, late_pv_wait=True)
    assert kw0["right_edge"] and not kw0["left_edge"] and kw0["lse"] is False
    assert d1 == 64 and kw1["tiles"] == tables.SM90[(64, True)]._replace(q_buffers=2)
    with pytest.raises(ValueError):
        sass_schedule.compile_variant(dict(head_dim=64, blockm=64))
