"""Where a short backward's time goes: host or GPU. For rows of the fa sweep (bf16), vflash's backward
op (`torch.ops.vflash.attention_bwd`, what autograd calls) and autograd over vflash and over SDPA cuDNN,
each timed eagerly (`time_call`) and by its host cost per call (`per_call_us`: the calls only queue
kernels), the op also as a CUDA graph replay (the GPU's time alone). Eager well above the op's graph
replay means the call is bound by its host path. Prints one line a measurement and writes a CSV.

  PYTHONPATH=src:. python3 -m benchmarks.experiments.bwd_host [--out bwd_host.csv] [--rows D:N:causal ...]
"""

import argparse

import torch

import vflash
from benchmarks.experiments.common import backward_row, require_cuda, write_rows
from vflash import dispatch
from vflash.harness.bench import attention_flops
from vflash.harness.timing import graphed, per_call_us, time_call

ROWS = ["128:512:1", "128:512:0", "64:512:1", "64:512:0", "128:1024:1", "128:16384:1"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bwd_host.csv")
    ap.add_argument("--rows", nargs="*", default=ROWS, help="D:N:causal (0/1), shapes of the fa sweep")
    args = ap.parse_args()
    if not require_cuda("bwd_host"):
        return 0
    dev = torch.device("cuda")
    rows = []
    for row in args.rows:
        r = backward_row(row, dev)
        s, band = r.shape, r.band
        flops = 2.5 * attention_flops(s)
        kernel = dispatch.select_backward(r.problem).kernel

        def op():
            return torch.ops.vflash.attention_bwd(r.do, None, r.q, r.k, r.v, r.out, r.lse, band.off, band.left,
                                                  band.right, r.scale, None, None)

        leaves = [t.detach().requires_grad_() for t in (r.q, r.k, r.v)]
        out_v = vflash.attention(*leaves, causal=s.causal)
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
            out_c = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=s.causal)
        calls = [("vflash_op", op),
                 ("vflash_autograd", lambda: torch.autograd.grad(out_v, leaves, r.do, retain_graph=True)),
                 ("cudnn_autograd", lambda: torch.autograd.grad(out_c, leaves, r.do, retain_graph=True))]
        for name, fn in calls:
            rec = dict(D=s.D, N=s.Nq, causal=int(s.causal), B=s.B, H=s.Hq, what=name, kernel=kernel)
            try:
                fn()
                torch.cuda.synchronize()
                rec["eager_ms"] = time_call(fn, dev)[0]
                rec["host_us"] = per_call_us(fn, n=300, rounds=10)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"{row} {name}: {type(e).__name__} {str(e)[:200]}", flush=True)
                continue
            # the op alone as a CUDA graph: its GPU time (capturing autograd.grad fails, and a failed
            # capture spoils the process's later calls)
            rec["graph_ms"] = time_call(graphed(fn), dev)[0] if name == "vflash_op" else float("nan")
            rec["tflops_eager"] = flops / rec["eager_ms"] / 1e9
            rec["tflops_graph"] = flops / rec["graph_ms"] / 1e9
            rows.append(rec)
            print(f"D{s.D} N{s.Nq} causal={int(s.causal)} {name} ({kernel}): eager {rec['eager_ms']:.3f} ms "
                  f"({rec['tflops_eager']:.0f} TFLOP/s), graph {rec['graph_ms']:.3f} ms "
                  f"({rec['tflops_graph']:.0f}), host {rec['host_us']:.0f} us a call", flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
