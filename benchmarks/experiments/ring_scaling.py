"""Ring attention over R GPUs of one host (issue 26): per-GPU TFLOP/s of the forward and of
forward + backward, and the fraction of the single-GPU kernel's TFLOP/s that each GPU keeps.

One process a GPU (NCCL), R in --gpus (capped by the GPUs present). For each total length N
and mask (causal: zig-zag shards; full: contiguous shards), each rank holds its shard of
bf16 q [1, 32, N / R, 128] and k / v [1, 8, N / R, 128] and runs `ring_attention` (method
`vflash`; at R = 1 `vflash.attention` on the whole sequence, the single-GPU kernel). Beside
it, PyTorch's `context_parallel` over SDPA restricted to cuDNN (method `cp_sdpa_cudnn`, its
default options: K / V all-gathered, head-tail load balance for causal masks; it takes no GQA,
so its K / V are expanded to 32 heads, four times the traffic; R = 1 is plain SDPA cuDNN). A
call's time is the slowest rank's (CUDA events around the call, after a barrier), the median
of 10 calls (3 past 50 ms, 1 past 1 s, after one warm-up). TFLOP/s a GPU count the causal
band's pairs (forward 4 N^2 D H, backward 2.5x that) over R; `kept` is that over the same
method's R = 1 row (kept_and_ratios). Peak memory is rank 0's, the call's incremental peak.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1, set here for every rank). Rows go to --out (appended with --append,
so that one sweep can span several device calls; `kept` is computed over the whole file).

  PYTHONPATH=src:. python3 -m benchmarks.experiments.ring_scaling --gpus 1,2,4,8 --tokens 32768,131072
  ... --smoke: gloo on the CPU, tiny shapes through the interpreter (checks the script; times nothing real)
"""

import argparse
import contextlib
import csv
import datetime
import os
import socket
import statistics
import tempfile
import time

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_name] = _value

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import vflash  # noqa: E402
from vflash.distributed import ring_attention  # noqa: E402
from vflash.harness.bench import Shape, attention_flops, error_text  # noqa: E402

FIELDS = ["method", "R", "N", "mask", "layout", "pass", "Hq", "Hkv", "D", "dtype", "status", "ms_median", "reps",
          "tflops_per_gpu", "kept", "single_N", "vs_cp_sdpa_cudnn", "peak_gib", "note"]
METHODS = ("vflash", "cp_sdpa_cudnn")
BWD_FACTOR = 3.5  # forward + backward: the backward counted as 2.5x the forward's FLOPs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time(call, dev, world):
    # the median over calls of the slowest rank's time (ms); one warm-up call picks the count
    def once():
        dist.barrier()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            call()
            ms = (time.perf_counter() - t0) * 1e3
        t = torch.tensor([ms], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())
    first = once()
    reps = 1 if dev.type != "cuda" or first > 1000 else 3 if first > 50 else 10
    return statistics.median(once() for _ in range(reps)), reps


def _vflash_call(q, k, v, causal, layout, world, do):
    # the call of one pass: the ring over the shards, or at R = 1 the single-GPU kernel
    def attend(q_, k_, v_):
        if world == 1:
            return vflash.attention(q_, k_, v_, causal=causal)
        return ring_attention(q_, k_, v_, causal=causal, layout=layout)
    if do is None:
        return lambda: attend(q, k, v)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    return lambda: torch.autograd.grad(attend(*leaves), leaves, do)


