"""Issue 4 experiment: where the host time of one vflash.attention call goes. GPU only.

Prints per-call host microseconds (CPU timer around many calls, queued behind a
sleep kernel so that only host work is timed: vflash.harness.timing.per_call_us) for:
  1. vflash.attention end to end through the full path (plans off), plain and causal with LSE;
  2. validation + launcher Python with the kernel launch stubbed out;
  3. the raw `attention_fwd_kernel[grid](...)` JIT dispatch with prebuilt arguments, and
     the CompiledKernel it returns launched directly (no specialization or cache lookup);
  4. Triton JIT dispatch of a trivial kernel with 5 and with 40 arguments (scaling);
  5. vflash.attention repeated with plans on (the fast path of vflash.ops.plans);
  6. SDPA with its default dispatch and restricted to flash, the same-run yardsticks.

GPU only:  PYTHONPATH=src:. python3 -m benchmarks.experiments.launch_overhead
"""

import sys

import torch
import triton
import triton.language as tl

import vflash
from benchmarks.experiments.common import require_cuda
from vflash.harness import lab
from vflash.harness.timing import per_call_us


@triton.jit
def _touch5(X, a, b, c, d):
    tl.store(X + tl.program_id(0), a + b + c + d)


@triton.jit
def _touch40(X, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9,
             c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0, d1, d2, d3, d4, d5, d6, d7, d8):
    tl.store(X + tl.program_id(0), a0 + d8)


def main() -> int:
    if not require_cuda("launch_overhead"):
        return 1
    q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
    # Plans off for the first rows: every call takes the full path.
    with lab.plans_off():
        rows = [("vflash.attention, full path", per_call_us(lambda: vflash.attention(q, q, q))),
                ("vflash.attention causal + lse, full path",
                 per_call_us(lambda: vflash.attention(q, q, q, causal=True, return_lse=True)))]
    with lab.capturing_launches() as captured:  # the full path with its launch stubbed out
        rows.append(("validation + dispatch + launcher (launch stubbed)",
                     per_call_us(lambda: vflash.attention(q, q, q))))
    kernel_launch = captured[-1]
    captured.clear()  # the other stubbed calls' launches and outputs
    real, grid, args = kernel_launch.kernel, kernel_launch.grid, kernel_launch.args
    kwargs = dict(kernel_launch.constexprs, **kernel_launch.options)
    rows.append(("raw kernel[grid](...) JIT dispatch", per_call_us(lambda: real[grid](*args, **kwargs))))
    try:
        compiled = real[grid](*args, **kwargs)
        values = kernel_launch.params()  # the compiled launcher takes every parameter, constexprs included
        launch = compiled[grid]
        rows.append(("CompiledKernel[grid](...) direct launch", per_call_us(lambda: launch(*values))))
        out = args[3]
        expected = out.clone()
        out.zero_()
        launch(*values)
        torch.cuda.synchronize()
        print("direct launch reproduces the JIT launch's output:", torch.equal(out, expected))
    except Exception as exc:
        print("direct launch failed:", type(exc).__name__, str(exc)[:300])
    lab.clear_plans()
    rows.append(("vflash.attention, planned repeat (fast path)", per_call_us(lambda: vflash.attention(q, q, q))))
    rows.append(("  ... causal + lse",
                 per_call_us(lambda: vflash.attention(q, q, q, causal=True, return_lse=True))))
    # D = 128 runs the Gluon sm90 kernel on sm_90: four TMA descriptors per call.
    q128 = torch.randn(1, 2, 16, 128, device="cuda", dtype=torch.float16)
    vflash.attention(q128, q128, q128)
    rows.append(("  ... D = 128 (sm90 kernel)", per_call_us(lambda: vflash.attention(q128, q128, q128))))

    x = torch.zeros(1, device="cuda", dtype=torch.int32)
    rows.append(("trivial kernel, 5 args", per_call_us(lambda: _touch5[(1,)](x, 1, 2, 3, 4))))
    many = list(range(2, 41))
    rows.append(("trivial kernel, 40 args", per_call_us(lambda: _touch40[(1,)](x, *many))))

    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows.append(("SDPA (default dispatch)",
                 per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        rows.append(("SDPA flash", per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))))
    for name, us in rows:
        print(f"{name:>40}: {us:7.1f} us per call (host)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
