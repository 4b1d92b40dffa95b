#!/usr/bin/env bash
# Device run (issue 22): decode K+V GB/s against the KV length (1k-128k), fp32/fp16/bf16, 1 and 2 threads pinned to cores 2,3.
set -uo pipefail
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null 2>&1 || echo "cmake failed"
ninja -C build-dev bench_decode > build.log 2>&1 || tail -20 build.log
FLASHATTN_BENCH_SWEEP=1 FLASHATTN_BENCH_THREADS=1,2 timeout 240 taskset -c 2,3 ./build-dev/bench/bench_decode --benchmark_filter='^decode/' --benchmark_format=json > $OUT/decode_sweep_xeon.json
tail -c 300 $OUT/decode_sweep_xeon.json
