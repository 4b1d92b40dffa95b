#!/usr/bin/env bash
# Device run (issue 22, 2026-12-06 session 3): mixed-precision and varlen-backward tests, then the decode
# rows (fp16/bf16 same type and fp32 Q with fp16/bf16 K/V, 1 and 2 threads pinned to cores 2,3) and the
# varlen forward/backward rows.
set -uo pipefail
exec > >(tee "$OUT/log.txt") 2>&1
lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"; g++ --version | head -1
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null 2>&1 || echo "cmake failed"
ninja -C build-dev test_mixed_precision test_varlen test_decode test_kv_cache bench_decode bench_varlen > build.log 2>&1 || tail -30 build.log
for t in test_mixed_precision test_varlen test_decode test_kv_cache; do echo "== $t"; ./build-dev/tests/$t --gtest_brief=1 2>&1 | tail -3; done
FLASHATTN_BENCH_THREADS=1,2 timeout 300 taskset -c 2,3 ./build-dev/bench/bench_decode --benchmark_filter='^decode/(fp16|bf16|fp32q)' --benchmark_counters_tabular=true 2>&1 | tee $OUT/decode_mixed_xeon.txt
FLASHATTN_BENCH_THREADS=1,2 timeout 200 taskset -c 2,3 ./build-dev/bench/bench_varlen --benchmark_counters_tabular=true 2>&1 | tee $OUT/varlen_backward_xeon.txt
