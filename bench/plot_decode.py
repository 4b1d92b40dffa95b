#!/usr/bin/env python3
"""K+V read rate of a decoding step against the KV length, per K/V dtype and thread count, as a PNG.

    python3 bench/plot_decode.py --json decode_sweep.json --out docs/img/decode_kv_sweep_<cpu>.png [--title ...]

The JSON comes from one bench_decode run with the sweep rows:

    FLASHATTN_BENCH_SWEEP=1 FLASHATTN_BENCH_THREADS=1,2 build-bench/bench/bench_decode \
        --benchmark_filter='^decode/' --benchmark_format=json > decode_sweep.json

Solid (one thread) and dash-dotted (more) lines: the kernel's K+V GB/s; gray dashed (one thread) and black
dotted (more): the median over dtypes of the same-run streaming read of a buffer as large as K+V at the
same thread count (at small KV lengths both fit in the last-level cache, so both rates are cache rates).
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    rows = json.load(open(args.json))["benchmarks"]
    series = {}  # (dtype, threads) -> [(kv, kv_GBps, read_GBps)]
    for r in rows:
        parts = r["name"].split("/")  # decode/<dtype>/kv:<n>/q:1/threads:<t>/...
        if parts[0] != "decode" or parts[3] != "q:1":
            continue
        key = (parts[1], int(parts[4].split(":")[1]))
        series.setdefault(key, []).append((int(parts[2].split(":")[1]), r["kv_GBps"], r["read_GBps"]))
    if not series:
        sys.exit("no decode/<dtype>/kv:<n>/q:1 rows in " + args.json)
    colors = {"fp32": "tab:blue", "fp16": "tab:orange", "bf16": "tab:green"}
    fig, ax = plt.subplots(figsize=(8, 5))
    for (dtype, threads), pts in sorted(series.items()):
        pts.sort()
        kv = [p[0] for p in pts]
        style = "-" if threads == 1 else "-."
        ax.plot(kv, [p[1] for p in pts], style, marker="o", color=colors.get(dtype, "k"),
                label=f"{dtype} K/V, {threads} thread{'s' if threads > 1 else ''}")
    for threads in sorted({t for _, t in series}):
        pts = sorted(p for (d, t), ps in series.items() if t == threads for p in ps)
        by_kv = {}
        for kv, _, read in pts:
            by_kv.setdefault(kv, []).append(read)
        ax.plot(sorted(by_kv), [sorted(by_kv[k])[len(by_kv[k]) // 2] for k in sorted(by_kv)],
                "--" if threads == 1 else ":", color="gray" if threads == 1 else "black",
                label=f"streaming read, {threads} thread{'s' if threads > 1 else ''} (median)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV length (keys)")
    ax.set_ylabel("GB/s of K+V")
    ax.set_ylim(bottom=0)
    ax.set_title(args.title or "Decode (B=1, 32:8 heads, d=128, BHSD): K+V read rate")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
