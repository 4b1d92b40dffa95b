#!/usr/bin/env bash
# The README's main job: what the library is for, measured on this machine. Builds bench/bench_main.cpp
# (Release, -march=native) and runs the naive attention (the N × N score matrix S in memory) and the tiled
# one (FlashAttention) on the same calls for N from 512 up, the naive one while its S fits the budget below
# and the tiled one past it; prints one table (time, GFLOP/s, bytes moved through main memory as the
# kernels count them, peak extra memory) with a summary, and writes a plot of bytes and time against N.
#
#   bash bench/run.sh            (about two minutes on 2 cores, the build included)
#
# Environment: FLASHATTN_BENCH_BUILD_DIR (default build-bench), FLASHATTN_MAIN_OUT (the folder for the
# JSON, the table and naive_vs_tiled.png; default $build/main), FLASHATTN_MAIN_MAX_N (largest N, default
# 65536), FLASHATTN_MAIN_NAIVE_GIB (the naive path runs while its S takes at most this many GiB; default 1).
# The other benchmarks (GEMM-rate ratios, threads, 16-bit, backward, decode, variants): docs/performance.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/deps.sh
flashattn_ensure_packages cmake ninja-build g++ libeigen3-dev libbenchmark-dev libopenblas-dev python3-matplotlib

build="${FLASHATTN_BENCH_BUILD_DIR:-build-bench}"
out="${FLASHATTN_MAIN_OUT:-$build/main}"
max_n="${FLASHATTN_MAIN_MAX_N:-65536}"
naive_gib="${FLASHATTN_MAIN_NAIVE_GIB:-1}"
start=$SECONDS

echo "== building bench_main in $build (Release, -march=native)"
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
  -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null
cmake --build "$build" --target bench_main -j "$(nproc)" > "$build/bench_main_build.log" 2>&1 ||
  { tail -30 "$build/bench_main_build.log"; exit 1; }
echo "   built in $((SECONDS - start)) s"

rm -rf "$out"
mkdir -p "$out"
cpu="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
rows=()
for n in 512 1024 2048 4096 8192 16384 32768 65536; do
  [ "$n" -le "$max_n" ] || break
  # S is N × N fp32: 4·N² bytes.
  if [ $((4 * n * n)) -le $((naive_gib * 1024 * 1024 * 1024)) ]; then
    rows+=("naive $n")
  else
    echo "$n needs $((4 * n * n / 1024 / 1024)) MiB for S, above the ${naive_gib} GiB budget (FLASHATTN_MAIN_NAIVE_GIB)" \
      >> "$out/skipped.txt"
  fi
  rows+=("tiled $n")
done

echo "== naive vs tiled, fp32, one head, d = 64, one thread, ${#rows[@]} runs on ${cpu:-this CPU}"
i=0
for row in "${rows[@]}"; do
  read -r path n <<< "$row"
  i=$((i + 1))
  t0=$EPOCHREALTIME
  printf '   [%2d/%d] %-5s N = %-6d ' "$i" "${#rows[@]}" "$path" "$n"
  # Google Benchmark's console output is not shown (the table below is); its JSON is kept. Debian's
  # libbenchmark prints a "Library was built as DEBUG" warning there: it concerns the harness's own build,
  # not the timings of the code under test.
  env -u OPENBLAS_CORETYPE "$build/bench/bench_main" --benchmark_filter="^main/$path/N:$n/" \
    --benchmark_out="$out/main_${path}_$n.json" --benchmark_out_format=json > "$out/main_${path}_$n.log" 2>&1 &&
    [ -s "$out/main_${path}_$n.json" ] || { echo; tail -20 "$out/main_${path}_$n.log"; exit 1; }
  LC_ALL=C awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s\n", b - a }'
done
echo
python3 bench/main_report.py "$out" --cpu "${cpu:-unknown CPU}"
echo
echo "== done in $((SECONDS - start)) s; table and JSON in $out"
