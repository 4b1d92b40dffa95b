#!/usr/bin/env python3
"""Side by side with PyTorch: torch.nn.functional.scaled_dot_product_attention on the CPU against
flashattn, in one process, on the same tensors, alternated in blocks.

    python3 bench/compare_torch.py --shim build/bench/libflashattn_torch_shim.so --threads 1,16 [--out results.csv]

flashattn is called through bench/torch_shim.cpp (a C entry point loaded with ctypes), so both kernels see
the same memory, cores and clock state: a drift of the machine moves both sides, not the ratio. Per shape
the sides alternate in --rounds blocks, each WARMUP_S seconds of untimed calls and then --reps timed calls;
each side's figure is the median of its timed calls, and each round also gives a paired ratio (our block's
median over torch's of the same round; their median and the rounds we were ahead in are printed). Blocks,
not single calls, because with several threads PyTorch's OpenMP workers keep spinning for a while after
each call, and would take cores from a call of ours that followed at once; the warm-up of each block lets
them go to sleep. Both sides count 4·B·H·N²·d flops (×0.5 causal). One thread: per second of process CPU
time; several threads: wall time. --layouts: bhsd (torch's contiguous (B, H, N, d)) and/or bshd (a
contiguous (B, N, H, d) buffer, given to torch as its transpose(1, 2) view). The outputs of the two are
compared on every shape (max |difference| printed), so the figures are for the same result.
"""
import argparse
import csv
import ctypes
import faulthandler
import math
import sys
import time

WARMUP_S = 0.3  # seconds of alternated untimed calls before the timed ones


