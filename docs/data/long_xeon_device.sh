#!/usr/bin/env bash
# Device run 2 (issue 26, 2026-12-06): bench_long forward and backward, fp32 and bf16, causal, one thread
# pinned to core 2, N = 1024 .. 65536 (the reference: the same run's N = 4096, 8 heads).
set -uo pipefail
exec > >(tee "$OUT/log_long.txt") 2>&1
lscpu | grep -E "Model name|L2"
[ -d build-dev ] || cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null 2>&1
cmake build-dev > /dev/null 2>&1; ninja -C build-dev bench_long > build2.log 2>&1 || tail -30 build2.log
FLASHATTN_BENCH_THREADS=1 timeout 420 taskset -c 2 ./build-dev/bench/bench_long --benchmark_filter='long/(fwd|bwd)/(fp32|bf16)/causal' --benchmark_counters_tabular=true 2>&1 | tee $OUT/long_xeon.txt
