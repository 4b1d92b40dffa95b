#pragma once
// What the running CPU and operating system offer, asked once per process (CPUID and XGETBV on x86-64;
// Portable elsewhere). The kernels are chosen at compile time (isa.hpp); this says what the machine could
// run, so that a build below it can say so (build_info.hpp).

#include "flashattn/cpu/amx.hpp"
#include "flashattn/cpu/isa.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define FLASHATTN_HAS_CPUID 1
#else
#define FLASHATTN_HAS_CPUID 0
#endif

namespace flashattn::cpu {

namespace detail {
#if FLASHATTN_HAS_CPUID
// XCR0: which register states the OS saves on a context switch (a feature is usable only with its state).
inline unsigned long long xcr0() {
  unsigned eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

inline Isa detect_best_isa() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return Isa::Portable;
  const bool osxsave = (ecx >> 27) & 1u, fma = (ecx >> 12) & 1u;
  if (!osxsave) return Isa::Portable;
  const unsigned long long xcr = xcr0();
  const bool ymm_state = (xcr & 0x6) == 0x6, zmm_state = (xcr & 0xE6) == 0xE6;  // SSE+AVX, + opmask/ZMM
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return Isa::Portable;
  const bool avx2 = (ebx >> 5) & 1u;
  const bool avx512 = ((ebx >> 16) & 1u) && ((ebx >> 17) & 1u) && ((ebx >> 30) & 1u) && ((ebx >> 31) & 1u);
  unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
  const bool bf16 = __get_cpuid_count(7, 1, &eax1, &ebx1, &ecx1, &edx1) && ((eax1 >> 5) & 1u);
  if (avx512 && zmm_state) {
    if (!bf16) return Isa::Avx512;
    return amx::usable() ? Isa::Amx : Isa::Avx512Bf16;
  }
  return avx2 && fma && ymm_state ? Isa::Avx2 : Isa::Portable;
}
#else
inline Isa detect_best_isa() { return Isa::Portable; }
#endif
}  // namespace detail

// The best instruction set this CPU and OS run, of those flashattn has kernels for (AMX: with the OS's
// permission for the tile state, which this asks for; see amx.hpp).
inline Isa cpu_best_isa() {
  static const Isa best = detail::detect_best_isa();
  return best;
}

}  // namespace flashattn::cpu
