#!/usr/bin/env bash
# Device run (issue 23, 2026-12-07, tenth session): the additive bias (forward, backward with d_bias), the
# backward at head dims off 64 / 128, and a repeat of the soft-cap and ALiBi rows, on the device's Xeon.
# Builds bench_variants from the working tree and runs those rows with 1 and 2 threads pinned to cores
# 2 and 3. Output: $OUT/variants_bias_xeon.txt.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF \
  -DFLASHATTN_INSTALL=OFF > /dev/null
ninja -C build-dev bench_variants > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
{
  echo "# $(date -u) $(lscpu | grep 'Model name' | sed 's/  */ /g'), flashattn $(git rev-parse --short HEAD) + working tree"
  for filter in 'bias' 'softcap/builtin/|alibi' 'head_dim'; do
    echo "# command: FLASHATTN_BENCH_THREADS=1,2 taskset -c 2,3 build-dev/bench/bench_variants --benchmark_filter='$filter' --benchmark_counters_tabular=true"
    FLASHATTN_BENCH_THREADS=1,2 timeout 240 taskset -c 2,3 build-dev/bench/bench_variants \
      --benchmark_filter="$filter" --benchmark_counters_tabular=true 2>&1 | grep -vE '^\*\*\*|^-+$'
  done
} | tee "$OUT/variants_bias_xeon.txt"
