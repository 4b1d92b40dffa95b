#pragma once
// The bf16 dot-product steps of the decode kernel (decode_kernel.hpp), for bf16 queries with bf16 K/V on
// CPUs with AVX512_BF16. vdpbf16ps multiplies 32 bf16 pairs per instruction, twice an fp32 FMA's work, and
// reads bf16 as it is stored: the widening (two instructions per 16 elements) that the fp32 path spends on
// every K/V element goes away with it. That arithmetic is what a decoding step does besides reading K and
// V, so it is what keeps the read from running at memory speed (docs/inference.md).
//
//   qk: a K row and a staged Q row are both (c, c+1) pairs in memory order, so one 512-bit load of each
//       feeds vdpbf16ps directly, and the lanes are summed at the end as in the fp32 path.
//   pv: lane c needs (V[j][c], V[j+1][c]); unpacking two V rows 16 bits at a time gives those pairs in
//       one instruction per 32 columns, with the columns in unpack order (column_of below), not memory
//       order. The output rows stay in that order until the program ends. P is rounded to bf16 pairs, as
//       the bf16 prefill kernels do (bf16_pairs.hpp's pack_p_pairs).
//
// Products of two bf16 are exact in fp32 and every sum is fp32. vdpbf16ps treats subnormal inputs as zero
// and flushes subnormal results, as in the bf16 prefill kernels.

#include <cstdint>

#include "flashattn/cpu/bf16_pairs.hpp"

namespace flashattn::cpu::detail {

// Declared everywhere, defined where AVX512_BF16 is compiled in: the decode kernel names it only in
// branches that exist for bf16 on those builds.
template <class T>
struct DecodeBf16Dot;

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)

template <class T>
struct DecodeBf16Dot {
  using Reg = __m512;
  using Operand = __m512bh;
  using QElem = std::uint16_t;  // Q staged as bf16 bits

  template <class E>
  static Operand load_k(const E* p) {
    return load_pairs(p);
  }
  static Operand load_q(const QElem* p) { return load_pairs(p); }
  static Reg madd(Reg acc, Operand q, Operand k) { return _mm512_dpbf16_ps(acc, q, k); }

  template <class E>
  static std::uint16_t bits(const E* x) {
    return bf16_bits(x);
  }
  // Pᵀ (cols, 16) fp32 into (⌈cols/2⌉, 16) pairs.
  static void pack_p(const float* pt, std::uint32_t* pp, int cols) { Bf16Pairs<T, 16>::pack_p_pairs(pt, pp, cols); }

  // Rows a and b of V, 32 columns each, as pairs (a[c], b[c]): lo holds the columns column_of(0, lane),
  // hi those of column_of(1, lane).
  static void interleave(const void* a, const void* b, Operand& lo, Operand& hi) {
    const __m512i x = _mm512_loadu_si512(a), y = _mm512_loadu_si512(b);
    lo = (Operand)_mm512_unpacklo_epi16(x, y);
    hi = (Operand)_mm512_unpackhi_epi16(x, y);
  }
  static Operand broadcast(std::uint32_t pair) { return (Operand)_mm512_set1_epi32(int(pair)); }
  // The column (of 32) that lane `lane` of interleave's lo (half 0) or hi (half 1) holds: unpacking works
  // within 128-bit blocks of 8 columns, the low 4 into lo and the high 4 into hi.
  static constexpr int column_of(int half, int lane) { return lane / 4 * 8 + half * 4 + lane % 4; }
};

#endif

}  // namespace flashattn::cpu::detail
