#pragma once
// bf16 tiles multiplied by the AMX tile unit (amx.hpp). On a CPU with AMX (Sapphire Rapids and later
// Xeons) one TDPBF16PS does 16·16·32 multiply-adds, where vdpbf16ps does 16·2, and on those cores
// vdpbf16ps has no more throughput than an fp32 FMA, so bf16 gains nothing over fp32 without the tile
// unit (docs/performance.md). Accumulation stays fp32.
//
// The transposed layout of tile_ops.hpp carries over unchanged, so the softmax and everything around
// the two GEMMs is the AVX-512 code; the tile unit only needs its operands as tiles of 16 rows × 64 bytes:
//   qk: Sᵀ (cols, Lanes) = K (cols, d) · Qᵀ. A = 16 K rows × 32 bf16 of d, read in place when the rows
//       allow it; B = 16 pair rows of Qᵀ (the AVX512-BF16 pair layout) × 16 queries; C = 16 × 16 of Sᵀ.
//   pv: Oᵀ (d, Lanes) += Vᵀ (d, cols) · Pᵀ. A = 16 rows of Vᵀ (V staged transposed, once per head
//       thanks to staged_tile_cache.hpp) × 32 keys; B = 16 pair rows of P (packed in place, as for
//       AVX512-BF16) × 16 queries; C = 16 × 16 of Oᵀ, loaded, accumulated and stored back.
// The reduction dimension is padded with zeros to a multiple of 32 (Qᵀ pair rows, staged K columns, Vᵀ
// and P keys), key rows of K to a multiple of 16; Oᵀ rows past an odd head dim go through a small buffer.
// The loops are microkernel.hpp's skeleton with the AMX step below: a group is 16 rows of the output (one
// C tile high), a depth step one TDPBF16PS (32 bf16 of the reduction), and a block 2 × 2 C tiles (4
// accumulators, 2 A and 2 B tiles: all 8 registers).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "flashattn/cpu/amx.hpp"
#include "flashattn/cpu/bf16_pairs.hpp"
#include "flashattn/cpu/microkernel.hpp"
#include "flashattn/cpu/tile_ops.hpp"
#include "flashattn/cpu/transpose.hpp"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && (FLASHATTN_AMX_INSTRUCTIONS || defined(FLASHATTN_AMX_EMULATE))

namespace flashattn::cpu {

namespace detail {
// The AMX step of microkernel.hpp's skeleton. A is 16 rows of the streamed operand × 32 bf16 of the
// reduction, B 16 pair rows of the packet operand × 16 lanes, C 16 × 16 fp32. Tile registers: C tile
// (jj, ii) of a block in jj·NI + ii (0–3), the A tile of group jj in 4 + jj, the B tile of packet ii in
// 6 + ii; a block is at most 2 × 2.
struct AmxStep {
  using Acc = float;
  using LaneElem = std::uint32_t;    // a pair of bf16
  using StreamElem = std::uint16_t;  // bf16 bits
  static constexpr int W = amx::kRows;           // lanes per C tile
  static constexpr int kRows = amx::kRows;       // output rows per group: one C tile high
  static constexpr int kLaneRows = amx::kRows;   // pair rows of B per depth step
  static constexpr int kUnit = amx::kDepth;      // streamed bf16 per depth step

  template <int NJ, int NI>
  struct Accumulators {
    static_assert(NJ >= 1 && NJ <= 2 && NI >= 1 && NI <= 2, "a block uses at most 4 C, 2 A and 2 B tiles");

    void zero() {
      for_tiles([](auto jj, auto ii) { amx::zero<c_tile(decltype(jj)::value, decltype(ii)::value)>(); });
    }
    void load(const Acc* out, index_t ld) {
      for_tiles([&](auto jj, auto ii) { amx::load<c_tile(decltype(jj)::value, decltype(ii)::value)>(c_address(out, ld, jj, ii), bytes(ld)); });
    }
    void store(Acc* out, index_t ld) const {
      for_tiles([&](auto jj, auto ii) { amx::store<c_tile(decltype(jj)::value, decltype(ii)::value)>(c_address(out, ld, jj, ii), bytes(ld)); });
    }
    void madd(const LaneElem* lanes, index_t lanes_ld, const StreamElem* stream, StreamWalk walk) {
      amx::load<4>(stream, walk.ld * sizeof(StreamElem));
      if constexpr (NJ > 1) amx::load<5>(stream + walk.group, walk.ld * sizeof(StreamElem));
      amx::load<6>(lanes, bytes(lanes_ld));
      if constexpr (NI > 1) amx::load<7>(lanes + W, bytes(lanes_ld));
      for_tiles([](auto jj, auto ii) { constexpr int j = decltype(jj)::value, i = decltype(ii)::value;
        amx::dp_bf16<c_tile(j, i), 4 + j, 6 + i>();; });
    }

