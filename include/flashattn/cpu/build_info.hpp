#pragma once
// What this program's build of the CPU kernels is, next to what the machine offers, and a note on
// stderr, once per process at the first call, when the build leaves most of the speed unused:
//   - a translation unit that includes flashattn was compiled without optimisation (no -O1/-O2/-O3):
//     the kernels' packet code is then 100–300× slower;
//   - the kernels were compiled for a lower instruction set than the CPU runs (no -march=native or
//     -mavx2 -mfma / -mavx512f ...): the portable path is 10–13× slower than AVX-512.
// Silenced by the environment variable FLASHATTN_QUIET (any value but "0"), or for one translation unit
// by defining FLASHATTN_NO_BUILD_NOTICE before including flashattn.
//
// Every translation unit that includes this header records its own flags in a process-wide record at
// static initialisation (an object with internal linkage per unit), so that the answer is the whole
// program's, whichever unit's copy of an inline function the linker kept.

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "flashattn/cpu/cpu_features.hpp"
#include "flashattn/cpu/isa.hpp"

namespace flashattn::cpu {

struct BuildInfo {
  // The lowest of the best instruction sets the program's translation units compiled kernels for (Amx
  // where the AMX instructions were enabled too); Portable when no unit registered.
  Isa compiled = Isa::Portable;
  // The best one this CPU and OS run (cpu_features.hpp).
  Isa cpu = Isa::Portable;
  // Whether every unit was compiled with optimisation.
  bool optimised = true;

  // One line, e.g. "kernels compiled for avx2; this CPU runs avx512bf16; optimised build".
  std::string describe() const {
    std::string s = "kernels compiled for ";
    s += isa_name(compiled);
    s += "; this CPU runs ";
    s += isa_name(cpu);
    s += optimised ? "; optimised build" : "; UNOPTIMISED build";
    return s;
  }
};

namespace detail {
struct BuildRecord {
  std::atomic<bool> any_unit{false};
  std::atomic<bool> unoptimised{false};
  std::atomic<int> lowest_isa{int(Isa::Amx)};
  std::atomic<bool> announced{false};
};
inline BuildRecord& build_record() {
  static BuildRecord record;
  return record;
}

inline void record_translation_unit(bool optimised, Isa compiled) {
  BuildRecord& r = build_record();
  r.any_unit.store(true);
  if (!optimised) r.unoptimised.store(true);
  int lowest = r.lowest_isa.load();
  while (int(compiled) < lowest && !r.lowest_isa.compare_exchange_weak(lowest, int(compiled))) {
  }
}

inline bool build_notice_silenced() {
  const char* quiet = std::getenv("FLASHATTN_QUIET");
  return quiet != nullptr && quiet[0] != '\0' && !(quiet[0] == '0' && quiet[1] == '\0');
}
}  // namespace detail

// This program's build (every unit that included flashattn) and this machine.
inline BuildInfo build_info() {
  const detail::BuildRecord& r = detail::build_record();
  BuildInfo info;
  info.compiled = r.any_unit.load() ? Isa(r.lowest_isa.load()) : Isa::Portable;
  info.cpu = cpu_best_isa();
  info.optimised = !r.unoptimised.load();
  return info;
}

namespace detail {
// The note described at the top, at most once per process; called where every CPU call starts
// (parallel.hpp's run_workers).
inline void announce_build_once() {
  BuildRecord& r = build_record();
  if (r.announced.load(std::memory_order_relaxed) || r.announced.exchange(true)) return;
  if (build_notice_silenced()) return;
  const BuildInfo info = build_info();
  if (!info.optimised)
    std::fprintf(stderr,
                 "flashattn: this program was compiled without optimisation, so attention runs 100-300x "
                 "slower than it can: build with -O2 (CMake: -DCMAKE_BUILD_TYPE=Release). "
                 "FLASHATTN_QUIET=1 silences this note.\n");
  if (r.any_unit.load() && int(info.compiled) < int(info.cpu))
    std::fprintf(stderr,
                 "flashattn: the kernels were compiled for %s, but this CPU runs %s, several times faster: "
                 "compile with -march=native (or the -m flags of the CPUs you target). "
                 "FLASHATTN_QUIET=1 silences this note.\n",
                 isa_name(info.compiled), isa_name(info.cpu));
}
}  // namespace detail

}  // namespace flashattn::cpu

#if !defined(FLASHATTN_NO_BUILD_NOTICE)
namespace flashattn::cpu::detail {
namespace {
// This translation unit's flags, recorded before main (see the top).
struct RecordThisTranslationUnit {
  RecordThisTranslationUnit() noexcept {
#if defined(__OPTIMIZE__)
    constexpr bool optimised = true;
#else
    constexpr bool optimised = false;
#endif
    record_translation_unit(optimised, kHasAmx ? Isa::Amx : kBestIsa);
  }
};
RecordThisTranslationUnit record_this_translation_unit;
}  // namespace
}  // namespace flashattn::cpu::detail
#endif
