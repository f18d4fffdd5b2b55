"""`vflash` command line: check, bench, plot, memory, demo, env.

Also runs as `python -m vflash`.
"""

import argparse
import json
import os
import sys
from typing import List, Optional


def _env() -> dict:
    from vflash.harness.env import environment
    return environment()


def _device(name: str):
    import torch
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but no CUDA device is available here")
    return torch.device(name)


def _pair(text: str):
    parts = text.split(",")
    try:
        left, right = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT integers (-1 = unbounded), got {text!r}") from None
    return (left, right)


def _causal(text: str):
    table = {"false": False, "no": False, "true": True, "yes": True,
             "top_left": "top_left", "bottom_right": "bottom_right"}
    if text.lower() not in table:
        raise argparse.ArgumentTypeError(f"expected false, true, top_left or bottom_right, got {text!r}")
    return table[text.lower()]


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
    print("online softmax equals the full softmax to machine precision" if worst < 1e-12
          else "MISMATCH: online and full softmax differ")
    return 0 if worst < 1e-12 else 1


def _custom_case(args):
    from vflash.harness.bench import Shape
    from vflash.harness.cases import Case, Fp8Case

    try:
        s = Shape.parse(args.shape, causal=False)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.dtype == "fp8":  # e4m3 inputs, a descale a (sequence, KV head), bf16 out: the FP8 rule
        if args.layout is not None or args.scale is not None:
            args.subparser.error("--layout and --scale do not apply to --dtype fp8")
        return Fp8Case(B=s.B, Hq=s.Hq, Hkv=s.Hkv, Nq=s.Nq, Nk=s.Nk, D=s.D, causal=bool(args.causal) if
                       args.causal is None else args.causal, window=args.window, softcap=args.softcap,
                       sinks=bool(args.sinks), descale="head")
    return Case(B=s.B, Hq=s.Hq, Hkv=s.Hkv, Nq=s.Nq, Nk=s.Nk, D=s.D, dtype=args.dtype or "fp16",
                causal=bool(args.causal) if args.causal is None else args.causal, window=args.window,
                softcap=args.softcap, scale=args.scale, layout=args.layout or "bhnd", sinks=bool(args.sinks))


# The options of `check` that describe the one case --shape names.
CHECK_SHAPE_OPTIONS = ("dtype", "causal", "window", "softcap", "scale", "layout", "sinks")


def _only_with(args, flag: str, names) -> None:
    """A usage error (exit code 2) when any of `names` was given without `flag`."""
    given = [f"--{n}" for n in names if getattr(args, n) is not None]
    if given:
        args.subparser.error(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with "
                             f"{flag}")


def cmd_check(args) -> int:
    from vflash.harness.check import cpu_matrix, gpu_matrix, run_matrix

    if not args.shape:
        _only_with(args, "--shape B,Hq,Hkv,Nq,Nk,D (one case); without it check runs the whole matrix",
                   CHECK_SHAPE_OPTIONS)
    device = _device(args.device)
    if args.shape:
        if args.match:
            args.subparser.error("--match picks cases of the matrix; it does not combine with --shape")
        cases, what = [_custom_case(args)], "your shape"
    elif device.type == "cuda":
        cases, what = gpu_matrix(), "full GPU matrix"
    else:
        cases, what = cpu_matrix(), "reduced CPU matrix through the Triton interpreter (a few minutes at most)"
    if args.match:
        cases = [c for c in cases if args.match in c.name]
        what += f", the cases named with {args.match!r}"
    if args.kernel:
        from vflash.dispatch import rules
        rules.FORCED = args.kernel
        what += f", the {args.kernel} kernels forced"
    info = _env()
    header = f"vflash check on {device} ({info.get('gpu', 'CPU')}): {len(cases)} cases, {what}"
    log = open(args.log, "w") if args.log else None

    class Tee:
        def write(self, s):
            sys.stdout.write(s)
            if log:
                log.write(s)

        def flush(self):
            sys.stdout.flush()
            if log:
                log.flush()

    try:
        if log:
            print(json.dumps(info), file=log)
        print(header, file=Tee(), flush=True)
        failed = run_matrix(cases, device, stream=Tee())
    finally:
        if log:
            log.close()
    return 1 if failed else 0


