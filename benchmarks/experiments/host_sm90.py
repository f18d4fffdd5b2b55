"""Issue 4 experiment: where the host time of a planned call goes. GPU only (sm_90 for the Hopper rows).

Per-call host microseconds (CPU timer around many calls) for tiny shapes:
  1. vflash.attention, planned repeat: portable kernel (D = 64), sm90 kernel (D = 128), each
     with the plan's direct C launch (vflash.ops.direct_launch) and with Triton's own runner;
  2. the pieces of a planned repeat: the key, the lookup, the output allocation, the launch alone;
     and a causal Hopper call that draws its work tiles from a counter (one more allocation and fill);
  3. SDPA flash, the same-run yardstick.
Both head dims run twice, in alternating order, to show the host's drift. Timing:
vflash.harness.timing.per_call_us (kernels queued behind a sleep kernel, so only host work is timed).

GPU only:  PYTHONPATH=src:. python3 -m benchmarks.experiments.host_sm90
"""

import sys

import torch

import vflash
from benchmarks.experiments.common import require_cuda
from vflash.harness import lab
from vflash.harness.timing import per_call_us


def row(name, us):
    print(f"{name:>50}: {us:7.1f} us per call (host)", flush=True)


def main() -> int:
    if not require_cuda("host_sm90"):
        return 1
    import triton
    print(f"triton {triton.__version__}, torch {torch.__version__}")
    for d in (64, 128, 128, 64):
        q = torch.randn(1, 2, 16, d, device="cuda", dtype=torch.float16)
        lab.clear_plans()
        vflash.attention(q, q, q)
        plan = lab.recorded_plans()[0]
        kind = "sm90 kernel" if d == 128 else "portable kernel"
        row(f"planned repeat, {kind} (D {d}) [{plan.launch.__qualname__.split('.')[-1]}]",
            per_call_us(lambda: vflash.attention(q, q, q)))
        row("  ... causal + lse", per_call_us(lambda: vflash.attention(q, q, q, causal=True, return_lse=True)))
        with lab.triton_launcher_only():
            lab.clear_plans()
            vflash.attention(q, q, q)
            row("  ... Triton's runner instead of the direct launch", per_call_us(lambda: vflash.attention(q, q, q)))
        lab.clear_plans()
        vflash.attention(q, q, q)
        key_args = tuple(dict(q=q, k=q, v=q, causal=False, return_lse=False).get(n) for n in lab.ATTENTION.names)
        key = lab.plan_key(*key_args)  # vflash.call.ATTENTION's arguments, None where unset
        out = torch.empty_like(q)
        row("  plan_key", per_call_us(lambda: lab.plan_key(*key_args)))
        row("  lookup", per_call_us(lambda: lab.lookup_plan(key)))
        row("  q.new_empty(out shape)", per_call_us(lambda: q.new_empty(plan.allocs[0].shape)))
        args = (q, q, q, False, None, None, None, False)  # the plan's inputs: the API's arguments in order
        row("  plan.launch alone (output preallocated)", per_call_us(lambda: plan.launch(*args, out)))
        if d == 128:  # causal: DYNAMIC, a fresh work-tile counter a call, where work tiles outnumber the SMs
            for heads, what in ((16, "DYNAMIC: 144 work tiles"), (2, "static: 18 work tiles")):
                long_q = torch.randn(1, heads, 1100, d, device="cuda", dtype=torch.float16)
                vflash.attention(long_q, long_q, long_q, causal=True)
                row(f"planned repeat, sm90 kernel, causal N 1100 ({what})",
                    per_call_us(lambda: vflash.attention(long_q, long_q, long_q, causal=True)))
            row("  q.new_zeros(1, int32) (its counter)", per_call_us(lambda: q.new_zeros(1, dtype=torch.int32)))
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
        row("SDPA flash", per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
