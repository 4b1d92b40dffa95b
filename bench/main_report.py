#!/usr/bin/env python3
"""The main job's report (bench/run.sh): reads the bench_main JSON files of one run and prints one table,
naive vs tiled at each N, with a summary paragraph, and writes a plot of bytes moved and time against N.

    python3 bench/main_report.py OUT_DIR [--cpu "CPU name"]

OUT_DIR holds main_*.json (one bench_main run each); writes OUT_DIR/naive_vs_tiled.txt (the table and the
summary, as printed) and OUT_DIR/naive_vs_tiled.png (when matplotlib is there).
"""
import glob
import json
import os
import re
import sys
import textwrap


def load(out_dir):
    rows = {}  # (path, n) -> {time_ms, gflops, moved, extra}
    context = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "main_*.json"))):
        with open(path) as f:
            data = json.load(f)
        context = data.get("context", context)
        for b in data.get("benchmarks", []):
            m = re.match(r"main/(naive|tiled)/N:(\d+)/", b["name"])
            if not m:
                continue
            unit = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b.get("time_unit", "ms")]
            rows[(m.group(1), int(m.group(2)))] = {
                "time_ms": b["real_time"] * unit,
                "gflops": b["GFLOP/s"],
                "moved": b["moved_B"],
                "extra": b["extra_B"],
            }
    return rows, context


def human_bytes(x):
    if x < 0:
        return "n/a"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= div:
            return f"{x / div:.1f} {unit}"
    return f"{x:.0f} B"


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    out_dir = args[0]
    cpu = args[args.index("--cpu") + 1] if "--cpu" in args else ""
    skipped = {}  # N -> reason, from OUT_DIR/skipped.txt ("N reason" lines)
    skip_file = os.path.join(out_dir, "skipped.txt")
    if os.path.exists(skip_file):
        for line in open(skip_file):
            n, _, why = line.strip().partition(" ")
            if n:
                skipped[int(n)] = why
    rows, context = load(out_dir)
    ns = sorted({n for (_, n) in rows})
    if not ns:
        sys.exit(f"main_report.py: no bench_main results in {out_dir}")

    lines = []
    lines.append("naive (S = Q·Kᵀ in memory) vs tiled (FlashAttention), fp32, one head, d = 64, non-causal, one thread"
                 + (f", {cpu}" if cpu else ""))
    lines.append("moved: bytes between main memory and the kernel's tiles, counted by the kernels (docs/io.md);"
                 " extra: peak heap beyond inputs and output")
    header = f"{'N':>6} | {'naive ms':>9} {'tiled ms':>9} {'speed-up':>8} | {'naive GFLOP/s':>13} {'tiled GFLOP/s':>13} | " \
             f"{'naive moved':>11} {'tiled moved':>11} {'less':>6} | {'naive extra':>11} {'tiled extra':>11}"
    lines.append(header)
    lines.append("-" * len(header))
    for n in ns:
        t = rows.get(("tiled", n))
        v = rows.get(("naive", n))
        def cell(r, key, fmt):
            return fmt(r[key]) if r else "-"
        speed = f"{v['time_ms'] / t['time_ms']:.2f}x" if v and t else "-"
        less = f"{v['moved'] / t['moved']:.0f}x" if v and t and t["moved"] > 0 else "-"
        lines.append(
            f"{n:>6} | {cell(v, 'time_ms', lambda x: f'{x:.1f}'):>9} {cell(t, 'time_ms', lambda x: f'{x:.1f}'):>9} {speed:>8} | "
            f"{cell(v, 'gflops', lambda x: f'{x:.1f}'):>13} {cell(t, 'gflops', lambda x: f'{x:.1f}'):>13} | "
            f"{cell(v, 'moved', lambda x: human_bytes(x)):>11} {cell(t, 'moved', lambda x: human_bytes(x)):>11} {less:>6} | "
            f"{cell(v, 'extra', lambda x: human_bytes(x)):>11} {cell(t, 'extra', lambda x: human_bytes(x)):>11}")
        if not v and n in skipped:
            lines.append(f"{'':>6}   naive skipped: {skipped[n]}")

    both = [n for n in ns if ("naive", n) in rows and ("tiled", n) in rows]
    if both:
        n = both[-1]
        v, t = rows[("naive", n)], rows[("tiled", n)]
        nt = ns[-1]
        tl = rows[("tiled", nt)]
        summary = (
            f"At N = {n} the naive path moved {human_bytes(v['moved'])} through main memory and held "
            f"{human_bytes(v['extra'])} extra (its N × N score matrix); the tiled path moved {human_bytes(t['moved'])} "
            f"({v['moved'] / t['moved']:.0f}x less) with {human_bytes(t['extra'])} of tiles, and ran "
            f"{v['time_ms'] / t['time_ms']:.2f}x faster ({t['gflops']:.1f} against {v['gflops']:.1f} GFLOP/s). "
            f"The naive path's extra memory grows as N² (4·N² bytes); the tiled path's is bounded whatever N (its "
            f"tiles, plus at most 8 MiB per thread of staged K/V tiles kept for reuse at moderate N). Its traffic "
            f"also grows as N², since K and V are read once per block of query rows, but it is the naive path's "
            f"divided by about 2·(block rows)/d: the block grows with the cache, as the FlashAttention paper's "
            f"N²·d²/M (docs/io.md).")
        if nt > n:
            summary += (f" Beyond N = {n} only the tiled path ran (N = {nt}: {tl['time_ms'] / 1000:.1f} s, "
                        f"{human_bytes(tl['extra'])} extra; the naive one would need {human_bytes(4.0 * nt * nt)} "
                        f"for S alone).")
        lines.append("")
        lines.extend(textwrap.wrap(summary, 110))
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out_dir, "naive_vs_tiled.txt"), "w") as f:
        f.write(text + "\n")
    plot(rows, ns, out_dir, cpu)


def plot(rows, ns, out_dir, cpu):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: python3-matplotlib is not installed)")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for path, color in (("naive", "tab:red"), ("tiled", "tab:blue")):
        xs = [n for n in ns if (path, n) in rows]
        ax1.plot(xs, [rows[(path, n)]["moved"] for n in xs], "o-", color=color, label=f"{path}: bytes moved")
        ax1.plot(xs, [max(rows[(path, n)]["extra"], 1) for n in xs], "s--", color=color, alpha=0.6,
                 label=f"{path}: extra memory")
        ax2.plot(xs, [rows[(path, n)]["time_ms"] / 1000 for n in xs], "o-", color=color, label=path)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (sequence length)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("bytes")
    ax1.set_title("memory traffic (counted) and extra memory")
    ax2.set_ylabel("seconds per call")
    ax2.set_title("time")
    fig.suptitle("naive vs tiled attention: fp32, one head, d = 64, one thread" + (f" ({cpu})" if cpu else ""),
                 fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, "naive_vs_tiled.png")
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    # A python3 on PATH without matplotlib (a virtual environment): Debian's has it (python3-matplotlib).
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
            os.execv("/usr/bin/python3", ["/usr/bin/python3", __file__] + sys.argv[1:])
    main()
