#pragma once
// bf16 pairs: the layout that the bf16 dot-product instruction (AVX512_BF16's vdpbf16ps: per fp32 lane,
// acc += a0·b0 + a1·b1 over a pair of bf16) and the AMX tile unit read, and the dot step of the register-
// blocked skeleton (microkernel.hpp) on it. Products of two bf16 are exact in fp32 and the sums are
// fp32: the accumulation is fp32, as for the other storage types.

#include <cstdint>
#include <cstring>

#include "flashattn/core/views.hpp"
#include "flashattn/cpu/microkernel.hpp"
#include "flashattn/cpu/simd.hpp"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)

namespace flashattn::cpu {

namespace detail {
template <class Bf16>
std::uint16_t bf16_bits(const Bf16* x) {
  static_assert(sizeof(Bf16) == 2, "bf16 storage is 16 bits");
  std::uint16_t bits;
  std::memcpy(&bits, x, sizeof bits);
  return bits;
}
// One pair of bf16 (32 bits) broadcast to every lane.
inline __m512bh broadcast_pair(const void* p) {
  std::uint32_t pair;
  std::memcpy(&pair, p, sizeof pair);
  return (__m512bh)_mm512_set1_epi32(int(pair));
}
inline __m512bh load_pairs(const void* p) { return (__m512bh)_mm512_loadu_si512(p); }

// The bf16 dot step of microkernel.hpp's skeleton: 16 lanes of bf16 pairs times a broadcast pair,
// accumulated in fp32 by vdpbf16ps (acc += a0·b0 + a1·b1 per lane).
struct Bf16DotStep {
  using Acc = float;
  using Reg = __m512;
  using Operand = __m512bh;
  using LaneElem = std::uint32_t;    // a pair of bf16
  using StreamElem = std::uint16_t;  // bf16 bits
  static constexpr int W = 16;
  static constexpr int kRows = 1;      // output rows per group
  static constexpr int kLaneRows = 1;  // pair rows of Qᵀ (or Pᵀ) per depth step
  static constexpr int kUnit = 2;      // streamed bf16 per depth step: one pair
  template <int NJ, int NI>
  using Accumulators = RegisterAccumulators<Bf16DotStep, NJ, NI>;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Operand load_lanes(const LaneElem* p) { return load_pairs(p); }
  static Operand broadcast(const StreamElem* p) { return broadcast_pair(p); }
  static Reg madd(Reg acc, Operand lanes, Operand b) { return _mm512_dpbf16_ps(acc, lanes, b); }
};
}  // namespace detail

// The pair layout of bf16 tiles, shared by the vdpbf16ps kernels (tile_ops_bf16.hpp) and the AMX ones
// (tile_ops_amx.hpp): pairs along the reduction dimension, as the transposed layout of tile_ops.hpp
// needs them. T is Eigen::bfloat16 (a template parameter, so that this header needs no Eigen).
template <class T, int Lanes>
struct Bf16Pairs {
  using Acc = float;
  static constexpr int W = 16;

  static int pairs(int n) { return (n + 1) / 2; }

  // qt (⌈d/2⌉, Lanes) pairs of Q[q0 : q0 + rows], zero pairs in padding rows and past an odd d.
  static void load_lanes(std::uint32_t* qt, const TensorView<const T>& q, index_t b, index_t h, index_t q0, int rows,
                         int d) {
    const int d2 = pairs(d);
    for (int i = 0; i < rows; ++i) {
      const T* row = q.row(b, q0 + i, h);
      for (int p = 0; p < d2; ++p) {
        const std::uint32_t lo = detail::bf16_bits(row + 2 * p * q.stride_dim);
        const std::uint32_t hi = 2 * p + 1 < d ? detail::bf16_bits(row + (2 * p + 1) * q.stride_dim) : 0u;
        qt[p * Lanes + i] = lo | (hi << 16);
      }
    }
    for (int p = 0; p < d2; ++p)
      for (int i = rows; i < Lanes; ++i) qt[p * Lanes + i] = 0u;
  }

  // A K row's (2p, 2p + 1) pairs lie side by side in memory: it can be read in place with 32-bit broadcasts.
  template <class Rows>
  static bool adjacent_pairs(const Rows& k, int d) { return k.dim_stride() == 1 && d % 2 == 0; }

  // permutex2var index that interleaves 16 bf16 of `a` (from `first`) with the same 16 of `b`
  // (index bit 5 selects b).
  static __m512i interleave_index(int first) {
    alignas(64) std::uint16_t idx[32];
    for (int k = 0; k < 32; ++k) idx[k] = std::uint16_t(first + k / 2 + (k % 2 ? 32 : 0));
    return _mm512_load_si512(idx);
  }
  // permutexvar index that interleaves the low and high 16 bf16 of one register: (x[k], x[16 + k]).
  static __m512i halves_interleave_index() {
    alignas(64) std::uint16_t idx[32];
    for (int k = 0; k < 32; ++k) idx[k] = std::uint16_t(k / 2 + (k % 2 ? 16 : 0));
    return _mm512_load_si512(idx);
  }

  // Rows 2q, 2q + 1 of fp32 P become pair row q (bf16, round to nearest even), into pp (⌈cols/2⌉, Lanes).
  // Pair row q is written after rows 2q and 2q + 1 (both >= q) have been read, so pp may be pt itself.
  static void pack_p_pairs(const Acc* pt, std::uint32_t* pp, int cols) {
    const __m512i idx = halves_interleave_index();
    for (int q = 0; q < pairs(cols); ++q) {
      for (int i = 0; i < Lanes; i += W) {
        const __m512 a = _mm512_loadu_ps(pt + 2 * q * Lanes + i);
        const __m512 b = 2 * q + 1 < cols ? _mm512_loadu_ps(pt + (2 * q + 1) * Lanes + i) : _mm512_setzero_ps();
        // cvtne2ps_pbh(b, a): a in the low 16 bf16, b in the high 16; then interleave them pairwise.
        const __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        _mm512_storeu_si512(pp + q * Lanes + i, _mm512_permutexvar_epi16(idx, ab));
      }
    }
  }
  // In place: pair row q over fp32 row q.
  static void pack_p_pairs(Acc* pt, int cols) { pack_p_pairs(pt, reinterpret_cast<std::uint32_t*>(pt), cols); }
};

}  // namespace flashattn::cpu

#endif
