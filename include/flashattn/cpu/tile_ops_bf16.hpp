#pragma once
// bf16 tiles multiplied by the CPU's bf16 dot-product instruction (AVX512_BF16's vdpbf16ps: per fp32 lane,
// acc += a0·b0 + a1·b1 over a pair of bf16), so bf16 data is never widened before the multiply and each
// instruction does twice the work of an fp32 FMA. Products of two bf16 are exact in fp32 and the sums
// are fp32: the accumulation is fp32, as for the other storage types.
//
// The transposed layout of tile_ops.hpp carries over with pairs along the reduction dimension:
//   qk: Qᵀ is staged as (d/2, Lanes) pairs (Q[i][2p], Q[i][2p+1]); a K row already holds its pairs
//       (K[j][2p], K[j][2p+1]) side by side, so K is read in place with 32-bit broadcasts.
//   pv: P (fp32 from the softmax) is packed into (cols/2, Lanes) pairs (P[2q][i], P[2q+1][i]) in place,
//       and a V tile is staged as (cols/2, d) pairs (V[2q][c], V[2q+1][c]).
// Odd head dims and odd tile widths are padded with zero pairs.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "flashattn/cpu/microkernel.hpp"
#include "flashattn/cpu/tile_ops.hpp"

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
  static constexpr int kUnit = 2;    // one pair
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Operand load_lanes(const LaneElem* p) { return load_pairs(p); }
  static Operand broadcast(const StreamElem* p) { return broadcast_pair(p); }
  static Reg madd(Reg acc, Operand lanes, Operand b) { return _mm512_dpbf16_ps(acc, lanes, b); }
};
}  // namespace detail

// T is Eigen::bfloat16 (kept a template parameter so that this header needs no Eigen).
template <class T, int Lanes, int Streamed, int HeadDim>
struct TileOps<T, Lanes, Streamed, HeadDim, Isa::Avx512Bf16, std::enable_if_t<is_bf16<T>>> {
  using Acc = float;
  using LaneElem = std::uint32_t;   // a pair of bf16
  using StagedElem = std::uint16_t;  // bf16 bits

  static constexpr int W = 16;
  static constexpr int kQueryPackets = Lanes / W;
  static_assert(Lanes % W == 0, "Lanes must be a multiple of 16 for the bf16 kernels");
  static constexpr int NI = kQueryPackets % 2 == 0 ? 2 : 1;
  static constexpr int NJ = 16 / NI;
  static constexpr int NC = NJ;
  using Blocked = RegisterBlocked<detail::Bf16DotStep, Lanes, NI>;

  struct StagedTile {
    const StagedElem* data;
    index_t ld;  // elements between rows: of K rows for K; of pair rows (in bf16 elements) for V
  };

  static int pairs(int n) { return (n + 1) / 2; }
  static std::size_t lane_elems(int d) { return std::size_t(pairs(d)) * Lanes; }
  // K: (Streamed, 2·⌈d/2⌉) bf16; V: (⌈Streamed/2⌉, d) pairs — the larger of the two.
  static std::size_t stage_elems(int d) {
    return std::max(std::size_t(Streamed) * 2 * pairs(d), std::size_t(2 * pairs(Streamed)) * d);
  }