def heads_for(n):
    # bench_forward's rule: H=8 up to N=4096, fewer beyond so that one call stays ~1 s.
    return 8 if n <= 4096 else max(1, 8 * 4096 * 4096 // (n * n))


def make_qkvo(torch, n, d, h, dtype, layout):
    g = torch.Generator().manual_seed(0)
    if layout == "bhsd":
        shape, to_bhsd = (1, h, n, d), (lambda x: x)
    else:  # bshd storage, seen by torch as (B, H, N, d) through transpose(1, 2)
        shape, to_bhsd = (1, n, h, d), (lambda x: x.transpose(1, 2))
    q, k, v = (to_bhsd(torch.randn(*shape, generator=g).to(dtype)) for _ in range(3))
    o = to_bhsd(torch.empty(*shape, dtype=dtype))
    return q, k, v, o


def ours_call(shim, torch, q, k, v, o, causal, threads):
    dtype_code = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[q.dtype]
    shape = (ctypes.c_int64 * 4)(*q.shape)
    strides = (ctypes.c_int64 * 16)(*(s for x in (q, k, v, o) for s in x.stride()))
    ptrs = [ctypes.c_void_p(x.data_ptr()) for x in (q, k, v, o)]

    def call():
        if shim.flashattn_shim_forward(*ptrs, dtype_code, shape, strides, int(causal), threads) != 0:
            sys.exit("flashattn_shim_forward failed")
    return call


def timed_block(call, clock, reps):
    """WARMUP_S of untimed calls, then `reps` timed ones: their times."""
    t_end = time.perf_counter() + WARMUP_S
    while time.perf_counter() < t_end:
        call()
    times = []
    for _ in range(reps):
        t0 = clock()
        call()
        times.append(clock() - t0)
    return times


def alternated_rates(torch, shims, n, d, causal, threads, dtype, layout, reps, rounds):
    """GFLOP/s of each shim and of torch (medians of all timed calls), each shim's per-round ratios (its
    block's median rate over torch's block of the same round: a pair that a drift of the machine moves
    together), and each shim's max |difference| from torch's output."""
    torch.set_num_threads(threads)
    h = heads_for(n)
    q, k, v, o = make_qkvo(torch, n, d, h, dtype, layout)
    f = torch.nn.functional.scaled_dot_product_attention
    ours = [ours_call(shim, torch, q, k, v, o, causal, threads) for shim in shims]
    theirs = lambda: f(q, k, v, is_causal=causal)
    clock = time.process_time if threads == 1 else time.perf_counter
    flops = 4.0 * h * n * n * d * (0.5 if causal else 1.0)
    rate = lambda ts: flops / median(ts) * 1e-9
    t_ours, t_torch, diffs = [[] for _ in shims], [], [0.0] * len(shims)
    round_ratios = [[] for _ in shims]
    with torch.no_grad():
        ref = f(q, k, v, is_causal=causal).float()
        for _ in range(rounds):
            blocks = []
            for i, call in enumerate(ours):
                blocks.append(timed_block(call, clock, reps))
                diffs[i] = max(diffs[i], (o.float() - ref).abs().max().item())
            theirs_block = timed_block(theirs, clock, reps)
            t_torch += theirs_block
            for i, block in enumerate(blocks):
                t_ours[i] += block
                round_ratios[i].append(rate(block) / rate(theirs_block))
    return [rate(t) for t in t_ours], rate(t_torch), round_ratios, diffs


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def torch_sgemm_rate(torch, threads, n=2048, reps=5):
    """The machine's sgemm rate through torch.mm (MKL / oneDNN): the reference both kernels are held to."""
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True,
                    help="path of libflashattn_torch_shim.so; or LABEL=PATH,LABEL=PATH,... to compare builds of "
                         "it (variants of the kernels), each alternated with torch, one row per build")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--n", default="1024,4096")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--layouts", default="bhsd,bshd")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per block")
    ap.add_argument("--rounds", type=int, default=3, help="blocks per side, alternated")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    faulthandler.enable()
    import torch
    labelled = [x.split("=", 1) if "=" in x else ["flashattn", x] for x in a.shim.split(",")]
    labels = [label for label, _ in labelled]
    shims = [ctypes.CDLL(path) for _, path in labelled]
    for shim in shims:
        shim.flashattn_shim_forward.restype = ctypes.c_int
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads available, "
          f"cpu capability: {torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, 'cpu') else '?'}; "
          f"in-process; per shape {a.rounds} alternated blocks per side of {WARMUP_S} s warm-up + {a.reps} "
          f"timed calls; medians", flush=True)
    rows = []
    header = ["build", "layout", "dtype", "N", "d", "causal", "threads", "flashattn_GFLOPs", "torch_GFLOPs", "ratio",
              "flashattn_x_sgemm", "torch_x_sgemm", "round_ratio_median", "rounds_ahead", "max_abs_diff"]
    print("  ".join(f"{h:>10}" for h in header), flush=True)
    for threads in [int(t) for t in a.threads.split(",")]:
        sgemm = torch_sgemm_rate(torch, threads)
        print(f"torch.mm sgemm 2048^3, {threads} threads: {sgemm:.1f} GFLOP/s", flush=True)
        for layout in a.layouts.split(","):
            for dt in a.dtypes.split(","):
                for n in [int(x) for x in a.n.split(",")]:
                    for d in [int(x) for x in a.d.split(",")]:
                        for causal in [bool(int(x)) for x in a.causal.split(",")]:
                            mine, theirs, round_ratios, diffs = alternated_rates(torch, shims, n, d, causal, threads,
                                                                   dtypes[dt], layout, a.reps, a.rounds)
                            for label, rate, rr, diff in zip(labels, mine, round_ratios, diffs):
                                row = [label, layout, dt, n, d, int(causal), threads, round(rate, 1),
                                       round(theirs, 1), round(rate / theirs, 2), round(rate / sgemm, 2),
                                       round(theirs / sgemm, 2), round(median(rr), 2),
                                       f"{sum(r >= 1.0 for r in rr)}/{len(rr)}", f"{diff:.1e}"]
                                rows.append(row)
                                print("  ".join(f"{str(x):>10}" for x in row), flush=True)
    # One line per (build, threads): how many rows are ahead, and the geometric mean of the ratios.
    for label in labels:
        for threads in sorted({r[6] for r in rows}):
            ratios = [r[9] for r in rows if r[0] == label and r[6] == threads]
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            print(f"summary {label}, {threads} threads: {sum(x >= 1.0 for x in ratios)}/{len(ratios)} rows >= 1.0x, "
                  f"min {min(ratios):.2f}, geometric mean {geo:.2f}", flush=True)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)


if __name__ == "__main__":
    main()
