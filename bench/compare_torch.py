#!/usr/bin/env python3
"""Side by side with PyTorch: torch.nn.functional.scaled_dot_product_attention on the CPU against
flashattn's bench_forward, same shapes, dtypes and thread counts, interleaved shape by shape.

    python3 bench/compare_torch.py --bench build/bench/bench_forward --threads 1,16 [--out results.csv]

Both sides count 4·B·H·N²·d flops (×0.5 causal). One thread: rates per second of process CPU time
(both sides); several threads: wall time. Each torch figure is the median of --reps calls after a warm-up;
with --rounds R the two sides alternate R times per shape and the row is the round of median ratio.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time

WARMUP_S = 0.3  # seconds of untimed calls before each side's timed calls


def heads_for(n):
    # bench_forward's rule: H=8 up to N=4096, fewer beyond so that one call stays ~1 s.
    return 8 if n <= 4096 else max(1, 8 * 4096 * 4096 // (n * n))


def torch_rate(torch, n, d, causal, threads, dtype, reps):
    torch.set_num_threads(threads)
    h = heads_for(n)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, d, generator=g).to(dtype) for _ in range(3))
    f = torch.nn.functional.scaled_dot_product_attention
    clock = time.process_time if threads == 1 else time.perf_counter
    with torch.no_grad():
        t_end = time.perf_counter() + WARMUP_S
        while time.perf_counter() < t_end:
            f(q, k, v, is_causal=causal)
        times = []
        for _ in range(reps):
            t0 = clock()
            f(q, k, v, is_causal=causal)
            times.append(clock() - t0)
    times.sort()
    flops = 4.0 * h * n * n * d * (0.5 if causal else 1.0)
    return flops / times[len(times) // 2] * 1e-9


def torch_sgemm_rate(torch, threads, n=2048, reps=5):
    """The machine's sgemm rate through torch.mm (MKL / oneDNN), for the ratio PyTorch's kernel reaches."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    clock = time.process_time if threads == 1 else time.perf_counter
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t0 = clock()
        torch.mm(a, b)
        times.append(clock() - t0)
    times.sort()
    return 2.0 * n ** 3 / times[len(times) // 2] * 1e-9


def ours(bench, dtype, n, d, causal, threads):
    name = f"tiled/{dtype}/N:{n}/d:{d}/causal:{int(causal)}/threads:{threads}/"
    env = dict(os.environ, FLASHATTN_BENCH_THREADS=str(threads))
    # The same warm-up as the torch side (WARMUP_S of calls): the core this process lands on may have been
    # idle, and its clock ramps up over tens of milliseconds, a large part of an N=1024 call.
    out = subprocess.run([bench, f"--benchmark_filter=^{name}", "--benchmark_format=json",
                          f"--benchmark_min_warmup_time={WARMUP_S}"],
                         env=env, check=True, capture_output=True, text=True).stdout
    runs = json.loads(out)["benchmarks"]
    if not runs:
        sys.exit(f"no benchmark matched {name}")
    return runs[0]["GFLOP/s"], runs[0]["x_sgemm"], runs[0]["x_fma_peak"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--n", default="1024,4096")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate ours and torch this many times per shape; report medians")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import torch
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads available, "
          f"flash kernel: {torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, 'cpu') else '?'}",
          flush=True)
    rows = []
    header = ["dtype", "N", "d", "causal", "threads", "flashattn_GFLOPs", "torch_GFLOPs", "ratio",
              "flashattn_x_sgemm", "torch_x_torch_sgemm"]
    print("  ".join(f"{h:>18}" for h in header), flush=True)
    for threads in [int(t) for t in a.threads.split(",")]:
        sgemm = torch_sgemm_rate(torch, threads)
        print(f"torch.mm sgemm 2048^3, {threads} threads: {sgemm:.1f} GFLOP/s", flush=True)
        for dt in a.dtypes.split(","):
            for n in [int(x) for x in a.n.split(",")]:
                for d in [int(x) for x in a.d.split(",")]:
                    for causal in [bool(int(x)) for x in a.causal.split(",")]:
                        runs = []
                        for _ in range(a.rounds):
                            mine, x_sgemm, _ = ours(a.bench, dt, n, d, causal, threads)
                            theirs = torch_rate(torch, n, d, causal, threads, dtypes[dt], a.reps)
                            runs.append((mine / theirs, mine, theirs, x_sgemm))
                        runs.sort()
                        ratio, mine, theirs, x_sgemm = runs[len(runs) // 2]  # the round of median ratio
                        row = [dt, n, d, int(causal), threads, round(mine, 1), round(theirs, 1),
                               round(ratio, 2), round(x_sgemm, 2), round(theirs / sgemm, 2)]
                        rows.append(row)
                        print("  ".join(f"{str(x):>18}" for x in row), flush=True)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)


if __name__ == "__main__":
    main()
