// A translation unit of test_build_info compiled as an unoptimised, baseline x86-64 one would be (the
// test's CMake gives it -O0 and -march=x86-64 after the project's flags): it includes flashattn, so its
// flags join the program's build record (cpu/build_info.hpp). It includes no kernel, so no inline
// function of different instruction sets is shared with the other unit.
#include "flashattn/cpu/build_info.hpp"

namespace build_info_test {
// What this unit was compiled for, to check that the flags took effect.
int baseline_unit_isa() { return int(flashattn::cpu::kBestIsa); }
bool baseline_unit_optimised() {
#if defined(__OPTIMIZE__)
  return true;
#else
  return false;
#endif
}
}  // namespace build_info_test
