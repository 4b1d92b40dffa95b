#!/usr/bin/env bash
# Device run for issue 22 (written 2026-12-06, not yet run: no device was lent that session), minimal: test_decode on the real AMX tile unit (AutoTiles sends
# its bf16 decode calls to AmxTiles there), then bf16 decode rows base (c93527d) vs new, one thread, core 2.
# Base headers: `git archive c93527d include | tar -x -C ab_base/include_c93 --strip-components=1`, carried to
# the device with ab_base (run with carry ["ab_base"]; OUT is the device's output folder).
set -uo pipefail
exec > >(tee "$OUT/log_decode_amx_min.txt") 2>&1
lscpu | grep -E "Model name|L2|^CPU\(s\)|amx" | cut -c1-100; date
F="-std=c++17 -O3 -march=native -DNDEBUG -isystem /usr/include/eigen3 -Ibench bench/bench_decode.cpp -lbenchmark -lpthread"
pids=()
g++ -Iab_base/include_c93 $F -o /tmp/dec_base & pids+=($!)
g++ -Iinclude $F -o /tmp/dec_new & pids+=($!)
g++ -std=c++17 -O2 -march=native -isystem /usr/include/eigen3 -Iinclude -Itests tests/test_decode.cpp -lgtest -lgtest_main -lpthread -o /tmp/test_decode & pids+=($!)
wait "${pids[@]}"; date
timeout 60 /tmp/test_decode --gtest_brief=1 2>&1 | tail -3
for v in base new; do
  echo "-- $v"
  FLASHATTN_BENCH_THREADS=1 timeout 40 taskset -c 2 /tmp/dec_$v --benchmark_filter='^decode(_no_amx)?/bf16/kv:32768/' --benchmark_counters_tabular=true 2>&1 | grep -E "^decode"
done 2>&1 | tee $OUT/decode_amx_xeon_t1.txt
date