def _cp_rows(args, rank, world, dev, mesh, n, causal, passes, base):
    # PyTorch's context_parallel over SDPA cuDNN on the same total length: every rank builds the
    # full-length buffers (the context shards them in place), K / V expanded to Hq heads
    rows = []
    if dev.type != "cuda":
        return [dict(base, **{"pass": p}, status="skipped: context_parallel's ring SDPA needs CUDA") for p in passes]
    from torch.distributed.tensor.experimental import _attention as cp_attention, context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # its head-tail load balancer (zigzag) is for causal masks only: it refuses a full one
    cp_attention._cp_options.enable_load_balance = causal
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(1, args.hq, n, args.d, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, args.hkv, n, args.d, device=dev, dtype=torch.bfloat16, generator=g)
    k = k.repeat_interleave(args.hq // args.hkv, dim=1).contiguous()
    v = torch.randn_like(k)
    do = torch.randn_like(q)
    ctx = contextlib.nullcontext() if world == 1 else context_parallel(
        mesh, buffers=[q, k, v, do], buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers={q, k, v, do})
    try:
        with ctx:
            for p in passes:
                row = dict(base, **{"pass": p})
                try:
                    leaves = [t.detach().requires_grad_(p != "fwd") for t in (q, k, v)]

                    def attend():
                        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                            return torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
                    call = attend if p == "fwd" else (lambda: torch.autograd.grad(attend(), leaves, do))
                    rows.append(_measure(row, call, dev, world, n, causal, args, p))
                except Exception as e:  # noqa: BLE001  (a row records why it did not run)
                    rows.append(dict(row, status=f"error: {error_text(e)}"))
    except Exception as e:  # noqa: BLE001  (entering or leaving the context: the passes not yet recorded)
        rows += [dict(base, **{"pass": p}, status=f"error: {error_text(e)}")
                 for p in passes if not any(r["pass"] == p for r in rows)]
    return rows


def _measure(row, call, dev, world, n, causal, args, p):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    ms, reps = _time(call, dev, world)
    flops = attention_flops(Shape(1, args.hq, args.hkv, n, n, args.d, causal)) * (1 if p == "fwd" else BWD_FACTOR)
    tflops = flops / world / (ms * 1e-3) / 1e12
    row.update(status="ok", ms_median=round(ms, 4), reps=reps, tflops_per_gpu=float(f"{tflops:.4g}"))
    if dev.type == "cuda":
        row["peak_gib"] = round((torch.cuda.max_memory_allocated(dev) - before) / 2 ** 30, 3)
    return row


def _worker(rank, world, port, args, out_path):
    cuda = not args.smoke
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    # NCCL: a bounded wait where a rank failed. gloo keeps its default: with this timeout its teardown
    # aborted now and then on the CPU (2 of 16 smoke runs, none of 26 without)
    wait = dict(timeout=datetime.timedelta(seconds=args.timeout)) if cuda else {}
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, **wait)
    rows = []
    try:
        mesh = None
        if cuda and "cp_sdpa_cudnn" in args.methods:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cuda", (world,))
        dt = torch.bfloat16 if cuda else torch.float32
        passes = args.passes
        for n in args.tokens:
            for mask in args.masks:
                causal = mask == "causal"
                layout = "zigzag" if causal else "contiguous"
                base = dict(R=world, N=n, mask=mask, layout=layout, Hq=args.hq, Hkv=args.hkv, D=args.d,
                            dtype=str(dt).replace("torch.", ""))
                if n % (2 * world):
                    rows += [dict(base, method=m, **{"pass": p}, status=f"skipped: N not a multiple of {2 * world}")
                             for m in args.methods for p in passes]
                    continue
                if "vflash" in args.methods:
                    g = torch.Generator(device=dev).manual_seed(1000 + rank)
                    local = n // world
                    q = torch.randn(1, args.hq, local, args.d, device=dev, generator=g).to(dt)
                    k = torch.randn(1, args.hkv, local, args.d, device=dev, generator=g).to(dt)
                    v = torch.randn_like(k)
                    do = torch.randn_like(q)
                    for p in passes:
                        row = dict(base, method="vflash", **{"pass": p})
                        call = _vflash_call(q, k, v, causal, layout, world, None if p == "fwd" else do)
                        with torch.no_grad() if p == "fwd" else torch.enable_grad():
                            rows.append(_measure(row, call, dev, world, n, causal, args, p))
                    del q, k, v, do
                if "cp_sdpa_cudnn" in args.methods:
                    rows += _cp_rows(args, rank, world, dev, mesh, n, causal, passes,
                                     dict(base, method="cp_sdpa_cudnn", note="K/V expanded to Hq heads"))
                if rank == 0:
                    for r in rows[-len(passes) * len(args.methods):]:
                        print(f"R {world} N {n} {mask} {r['method']} {r['pass']}: {r.get('status')} "
                              f"{r.get('tflops_per_gpu', '')} TFLOP/s a GPU", flush=True)
        if rank == 0:
            with open(out_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=FIELDS)
                w.writeheader()
                w.writerows(rows)
        dist.barrier()  # no rank leaves while another still talks
    finally:
        dist.destroy_process_group()


def kept_and_ratios(rows):
    """Fill `kept` (TFLOP/s a GPU over the same method's R = 1 row of the same mask and pass, at
    the same N, or where R = 1 did not run that long, the longest N below it: `single_N` says
    which; past 32k tokens the single-GPU kernel's rate is flat in N) and `vs_cp_sdpa_cudnn`
    (vflash over PyTorch's context parallel at the same R, N, mask and pass)."""
    ok = [r for r in rows if r["status"] == "ok"]
    single = {}
    for r in ok:
        if int(r["R"]) == 1:
            single.setdefault((r["method"], r["mask"], r["pass"]), {})[int(r["N"])] = float(r["tflops_per_gpu"])
    cp = {(r["R"], r["N"], r["mask"], r["pass"]): float(r["tflops_per_gpu"]) for r in ok
          if r["method"] == "cp_sdpa_cudnn"}
    for r in ok:
        by_n = single.get((r["method"], r["mask"], r["pass"]), {})
        below = [n for n in by_n if n <= int(r["N"])]
        r["kept"] = r["single_N"] = ""
        if below:
            n = max(below)
            r["kept"], r["single_N"] = round(float(r["tflops_per_gpu"]) / by_n[n], 3), n
        c = cp.get((r["R"], r["N"], r["mask"], r["pass"]))
        r["vs_cp_sdpa_cudnn"] = round(float(r["tflops_per_gpu"]) / c, 3) if c and r["method"] == "vflash" else ""
    return rows


