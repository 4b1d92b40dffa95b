#!/usr/bin/env bash
# Device run (issue 22, 2026-12-07): decoding side by side with PyTorch's CPU SDPA on the accelerator
# machine's Xeon (bench/compare_torch_decode.py through bench/device_compare.sh), one thread pinned to core 2
# and two threads on cores 2,3; then (STAGE=bench) bench_decode at 1 and 2 threads on the same cores.
#   run: STAGE=torch bash docs/data/decode_torch_xeon_device.sh ; STAGE=bench bash docs/data/decode_torch_xeon_device.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"
if [ "${STAGE:-torch}" = torch ]; then
  DECODE=1 PIN=2 bash bench/device_compare.sh "$OUT/t1" 1
  DECODE=1 PIN=2,3 bash bench/device_compare.sh "$OUT/t2" 2
else
  cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
    -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null
  ninja -C build-dev bench_decode > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log"
  FLASHATTN_BENCH_THREADS=1,2 timeout 420 taskset -c 2,3 ./build-dev/bench/bench_decode \
    --benchmark_counters_tabular=true 2>&1 | tee "$OUT/decode_xeon.txt"
fi
