"""`vflash` command line: check, demo, env."""

import argparse
import json
import platform
import sys
from typing import List, Optional


def _env() -> dict:
    import torch
    import triton

    import vflash
    from vflash._backend import interpreting

    info = {
        "vflash": vflash.__version__, "python": platform.python_version(), "torch": torch.__version__,
        "triton": triton.__version__, "cuda_available": torch.cuda.is_available(),
        "triton_interpreter": interpreting(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, compute_capability=f"{p.major}.{p.minor}", cuda=torch.version.cuda,
                    sm_count=p.multi_processor_count)
    return info


def cmd_env(args) -> int:
    info = _env()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:>20}: {v}")
    return 0


def cmd_demo(args) -> int:
    from vflash.reference.scalar import DEMO_K, DEMO_Q, DEMO_V, full_attention, online_attention

    full = full_attention(DEMO_Q, DEMO_K, DEMO_V)
    print("full          :", [round(x, 6) for x in full])
    worst = 0.0
    for block in (1, 2, 6):
        online = online_attention(DEMO_Q, DEMO_K, DEMO_V, block=block)
        diff = max(abs(a - b) for a, b in zip(full, online))
        worst = max(worst, diff)
        print(f"online block={block}:", [round(x, 6) for x in online], f"max abs diff = {diff:.2e}")
    return 0 if worst < 1e-12 else 1


def cmd_check(args) -> int:
    import torch

    from vflash.harness.check import cpu_matrix, default_device, gpu_matrix, run_matrix

    device = default_device() if args.device == "auto" else torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    cases = gpu_matrix() if device.type == "cuda" else cpu_matrix()
    info = _env()
    header = (f"vflash check on {device} ({info.get('gpu', 'CPU')}), {len(cases)} cases"
              + (" - reduced CPU matrix through the Triton interpreter" if device.type == "cpu" else ""))
    print(header, flush=True)
    log = open(args.log, "w") if args.log else None
    try:
        if log:
            print(json.dumps(info), file=log)
            print(header, file=log)

        class Tee:
            def write(self, s):
                sys.stdout.write(s)
                if log:
                    log.write(s)

            def flush(self):
                sys.stdout.flush()

        failed = run_matrix(cases, device, stream=Tee())
    finally:
        if log:
            log.close()
    return 1 if failed else 0


def cmd_bench(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("vflash bench needs a CUDA GPU; none is available here", file=sys.stderr)
        return 2
    from vflash.harness.bench import run_bench

    run_bench(args.sweep, args.dtype.split(","), args.out)
    print(f"wrote {args.out}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="vflash", description="Exact FlashAttention in Triton, verifiable.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="run the correctness matrix against the fp32/fp64 oracle")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: CUDA when present, else CPU through the Triton interpreter")
    p.add_argument("--log", metavar="FILE", help="also write the full record, with the environment, here")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("bench", help="time vflash against SDPA flash and cuDNN on the GPU")
    p.add_argument("--sweep", default="fa", choices=["fa", "article"],
                   help="fa: 16k tokens, hidden 2048, D 64/128, N 512..16384; article: B1 H16 D64")
    p.add_argument("--dtype", default="fp16", help="comma-separated: fp16,bf16")
    p.add_argument("--out", default="bench.csv", metavar="CSV")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("demo", help="online softmax vs full softmax in pure Python")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("env", help="versions, device and whether the interpreter is on")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_env)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
