#!/usr/bin/env python3
"""Issue 3's speed targets, measured in one run of bench_forward and printed as a table.

    python3 bench/targets.py --bench build-bench/bench/bench_forward [--json out.json]

One process, every ratio from two calls alternated call by call: the GEMM-rate targets alternate the tiled
forward with an OpenBLAS sgemm 2048^3 (bench_forward's vs_sgemm; without OpenBLAS, the sgemm reference
measured at start-up is used instead), the others two variants of the forward (one thread: process CPU
time; the thread speed-up: wall time). Shape: B=1, H=8, N=4096, fp32 unless said.
"""
import argparse
import json
import os
import subprocess


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    threads = os.cpu_count() or 1
    filt = ("^(vs_sgemm/fp32/N:4096/d:(64|128|256)/"
            "|tiled/fp32/N:4096/d:(64|128|256)/causal:0/threads:1/"
            "|causal_vs_full/fp32/N:4096/d:128/"
            "|vs_fp32/(bf16|fp16)/N:4096/d:128/causal:0/"
            "|scaling/fp32/N:4096/d:128/causal:0/)")
    env = dict(os.environ, FLASHATTN_BENCH_THREADS=f"1,{threads}")
    env.pop("OPENBLAS_CORETYPE", None)  # let OpenBLAS pick its best kernel for this CPU
    env.pop("OPENBLAS_L2_SIZE", None)
    print(f"running {a.bench} --benchmark_filter='{filt}' (FLASHATTN_BENCH_THREADS=1,{threads})", flush=True)
    out = subprocess.run([a.bench, f"--benchmark_filter={filt}", "--benchmark_format=json"], env=env,
                         check=True, capture_output=True, text=True)
    data = json.loads(out.stdout)
    if a.json:
        with open(a.json, "w") as f:
            f.write(out.stdout)
    refs = dict(kv.split("=") for kv in data["context"]["ref_threads1"].split())
    print(f"references (1 thread): FMA peak {float(refs['fma_peak']):.1f}, OpenBLAS sgemm "
          f"{float(refs['openblas_sgemm']):.1f}, Eigen sgemm {float(refs['eigen_sgemm']):.1f} GFLOP/s; "
          f"load average at start: {data['context'].get('load_avg', ['?'])[0]}")
    b = {r["name"].split("/iterations")[0].split("/min_time")[0]: r for r in data["benchmarks"]}

    def get(prefix, key):
        for name, r in b.items():
            if name.startswith(prefix):
                return r[key]
        raise KeyError(prefix)

    openblas = float(refs["openblas_sgemm"]) or float(refs["eigen_sgemm"])
    rows = []
    for d, target in ((128, 0.90), (64, 0.80), (256, 0.90)):
        try:  # alternated with OpenBLAS's sgemm call by call (built with OpenBLAS)
            r = f"vs_sgemm/fp32/N:4096/d:{d}"
            rows.append((f"tiled fp32 d={d}: x OpenBLAS sgemm (alternated)", get(r, "x_sgemm"), target,
                         f"{get(r, 'GFLOP/s_tiled'):.1f} vs {get(r, 'GFLOP/s_sgemm'):.1f}"))
        except KeyError:  # else against the start-up reference
            g = get(f"tiled/fp32/N:4096/d:{d}/causal:0/threads:1", "GFLOP/s")
            rows.append((f"tiled fp32 d={d}: x sgemm at start-up", g / openblas, target, f"{g:.1f} GFLOP/s"))
    rows.append(("causal effective rate: x non-causal (d=128)", get("causal_vs_full/fp32/N:4096/d:128", "x_full"), 0.85,
                 f"{get('causal_vs_full/fp32/N:4096/d:128', 'GFLOP/s_causal'):.1f} vs "
                 f"{get('causal_vs_full/fp32/N:4096/d:128', 'GFLOP/s_full'):.1f}"))
    if threads > 1:
        s = get("scaling/fp32/N:4096/d:128/causal:0", "speedup")
        rows.append((f"{threads} threads: x 1 thread (d=128, wall)", s, 1.85,
                     f"{get('scaling/fp32/N:4096/d:128/causal:0', 'GFLOP/s_n'):.1f} vs "
                     f"{get('scaling/fp32/N:4096/d:128/causal:0', 'GFLOP/s_1'):.1f}"))
    for dt, target in (("bf16", 1.6), ("fp16", 1.0)):
        r = f"vs_fp32/{dt}/N:4096/d:128/causal:0"
        rows.append((f"{dt} storage: x fp32 rate (d=128)", get(r, "x_fp32"), target,
                     f"{get(r, 'GFLOP/s_16bit'):.1f} vs {get(r, 'GFLOP/s_fp32'):.1f}"))
    print()
    print(f"| {'target':46} | measured | goal  | met | rates (GFLOP/s) |")
    print(f"| {'-' * 46} | -------- | ----- | --- | --------------- |")
    for what, got, goal, detail in rows:
        print(f"| {what:46} | {got:8.2f} | >= {goal:.2f} | {'yes' if got >= goal else 'NO':3} | {detail} |")


if __name__ == "__main__":
    main()
