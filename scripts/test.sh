#!/usr/bin/env bash
# The README's test command: installs the Debian packages it is missing, configures an optimised build of
# the tests and examples in build-ci (-O2: a third less compile time than Release's -O3, which the heavily
# templated test TUs spend nearly all of their time on; the benchmarks are built by their own commands,
# bench/run.sh and docs/performance.md), builds it with every core, runs ctest --output-on-failure and
# prints ctest's summary.
#
#   bash scripts/test.sh
#
# Environment: FLASHATTN_BUILD_DIR (default build-ci), FLASHATTN_WERROR=ON to fail on warnings (CI),
# CXX to pick the compiler of a fresh build folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/deps.sh
flashattn_ensure_packages "${FLASHATTN_TEST_PACKAGES[@]}"

build="${FLASHATTN_BUILD_DIR:-build-ci}"
jobs="$(nproc)"
generator=()
# The generator can only be chosen when the folder is configured the first time.
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)

cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DFLASHATTN_BUILD_BENCHMARKS=OFF -DFLASHATTN_WERROR="${FLASHATTN_WERROR:-OFF}"
cmake --build "$build" -j "$jobs"

set +e
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 600) 2>&1 | tee "$build/ctest.log"
rc=${PIPESTATUS[0]}
set -e

echo
echo "==== ctest summary ($build) ===="
sed -n '/tests passed/,$p' "$build/ctest.log"
exit "$rc"
