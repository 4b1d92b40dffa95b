#!/usr/bin/env bash
# Zen 4 (this machine), issue 26: fwd and bwd, fp32 and bf16, causal, N = 4096 (ref), 65536, 131072; 1 and 2 threads.
cd /work/main
lscpu | grep -E "Model name|L2|L3"
for t in 1 2; do
  pin=$([ $t = 1 ] && echo 1 || echo 0,1)
  FLASHATTN_BENCH_LONG_MAX_N=131072 FLASHATTN_BENCH_THREADS=$t taskset -c $pin ./build-bench/bench/bench_long \
    --benchmark_filter='long/(fwd|bwd)/(fp32|bf16)/causal/.*N:(4096|65536|131072)/' --benchmark_counters_tabular=true \
    --benchmark_out=docs/data/long_zen4_t$t.json --benchmark_out_format=json 2>&1 | tee docs/data/long_zen4_t$t.txt
done
