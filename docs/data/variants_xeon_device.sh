#!/usr/bin/env bash
# Device run (issue 23, 2026-12-07): bench_variants on the accelerator machine's Xeon, pinned to cores 2,3,
# one and two threads. Output: $OUT/variants_xeon.txt.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
  -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null
ninja -C build-dev bench_variants > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log"
{
  echo "# $(date -u) $(lscpu | grep 'Model name' | sed 's/  */ /g'), flashattn $(git rev-parse --short HEAD 2>/dev/null)"
  echo "# command: FLASHATTN_BENCH_THREADS=1,2 taskset -c 2,3 build-dev/bench/bench_variants --benchmark_counters_tabular=true"
  FLASHATTN_BENCH_THREADS=1,2 timeout 400 taskset -c 2,3 ./build-dev/bench/bench_variants --benchmark_counters_tabular=true 2>&1
} | tee "$OUT/variants_xeon.txt"
