"""examples/serve.py: a random-weight Llama-shaped model served through vflash (packed prefill
into a paged cache, then 32 greedy decode steps with attention_with_kvcache) generates the
same tokens as a dense SDPA run of the same model."""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_serve_example_matches_dense_sdpa_token_for_token():
    device = os.environ.get("VFLASH_TEST_DEVICE", "cpu")
    size = "real" if device == "cuda" and torch.cuda.is_available() else "tiny"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "serve.py"), "--device", device,
                          "--size", size, "--tokens", "32"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "matches dense SDPA token for token" in run.stdout
    assert run.stdout.count(": match") == 4
