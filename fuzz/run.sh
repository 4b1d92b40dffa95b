#!/usr/bin/env bash
# Builds the libFuzzer harness (fuzz/fuzz_attention.cpp, clang++ with ASan + UBSan) and fuzzes the public
# API for SECONDS, starting from a copy of the seed corpus in fuzz/corpus/. Exits non-zero on a finding;
# the crashing input is kept under $BUILD/fuzz-artifacts/ (replay: $BUILD/fuzz/fuzz_attention FILE).
#
#   bash fuzz/run.sh SECONDS [JOBS [OPT]]      (OPT: -O1 or -O0, as FLASHATTN_FUZZ_OPT below)
#
# Environment: FLASHATTN_FUZZ_BUILD (build dir, default <repo>/build-fuzz), FLASHATTN_FUZZ_CORPUS (a
# working corpus to keep and grow across runs instead of a temporary copy), FLASHATTN_FUZZ_OPT (-O1, the
# default, or -O0: builds 4x faster, fuzzes about 3x slower; CI's short pass takes -O0), CXX (default
# clang++-14 or clang++).
set -euo pipefail

seconds=${1:?usage: fuzz/run.sh SECONDS [JOBS [OPT]]}
jobs=${2:-1}
opt=${3:-${FLASHATTN_FUZZ_OPT:--O1}}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_FUZZ_BUILD:-$root/build-fuzz}
cxx=${CXX:-$(command -v clang++-14 || command -v clang++ || true)}
[[ -n "$cxx" ]] || { echo "fuzz/run.sh: clang++ not found (libFuzzer needs clang)" >&2; exit 2; }

echo "== fuzz: configuring and building $build/fuzz/fuzz_attention with $cxx $opt"
start=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=None \
  -DFLASHATTN_BUILD_FUZZERS=ON -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_BENCHMARKS=OFF \
  -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF -DFLASHATTN_FUZZ_OPT="$opt" >/dev/null
cmake --build "$build" --target fuzz_attention -j "$(( jobs > 2 ? jobs : 2 ))"
echo "== fuzz: build took $(( $(date +%s) - start )) s"

if [[ -n "${FLASHATTN_FUZZ_CORPUS:-}" ]]; then
  corpus=$FLASHATTN_FUZZ_CORPUS
  mkdir -p "$corpus"
else
  corpus=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-fuzz.XXXXXX")
  trap 'rm -rf "$corpus"' EXIT
fi
cp -n "$root"/fuzz/corpus/* "$corpus"/ 2>/dev/null || true
artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
log=$build/fuzz-last.log

# -max_len: the decoder needs a few hundred bytes at most. -timeout: the largest input does well under
# 1 s of work, so 25 s means a hang. -rss_limit_mb: the largest input needs a few MB.
args=(-max_total_time="$seconds" -max_len=1024 -timeout=25 -rss_limit_mb=2048 -print_final_stats=1
      -artifact_prefix="$artifacts/" -report_slow_units=30)
if (( jobs > 1 )); then
  args+=(-fork="$jobs")
fi
echo "== fuzz: $seconds s, $jobs job(s), corpus $corpus ($(ls "$corpus" | wc -l) inputs), log $log"
set +e
"$build/fuzz/fuzz_attention" "${args[@]}" "$corpus" 2>&1 | tee "$log" | grep --line-buffered -E \
  '^#[0-9]+[[:space:]]+(INITED|pulse|DONE|REDUCE|NEW)|FINDING|ERROR|SUMMARY|runtime error|Test unit written|stat::' |
  awk '/[[:space:]](NEW|REDUCE)[[:space:]]/ { if (++n % 50) next } { print; fflush() }'
status=${PIPESTATUS[0]}
set -e

last=$(grep -E '^#[0-9]+[[:space:]]' "$log" | tail -n 1 || true)
echo "== fuzz: exit $status; last status line: ${last:-none}"
if (( status != 0 )); then
  echo "== fuzz: FAILED (finding); reproducer(s) in $artifacts:" >&2
  ls -t "$artifacts" | head -n 3 >&2
  exit "$status"
fi
echo "== fuzz: no findings"