  // qt (⌈d/2⌉, Lanes) pairs of Q[q0 : q0 + rows], zero pairs in padding rows and past an odd d.
  static void load_lanes(LaneElem* qt, Acc* /*row_buf*/, const TensorView<const T>& q, index_t b, index_t h, index_t q0,
                     int rows, int d) {
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

  // K rows in place when their pairs are adjacent in memory (unit dim stride, even d) unless `copy`; else
  // staged.
  template <class Rows>
  static StagedTile stage_for_qk(StagedElem* stage, const Rows& k, index_t b, index_t h, index_t k0, int cols, int d,
                        bool copy = false) {
    const bool pairs_adjacent = adjacent_pairs(k, d);
    if (pairs_adjacent && !copy && k.even_rows(b, h, k0, cols))
      return {reinterpret_cast<const StagedElem*>(k.row(b, h, k0)), k.row_stride()};
    const int width = 2 * pairs(d);
    for (int j = 0; j < cols; ++j) {
      const T* row = k.row(b, h, k0 + j);
      if (pairs_adjacent) {
        std::memcpy(stage + std::size_t(j) * width, row, sizeof(StagedElem) * std::size_t(d));
        continue;
      }
      for (int c = 0; c < width; ++c) stage[j * width + c] = c < d ? detail::bf16_bits(row + c * k.dim_stride()) : 0;
    }
    return {stage, width};
  }

  // Whether staged tiles are worth keeping for a head's later query blocks (staged_tile_cache.hpp): K when it
  // is staged or its rows in place are not contiguous; V always (it is always interleaved).
  template <class Rows>
  static bool keeps_qk_tiles(const Rows& k, int d) { return !(adjacent_pairs(k, d) && k.row_stride() == d); }
  template <class Rows>
  static bool keeps_pv_tiles(const Rows& /*v*/, int /*d*/) { return true; }

  // V rows 2q and 2q + 1 interleaved into pair row q: (V[2q][c], V[2q+1][c]) for every c.
  template <class Rows>
  static StagedTile stage_for_pv(StagedElem* stage, const Rows& v, index_t b, index_t h, index_t k0, int cols, int d,
                        bool /*copy: V is always staged*/ = false) {
    const __m512i lo_idx = interleave_index(0), hi_idx = interleave_index(16);
    const index_t dim_stride = v.dim_stride();
    for (int q = 0; q < pairs(cols); ++q) {
      const T* r0 = v.row(b, h, k0 + 2 * q);
      const T* r1 = 2 * q + 1 < cols ? v.row(b, h, k0 + 2 * q + 1) : nullptr;
      StagedElem* out = stage + std::size_t(q) * 2 * d;
      int c = 0;
      if (dim_stride == 1) {
        for (; c + 32 <= d; c += 32) {
          const __m512i a = _mm512_loadu_si512(r0 + c);
          const __m512i z = r1 ? _mm512_loadu_si512(r1 + c) : _mm512_setzero_si512();
          _mm512_storeu_si512(out + 2 * c, _mm512_permutex2var_epi16(a, lo_idx, z));
          _mm512_storeu_si512(out + 2 * c + 32, _mm512_permutex2var_epi16(a, hi_idx, z));
        }
      }
      for (; c < d; ++c) {
        out[2 * c] = detail::bf16_bits(r0 + c * dim_stride);
        out[2 * c + 1] = r1 ? detail::bf16_bits(r1 + c * dim_stride) : 0;
      }
    }
    return {stage, 2 * index_t(d)};
  }

  // st (cols, Lanes) = raw scores K·Qᵀ.
  static void qk(Acc* st, const LaneElem* qt, StagedTile k, int cols, int d, const PrefetchRows& next = {}) {
    const int d2 = HeadDim > 0 ? (HeadDim + 1) / 2 : pairs(d);
    int j = 0;
    for (; j + NJ <= cols; j += NJ, st += NJ * Lanes, k.data += NJ * k.ld) {
      next.issue(j, j + NJ);
      Blocked::template qk_block<NJ>(st, qt, k.data, k.ld, d2);
    }
    for (; j < cols; ++j, st += Lanes, k.data += k.ld) Blocked::template qk_block<1>(st, qt, k.data, k.ld, d2);
  }

  // ot (d, Lanes) = ot · diag(alpha) + Vᵀ·Pᵀ. pt (cols, Lanes) fp32 probabilities, packed to pairs in place.
  static void pv(Acc* ot, const Acc* alpha, Acc* pt, StagedTile v, int cols, int d, const PrefetchRows& next = {}) {
    next.issue(0, next.rows);  // the V staging already streamed this tile; the next K tile goes in one go
    pack_p_pairs(pt, cols);
    const LaneElem* p2 = reinterpret_cast<const LaneElem*>(pt);
    const int width = HeadDim > 0 ? HeadDim : d;
    const int cols2 = pairs(cols);
    int c = 0;
    const StagedElem* v_col = v.data;  // pair column c of the staged V
    for (; c + NC <= width; c += NC, ot += NC * Lanes, v_col += 2 * NC)
      Blocked::template pv_block<NC>(ot, alpha, p2, v_col, v.ld, cols2);
    for (; c < width; ++c, ot += Lanes, v_col += 2) Blocked::template pv_block<1>(ot, alpha, p2, v_col, v.ld, cols2);
  }

 protected:  // the AMX kernels (tile_ops_amx.hpp) share the pair layouts
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

  // Rows 2q, 2q + 1 of fp32 P become pair row q (bf16, round to nearest even). Row q is written after rows
  // 2q and 2q + 1 (both >= q) have been read, so packing in place is safe.
  static void pack_p_pairs(Acc* pt, int cols) {
    const __m512i idx = halves_interleave_index();
    for (int q = 0; q < pairs(cols); ++q) {
      for (int i = 0; i < Lanes; i += W) {
        const __m512 a = _mm512_loadu_ps(pt + 2 * q * Lanes + i);
        const __m512 b = 2 * q + 1 < cols ? _mm512_loadu_ps(pt + (2 * q + 1) * Lanes + i) : _mm512_setzero_ps();
        // cvtne2ps_pbh(b, a): a in the low 16 bf16, b in the high 16; then interleave them pairwise.
        const __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        _mm512_storeu_si512(pt + q * Lanes + i, _mm512_permutexvar_epi16(idx, ab));
      }
    }
  }

};

}  // namespace flashattn::cpu

#endif
