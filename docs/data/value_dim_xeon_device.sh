#!/usr/bin/env bash
# Device run (issue 23, 2026-12-07, eleventh session): V's head dim apart from Q/K's on the device's Xeon
# (AMX: bf16 prefill on the tile unit, the decode kernel's AMX lane programs). Builds test_value_dim,
# test_decode, test_decode_amx and bench_variants from the working tree, runs the three test binaries, then
# the head-dim rows of bench_variants with 1 and 2 threads pinned to cores 2 and 3.
# Output: $OUT/value_dim_tests_xeon.txt, $OUT/value_dim_xeon.txt.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF \
  -DFLASHATTN_INSTALL=OFF > /dev/null
ninja -C build-dev -j 16 test_value_dim test_decode test_decode_amx bench_variants > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
{
  echo "# $(date -u) $(lscpu | grep 'Model name' | sed 's/  */ /g'), flashattn $(git rev-parse --short HEAD) + working tree"
  for t in test_value_dim test_decode test_decode_amx; do
    echo "# command: build-dev/tests/$t"
    build-dev/tests/$t 2>&1 | grep -E '^\[ +(OK|FAILED|PASSED) |Failure|^\[=+\]'
  done
} | tee "$OUT/value_dim_tests_xeon.txt"
{
  echo "# $(date -u) $(lscpu | grep 'Model name' | sed 's/  */ /g'), flashattn $(git rev-parse --short HEAD) + working tree"
  filter='head_dim/(dk:|d:192)'
  echo "# command: FLASHATTN_BENCH_THREADS=1,2 taskset -c 2,3 build-dev/bench/bench_variants --benchmark_filter='$filter' --benchmark_counters_tabular=true"
  for round in 1 2; do
    echo "## round $round"
    FLASHATTN_BENCH_THREADS=1,2 timeout 200 taskset -c 2,3 build-dev/bench/bench_variants \
      --benchmark_filter="$filter" --benchmark_counters_tabular=true 2>&1 | grep -vE '^\*\*\*|^-+$'
  done
} | tee "$OUT/value_dim_xeon.txt"
