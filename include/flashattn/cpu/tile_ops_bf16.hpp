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

#include "flashattn/cpu/bf16_pairs.hpp"
#include "flashattn/cpu/microkernel.hpp"
#include "flashattn/cpu/tile_ops.hpp"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)

namespace flashattn::cpu {


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
  using Blocked = RegisterBlocked<detail::Bf16DotStep, Lanes, NI, NJ>;
  using Pairs = Bf16Pairs<T, Lanes>;
  static int pairs(int n) { return Pairs::pairs(n); }

  struct StagedTile {
    const StagedElem* data;
    index_t ld;  // elements between rows: of K rows for K; of pair rows (in bf16 elements) for V
  };

  static std::size_t lane_elems(int d) { return std::size_t(pairs(d)) * Lanes; }
  // K: (Streamed, 2·⌈d/2⌉) bf16; V: (⌈Streamed/2⌉, d) pairs — the larger of the two.
  static std::size_t stage_elems(int d) {
    return std::max(std::size_t(Streamed) * 2 * pairs(d), std::size_t(2 * pairs(Streamed)) * d);
  }

  // qt (⌈d/2⌉, Lanes) pairs of Q[q0 : q0 + rows], zero pairs in padding rows and past an odd d.
  static void load_lanes(LaneElem* qt, Acc* /*row_buf*/, const TensorView<const T>& q, index_t b, index_t h, index_t q0,
                         int rows, int d) {
    Pairs::load_lanes(qt, q, b, h, q0, rows, d);
  }

  // K rows in place when their pairs are adjacent in memory (unit dim stride, even d) unless `copy`; else
  // staged.
  template <class Rows>
  static StagedTile stage_for_qk(StagedElem* stage, const Rows& k, index_t b, index_t h, index_t k0, int cols, int d,
                        bool copy = false) {
    const bool pairs_adjacent = Pairs::adjacent_pairs(k, d);
    if (pairs_adjacent && !copy && k.even_run(b, h, k0) >= cols)
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
  static bool keeps_qk_tiles(const Rows& k, int d) { return !(Pairs::adjacent_pairs(k, d) && k.row_stride() == d); }
  template <class Rows>
  static bool keeps_pv_tiles(const Rows& /*v*/, int /*d*/) { return true; }

  // V rows 2q and 2q + 1 interleaved into pair row q: (V[2q][c], V[2q+1][c]) for every c.
  template <class Rows>
  static StagedTile stage_for_pv(StagedElem* stage, const Rows& v, index_t b, index_t h, index_t k0, int cols, int d,
                        bool /*copy: V is always staged*/ = false) {
    const __m512i lo_idx = Pairs::interleave_index(0), hi_idx = Pairs::interleave_index(16);
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
    Blocked::template run<Start::kZero>(st, nullptr, qt, k.data, StreamWalk{k.ld, 2, k.ld}, cols, d2,
                                        [&](int j0, int j1, int, int) { next.issue(j0, j1); });
  }

  // ot (d, Lanes) = ot · diag(alpha) + Vᵀ·Pᵀ. pt (cols, Lanes) fp32 probabilities, packed to pairs in place.
  static void pv(Acc* ot, const Acc* alpha, Acc* pt, StagedTile v, int cols, int d, const PrefetchRows& next = {}) {
    next.issue(0, next.rows);  // the V staging already streamed this tile; the next K tile goes in one go
    Pairs::pack_p_pairs(pt, cols);
    const int width = HeadDim > 0 ? HeadDim : d;
    // A group is one head-dim column c: its pair (V[2q][c], V[2q+1][c]) for depth step q lies at 2c + q·ld.
    Blocked::template run<Start::kScale>(ot, alpha, reinterpret_cast<const LaneElem*>(pt), v.data,
                                         StreamWalk{2, v.ld, v.ld}, width, pairs(cols));
  }

};

}  // namespace flashattn::cpu

#endif
