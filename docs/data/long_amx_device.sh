#!/usr/bin/env bash
# Device run 1 (issue 26, AMX long context, 2026-12-06 4th session): real-AMX tests of the new shapes, then
# bf16 forward A/B on one thread: base (HEAD headers in ab_base/include) vs new (vector Vᵀ staging +
# AmxTallerTiles 256,128,32) vs new with 128-row programs vs new with 32-row programs (transpose only);
# then new at 2 and 16 threads (JSON for the plot).
set -uo pipefail
exec > >(tee "$OUT/log_amx_long.txt") 2>&1
lscpu | grep -E "Model name|L2|L3|^CPU\(s\)"; date
F="-std=c++17 -O3 -march=native -DNDEBUG -isystem /usr/include/eigen3 -Ibench bench/bench_long.cpp -lbenchmark -lpthread"
pids=()
[ -x /tmp/long_base ] || { g++ -Iab_base/include $F -o /tmp/long_base & pids+=($!); }
[ -x /tmp/long_new256 ] || { g++ -Iinclude $F -o /tmp/long_new256 & pids+=($!); }
[ -x /tmp/long_new128 ] || { g++ -Iinclude -DFLASHATTN_AMX_TALLER_TILES=128,128,32 $F -o /tmp/long_new128 & pids+=($!); }
[ -x /tmp/long_newT32 ] || { g++ -Iinclude -DFLASHATTN_AMX_TALLER_TILES=32,128 $F -o /tmp/long_newT32 & pids+=($!); }
( cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_BENCHMARKS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null 2>&1; ninja -C build-dev test_forward_isa test_forward_amx test_long_context > build.log 2>&1 || tail -20 build.log ) & pids+=($!)
wait "${pids[@]}"; date; ls -la /tmp/long_*
for t in test_forward_isa test_forward_amx test_long_context; do echo "== $t"; timeout 100 ./build-dev/tests/$t --gtest_brief=1 2>&1 | tail -3; done
date
echo "== A/B bf16 fwd causal, 1 thread (core 2)"
for r in 1 2; do for v in base new256 new128 newT32; do
  echo "-- $v round $r"
  FLASHATTN_BENCH_THREADS=1 timeout 60 taskset -c 2 /tmp/long_$v --benchmark_filter='long/fwd/bf16/causal/.*N:(4096|65536)/' --benchmark_counters_tabular=true 2>&1 | grep -E "^long"
done; done 2>&1 | tee $OUT/amx_long_ab_t1.txt
date
echo "== new256, 1 thread, bf16 fwd causal sweep to 131072"
FLASHATTN_BENCH_LONG_MAX_N=131072 FLASHATTN_BENCH_THREADS=1 timeout 60 taskset -c 2 /tmp/long_new256 --benchmark_filter='long/fwd/bf16/causal/' --benchmark_counters_tabular=true --benchmark_out=$OUT/long_xeon_t1_bf16.json --benchmark_out_format=json 2>&1 | tee $OUT/long_xeon_t1_bf16.txt
date
echo "== new256, 2 threads (cores 2,3): fwd bf16 causal+full, fwd fp32 causal, to 131072"
FLASHATTN_BENCH_LONG_MAX_N=131072 FLASHATTN_BENCH_THREADS=2 timeout 100 taskset -c 2,3 /tmp/long_new256 --benchmark_filter='long/fwd/(bf16/|fp32/causal)' --benchmark_counters_tabular=true --benchmark_out=$OUT/long_xeon_t2.json --benchmark_out_format=json 2>&1 | tee $OUT/long_xeon_t2.txt
date
echo "== new256, 16 threads: fwd and bwd, bf16 and fp32, causal, to 131072"
FLASHATTN_BENCH_LONG_MAX_N=131072 FLASHATTN_BENCH_THREADS=16 timeout 120 /tmp/long_new256 --benchmark_filter='long/(fwd|bwd)/(bf16|fp32)/causal/' --benchmark_counters_tabular=true --benchmark_out=$OUT/long_xeon_t16.json --benchmark_out_format=json 2>&1 | tee $OUT/long_xeon_t16.txt
date
