#!/usr/bin/env bash
# Source coverage of the library's headers by a fuzz corpus: builds the harness with clang's coverage
# instrumentation (no sanitizers), runs every input of CORPUS once, and prints llvm-cov's report for
# include/flashattn (lines, functions, regions per header).
#
#   bash fuzz/coverage.sh [CORPUS_DIR...]      (default: fuzz/corpus, the seed corpus in the repo)
#
# Environment: FLASHATTN_FUZZ_COV_BUILD (default <repo>/build-fuzz-cov), CXX (default clang++-14 or clang++).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_FUZZ_COV_BUILD:-$root/build-fuzz-cov}
cxx=${CXX:-$(command -v clang++-14 || command -v clang++ || true)}
[[ -n "$cxx" ]] || { echo "fuzz/coverage.sh: clang++ not found" >&2; exit 2; }
suffix=${cxx##*clang++}  # "-14" for clang++-14: use the matching llvm tools
profdata=$(command -v "llvm-profdata$suffix" || command -v llvm-profdata)
cov=$(command -v "llvm-cov$suffix" || command -v llvm-cov)
corpora=("$@")
(( ${#corpora[@]} )) || corpora=("$root/fuzz/corpus")

mkdir -p "$build"
echo "== coverage: building $build/fuzz_cov with $cxx (about 2 minutes)"
start=$(date +%s)
"$cxx" -std=c++17 -O1 -march=native -I"$root/include" -I"$root/tests" -I/usr/include/eigen3 \
  -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping \
  "$root"/fuzz/fuzz_attention.cpp "$root"/fuzz/type_*.cpp -o "$build/fuzz_cov"
echo "== coverage: build took $(( $(date +%s) - start )) s"

inputs=0
for c in "${corpora[@]}"; do inputs=$(( inputs + $(ls "$c" | wc -l) )); done
echo "== coverage: running $inputs inputs once each (${corpora[*]})"
start=$(date +%s)
rm -f "$build"/*.profraw
LLVM_PROFILE_FILE="$build/fuzz-%p.profraw" "$build/fuzz_cov" -runs=0 "${corpora[@]}" 2>&1 |
  grep --line-buffered -E '^#[0-9]+[[:space:]]+(INITED|pulse|DONE)' || true
echo "== coverage: run took $(( $(date +%s) - start )) s"
"$profdata" merge -sparse "$build"/*.profraw -o "$build/fuzz.profdata"
"$cov" report "$build/fuzz_cov" -instr-profile="$build/fuzz.profdata" "$root/include/flashattn"
