#!/usr/bin/env bash
# flashattn vs PyTorch's CPU attention on a machine with PyTorch installed (the accelerator machine's
# 16-core Xeon here), in one command: builds the ctypes shim (bench/torch_shim.cpp), then runs
# bench/compare_torch.py, which times both kernels in one process, alternated in blocks.
#   bash bench/device_compare.sh [OUTDIR] [THREADS]       e.g. bash bench/device_compare.sh out 1,16
# Environment: DTYPES (default fp32; e.g. fp32,bf16), LAYOUTS (default bhsd,bshd), NS and DS (sequence lengths
# and head dims, default 1024,4096 and 64,128), ROUNDS and REPS (per shape,
# ROUNDS alternated blocks per side of REPS timed calls; default 3 and 3), PIN (a taskset core list, e.g.
# PIN=3 with THREADS=1). DECODE=1 runs bench/compare_torch_decode.py instead (decoding against a long KV
# cache; KEYS, QS and DTYPES pass through, default 32768,131072 / 1,4 / fp32,bf16,fp16; output torch_decode.txt).
set -euo pipefail
out=${1:-out}
threads=${2:-1,16}
mkdir -p "$out"
build=build-device
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
  -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > "$out/cmake.log"
cmake --build "$build" --target flashattn_torch_shim -j "$(nproc)" > "$out/build.log"
name=torch_compare
[ "${DECODE:-0}" = 1 ] && name=torch_decode
{
  echo "# $(date -u) $(uname -m); $(lscpu | grep 'Model name' | sed 's/  */ /g')"
  echo "# command: ${DECODE:+DECODE=$DECODE }${PIN:+PIN=$PIN }${ROUNDS:+ROUNDS=$ROUNDS }${NS:+NS=$NS }${DS:+DS=$DS }${DTYPES:+DTYPES=$DTYPES }${LAYOUTS:+LAYOUTS=$LAYOUTS }bash bench/device_compare.sh $out $threads"
  echo "# flashattn $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+local changes')"
} | tee "$out/$name.txt"
if [ "${DECODE:-0}" = 1 ]; then
  ${PIN:+taskset -c "$PIN"} env OMP_NUM_THREADS="${threads##*,}" \
    python3 bench/compare_torch_decode.py --shim "$build/bench/libflashattn_torch_shim.so" --threads "$threads" \
    ${KEYS:+--keys "$KEYS"} ${QS:+--q "$QS"} ${DTYPES:+--dtypes "$DTYPES"} 2>&1 | tee -a "$out/$name.txt"
  exit 0
fi
${PIN:+taskset -c "$PIN"} env OMP_NUM_THREADS="${threads##*,}" \
  python3 bench/compare_torch.py --shim "$build/bench/libflashattn_torch_shim.so" --threads "$threads" \
  --n "${NS:-1024,4096}" --d "${DS:-64,128}" --dtypes "${DTYPES:-fp32}" --layouts "${LAYOUTS:-bhsd,bshd}" --rounds "${ROUNDS:-3}" --reps "${REPS:-3}" \
  --out "$out/torch_compare.csv" 2>&1 | tee -a "$out/torch_compare.txt"
