"""Experiment scripts kept in the repository still run (their correctness half)."""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run times the variants; CI checks them on the CPU")
def test_fwd_variants_check_half_passes_under_the_interpreter():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks/experiments/fwd_variants.py"), "--check-only"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASS") == 12 and "FAIL" not in r.stdout and "ERROR" not in r.stdout
