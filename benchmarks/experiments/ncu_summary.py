"""Issue 4 tool: a short text summary of one Nsight Compute profile of the Hopper
kernel, from the pages `gpu_session.sh profile_sm90` exports (ncu's details page and
its per-SASS-instruction source page as CSV): the pipe and scheduler metrics,
the executed-instruction mix, the warp-stall samples of each warp-specialized
partition (producer, each consumer), and the instructions with the most
warp-stall samples, each with its partition and top stall reasons. Standard
library only.

  python3 -m benchmarks.experiments.ncu_summary NAME.details.txt NAME.sass.csv [--top 30]
"""

import argparse
import collections
import csv
import re

METRICS = re.compile(r"Duration|SM Frequency|Pipe .*Cycles Active|Inst Executed Pipe|Issue Active|Issued Warp Per "
                     r"Scheduler|Eligible Warps|Warp Cycles Per Issued|Registers Per Thread|Achieved Occupancy|^Stall ")


def details(path):
    """Metric lines of the details page, first occurrence of each metric name."""
    seen, out = set(), []
    for line in open(path):
        text = line.strip()
        name = re.split(r"\s{2,}", text)[0] if text else ""
        if name and METRICS.search(name) and name not in seen:
            seen.add(name)
            out.append(text)
    return out


def sass_rows(path):
    rows = list(csv.reader(open(path)))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[header], rows[header + 1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("details")
    ap.add_argument("sass")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    print("## Sections (ncu --page details)")
    print("\n".join(details(a.details)))

    hdr, rows = sass_rows(a.sass)
    col = {h: i for i, h in enumerate(hdr)}
    samples = col["Warp Stall Sampling (All Samples)"]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, c):
        return int(r[c] or 0) if c < len(r) else 0

    def opcode(src):
        tokens = src.split()
        return tokens[1] if tokens[0].startswith("@") else tokens[0]

    executed, sampled = collections.Counter(), collections.Counter()
    for r in rows:
        if len(r) > 1 and r[1].strip():
            executed[opcode(r[1])] += num(r, col["Instructions Executed"])
            sampled[opcode(r[1])] += num(r, samples)
    total = sum(executed.values()) or 1
    print("\n## Instruction mix (executed, from the SASS source page)")
    for op, n in executed.most_common(16):
        print(f"{op:32s} {n:14d} {100 * n / total:5.1f}%  stall samples {sampled[op]}")

    all_samples = sum(num(r, samples) for r in rows) or 1
    region = partitions(rows)
    print("\n## Warp-stall samples by partition (code between setmaxnreg markers; consumer: has a wgmma, "
          "producer: has UTMALDG)")
    looped = in_key_loops(rows)
    for name in dict.fromkeys(region.values()):
        n = sum(num(r, samples) for r in rows if region[r[0]] == name)
        inside = sum(num(r, samples) for r in rows if region[r[0]] == name and r[0] in looped)
        print(f"{name:24s} {n:8d} {100 * n / all_samples:5.1f}%   in key-tile loops {100 * inside / (n or 1):5.1f}%")
    print(f"\n## Top {a.top} SASS instructions by warp-stall samples (of {all_samples})")
    for r in sorted(rows, key=lambda r: -num(r, samples))[:a.top]:
        reasons = sorted(((num(r, col[h]), h[6:]) for h in stalls), reverse=True)[:3]
        print(f"{r[0][-5:]} {num(r, samples):7d} {100 * num(r, samples) / all_samples:5.1f}%  {region[r[0]]:12s} "
              f"{r[1].strip()[:60]:60s} {', '.join(f'{name} {n}' for n, name in reasons if n)}")


def in_key_loops(rows):
    """Addresses inside the innermost loops closed by a backward branch over more
    than 64 instructions (the consumers' key-tile loops; shorter ones are barrier
    spins, and the loops over work tiles hold the key-tile loops)."""
    index = {int(r[0], 16): i for i, r in enumerate(rows) if r and r[0].startswith("0x")}
    loops = []
    for i, r in enumerate(rows):
        m = re.search(r"\bBRA\s+(0x[0-9a-f]+)", r[1]) if len(r) > 1 else None
        target = index.get(int(m.group(1), 16)) if m else None
        if target is not None and target < i - 64:
            loops.append((target, i))
    inner = [(lo, hi) for lo, hi in loops if not any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in loops)]
    return {rows[k][0] for lo, hi in inner for k in range(lo, hi + 1)}


def partitions(rows):
    """{address: region name}. Gluon's warp_specialize gives each partition a
    `setmaxnreg` (USETMAXREG) at its start: a region runs from one marker to the
    next, named for what it holds (consumer: a wgmma, HGMMA / QGMMA / IGMMA; producer: UTMALDG; else
    other), consumers numbered in code order."""
    bounds = [0] + [i for i, r in enumerate(rows) if len(r) > 1 and "USETMAXREG" in r[1]] + [len(rows)]
    names, consumers = {}, 0
    for lo, hi in zip(bounds, bounds[1:]):
        ops = " ".join(r[1] for r in rows[lo:hi] if len(r) > 1)
        if any(op in ops for op in ("HGMMA", "QGMMA", "IGMMA")):  # wgmma of 16-bit, FP8, int8 operands
            name, consumers = f"consumer {consumers}", consumers + 1
        else:
            name = "producer" if "UTMALDG" in ops else "other"
        names.update((r[0], name) for r in rows[lo:hi])
    return names


if __name__ == "__main__":
    main()
