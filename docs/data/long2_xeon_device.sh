#!/usr/bin/env bash
# Device run 3 (issue 26, 2026-12-06): bench_long fp32 causal forward and backward up to N = 131072,
# 2 threads pinned to cores 2,3 (the N = 4096 reference measured in the same run).
set -uo pipefail
exec > >(tee "$OUT/log_long2.txt") 2>&1
lscpu | grep -E "Model name|L2"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_INSTALL=OFF > /dev/null 2>&1
ninja -C build-dev bench_long > build3.log 2>&1 || tail -30 build3.log
FLASHATTN_BENCH_LONG_MAX_N=131072 FLASHATTN_BENCH_THREADS=2 timeout 360 taskset -c 2,3 ./build-dev/bench/bench_long --benchmark_filter='long/(fwd|bwd)/fp32/causal/.*N:(4096|65536|131072)/' --benchmark_counters_tabular=true 2>&1 | tee $OUT/long2_xeon.txt
