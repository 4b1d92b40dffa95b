#pragma once
// Which SIMD instruction set a CPU kernel is compiled for. The kernels are written once against the
// packet interface in simd.hpp; an Isa names the packet implementation. A path is usable when the
// translation unit is compiled for it (e.g. -mavx512f or -march=native) and the CPU runs it.

namespace flashattn::cpu {

// Avx512Bf16 is Avx512 plus the bf16 dot-product instruction (vdpbf16ps), which the bf16 kernels use to
// multiply bf16 tiles without converting them; for every other storage type it behaves as Avx512.
enum class Isa { Portable, Avx2, Avx512, Avx512Bf16 };

// Paths compiled into this translation unit.
inline constexpr bool kHasAvx2 =
#if defined(__AVX2__) && defined(__FMA__)
    true;
#else
    false;
#endif
inline constexpr bool kHasAvx512 =
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
    true;
#else
    false;
#endif

inline constexpr bool kHasAvx512Bf16 =
#if defined(__AVX512BF16__)
    kHasAvx512;
#else
    false;
#endif

inline constexpr Isa kBestIsa = kHasAvx512Bf16 ? Isa::Avx512Bf16
                                : kHasAvx512   ? Isa::Avx512
                                : kHasAvx2     ? Isa::Avx2
                                               : Isa::Portable;

constexpr bool is_compiled(Isa isa) {
  return isa == Isa::Portable || (isa == Isa::Avx2 && kHasAvx2) || (isa == Isa::Avx512 && kHasAvx512) ||
         (isa == Isa::Avx512Bf16 && kHasAvx512Bf16);
}

constexpr bool is_avx512(Isa isa) { return isa == Isa::Avx512 || isa == Isa::Avx512Bf16; }

constexpr const char* isa_name(Isa isa) {
  return isa == Isa::Avx512Bf16 ? "avx512bf16"
         : isa == Isa::Avx512   ? "avx512"
         : isa == Isa::Avx2     ? "avx2"
                                : "portable";
}

}  // namespace flashattn::cpu
