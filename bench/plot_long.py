#!/usr/bin/env python3
"""Long context: the rate at N against the same run's N = 4096 rate (bench_long's x_4096), as a PNG.

    python3 bench/plot_long.py --json "Zen 4=zen4.json" --json "Xeon=xeon.json" --out docs/img/long_context.png

Each JSON comes from one bench_long run, e.g.

    FLASHATTN_BENCH_THREADS=1 build-bench/bench/bench_long --benchmark_filter='long/fwd/.*/causal/' \
        --benchmark_out=zen4.json --benchmark_out_format=json

One panel per label (machine), one line per (direction, dtype, mask, threads): colour the dtype, marker the
thread count, solid forward, dashed backward, hollow markers unmasked; the gray dashed line is issue 26's
target (0.90 x up to 131072 tokens), the dotted one the N = 4096 level itself. The N = 4096 rows (8 heads) are the references:
they sit at 1 by definition of the counter, up to the noise between two measurements of the same row.
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
except ImportError:  # a python3 first on PATH without Debian's python3-matplotlib: use the system one
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series_of(label, path):
    """(label, direction, dtype, mask, threads) -> sorted [(N, x_4096, GFLOPs)] from one bench_long JSON."""
    out = {}
    for r in json.load(open(path))["benchmarks"]:
        if r.get("run_type") == "aggregate" or "x_4096" not in r:
            continue
        parts = r["name"].split("/")  # long/<dir>/<dtype>/<mask>/H:<h>/N:<n>/threads:<t>/...
        if parts[0] != "long":
            continue
        n = int(parts[5].split(":")[1])
        threads = int(parts[6].split(":")[1])
        out.setdefault((label, parts[1], parts[2], parts[3], threads), []).append((n, r["x_4096"], r["GFLOPs"]))
    for pts in out.values():
        pts.sort()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="append", required=True, help="LABEL=PATH, one per run (machine)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="Long context: rate at N / rate at N = 4096 (same run), d = 128, batch 1")
    args = ap.parse_args()
    series = {}
    for spec in args.json:  # several runs may share a label (e.g. a sweep and a 1M run): their points join,
        label, _, path = spec.partition("=")  # the first run's point kept where both measured an N
        for key, pts in series_of(label, path).items():
            have = {p[0] for p in series.get(key, [])}
            series[key] = sorted(series.get(key, []) + [p for p in pts if p[0] not in have])
    if not series:
        sys.exit("no long/... rows with an x_4096 counter in the inputs")
    colors = {"fp32": "tab:blue", "bf16": "tab:green", "fp16": "tab:orange"}
    markers = {1: "o", 2: "s", 4: "D", 8: "v", 16: "^"}
    labels = [l for l in dict.fromkeys(spec.partition("=")[0] for spec in args.json) if any(k[0] == l for k in series)]
    fig, axes = plt.subplots(1, len(labels), figsize=(6.5 * len(labels), 5.5), squeeze=False, sharey=True)
    top = max(1.3, max(p[1] for pts in series.values() for p in pts) * 1.05)
    for ax, label in zip(axes[0], labels):
        for key, pts in sorted(series.items()):
            if key[0] != label:
                continue
            _, direction, dtype, mask, threads = key
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-" if direction == "fwd" else "--",
                    marker=markers.get(threads, "x"), color=colors.get(dtype, "k"),
                    markerfacecolor="white" if mask == "full" else colors.get(dtype, "k"),
                    label=f"{direction} {dtype} {mask}, {threads} thread{'s' if threads > 1 else ''}")
        ax.axhline(0.90, color="gray", linestyle="--", linewidth=1)
        ax.axhline(1.0, color="gray", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N (8 heads up to 4096, one head from 16384)")
        ax.set_ylim(0, top)
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("GFLOP/s at N / GFLOP/s at N = 4096 (same run)")
    fig.suptitle(args.title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