   private:
    static constexpr int c_tile(int jj, int ii) { return jj * NI + ii; }
    static std::size_t bytes(index_t ld) { return std::size_t(ld) * sizeof(Acc); }
    template <class P>
    static P* c_address(P* out, index_t ld, int jj, int ii) { return out + jj * kRows * ld + ii * W; }
    // f(jj, ii) for every C tile, with jj and ii as std::integral_constant (register numbers are immediates).
    template <class F>
    static void for_tiles(F&& f) { each(f, std::make_index_sequence<NJ * NI>{}); }
    template <class F, std::size_t... t>
    static void each(F& f, std::index_sequence<t...>) {
      (f(std::integral_constant<int, int(t) / NI>{}, std::integral_constant<int, int(t) % NI>{}), ...);
    }
  };
};
}  // namespace detail

template <class T, int Lanes, int Streamed, int HeadDim>
struct TileOps<T, Lanes, Streamed, HeadDim, Isa::Amx, std::enable_if_t<is_bf16<T>>> {
 private:
  using Pairs = Bf16Pairs<T, Lanes>;
  // Two C tiles along the lanes when they split evenly, and two groups of 16 output rows.
  static constexpr int NI = (Lanes / amx::kRows) % 2 == 0 ? 2 : 1;
  using Blocked = RegisterBlocked<detail::AmxStep, Lanes, NI, 2>;

 public:
  using Acc = float;
  using LaneElem = std::uint32_t;   // a pair of bf16
  using StagedElem = std::uint16_t;  // bf16 bits
  struct StagedTile {
    const StagedElem* data;
    index_t ld;  // elements between rows: K rows for K, Vᵀ rows (head-dim columns) for V
  };
  // Held by each worker while it runs programs of one call.
  using WorkerSetup = amx::TileSession;

  static_assert(Lanes % amx::kRows == 0, "the AMX kernels need Lanes to be a multiple of 16");
  static_assert(Streamed % amx::kDepth == 0, "the AMX kernels need Streamed to be a multiple of 32");

  static int round_up(int n, int m) { return (n + m - 1) / m * m; }
  // Qᵀ pair rows: d/2 rounded up to whole tiles (16 pair rows = 32 of d).
  static int q_pair_rows(int d) { return round_up(d, amx::kDepth) / 2; }
  static std::size_t lane_elems(int d) { return std::size_t(q_pair_rows(d)) * Lanes; }
  // K: (Streamed, d rounded to 32) bf16; Vᵀ: (d rounded to 16, Streamed) bf16 — the larger of the two.
  static std::size_t stage_elems(int d) {
    return std::max(std::size_t(Streamed) * round_up(d, amx::kDepth), std::size_t(round_up(d, amx::kRows)) * Streamed);
  }

  static void load_lanes(LaneElem* qt, Acc* /*row_buf*/, const TensorView<const T>& q, index_t b, index_t h, index_t q0,
                     int rows, int d) {
    Pairs::load_lanes(qt, q, b, h, q0, rows, d);
    const int filled = (d + 1) / 2;
    std::fill(qt + std::size_t(filled) * Lanes, qt + lane_elems(d), LaneElem(0));
  }

  // K rows in place when a tile can read them as they are (unit dim stride, d a multiple of 32, whole
  // 16-row groups) unless `copy`; else staged, zero-padded to (cols rounded to 16, d rounded to 32).
  template <class Rows>
  static StagedTile stage_for_qk(StagedElem* stage, const Rows& k, index_t b, index_t h, index_t k0, int cols, int d,
                        bool copy = false) {
    if (in_place(k, d) && cols % amx::kRows == 0 && !copy && k.even_run(b, h, k0) >= cols)
      return {reinterpret_cast<const StagedElem*>(k.row(b, h, k0)), k.row_stride()};
    const int width = round_up(d, amx::kDepth);
    for (int j = 0; j < cols; ++j) {
      const T* row = k.row(b, h, k0 + j);
      StagedElem* out = stage + std::size_t(j) * width;
      if (k.dim_stride() == 1) {
        std::memcpy(out, row, sizeof(StagedElem) * std::size_t(d));
      } else {
        for (int c = 0; c < d; ++c) out[c] = detail::bf16_bits(row + c * k.dim_stride());
      }
      std::fill(out + d, out + width, StagedElem(0));
    }
    std::fill(stage + std::size_t(cols) * width, stage + std::size_t(round_up(cols, amx::kRows)) * width, StagedElem(0));
    return {stage, width};
  }

