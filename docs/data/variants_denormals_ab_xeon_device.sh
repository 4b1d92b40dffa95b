#!/usr/bin/env bash
# Device run (issue 23, 2026-12-07, ninth session): the MXCSR guard alone (cpu/denormals.hpp's
# ScopedFlushDenormals in run_workers) on the Xeon. Builds bench_variants from the working tree and from a
# copy with the guard's two lines in cpu/parallel.hpp deleted (everything else identical, the flushing
# exp2 included), then alternates them over six rounds of the ALiBi and soft-cap backward rows and the
# non-causal ALiBi forward, one thread pinned to core 2. Output: $OUT/variants_denormals_ab_xeon.txt.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
rm -rf /tmp/noguard && mkdir -p /tmp/noguard && tar --exclude=./build-dev --exclude=./.git -cf - . | tar -x -C /tmp/noguard
sed -i '/const ScopedFlushDenormals flush;/d' /tmp/noguard/include/flashattn/cpu/parallel.hpp
grep -c ScopedFlushDenormals /tmp/noguard/include/flashattn/cpu/parallel.hpp
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF"
cmake -S . -B build-dev $cfg > /dev/null && cmake -S /tmp/noguard -B /tmp/build-noguard $cfg > /dev/null
( ninja -C build-dev bench_variants > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log" ) &
( ninja -C /tmp/build-noguard bench_variants > "$OUT/build-noguard.log" 2>&1 || tail -30 "$OUT/build-noguard.log" ) &
wait
filter='backward/alibi|backward/softcap/builtin/|forward/alibi/builtin_full'
{
  echo "# $(date -u) $(lscpu | grep 'Model name' | sed 's/  */ /g'); guard = working tree, noguard = the same without ScopedFlushDenormals in run_workers"
  for round in 1 2 3 4 5 6; do
    for build in /tmp/build-noguard build-dev; do
      echo "## round $round, build $build"
      FLASHATTN_BENCH_THREADS=1 timeout 60 taskset -c 2 "$build/bench/bench_variants" \
        --benchmark_filter="$filter" --benchmark_counters_tabular=true 2>&1 | grep -E "^(forward|backward)"
    done
  done
} | tee "$OUT/variants_denormals_ab_xeon.txt"
