#!/usr/bin/env bash
# The test suite under sanitizers (issue 5), clang++ at -O1 (fast enough, and reports point at the right
# lines):
#   1. ASan + UBSan (-fno-sanitize-recover=all: any report fails): every test binary and example ctest
#      knows, run by ctest (the packaging tests, which only configure and build consumer projects, are
#      left out).
#   2. TSan: the threaded tests (test_concurrency, and the forward and backward suites, whose calls run
#      num_threads = 2 or more), run by ctest.
# Build dirs: $FLASHATTN_ASAN_BUILD (default build-asan) and $FLASHATTN_TSAN_BUILD (default build-tsan);
# they are reused when present, so a second run only rebuilds what changed.
#
#   bash .ci/sanitizers.sh [asan|tsan|all]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
what=${1:-all}
cxx=${CXX:-$(command -v clang++-14 || command -v clang++ || true)}
[[ -n "$cxx" ]] || { echo ".ci/sanitizers.sh: clang++ not found" >&2; exit 2; }
jobs=${FLASHATTN_JOBS:-$(nproc)}
asan_dir=${FLASHATTN_ASAN_BUILD:-$root/build-asan}
tsan_dir=${FLASHATTN_TSAN_BUILD:-$root/build-tsan}
start=$SECONDS

say() { echo "== sanitizers: $* ($((SECONDS - start)) s)"; }

# configure DIR FLAGS...: the tests (and the examples ctest runs), no benchmarks; build type None, so the
# only optimisation flags are ours.
configure() {
  local dir=$1; shift
  cmake -S "$root" -B "$dir" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=None \
    -DFLASHATTN_BUILD_TESTS=ON -DFLASHATTN_BUILD_BENCHMARKS=OFF -DFLASHATTN_BUILD_EXAMPLES=ON \
    -DCMAKE_CXX_FLAGS="-O1 -gline-tables-only -fno-omit-frame-pointer $*" \
    -DCMAKE_EXE_LINKER_FLAGS="$*" >/dev/null
}

if [[ $what == all || $what == asan ]]; then
  say "ASan+UBSan: configure and build $asan_dir"
  configure "$asan_dir" -fsanitize=address,undefined -fno-sanitize-recover=all
  cmake --build "$asan_dir" -j "$jobs"
  say "ASan+UBSan: ctest"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$asan_dir" -LE packaging --output-on-failure -j "$jobs" --timeout 900
fi

if [[ $what == all || $what == tsan ]]; then
  say "TSan: configure and build $tsan_dir"
  configure "$tsan_dir" -fsanitize=thread
  tsan_targets=(test_concurrency test_forward test_backward)
  cmake --build "$tsan_dir" -j "$jobs" --target "${tsan_targets[@]}"
  say "TSan: ctest (the tests of ${tsan_targets[*]})"
  # The tests of those binaries, by the names gtest_discover_tests gives them (Concurrency.*, names that
  # contain <Instance>/ForwardTest/<config>, Backward*); binaries not built here only have *_NOT_BUILT
  # entries, which the regex leaves out.
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir "$tsan_dir" --output-on-failure -j "$jobs" --timeout 900 \
      -R 'Concurrency\.|/ForwardTest/|Backward'
fi
say "passed"
