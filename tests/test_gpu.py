"""The GPU suite: realistic sizes, long sequences and every feature, against the
fp64 oracle. Skipped without CUDA."""

import pytest
import torch

import vflash
from vflash.harness.cases import Case, make_inputs
from vflash.harness.check import gpu_matrix
from vflash.call import Call, Score

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", gpu_matrix(), ids=lambda c: c.name.replace(" ", "_"))
def test_gpu_matrix(case):
    for v in case.run(torch.device("cuda")):
        assert v.passed, f"{case.name}: {v.what} max err {v.max_err:.3e} > tol {v.tol:.3e} {v.note}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_poisoned_outputs_are_fully_written(causal, d):
    # The dispatch's own choice for the shape and the preallocated (TMA-ready) outputs.
    from vflash import dispatch
    from vflash._validate import mask_band
    from vflash.ops.attention import attention_forward
    q, k, v = make_inputs(Case(B=2, Hq=8, Hkv=2, Nq=1999, Nk=2001, D=d), torch.device("cuda"))
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    band = mask_band(1999, 2001, "bottom_right" if causal else None, (-1, -1))
    choice = dispatch.select(dispatch.problem_of(Call(q, k, v, None, band, Score(1.0), False, out)))
    attention_forward(q, k, v, band=band, score=Score(d ** -0.5, None), return_lse=True, tiles=choice.tiles,
                      kernel=choice.kernel, out=out, lse=lse)
    assert not out.isnan().any() and not lse.isnan().any()


def test_gpu_deterministic():
    q, k, v = make_inputs(Case(B=2, Hq=8, Hkv=8, Nq=3000, Nk=3000, D=128, causal=True), torch.device("cuda"))
    a = vflash.attention(q, k, v, causal=True)
    b = vflash.attention(q, k, v, causal=True)
    assert torch.equal(a, b)


def test_gpu_batch_times_heads_beyond_65535():
    # The grid is (tiles, heads, batch): 4096 x 32 = 131072 (batch, head) pairs in one launch.
    case = Case(B=4096, Hq=32, Hkv=8, Nq=5, Nk=7, D=16, causal=True)
    verdicts = case.run(torch.device("cuda"))
    assert all(v.passed for v in verdicts), [(v.what, v.max_err, v.tol) for v in verdicts]
