// build_info() and the build note (cpu/build_info.hpp, cpu/cpu_features.hpp). This binary links a second
// unit compiled at -O0 for baseline x86-64 (build_info_baseline_unit.cpp), so the program's record must
// say "unoptimised" and the lower instruction set, and the first call must print both notes, unless
// FLASHATTN_QUIET is set.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace build_info_test {
int baseline_unit_isa();
bool baseline_unit_optimised();
}  // namespace build_info_test

namespace {

using flashattn::cpu::Isa;

// One small forward call, the first kernel call of whatever test runs it.
void small_call() {
  std::vector<float> q(2 * 8, 0.5f), k(3 * 8, 0.25f), v(3 * 8, 1.0f), o(q.size());
  flashattn::attention_forward<float>(flashattn::bshd<const float>(q.data(), 1, 2, 1, 8),
                                      flashattn::bshd<const float>(k.data(), 1, 3, 1, 8),
                                      flashattn::bshd<const float>(v.data(), 1, 3, 1, 8),
                                      flashattn::bshd(o.data(), 1, 2, 1, 8));
  EXPECT_FLOAT_EQ(o[0], 1.0f);
}

// The note is printed once per process: a test that wants to see it starts the count again.
std::string stderr_of_first_call(const char* quiet) {
  if (quiet) setenv("FLASHATTN_QUIET", quiet, 1);
  else unsetenv("FLASHATTN_QUIET");
  flashattn::cpu::detail::build_record().announced.store(false);
  testing::internal::CaptureStderr();
  small_call();
  small_call();
  const std::string err = testing::internal::GetCapturedStderr();
  unsetenv("FLASHATTN_QUIET");
  return err;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(BuildInfo, TheSecondUnitWasCompiledAsIntended) {
  EXPECT_EQ(build_info_test::baseline_unit_isa(), int(Isa::Portable));
  EXPECT_FALSE(build_info_test::baseline_unit_optimised());
}

TEST(BuildInfo, RecordsTheLowestUnit) {
  const flashattn::cpu::BuildInfo info = flashattn::cpu::build_info();
  EXPECT_EQ(info.compiled, Isa::Portable);  // the baseline unit's
  EXPECT_FALSE(info.optimised);             // the baseline unit's -O0
  // This unit was compiled with -march=native: the CPU runs at least what it was compiled for.
  EXPECT_GE(int(info.cpu), int(flashattn::cpu::kBestIsa));
  EXPECT_EQ(info.cpu, flashattn::cpu::cpu_best_isa());
  EXPECT_NE(info.describe().find(std::string("kernels compiled for portable; this CPU runs ") +
                                 flashattn::cpu::isa_name(info.cpu) + "; UNOPTIMISED build"),
            std::string::npos)
      << info.describe();
}

TEST(BuildInfo, FirstCallSaysSoOnce) {
  const std::string err = stderr_of_first_call(nullptr);
  EXPECT_EQ(count(err, "flashattn: this program was compiled without optimisation"), 1u) << err;
  if (flashattn::cpu::cpu_best_isa() != Isa::Portable) {
    EXPECT_EQ(count(err, "flashattn: the kernels were compiled for portable, but this CPU runs"), 1u) << err;
  }
  EXPECT_EQ(count(err, "FLASHATTN_QUIET=1 silences this note"), count(err, "flashattn: ")) << err;
}

TEST(BuildInfo, QuietSilences) {
  EXPECT_EQ(stderr_of_first_call("1"), "");
  EXPECT_EQ(stderr_of_first_call("yes"), "");
  // "0" is not quiet.
  EXPECT_NE(stderr_of_first_call("0"), "");
}

TEST(BuildInfo, CpuDetectionAgreesWithTheCompiler) {
  // __builtin_cpu_supports asks CPUID as well (without the OS state check); a CPU we detect as running
  // a path must have the path's features.
  const Isa cpu = flashattn::cpu::cpu_best_isa();
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (int(cpu) >= int(Isa::Avx2)) {
    EXPECT_TRUE(__builtin_cpu_supports("avx2"));
    EXPECT_TRUE(__builtin_cpu_supports("fma"));
  }
  if (int(cpu) >= int(Isa::Avx512)) {
    EXPECT_TRUE(__builtin_cpu_supports("avx512f"));
    EXPECT_TRUE(__builtin_cpu_supports("avx512bw"));
  }
  if (!__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(cpu, Isa::Portable);
  }
#else
  EXPECT_EQ(cpu, Isa::Portable);
#endif
}

}  // namespace
