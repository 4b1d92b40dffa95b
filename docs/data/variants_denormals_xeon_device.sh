#!/usr/bin/env bash
# Device run (issue 23, 2026-12-07, ninth session): kernels flushing subnormals in the MXCSR
# (cpu/denormals.hpp, working tree) against the committed HEAD (flushing only in exp2), on the Xeon.
# bench_variants' ALiBi, soft-cap and sink rows, one thread pinned to core 2, two rounds alternating the
# builds. Output: $OUT/variants_denormals_xeon.txt.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
rm -rf /tmp/head-src && mkdir -p /tmp/head-src && git archive HEAD | tar -x -C /tmp/head-src
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF"
cmake -S . -B build-dev $cfg > /dev/null && cmake -S /tmp/head-src -B /tmp/build-head $cfg > /dev/null
( ninja -C build-dev bench_variants > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log" ) &
( ninja -C /tmp/build-head bench_variants > "$OUT/build-head.log" 2>&1 || tail -30 "$OUT/build-head.log" ) &
wait
filter='alibi|softcap/builtin/|sinks'
{
  echo "# $(date -u) $(lscpu | grep 'Model name' | sed 's/  */ /g'), flashattn $(git rev-parse --short HEAD) (+ working tree: MXCSR flush in run_workers)"
  for round in 1 2; do
    for build in /tmp/build-head build-dev; do
      echo "## round $round, build $build"
      echo "# command: FLASHATTN_BENCH_THREADS=1 taskset -c 2 $build/bench/bench_variants --benchmark_filter='$filter' --benchmark_counters_tabular=true"
      FLASHATTN_BENCH_THREADS=1 timeout 120 taskset -c 2 "$build/bench/bench_variants" \
        --benchmark_filter="$filter" --benchmark_counters_tabular=true 2>&1 | grep -E "^(forward|backward)"
    done
  done
} | tee "$OUT/variants_denormals_xeon.txt"