def cmd_bench(args) -> int:
    import torch

    from vflash.harness.bench import METHODS, Shape, run_bench, sweep_shapes
    from vflash.harness.serving import SWEEPS, run_serving

    if args.sweep in SWEEPS:
        if args.shape or args.smoke or args.methods or args.interleave or args.mode != "fwd":
            args.subparser.error(f"--sweep {args.sweep} runs its own rows and methods (bf16, forward); it does not "
                                 "combine with --shape, --smoke, --methods, --interleave or --mode")
        if not torch.cuda.is_available():
            print("vflash bench measures GPU kernels and no CUDA device is available here", file=sys.stderr)
            return 2
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        run_serving(args.sweep, args.out, torch.device("cuda"), printer=lambda s: print(s, flush=True))
        print(f"wrote {args.out}")
        return 0
    if not args.shape:
        _only_with(args, "--shape", ("causal",))
    if args.sweep is not None and (args.shape or args.smoke):
        args.subparser.error("--sweep names the shapes to run; it does not combine with "
                             + ("--shape" if args.shape else "--smoke, which runs its own tiny shapes"))
    if args.smoke:
        device, sweep = torch.device("cpu"), "smoke"
    else:
        if not torch.cuda.is_available():
            print("vflash bench measures GPU kernels and no CUDA device is available here; "
                  "`vflash bench --smoke` exercises the harness on the CPU", file=sys.stderr)
            return 2
        device, sweep = torch.device("cuda"), args.sweep or "fa"
    if args.shape:
        try:
            shapes, sweep = [Shape.parse(args.shape, bool(args.causal))], "custom"
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
    else:
        shapes = sweep_shapes(sweep)
    methods = args.methods.split(",") if args.methods else None
    for m in methods or []:
        if m not in METHODS:
            raise SystemExit(f"error: unknown method {m!r}; choose from {', '.join(METHODS)}")
    dtypes = args.dtype.split(",")
    for d in dtypes:
        if d not in ("fp16", "bf16", "fp32"):
            raise SystemExit(f"error: unknown dtype {d!r}; choose fp16, bf16 or fp32")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    run_bench(shapes, sweep, dtypes, args.out, methods, device, printer=lambda s: print(s, flush=True),
              interleave=args.interleave, mode=args.mode)
    print(f"wrote {args.out}")
    return 0


def cmd_plot(args) -> int:
    from vflash.harness.plot import plot_csv

    if not os.path.exists(args.csv):
        raise SystemExit(f"error: no such file: {args.csv}")
    try:
        for path in plot_csv(args.csv, args.out):
            print(f"wrote {path}")
    except (ValueError, ImportError) as exc:  # a bad CSV, or matplotlib missing (the message names the extra)
        raise SystemExit(f"error: {exc}") from None
    return 0


# `vflash memory` on the CPU: the largest S run without --force. vflash's call under the
# Triton interpreter (B = 1, H = 28, D = 128, bf16, causal; one core of a 2026 x86 host)
# measured 4 s at S = 64, 8 s at 128, 30 s at 256, 66 s at 512 and 385 s at 1024: four to
# six times longer for each doubling, so S = 2048 would take over half an hour, S = 4096 hours.
CPU_MAX_SIZE = 1024


def _sizes(text: str):
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return sizes


