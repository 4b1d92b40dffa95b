#pragma once
// The AMX tile unit as the bf16 kernels use it (tile_ops_amx.hpp): eight tile registers, every one
// configured as 16 rows × 64 bytes, which is a 16 × 32 bf16 operand, a 16 × 16 (pairs) operand or a
// 16 × 16 fp32 accumulator; loads and stores with any row stride; and TDPBF16PS,
//   C[m][n] += Σ_k A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1]   (k < 16, fp32 accumulation).
//
// Three things the SIMD paths do not need:
//  - Permission: Linux enables AMX state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM), asked
//    once by usable(); a CPU without AMX or a kernel that refuses makes usable() false, and the dispatch
//    then keeps the AVX512-BF16 kernels.
//  - A tile configuration per thread (LDTILECFG), held by a TileSession for as long as a worker runs
//    programs of one call, and released (TILERELEASE) after it, so that the thread does not carry 8 KiB
//    of live tile state through context switches. A tile configuration of the caller's own on the
//    calling thread does not survive a bf16 call (code that uses AMX, oneDNN's for one, loads its
//    configuration before each kernel).
//  - Tile register numbers are instruction immediates, hence the template parameters.
//
// FLASHATTN_AMX_EMULATE replaces the instructions by a scalar model of the same register file, so that
// the kernels' data layouts are tested on every CPU with AVX512-BF16 (tests/test_forward_amx.cpp). Like
// every FLASHATTN_* switch, define it for a whole program or not at all: the functions keep their names.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "flashattn/cpu/isa.hpp"

#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace flashattn::cpu::amx {

inline constexpr int kRows = 16;       // rows of every tile
inline constexpr int kRowBytes = 64;   // bytes per tile row: 32 bf16, 16 bf16 pairs or 16 fp32
inline constexpr int kDepth = 32;      // bf16 elements of the reduction per TDPBF16PS

// Whether this process may execute AMX bf16 instructions: the CPU has AMX-TILE and AMX-BF16 and the
// operating system granted the tile state. Asked once per process (the grant is process-wide).
inline bool usable() {
  static const bool ok = [] {
#if defined(FLASHATTN_AMX_EMULATE)
    return true;
#elif defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // <asm/prctl.h>, Linux >= 5.16
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

#if defined(FLASHATTN_AMX_EMULATE)

namespace detail {
struct RegisterFile {
  alignas(64) unsigned char tile[8][kRows][kRowBytes];
};
inline RegisterFile& registers() {
  thread_local RegisterFile r;
  return r;
}
inline float bf16_to_float(const unsigned char* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  const std::uint32_t bits = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace detail

template <int t>
inline void load(const void* src, std::size_t stride) {
  for (int r = 0; r < kRows; ++r)
    std::memcpy(detail::registers().tile[t][r], static_cast<const unsigned char*>(src) + r * stride, kRowBytes);
}
template <int t>
inline void store(void* dst, std::size_t stride) {
  for (int r = 0; r < kRows; ++r)
    std::memcpy(static_cast<unsigned char*>(dst) + r * stride, detail::registers().tile[t][r], kRowBytes);
}
template <int t>
inline void zero() {
  std::memset(detail::registers().tile[t], 0, sizeof detail::registers().tile[t]);
}
template <int c, int a, int b>
inline void dp_bf16() {
  auto& reg = detail::registers();
  for (int m = 0; m < kRows; ++m) {
    for (int n = 0; n < 16; ++n) {
      float acc;
      std::memcpy(&acc, &reg.tile[c][m][4 * n], 4);
      for (int k = 0; k < 16; ++k) {
        acc += detail::bf16_to_float(&reg.tile[a][m][4 * k]) * detail::bf16_to_float(&reg.tile[b][k][4 * n]) +
               detail::bf16_to_float(&reg.tile[a][m][4 * k + 2]) * detail::bf16_to_float(&reg.tile[b][k][4 * n + 2]);
      }
      std::memcpy(&reg.tile[c][m][4 * n], &acc, 4);
    }
  }
}
inline void configure() {}
inline void release() {}

#elif FLASHATTN_AMX_INSTRUCTIONS

// Inline assembly rather than the _tile_* intrinsics: GCC defines those as macros that paste their
// argument's spelling into the register name, which a template parameter cannot be. "%c" prints the
// immediate without its '$'; the memory clobbers order the tile loads and stores with ordinary ones.
// Each string is "{AT&T|Intel}": the compiler emits the half of the assembler dialect it was told to use
// (-masm=intel picks the second), so the header builds in programs compiled either way.
template <int t>
inline void load(const void* src, std::size_t stride) {
  __asm__ volatile("tileloadd {(%0,%1,1), %%tmm%c2|tmm%c2, [%0+%1*1]}" ::"r"(src), "r"(static_cast<long>(stride)), "i"(t) : "memory");
}
template <int t>
inline void store(void* dst, std::size_t stride) {
  __asm__ volatile("tilestored {%%tmm%c2, (%0,%1,1)|[%0+%1*1], tmm%c2}" ::"r"(dst), "r"(static_cast<long>(stride)), "i"(t) : "memory");
}
template <int t>
inline void zero() {
  __asm__ volatile("tilezero {%%tmm%c0|tmm%c0}" ::"i"(t));
}
template <int c, int a, int b>
inline void dp_bf16() {
  __asm__ volatile("tdpbf16ps {%%tmm%c2, %%tmm%c1, %%tmm%c0|tmm%c0, tmm%c1, tmm%c2}" ::"i"(c), "i"(a), "i"(b));
}

// Palette 1, tiles 0–7 each kRows × kRowBytes (the layout of LDTILECFG's 64-byte operand).
inline void configure() {
  struct alignas(64) Config {
    std::uint8_t palette, start_row, reserved[14];
    std::uint16_t colsb[16];
    std::uint8_t rows[16];
  } cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = kRowBytes;
    cfg.rows[t] = kRows;
  }
  // Not _tile_loadconfig: GCC 13's prints its memory operand with a size the Intel-syntax assembler
  // rejects ("operand size mismatch for `ldtilecfg'"); an address in a register has no size.
  __asm__ volatile("ldtilecfg {(%0)|[%0]}" ::"r"(&cfg) : "memory");
}
inline void release() { __asm__ volatile("tilerelease" ::: "memory"); }

#endif

#if defined(FLASHATTN_AMX_EMULATE) || FLASHATTN_AMX_INSTRUCTIONS
// The tile configuration of the current thread while it runs the AMX kernels of one call.
class TileSession {
 public:
  TileSession() { configure(); }
  ~TileSession() { release(); }
  TileSession(const TileSession&) = delete;
  TileSession& operator=(const TileSession&) = delete;
};
#endif

}  // namespace flashattn::cpu::amx
