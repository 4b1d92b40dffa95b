#!/usr/bin/env bash
# Decoding, flashattn vs PyTorch's CPU SDPA on a machine with PyTorch (the accelerator machine's Xeon), one
# command: builds the ctypes shim, then runs bench/compare_torch_decode.py pinned to PIN (default core 2).
#   bash bench/device_compare_decode.sh [OUTDIR] [THREADS]
set -euo pipefail
out=${1:-out}
threads=${2:-1}
mkdir -p "$out"
build=build-device
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
  -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > "$out/cmake.log"
cmake --build "$build" --target flashattn_torch_shim -j "$(nproc)" > "$out/build.log"
{
  echo "# $(date -u) $(uname -m); $(lscpu | grep 'Model name' | sed 's/  */ /g')"
  echo "# command: PIN=${PIN:-2} bash bench/device_compare_decode.sh $out $threads"
  echo "# flashattn $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+local changes')"
} | tee "$out/torch_decode.txt"
taskset -c "${PIN:-2}" env OMP_NUM_THREADS="${threads##*,}" \
  python3 bench/compare_torch_decode.py --shim "$build/bench/libflashattn_torch_shim.so" --threads "$threads" \
  ${KEYS:+--keys "$KEYS"} ${QS:+--q "$QS"} ${DTYPES:+--dtypes "$DTYPES"} 2>&1 | tee -a "$out/torch_decode.txt"
