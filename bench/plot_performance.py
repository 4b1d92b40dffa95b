#!/usr/bin/env python3
"""GFLOP/s vs N for naive, tiled and the same-run GEMM references, as a CSV and a PNG.

    python3 bench/plot_performance.py --bench build-bench/bench/bench_forward \
        [--d 128] [--dtype fp32] [--threads 1] [--max-n 16384] [--out docs]

Runs bench_forward once (one process: the references and every point come from the same run), writes
<out>/data/performance_<dtype>_d<d>_t<threads>.csv and <out>/img/performance_<dtype>_d<d>_t<threads>.png.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

try:
    import matplotlib
except ImportError:  # a python3 first on PATH without Debian's python3-matplotlib: use the system one
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-n", type=int, default=16384)
    ap.add_argument("--out", default="docs")
    a = ap.parse_args()

    ns = [n for n in (512, 1024, 2048, 4096, 8192, 16384) if n <= a.max_n]
    n_re = "|".join(str(n) for n in ns)
    paths = "naive|tiled" if a.dtype == "fp32" else "tiled"
    filt = f"^({paths})/{a.dtype}/N:({n_re})/d:{a.d}/causal:0/threads:{a.threads}/"
    env = dict(os.environ, FLASHATTN_BENCH_THREADS=str(a.threads))
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    print("running:", a.bench, f"--benchmark_filter='{filt}'", flush=True)
    out = subprocess.run([a.bench, f"--benchmark_filter={filt}", "--benchmark_format=json"], env=env,
                         check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    ctx = data["context"][f"ref_threads{a.threads}"]
    refs = dict(kv.split("=") for kv in ctx.split())
    rows = []
    for b in data["benchmarks"]:
        path, _, n = b["name"].split("/")[:3]
        rows.append((path, int(n.split(":")[1]), b["GFLOP/s"], b["x_sgemm"], b["scratch_B"]))
        print(f"{path:6} N={rows[-1][1]:6d}  {b['GFLOP/s']:7.1f} GFLOP/s  x_sgemm {b['x_sgemm']:.2f}", flush=True)

    tag = f"{a.dtype}_d{a.d}_t{a.threads}"
    os.makedirs(f"{a.out}/data", exist_ok=True)
    os.makedirs(f"{a.out}/img", exist_ok=True)
    with open(f"{a.out}/data/performance_{tag}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "N", "GFLOP/s", "x_sgemm", "scratch_bytes", "openblas_sgemm", "eigen_sgemm", "fma_peak"])
        for r in rows:
            w.writerow(list(r) + [refs["openblas_sgemm"], refs["eigen_sgemm"], refs["fma_peak"]])

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for path, style in (("naive", "o--"), ("tiled", "s-")):
        pts = sorted((n, g) for p, n, g, _, _ in rows if p == path)
        if pts:
            ax.plot([n for n, _ in pts], [g for _, g in pts], style, label=f"{path} attention")
    for key, label, style in (("openblas_sgemm", "OpenBLAS sgemm 2048³", ":"),
                              ("eigen_sgemm", "Eigen sgemm 2048³", "-."),
                              ("fma_peak", "FMA peak", "-")):
        if float(refs[key]) > 0:
            ax.axhline(float(refs[key]), linestyle=style, color="gray", linewidth=1)
            ax.text(ns[0], float(refs[key]) * 1.01, label, fontsize=8, color="gray")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("GFLOP/s (4·H·N²·d per call)")
    ax.set_title(f"forward attention, {a.dtype}, d={a.d}, {a.threads} thread(s), same-run references")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(f"{a.out}/img/performance_{tag}.png", dpi=120)
    print(f"wrote {a.out}/img/performance_{tag}.png and {a.out}/data/performance_{tag}.csv")


if __name__ == "__main__":
    main()
