# Sourced by scripts/test.sh, .ci/run (and any script that needs Debian packages): installs the packages
# that are missing, and nothing when all are present (no apt-get update either).
#
#   source scripts/deps.sh
#   flashattn_ensure_packages "${FLASHATTN_TEST_PACKAGES[@]}"

# What building and testing flashattn needs on Debian 12: compilers, CMake + Ninja, Eigen, GoogleTest,
# Google Benchmark and OpenBLAS (the benchmarks are configured with the tests), valgrind (cachegrind
# measurements), matplotlib (plots), pkgconf (the pkg-config packaging test).
FLASHATTN_TEST_PACKAGES=(cmake ninja-build g++ clang libeigen3-dev libgtest-dev libbenchmark-dev libopenblas-dev
                         valgrind python3-matplotlib pkgconf)

# True when the Debian package is installed (not merely known to dpkg, or removed with its config kept).
flashattn_has_package() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

flashattn_ensure_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    flashattn_has_package "$pkg" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "flashattn: missing Debian packages (${missing[*]}); run as root or install sudo" >&2
      return 1
    fi
  fi
  echo "flashattn: installing missing Debian packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}
