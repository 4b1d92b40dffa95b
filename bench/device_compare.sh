#!/usr/bin/env bash
# flashattn vs PyTorch's CPU attention on a machine with PyTorch installed (the accelerator machine's
# 16-core Xeon here), in one command: builds bench_forward, then runs bench/compare_torch.py.
#   bash bench/device_compare.sh [OUTDIR] [THREADS]       e.g. bash bench/device_compare.sh out 1,16
# Environment: DTYPES (default fp32; e.g. fp32,bf16), ROUNDS (alternations per shape, default 3), PIN (a
# taskset core list, e.g. PIN=3 with THREADS=1: both sides then run on the same core, one after the other).
set -euo pipefail
out=${1:-out}
threads=${2:-1,16}
mkdir -p "$out"
build=build-device
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
  -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > "$out/cmake.log"
cmake --build "$build" --target bench_forward -j "$(nproc)" > "$out/build.log"
{
  echo "# $(date -u) $(uname -m); $(lscpu | grep 'Model name' | sed 's/  */ /g')"
  echo "# command: ${PIN:+PIN=$PIN }bash bench/device_compare.sh $out $threads"
} | tee "$out/torch_compare.txt"
# OpenBLAS, when present, picks its kernel by CPU; a CORETYPE pinned in the environment would handicap it.
${PIN:+taskset -c "$PIN"} env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=1 \
  python3 bench/compare_torch.py --bench "$build/bench/bench_forward" --threads "$threads" \
  --dtypes "${DTYPES:-fp32}" --rounds "${ROUNDS:-3}" --out "$out/torch_compare.csv" 2>&1 | tee -a "$out/torch_compare.txt"
