"""The correctness rule (docs/DESIGN.md): a kernel output passes when

    max|out - ref| <= 2 * max|out_same_dtype - ref| + floor

where ref is explicit attention in fp64 from the same inputs and
out_same_dtype is explicit PyTorch attention run in the output's dtype (the
inputs' dtype for `out`; fp32 for `lse`, which is always fp32). The
floor is a quarter of the output dtype's ulp at 1.0, times the reference's
magnitude when that exceeds 1: it only matters where PyTorch itself is exact
(one visible key, say). Everything must be finite, and -inf LSE entries (rows
that see no key) must sit exactly where the reference has them.

FP8 inputs (`compare_rms`): the reference is fp64 attention on the dequantized
inputs, the yardstick the explicit FP8 pipeline (vflash.reference.fp8), and the
RMSE must also be within twice the yardstick's plus the floor. Their LSE on a GPU
adds the score's accumulation bound (`fp8_score_slack`): Hopper's e4m3 tensor-core
dot keeps about 14 bits of its running sum, not fp32's 24, which no PyTorch
yardstick reproduces.
"""

from dataclasses import dataclass

import torch

FLOORS = {torch.float16: 2.0**-12, torch.bfloat16: 2.0**-9, torch.float32: 1e-5}

# The relative error of an e4m3 tensor-core dot's accumulation on sm_90: about 14 significant bits kept (the
# DeepSeek-V3 technical report, section 3.3.2, measured on H800s), so a truncation of up to 2^-13 of the sum.
FP8_ACCUMULATION_ULP = 2.0**-13


@dataclass
class Verdict:
    what: str
    max_err: float
    mean_err: float
    tol: float
    passed: bool
    note: str = ""


def compare(what: str, got: torch.Tensor, ref: torch.Tensor, same_dtype: torch.Tensor,
            floor_dtype: torch.dtype, factor: float = 2.0, slack: float = 0.0) -> Verdict:
    """Judge `got` against `ref` with the same-dtype yardstick `same_dtype`; `slack` is an error bound the
    yardstick does not model (fp8_score_slack), added to the tolerance."""
    ref = ref.double()
    got_d = got.double()
    same_d = same_dtype.double()
    ref_inf = torch.isinf(ref)
    if ref_inf.any() and not torch.equal(torch.isinf(got_d) & (got_d < 0), ref_inf & (ref < 0)):
        return Verdict(what, float("nan"), float("nan"), 0.0, False, "-inf entries differ from the reference")
    fin = ~ref_inf
    if not torch.isfinite(got_d[fin]).all():
        return Verdict(what, float("nan"), float("nan"), 0.0, False, "non-finite values")
    if fin.sum() == 0:
        return Verdict(what, 0.0, 0.0, 0.0, True)
    err = (got_d[fin] - ref[fin]).abs()
    same_err = (same_d[fin] - ref[fin]).abs().nan_to_num(nan=0.0, posinf=0.0).max().item()
    magnitude = max(1.0, ref[fin].abs().max().item())
    tol = factor * same_err + FLOORS[floor_dtype] * magnitude + slack
    max_err = err.max().item()
    return Verdict(what, max_err, err.mean().item(), tol, max_err <= tol)


def compare_rms(what: str, got: torch.Tensor, ref: torch.Tensor, yardstick: torch.Tensor,
                floor_dtype: torch.dtype, factor: float = 2.0) -> Verdict:
    """`compare`'s rule on the max error, and the same rule on the RMSE (the FP8 rule)."""
    verdict = compare(what, got, ref, yardstick, floor_dtype, factor)
    if not verdict.passed or not torch.isfinite(ref.double()).any():
        return verdict
    fin = torch.isfinite(ref.double())
    ref_d = ref.double()[fin]
    rms = (got.double()[fin] - ref_d).pow(2).mean().sqrt().item()
    yard_rms = (yardstick.double()[fin] - ref_d).pow(2).mean().sqrt().item()
    rms_tol = factor * yard_rms + FLOORS[floor_dtype] * max(1.0, ref_d.abs().max().item())
    note = f"rmse {rms:.3e} tol {rms_tol:.3e}"
    return Verdict(what, verdict.max_err, verdict.mean_err, verdict.tol, rms <= rms_tol, note)


def fp8_score_slack(q: torch.Tensor, k: torch.Tensor, scale: float) -> float:
    """The largest error an e4m3 tensor-core dot's accumulation can put in one score, hence in the LSE (a
    logsumexp moves by at most its largest term's shift; a softcap's tanh only shrinks it): FP8_ACCUMULATION_ULP
    times the largest sum of |q_d k_d| over (row, key) pairs, in real units. q [B, Hq, Nq, D] and k
    [B, Hq, Nk, D] dequantized (k repeated to q's heads)."""
    if q.numel() == 0 or k.numel() == 0:
        return 0.0
    sums = torch.matmul(q.double().abs(), k.double().abs().transpose(-1, -2))
    return FP8_ACCUMULATION_ULP * abs(scale) * sums.max().item()
