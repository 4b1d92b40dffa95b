#!/usr/bin/env bash
# Device run for issue 22: bench_decode (decode kernel vs the prefill kernel, K+V GB/s against a same-run read) on the Xeon.
set -uo pipefail
lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null 2>&1 || echo "cmake failed"
ninja -C build-dev bench_decode > build.log 2>&1 || tail -20 build.log
FLASHATTN_BENCH_THREADS=1,2 timeout 420 taskset -c 2,3 ./build-dev/bench/bench_decode --benchmark_counters_tabular=true 2>&1 | tee $OUT/decode_xeon.txt