def plot(rows, path) -> bool:
    """kept against R, a panel a (mask, pass), a line a (method, N): the scaling at a glance.
    False where matplotlib is missing (the device's environment may lack it; re-plot here
    with --plot-only)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in rows if r["status"] == "ok" and r["kept"] != ""]
    panels = sorted({(r["mask"], r["pass"]) for r in ok})
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, (mask, p) in zip(axes[0], panels):
        for method, style in (("vflash", "-o"), ("cp_sdpa_cudnn", "--s")):
            for n in sorted({int(r["N"]) for r in ok if r["method"] == method}):
                pts = sorted((int(r["R"]), float(r["kept"])) for r in ok
                             if (r["method"], int(r["N"]), r["mask"], r["pass"]) == (method, n, mask, p))
                if pts:
                    ax.plot(*zip(*pts), style, label=f"{'vflash' if method == 'vflash' else 'PyTorch CP'} {n // 1024}k")
        ax.axhline(0.9, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{mask}, {p.replace('_', '+')}")
        ax.set_xlabel("GPUs")
    axes[0][0].set_ylabel("TFLOP/s a GPU / one GPU's")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="1,2,4,8", help="world sizes, capped by the GPUs present")
    ap.add_argument("--tokens", default="32768,131072,262144", help="total sequence lengths")
    ap.add_argument("--masks", default="causal,full")
    ap.add_argument("--passes", default="fwd,fwd_bwd")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default="ring_scaling.csv")
    ap.add_argument("--append", action="store_true", help="add to --out's rows instead of replacing them")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a collective may wait (a rank that failed)")
    ap.add_argument("--smoke", action="store_true", help="gloo on the CPU, tiny shapes (interpreter)")
    ap.add_argument("--plot", help="also draw kept against R into this PNG")
    ap.add_argument("--plot-only", action="store_true", help="draw --plot from --out's rows, run nothing")
    args = ap.parse_args(argv)
    if args.plot_only:
        with open(args.out, newline="") as f:
            drawn = args.plot and plot(kept_and_ratios(list(csv.DictReader(f))), args.plot)
        print(f"plot {'written to ' + args.plot if drawn else 'not drawn (no rows, no --plot or no matplotlib)'}")
        return 0 if drawn else 1
    args.tokens = [int(x) for x in args.tokens.split(",")]
    args.masks, args.passes, args.methods = (s.split(",") for s in (args.masks, args.passes, args.methods))
    bad = (set(args.masks) - {"causal", "full"}) | (set(args.passes) - {"fwd", "fwd_bwd"}) | \
        (set(args.methods) - set(METHODS))
    if bad:
        ap.error(f"unknown masks, passes or methods: {sorted(bad)}")
    worlds = [int(x) for x in args.gpus.split(",")]
    if args.smoke:
        args.hq, args.hkv, args.d = 2, 1, 16
    else:
        if not torch.cuda.is_available():
            print("ring_scaling needs CUDA devices (or --smoke)", flush=True)
            return 1
        args.hq, args.hkv, args.d = 32, 8, 128
        present = torch.cuda.device_count()
        skipped = [w for w in worlds if w > present]
        if skipped:
            print(f"{present} GPU(s) present: world sizes {skipped} not run", flush=True)
        worlds = [w for w in worlds if w <= present]
    rows = []
    if args.append and os.path.exists(args.out):
        with open(args.out, newline="") as f:
            rows = list(csv.DictReader(f))
    with tempfile.TemporaryDirectory() as d:
        for world in worlds:
            path = os.path.join(d, f"r{world}.csv")
            mp.spawn(_worker, args=(world, _free_port(), args, path), nprocs=world, join=True)
            with open(path, newline="") as f:
                rows += list(csv.DictReader(f))
    rows = kept_and_ratios(rows)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, restval="")
        w.writeheader()
        w.writerows(rows)
    if args.plot and not plot(rows, args.plot):
        print("no plot: matplotlib missing or no row ok (re-plot with --plot-only)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