def cmd_memory(args) -> int:
    from vflash.harness.memlab import CPU_SIZES, GPU_SIZES, run_memory_lab

    device = _device(args.device)
    sizes = args.sizes or (GPU_SIZES if device.type == "cuda" else CPU_SIZES)
    if device.type == "cpu" and max(sizes) > CPU_MAX_SIZE and not args.force:
        args.subparser.error(
            f"S = {max(sizes)} is above {CPU_MAX_SIZE}, the largest size run on the CPU without --force: "
            f"the Triton interpreter takes about a minute at S = 512, six at S = 1024, and four to six times "
            f"longer each time S doubles (S = 2048: over half an hour; S = 4096: hours). Run it on a GPU, "
            f"or pass --force to run it here anyway")
    print(f"peak memory on {device}, B=1 H=28 D=128 bf16 causal"
          + (" (CPU: tensor allocations tracked by dispatch; the Triton interpreter is slow: about a minute "
             "at S = 512, six at S = 1024)" if device.type == "cpu" else ""), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    run_memory_lab(device, sizes, args.out, printer=lambda s, end="\n": print(s, end=end, flush=True))
    print(f"wrote {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflash", description="Exact FlashAttention in Triton, verifiable.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="correctness matrix against the fp64 oracle",
                       description="Run vflash against the fp64 oracle: one line per case, then "
                                   "'N passed, M failed'; exit code 1 on any failure.")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: CUDA when present, else the CPU through the Triton interpreter")
    p.add_argument("--log", metavar="FILE", help="also write the full record, with the environment, here")
    p.add_argument("--shape", metavar="B,Hq,Hkv,Nq,Nk,D", help="check this one shape instead of the matrix")
    p.add_argument("--match", metavar="WORD", help="only the matrix's cases whose name holds WORD (e.g. sinks, grad)")
    p.add_argument("--kernel", choices=["portable", "sm90"],
                   help="force this kernel family (as VFLASH_KERNEL does); cases it cannot take are reported as "
                        "refused, with the reason, not run")
    # The options below describe the --shape case; given without --shape they are a usage error.
    # Their defaults are None so that "not given" can be told apart; _custom_case fills them in.
    p.add_argument("--dtype", choices=["fp16", "bf16", "fp32", "fp8"],
                   help="with --shape: input dtype (default fp16; fp8: e4m3 with descales, bf16 out)")
    p.add_argument("--causal", type=_causal,
                   help="with --shape: false|true|top_left|bottom_right (default false; true = bottom_right)")
    p.add_argument("--window", type=_pair, metavar="LEFT,RIGHT",
                   help="with --shape: sliding window, keys visible to the left and right (-1 = unbounded)")
    p.add_argument("--softcap", type=float, help="with --shape: tanh soft-capping of the scores at this value")
    p.add_argument("--scale", type=float, help="with --shape: score scale (default 1/sqrt(D))")
    p.add_argument("--layout", choices=["bhnd", "bnhd", "sliced"],
                   help="with --shape: contiguous (default), [B,N,H,D] transposed view, or a strided slice")
    p.add_argument("--sinks", action="store_true", default=None,
                   help="with --shape: a sink logit per query head (fp32, random)")
    p.set_defaults(func=cmd_check, subparser=p)

    p = sub.add_parser("bench", help="latency, TFLOP/s and peak memory against SDPA flash/cuDNN (GPU)",
                       description="Benchmark vflash and the baselines in one run and write a long-format "
                                   "CSV plus an environment record (<out>.env.json). Needs a GPU, except "
                                   "--smoke.")
    p.add_argument("--sweep", choices=["fa", "article", "d256", "decode", "varlen", "chunked", "merge", "write"],
                   help="fa (default): 16k tokens, hidden 2048, D 64/128, N 512..16384; article: B1 H16 D64, "
                        "N 128..8192; d256: 16k tokens, H8, D256, N 512..16384; decode: paged-KV decode GB/s, "
                        "B 1..128 x KV 1k..32k (bf16, Hq 32 / Hkv 8, D 128); varlen: 8 packed causal "
                        "sequences, 31k tokens; chunked: a chunk of new queries over a paged cached prefix; merge / "
                        "write: merge_states and write_kvcache GB/s against PyTorch ops")
    p.add_argument("--shape", metavar="B,Hq,Hkv,Nq,Nk,D", help="benchmark one shape instead of a sweep")
    p.add_argument("--causal", action="store_true", default=None, help="with --shape: causal (bottom-right)")
    p.add_argument("--dtype", default="fp16", help="comma-separated: fp16,bf16,fp32 (default fp16)")
    p.add_argument("--methods", help="comma-separated subset of: explicit_fp32, explicit, tiled, vflash, "
                                     "vflash_sinks (with a sink logit a head), vflash_fp8 (the shape in FP8, "
                                     "forward), sdpa_flash, sdpa_cudnn, flex, fa4 (default: all that can run but "
                                     "vflash_sinks and vflash_fp8)")
    p.add_argument("--out", default="bench.csv", metavar="CSV",
                   help="results CSV, one row per shape, dtype and method (default bench.csv); the environment "
                        "record goes beside it with .env.json for .csv (bench.env.json)")
    p.add_argument("--mode", default="fwd", choices=["fwd", "bwd", "fwd_bwd"],
                   help="what is timed: the forward (default), the backward of a recorded forward "
                        "(TFLOP/s as 2.5x the forward's FLOPs), or both (3.5x)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes through the interpreter: tests the harness")
    p.add_argument("--interleave", action="store_true",
                   help="time a shape's methods in turn, one repetition of each per round after 1.2 s of them "
                        "all, so each sees the same clocks (default: one method after another, each after a "
                        "0.1 s GEMM warm-up)")
    p.set_defaults(func=cmd_bench, subparser=p)

    p = sub.add_parser("plot", help="PNGs from a bench or memory CSV",
                       description="Latency, TFLOP/s, peak memory and speed-up plots from a `vflash bench` "
                                   "CSV, or the peak-memory plot from a `vflash memory` CSV.")
    p.add_argument("csv", metavar="RESULTS.csv", help="a CSV written by `vflash bench` or `vflash memory`")
    p.add_argument("--out", default="plots", metavar="DIR",
                   help="folder for the PNGs, named after the CSV (default plots)")
    p.set_defaults(func=cmd_plot, subparser=p)

    p = sub.add_parser("memory", help="peak memory: materialised attention vs vflash vs SDPA",
                       description="The lesson's lab: B=1, H=28, D=128, bf16, causal, S=1024..32768 on a GPU "
                                   "(the materialised path's OOM is recorded), small S on the CPU, where "
                                   f"the Triton interpreter is slow: S above {CPU_MAX_SIZE} is refused there "
                                   "unless --force. One line per size, written as each method finishes.")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: CUDA when present, else the CPU through the Triton interpreter")
    p.add_argument("--sizes", metavar="S1,S2,...", type=_sizes,
                   help="sequence lengths (default: 1024..32768 on a GPU, 64,128,256 on the CPU)")
    p.add_argument("--force", action="store_true",
                   help=f"on the CPU, run sizes above {CPU_MAX_SIZE} too (each doubling of S takes four to "
                        "six times longer under the interpreter: S = 2048 over half an hour)")
    p.add_argument("--out", default="memory.csv", metavar="CSV", help="results CSV (default memory.csv)")
    p.set_defaults(func=cmd_memory, subparser=p)

    p = sub.add_parser("demo", help="online softmax vs full softmax in pure Python",
                       description="The lesson's proof: streaming keys in blocks of 1, 2 and 6 gives the "
                                   "one-shot softmax to machine precision.")
    p.set_defaults(func=cmd_demo, subparser=p)

    p = sub.add_parser("env", help="versions, device, compute capability, interpreter on/off",
                       description="Print what vflash runs on: the vflash, torch, triton and CUDA versions, "
                                   "the GPU and its compute capability, and whether the Triton interpreter is "
                                   "on. The same record heads `vflash check --log` and `vflash bench`'s "
                                   "<out>.env.json.")
    p.add_argument("--json", action="store_true", help="print it as one JSON object")
    p.set_defaults(func=cmd_env, subparser=p)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
