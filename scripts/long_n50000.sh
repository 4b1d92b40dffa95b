#!/usr/bin/env bash
# The long check outside CI (issue 5): a forward call with N × N > 2^31 scores (N = 50000, float, head
# dim 64, one head, 2 threads), non-causal and causal, checked on 64 sampled rows (first and last among
# them) against an fp64 reference computed for those rows only. Takes a few minutes on 2 cores.
#
#   bash scripts/long_n50000.sh [N] [threads] [sampled rows]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_LONG_BUILD:-$root/build-long}
cxx=${CXX:-g++}
mkdir -p "$build"
echo "== long_n50000: building $build/long_n50000 with $cxx -O2 -march=native"
"$cxx" -std=c++17 -O2 -march=native -Wall -Wextra -Wpedantic -pthread -I "$root/include" -I /usr/include/eigen3 \
  "$root/scripts/long_n50000.cpp" -o "$build/long_n50000"
echo "== long_n50000: running"
/usr/bin/time -v "$build/long_n50000" "${1:-50000}" "${2:-2}" "${3:-64}" 2> "$build/time.log"
status=$?
grep -E "Elapsed|Maximum resident" "$build/time.log" || true
exit $status
