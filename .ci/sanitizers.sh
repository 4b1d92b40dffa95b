#!/usr/bin/env bash
# The test suite under sanitizers (issue 5), clang++ at -O1 (fast enough, and reports point at the right
# lines):
#   1. ASan + UBSan (-fno-sanitize-recover=all: any report fails), built with -Werror (this is also CI's
#      clang++ -Werror build of the tests): every test binary and example, run by ctest, but two not built
#      (FLASHATTN_SKIP_TESTS): test_accounting (the kernels of test_forward with a byte-counting policy,
#      checked by the g++ pass), test_long_context (N = 20000 on the kernels that test_forward's
#      TallerTiles rows run at short lengths: seconds unsanitized, minutes here), test_forward_isa (the
#      forward suite once per instruction set: the longest build of all, and the fuzzer below runs the
#      AVX2 and portable tiles under ASan) and test_forward itself (the second longest build; the same
#      forward kernels run under ASan in test_forward_amx, test_edge_cases, test_numerics, test_masks and
#      the variant tests, and the fuzzer's whole input space is forward calls: skipped to keep CI inside
#      its time limit), and five whose paths the fuzzer now drives under ASan+UBSan itself (fuzz/: the
#      score variants on lanes, sinks with d_sinks and dLSE, the structured and block masks, V's own head
#      dim, forward and backward): test_score_variants, test_backward_extras, test_structured_masks,
#      test_block_mask, test_value_dim (together about 9 of this pass's 40 minutes on a Zen 3 core pair,
#      2026-12-07); the packaging tests, which only configure and build consumer projects, are left out.
#   2. TSan: test_concurrency, whose forward, masked and backward calls run from many user threads, each
#      with workers of its own, run by ctest.
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

# configure DIR FLAGS... [-- CMAKE_ARGS...]: the tests (and the examples ctest runs), no benchmarks; build
# type None, so the only optimisation flags are ours.
configure() {
  local dir=$1; shift
  local flags=() cmake_args=()
  while (($#)) && [[ $1 != -- ]]; do flags+=("$1"); shift; done
  (($#)) && shift && cmake_args=("$@")
  cmake -S "$root" -B "$dir" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=None -DFLASHATTN_WERROR=ON \
    -DFLASHATTN_BUILD_TESTS=ON -DFLASHATTN_BUILD_BENCHMARKS=OFF -DFLASHATTN_BUILD_EXAMPLES=ON \
    -DCMAKE_CXX_FLAGS="-O1 -gline-tables-only -fno-omit-frame-pointer ${flags[*]}" \
    -DCMAKE_EXE_LINKER_FLAGS="${flags[*]}" "${cmake_args[@]}" >/dev/null
}

if [[ $what == all || $what == asan ]]; then
  say "ASan+UBSan: configure and build $asan_dir"
  configure "$asan_dir" -fsanitize=address,undefined -fno-sanitize-recover=all -- "-DFLASHATTN_SKIP_TESTS=test_accounting;test_long_context;test_forward_isa;test_forward;test_score_variants;test_backward_extras;test_structured_masks;test_block_mask;test_value_dim"
  cmake --build "$asan_dir" -j "$jobs"
  say "ASan+UBSan: ctest"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$asan_dir" -LE packaging --output-on-failure -j "$jobs" --timeout 600
fi

if [[ $what == all || $what == tsan ]]; then
  say "TSan: configure and build $tsan_dir"
  configure "$tsan_dir" -fsanitize=thread
  cmake --build "$tsan_dir" -j "$jobs" --target test_concurrency
  say "TSan: ctest (the tests of test_concurrency)"
  # Its tests by the names gtest_discover_tests gives them (the other binaries, not built here, only have
  # *_NOT_BUILT entries, which the regex leaves out), but the fork test: TSan ends a forked child that
  # starts threads (die_after_fork), and the child's new pool does.
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir "$tsan_dir" --output-on-failure -j "$jobs" --timeout 600 \
      -R '^(Concurrency|WorkerPool)\.' -E 'ForkedChild'
fi
say "passed"
