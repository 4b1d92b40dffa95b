#!/usr/bin/env bash
# Device run 2 (issue 26): staged tile cache all-or-nothing (new) vs partial (include2 = before), bf16 AMX
# 1 thread at 32768/65536 and 16 threads scratch; then N = 1M forward, bf16 and fp32 causal, 16 threads.
set -uo pipefail
exec > >(tee "$OUT/log_1m.txt") 2>&1
date
F="-std=c++17 -O3 -march=native -DNDEBUG -isystem /usr/include/eigen3 -Ibench bench/bench_long.cpp -lbenchmark -lpthread"
pids=()
g++ -Iab_base/include2 $F -o /tmp/long_partial & pids+=($!)
g++ -Iinclude $F -o /tmp/long_whole & pids+=($!)
wait "${pids[@]}"; date
for r in 1 2; do for v in partial whole; do
  echo "-- $v round $r"
  FLASHATTN_BENCH_THREADS=1 timeout 60 taskset -c 2 /tmp/long_$v --benchmark_filter='long/fwd/bf16/causal/.*N:(4096|16384|65536)/' --benchmark_counters_tabular=true 2>&1 | grep -E "^long"
done; done 2>&1 | tee $OUT/cache_ab_t1.txt
date
echo "== N = 1M, 16 threads, bf16 then fp32 forward causal (whole-head cache rule)"
FLASHATTN_BENCH_LONG_MAX_N=1048576 FLASHATTN_BENCH_THREADS=16 timeout 120 /tmp/long_whole --benchmark_filter='long/fwd/bf16/causal/.*N:(4096|65536|1048576)/' --benchmark_counters_tabular=true --benchmark_out=$OUT/long_1m_bf16_t16.json --benchmark_out_format=json 2>&1 | tee $OUT/long_1m_bf16_t16.txt
date
FLASHATTN_BENCH_LONG_MAX_N=1048576 FLASHATTN_BENCH_THREADS=16 timeout 280 /tmp/long_whole --benchmark_filter='long/fwd/fp32/causal/.*N:(4096|1048576)/' --benchmark_counters_tabular=true --benchmark_out=$OUT/long_1m_fp32_t16.json --benchmark_out_format=json 2>&1 | tee $OUT/long_1m_fp32_t16.txt
date
