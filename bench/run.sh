#!/usr/bin/env bash
# The README's main job: builds the benchmarks (Release, -march=native) and runs a short, readable
# naive-vs-tiled comparison on this machine, with the same-run references it is judged against.
#
#   bash bench/run.sh            (about two minutes on 2 cores)
#
# Every row: GFLOP/s (4·H·N²·d per call), x_sgemm = ÷ the best sgemm measured at start-up in the same
# process (OpenBLAS when installed, else Eigen), x_fma_peak = ÷ the FMA peak measured the same way,
# scratch_B = peak tracked kernel scratch (tiled) or the bytes of the materialised S (naive).
# The full sweep (N up to 16384, d 64/128/256, causal, bf16/fp16, all threads): run
#   build-bench/bench/bench_forward --benchmark_counters_tabular=true
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/deps.sh
flashattn_ensure_packages cmake ninja-build g++ libeigen3-dev libbenchmark-dev libopenblas-dev

build="${FLASHATTN_BENCH_BUILD_DIR:-build-bench}"
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
  -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null
cmake --build "$build" --target bench_forward -j "$(nproc)"

bench=("$build/bench/bench_forward" --benchmark_counters_tabular=true)
# OpenBLAS picks its best kernel for this CPU only when no core type is pinned in the environment.
run() { env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "${bench[@]}" "$@"; }

echo
echo "== naive (materialised S) vs tiled, fp32, d=128, B=1, H=8, one thread =="
FLASHATTN_BENCH_THREADS=1 run --benchmark_filter='^(naive|tiled)/fp32/N:(512|1024|2048|4096)/d:128/causal:0/threads:1/'
echo
echo "== N=4096, one thread, alternated calls: causal vs full (effective rate, d=128), bf16 and fp16 vs fp32"
echo "   (d=128), tiled fp32 vs OpenBLAS sgemm 2048^3 (d=64/128/256; only when built with OpenBLAS) =="
FLASHATTN_BENCH_THREADS=1 run \
  --benchmark_filter='^(causal_vs_full/fp32/N:4096/d:128|vs_fp32/(bf16|fp16)/N:4096/d:128/causal:0|vs_sgemm/fp32/N:4096)/'
threads=$(nproc)
if [ "$threads" -gt 1 ]; then
  echo
  echo "== tiled at N=4096, d=128, fp32: speed-up of $threads threads over one (wall time, alternated) =="
  FLASHATTN_BENCH_THREADS="1,$threads" run --benchmark_filter="^scaling/"
fi
