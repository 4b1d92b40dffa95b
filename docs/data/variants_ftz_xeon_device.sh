#!/usr/bin/env bash
# Device run (issue 23, 2026-12-07, ninth session): is the Xeon's ALiBi slowdown subnormal probabilities?
# Builds bench_variants twice, from the committed HEAD (AVX-512 exp2 keeping subnormals) and from the
# working tree (exp2 flushing below 2^-126 as the AVX2 and portable paths do), and runs the ALiBi and
# soft-cap rows of each, one thread pinned to core 2, with FLASHATTN_BENCH_FTZ=0 and =1 (MXCSR FTZ+DAZ).
# Output: $OUT/variants_ftz_xeon.txt.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
rm -rf /tmp/head-src && mkdir -p /tmp/head-src && git archive HEAD | tar -x -C /tmp/head-src
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF"
cmake -S . -B build-dev $cfg > /dev/null && cmake -S /tmp/head-src -B /tmp/build-head $cfg > /dev/null
( ninja -C build-dev bench_variants > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log" ) &
( ninja -C /tmp/build-head bench_variants > "$OUT/build-head.log" 2>&1 || tail -30 "$OUT/build-head.log" ) &
wait
filter='alibi|softcap/builtin/'
{
  echo "# $(date -u) $(lscpu | grep 'Model name' | sed 's/  */ /g'), flashattn $(git rev-parse --short HEAD) (+ working tree: flushing exp2)"
  for round in 1 2; do
    for build in /tmp/build-head build-dev; do
      for ftz in 0 1; do
        echo "## round $round, build $build, FLASHATTN_BENCH_FTZ=$ftz"
        echo "# command: FLASHATTN_BENCH_FTZ=$ftz FLASHATTN_BENCH_THREADS=1 taskset -c 2 $build/bench/bench_variants --benchmark_filter='$filter' --benchmark_counters_tabular=true"
        FLASHATTN_BENCH_FTZ=$ftz FLASHATTN_BENCH_THREADS=1 timeout 100 taskset -c 2 "$build/bench/bench_variants" \
          --benchmark_filter="$filter" --benchmark_counters_tabular=true 2>&1 | grep -E "^(forward|backward)|mxcsr"
      done
    done
  done
} | tee "$OUT/variants_ftz_xeon.txt"