  // Vᵀ: row c holds V[k0 + j][c] for the tile's keys j, zero-padded to the keys the tile unit reads (cols
  // rounded to 32) and to d rounded to 16 rows. Contiguous rows move in 32 × 32 register blocks
  // (transpose.hpp): staging Vᵀ element by element cost as much as the two GEMMs of a 32-row panel once the
  // tiles of a long head no longer fit the staged tile cache and every query block stages them again.
  template <class Rows>
  static StagedTile stage_for_pv(StagedElem* stage, const Rows& v, index_t b, index_t h, index_t k0, int cols, int d,
                        bool /*copy: V is always staged*/ = false) {
    if (v.dim_stride() == 1) {
      const std::uint16_t* rows[amx::kDepth];
      for (int j0 = 0; j0 < cols; j0 += amx::kDepth) {
        const int n = std::min(amx::kDepth, cols - j0);
        for (int j = 0; j < n; ++j) rows[j] = reinterpret_cast<const std::uint16_t*>(v.row(b, h, k0 + j0 + j));
        for (int c0 = 0; c0 < d; c0 += amx::kDepth)
          detail::transpose32x32_u16(rows, c0, n, std::min(amx::kDepth, d - c0), stage + std::size_t(c0) * Streamed + j0,
                                     Streamed);
      }
      return {stage, Streamed};
    }
    const int rows = round_up(d, amx::kRows);
    std::fill(stage, stage + std::size_t(rows) * Streamed, StagedElem(0));
    for (int j = 0; j < cols; ++j) {
      const T* row = v.row(b, h, k0 + j);
      for (int c = 0; c < d; ++c) stage[std::size_t(c) * Streamed + j] = detail::bf16_bits(row + c * v.dim_stride());
    }
    return {stage, Streamed};
  }

  template <class Rows>
  static bool keeps_qk_tiles(const Rows& k, int d) { return !(in_place(k, d) && k.row_stride() == d); }
  template <class Rows>
  static bool keeps_pv_tiles(const Rows& /*v*/, int /*d*/) { return true; }

  // st (cols, Lanes) = raw scores K·Qᵀ; rows up to cols rounded to 16 are written (zero for padding keys).
  static void qk(Acc* st, const LaneElem* qt, StagedTile k, int cols, int d, const PrefetchRows& = {}) {
    const int depth = HeadDim > 0 ? HeadDim : d;
    Blocked::template run<Start::kZero>(st, nullptr, qt, k.data, StreamWalk{amx::kRows * k.ld, amx::kDepth, k.ld},
                                        (cols + amx::kRows - 1) / amx::kRows, round_up(depth, amx::kDepth) / amx::kDepth);
  }

  // ot (d, Lanes) = ot · diag(alpha) + Vᵀ·Pᵀ. pt (cols, Lanes) fp32 probabilities, packed to pairs in place.
  static void pv(Acc* ot, const Acc* alpha, Acc* pt, StagedTile v, int cols, int d, const PrefetchRows& = {}) {
    const int width = HeadDim > 0 ? HeadDim : d;
    rescale(ot, alpha, width);  // the tile unit cannot scale its accumulators: the blocks start kLoad
    Pairs::pack_p_pairs(pt, cols);
    const int keys = round_up(cols, amx::kDepth);
    std::fill(reinterpret_cast<LaneElem*>(pt) + std::size_t(Pairs::pairs(cols)) * Lanes,
              reinterpret_cast<LaneElem*>(pt) + std::size_t(keys / 2) * Lanes, LaneElem(0));

    const LaneElem* p2 = reinterpret_cast<const LaneElem*>(pt);
    const StreamWalk walk{amx::kRows * v.ld, amx::kDepth, v.ld};
    const int steps = keys / amx::kDepth;
    const int whole = width / amx::kRows;  // Oᵀ row tiles inside ot; a partial one goes through `last`
    Blocked::template run<Start::kLoad>(ot, nullptr, p2, v.data, walk, whole, steps);
    if (const int left = width - whole * amx::kRows; left > 0) {
      alignas(64) Acc last[amx::kRows][Lanes];
      Acc* o = ot + std::size_t(whole) * amx::kRows * Lanes;
      for (int r = 0; r < amx::kRows; ++r)
        for (int i = 0; i < Lanes; ++i) last[r][i] = r < left ? o[r * Lanes + i] : Acc(0);
      Blocked::template block<1, Start::kLoad>(&last[0][0], nullptr, p2, v.data + whole * walk.group, walk, steps);
      for (int r = 0; r < left; ++r) std::memcpy(o + r * Lanes, last[r], sizeof last[r]);
    }
  }

 private:
  template <class Rows>
  static bool in_place(const Rows& x, int d) { return x.dim_stride() == 1 && d % amx::kDepth == 0; }

  // Oᵀ columns (queries) times alpha, skipped when no running max moved (alpha all 1).
  static void rescale(Acc* ot, const Acc* alpha, int width) {
    __mmask16 moved = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int i = 0; i < Lanes; i += 16) moved |= _mm512_cmp_ps_mask(_mm512_loadu_ps(alpha + i), one, _CMP_NEQ_UQ);
    if (!moved) return;
    for (int c = 0; c < width; ++c)
      for (int i = 0; i < Lanes; i += 16) {
        Acc* o = ot + c * Lanes + i;
        _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), _mm512_loadu_ps(alpha + i)));
      }
  }
};

}  // namespace flashattn::cpu

#endif
