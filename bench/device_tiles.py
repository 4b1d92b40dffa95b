#!/usr/bin/env python3
"""Tile configurations against PyTorch SDPA on one core, interleaved (device experiment).

    python3 bench/device_tiles.py TILE_SWEEP_BINARY ROUNDS

For each round and shape: tile_sweep (6 tile configurations, best of 3 calls each, 8 heads, process CPU
time) and then torch SDPA on the same shape (8 heads, median of 5 calls, process CPU time). Prints the
median over rounds per configuration and the ratio to torch.
"""
import re
import statistics
import subprocess
import sys
import time

import torch

SHAPES = [(1024, 64, 0), (1024, 64, 1), (1024, 128, 0), (1024, 128, 1),
          (4096, 64, 0), (4096, 64, 1), (4096, 128, 0), (4096, 128, 1)]


def torch_rate(n, d, causal, h=8, reps=5):
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, d, generator=g) for _ in range(3))
    f = torch.nn.functional.scaled_dot_product_attention
    with torch.no_grad():
        f(q, k, v, is_causal=bool(causal))
        ts = []
        for _ in range(reps):
            t0 = time.process_time()
            f(q, k, v, is_causal=bool(causal))
            ts.append(time.process_time() - t0)
    return 4.0 * h * n * n * d * (0.5 if causal else 1.0) / statistics.median(ts) * 1e-9


def main():
    binary, rounds = sys.argv[1], int(sys.argv[2])
    res = {}
    for r in range(rounds):
        for (n, d, c) in SHAPES:
            out = subprocess.run([binary, str(n), str(d), "fp32", str(c), "3", "8"], capture_output=True, text=True).stdout
            for m in re.finditer(r"BlockQ=\s*(\d+) BlockKV=\s*(\d+):\s*([\d.]+)", out):
                res.setdefault((n, d, c), {}).setdefault(f"{m.group(1)}x{m.group(2)}", []).append(float(m.group(3)))
            res[(n, d, c)].setdefault("torch", []).append(torch_rate(n, d, c))
            print(f"round {r + 1} N={n} d={d} causal={c}: " +
                  " ".join(f"{k}={v[-1]:.1f}" for k, v in res[(n, d, c)].items()), flush=True)
    print(f"\nmedian of {rounds} rounds, GFLOP/s (ratio to torch)")
    for key, cfgs in res.items():
        t = statistics.median(cfgs["torch"])
        row = " ".join(f"{k}={statistics.median(v):.1f}({statistics.median(v) / t:.2f})"
                       for k, v in cfgs.items() if k != "torch")
        print(f"N={key[0]} d={key[1]} causal={key[2]}: torch={t:.1f} {row}")


if __name__ == "__main__":
    main()
