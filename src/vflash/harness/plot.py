"""`vflash plot`: PNGs from a `vflash bench` or `vflash memory` CSV."""

import csv
import os
from collections import defaultdict
from typing import Dict, List

from vflash._optional import require

STYLE = {  # method: (label, colour, marker)
    "vflash": ("vflash", "#d62728", "o"),
    "sdpa_flash": ("SDPA flash (FA2)", "#1f77b4", "s"),
    "sdpa_cudnn": ("SDPA cuDNN", "#2ca02c", "^"),
    "flex": ("FlexAttention", "#9467bd", "v"),
    "fa4": ("FlashAttention-4", "#8c564b", "P"),
    "explicit": ("explicit, input dtype", "#7f7f7f", "x"),
    "explicit_fp32": ("explicit fp32", "#bcbd22", "+"),
    "tiled": ("tiled PyTorch", "#17becf", "d"),
    "materialised": ("materialised S×S", "#7f7f7f", "x"),
    "sdpa": ("SDPA (default dispatch)", "#1f77b4", "s"),
    "vflash_paged16": ("vflash, paged 16", "#d62728", "o"),
    "vflash_paged64": ("vflash, paged 64", "#ff7f0e", "D"),
    "vflash_paged16_invariant": ("vflash, paged 16, batch-invariant", "#e377c2", "v"),
    "vflash_contig": ("vflash, contiguous cache", "#8c564b", "P"),
}


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display), imported at first use."""
    require("matplotlib", "vflash plot").use("Agg")
    return require("matplotlib.pyplot", "vflash plot")


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _style(method):
    return STYLE.get(method, (method, None, "."))


def _line(ax, xs, ys, method):
    # vflash on top, drawn solid and larger, so a baseline with equal values cannot hide it.
    label, colour, marker = _style(method)
    mine = method == "vflash"
    ax.plot(xs, ys, marker=marker, color=colour, label=label, linestyle="-" if mine else "--",
            markersize=7 if mine else 5, linewidth=2.0 if mine else 1.3, zorder=3 if mine else 2)


def _panels(rows: List[dict]) -> Dict[tuple, List[dict]]:
    panels = defaultdict(list)
    for r in rows:
        panels[(r["dtype"], int(r["D"]), r["causal"] == "True")].append(r)
    return panels


def _series(rows, metric):
    """method -> sorted [(N, value)] for ok rows."""
    out = defaultdict(list)
    for r in rows:
        v = _num(r.get(metric))
        if r["status"] == "ok" and v is not None:
            out[r["method"]].append((int(r["Nq"]), v))
    return {m: sorted(pts) for m, pts in out.items()}


def _grid(panels, title):
    keys = sorted(panels)
    cols = min(2, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = _pyplot().subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    fig.suptitle(title)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    return fig, list(zip(keys, axes.flat))


def _finish(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_bench(rows: List[dict], out_dir: str, prefix: str) -> List[str]:
    panels = _panels(rows)
    gpu = rows[0].get("gpu", "")
    written = []
    for metric, ylabel, fname, logy in (
            ("ms_median", "median latency (ms)", "latency", True),
            ("tflops", "TFLOP/s (useful FLOPs)", "tflops", False),
            ("peak_mib", "incremental peak memory (MiB)", "memory", True)):
        fig, cells = _grid(panels, f"{ylabel} vs N - {gpu}")
        for (dtype, d, causal), ax in cells:
            for method, pts in _series(panels[(dtype, d, causal)], metric).items():
                _line(ax, [p[0] for p in pts], [p[1] for p in pts], method)
            oom = sorted({int(r["Nq"]) for r in panels[(dtype, d, causal)] if r["status"] == "oom"})
            if oom:
                ax.text(0.02, 0.02, f"OOM at N = {', '.join(map(str, oom))}", transform=ax.transAxes, fontsize=8)
            ax.set_xscale("log", base=2)
            if logy:
                ax.set_yscale("log")
            ax.set_title(f"{dtype}, D={d}, {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        written.append(_finish(fig, os.path.join(out_dir, f"{prefix}_{fname}.png")))
    # vflash's speed over each other method at the same shape.
    fig, cells = _grid(panels, f"vflash speed-up over each method (>1 = vflash faster) - {gpu}")
    for (dtype, d, causal), ax in cells:
        lat = _series(panels[(dtype, d, causal)], "ms_median")
        mine = dict(lat.get("vflash", []))
        top = 1.0
        for method, pts in lat.items():
            if method == "vflash":
                continue
            ratio = [(n, t / mine[n]) for n, t in pts if n in mine]
            if ratio:
                top = max(top, max(r for _, r in ratio))
                _line(ax, [p[0] for p in ratio], [p[1] for p in ratio], method)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        if top > 4:  # slow references (explicit, tiled) stretch the range: log scale then
            ax.set_yscale("log")
        ax.set_title(f"{dtype}, D={d}, {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("time(method) / time(vflash)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    written.append(_finish(fig, os.path.join(out_dir, f"{prefix}_ratio.png")))
    return written


def plot_memory(rows: List[dict], out_dir: str, prefix: str) -> List[str]:
    fig, ax = _pyplot().subplots(figsize=(7, 4.5))
    by = defaultdict(list)
    for r in rows:
        if r["status"] == "ok":
            by[r["method"]].append((int(r["S"]), float(r["peak_mib"])))
    for method, pts in by.items():
        pts.sort()
        _line(ax, [p[0] for p in pts], [p[1] for p in pts], method)
    oom = sorted({(r["method"], int(r["S"])) for r in rows if r["status"] == "oom"})
    if oom:
        ax.text(0.02, 0.95, "OOM: " + ", ".join(f"{m} S={s}" for m, s in oom), transform=ax.transAxes,
                fontsize=8, va="top")
    r0 = rows[0]
    ax.set_title(f"incremental peak memory, B={r0['B']} H={r0['H']} D={r0['D']} {r0['dtype']} causal")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length S")
    ax.set_ylabel("MiB")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return [_finish(fig, os.path.join(out_dir, f"{prefix}_peak_memory.png"))]


def plot_decode(rows: List[dict], out_dir: str, prefix: str) -> List[str]:
    """`vflash bench --sweep decode`: GB/s of K+V read against the KV length (a panel a batch
    size) and against the batch size (a panel a KV length), the run's copy bandwidth dotted."""
    ok = [r for r in rows if r["status"] == "ok" and _num(r.get("gbps")) is not None]
    copy = _num(rows[0].get("copy_gbps"))
    paths = []
    for across, along, name in (("B", "Nk", "kv"), ("Nk", "B", "batch")):
        panels = defaultdict(list)
        for r in ok:
            panels[int(r[across])].append(r)
        if not panels:
            continue
        fig, cells = _grid(panels, f"decode: GB/s of K+V read, {rows[0]['dtype']} ({prefix})")
        for key, ax in cells:
            series = defaultdict(list)
            for r in panels[key]:
                series[r["method"]].append((int(r[along]), float(r["gbps"])))
            for method, pts in sorted(series.items()):
                pts.sort()
                label, colour, marker = _style(method)
                mine = method.startswith("vflash")
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker=marker, color=colour, label=label,
                        linestyle="-" if mine else "--", linewidth=2.0 if mine else 1.3)
            if copy:
                ax.axhline(copy, color="#999999", linestyle=":", linewidth=1, label="copy bandwidth (read + write)")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("KV length" if along == "Nk" else "batch")
            ax.set_ylabel("GB/s")
            ax.set_title(f"{'B' if across == 'B' else 'KV'} = {key}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        paths.append(_finish(fig, os.path.join(out_dir, f"{prefix}_decode_by_{name}.png")))
    return paths


def plot_csv(path: str, out_dir: str) -> List[str]:
    _pyplot()  # a missing matplotlib named before any file is read
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path} has no rows")
    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.splitext(os.path.basename(path))[0]
    cols = set(rows[0])
    if {"method", "gbps", "sweep"} <= cols and rows[0]["sweep"] in ("decode", "smoke"):
        return plot_decode(rows, out_dir, prefix)
    if {"method", "Nq", "ms_median", "tflops"} <= cols:
        return plot_bench(rows, out_dir, prefix)
    if {"method", "S", "peak_mib"} <= cols:
        return plot_memory(rows, out_dir, prefix)
    raise ValueError(f"{path} is neither a `vflash bench` (attention or decode sweep) nor a `vflash memory` CSV "
                     f"(columns: {sorted(cols)})")
