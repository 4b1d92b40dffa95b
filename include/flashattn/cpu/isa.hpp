#pragma once
// Which SIMD instruction set a CPU kernel is compiled for. The kernels are written once against the
// packet interface in simd.hpp; an Isa names the packet implementation. A path is usable when the
// translation unit is compiled for it (e.g. -mavx512f or -march=native) and the CPU runs it.

namespace flashattn::cpu {

// Avx512Bf16 is Avx512 plus the bf16 dot-product instruction (vdpbf16ps), which the bf16 kernels use to
// multiply bf16 tiles without converting them; for every other storage type it behaves as Avx512.
// Amx is Avx512Bf16 plus Intel's AMX tile unit (TDPBF16PS: a 16 × 16 fp32 tile += 16 × 32 bf16 times
// 32 × 16 bf16 in one instruction) for the bf16 tile GEMMs (tile_ops_amx.hpp); for every other storage
// type it behaves as Avx512. AMX also needs the operating system's permission, so it is never kBestIsa:
// the forward dispatch picks it at run time (forward_dispatch.hpp, amx::usable()).
enum class Isa { Portable, Avx2, Avx512, Avx512Bf16, Amx };

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

// AMX-TILE and AMX-BF16 enabled for this translation unit (GCC spells the macros __AMX_TILE__, Clang
// __AMXTILE__).
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && (defined(__AMX_BF16__) || defined(__AMXBF16__))
#define FLASHATTN_AMX_INSTRUCTIONS 1
#else
#define FLASHATTN_AMX_INSTRUCTIONS 0
#endif

// FLASHATTN_AMX_EMULATE runs the AMX kernels on a scalar model of the tile unit (amx.hpp): slow, for
// testing their data layouts on CPUs without AMX (tests/test_forward_amx.cpp).
inline constexpr bool kHasAmx =
#if FLASHATTN_AMX_INSTRUCTIONS || defined(FLASHATTN_AMX_EMULATE)
    kHasAvx512Bf16;
#else
    false;
#endif

inline constexpr Isa kBestIsa = kHasAvx512Bf16 ? Isa::Avx512Bf16
                                : kHasAvx512   ? Isa::Avx512
                                : kHasAvx2     ? Isa::Avx2
                                               : Isa::Portable;

constexpr bool is_compiled(Isa isa) {
  return isa == Isa::Portable || (isa == Isa::Avx2 && kHasAvx2) || (isa == Isa::Avx512 && kHasAvx512) ||
         (isa == Isa::Avx512Bf16 && kHasAvx512Bf16) || (isa == Isa::Amx && kHasAmx);
}

constexpr bool is_avx512(Isa isa) { return isa == Isa::Avx512 || isa == Isa::Avx512Bf16 || isa == Isa::Amx; }

constexpr const char* isa_name(Isa isa) {
  return isa == Isa::Amx          ? "amx"
         : isa == Isa::Avx512Bf16 ? "avx512bf16"
         : isa == Isa::Avx512   ? "avx512"
         : isa == Isa::Avx2     ? "avx2"
                                : "portable";
}

}  // namespace flashattn::cpu
