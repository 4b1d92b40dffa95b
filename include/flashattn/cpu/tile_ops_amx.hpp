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
// C tiles are computed 2 × 2 at a time (4 accumulators, 2 A and 2 B tiles: all 8 registers).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "flashattn/cpu/amx.hpp"
#include "flashattn/cpu/bf16_pairs.hpp"
#include "flashattn/cpu/tile_ops.hpp"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && (FLASHATTN_AMX_INSTRUCTIONS || defined(FLASHATTN_AMX_EMULATE))

namespace flashattn::cpu {

template <class T, int Lanes, int Streamed, int HeadDim>
struct TileOps<T, Lanes, Streamed, HeadDim, Isa::Amx, std::enable_if_t<is_bf16<T>>> {
 private:
  using Pairs = Bf16Pairs<T, Lanes>;

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
    if (in_place(k, d) && cols % amx::kRows == 0 && !copy && k.even_rows(b, h, k0, cols))
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

  // Vᵀ: row c holds V[k0 + j][c] for the tile's keys j, zero-padded to Streamed keys and to d rounded to 16
  // rows.
  template <class Rows>
  static StagedTile stage_for_pv(StagedElem* stage, const Rows& v, index_t b, index_t h, index_t k0, int cols, int d,
                        bool /*copy: V is always staged*/ = false) {
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
    const std::size_t a_stride = std::size_t(k.ld) * sizeof(StagedElem), bc_stride = Lanes * sizeof(Acc);
    for_blocks((cols + amx::kRows - 1) / amx::kRows, [&](auto mi, auto ni, int m, int n) {
      tile_block<decltype(mi)::value, decltype(ni)::value>(reinterpret_cast<char*>(st + m * amx::kRows * Lanes + n * amx::kRows), bc_stride, false,
                         reinterpret_cast<const char*>(k.data + m * amx::kRows * k.ld), a_stride,
                         reinterpret_cast<const char*>(qt + n * amx::kRows), bc_stride,
                         round_up(depth, amx::kDepth) / amx::kDepth);
    });
  }

  // ot (d, Lanes) = ot · diag(alpha) + Vᵀ·Pᵀ. pt (cols, Lanes) fp32 probabilities, packed to pairs in place.
  static void pv(Acc* ot, const Acc* alpha, Acc* pt, StagedTile v, int cols, int d, const PrefetchRows& = {}) {
    const int width = HeadDim > 0 ? HeadDim : d;
    rescale(ot, alpha, width);
    Pairs::pack_p_pairs(pt, cols);
    const int keys = round_up(cols, amx::kDepth);
    std::fill(reinterpret_cast<LaneElem*>(pt) + std::size_t(Pairs::pairs(cols)) * Lanes,
              reinterpret_cast<LaneElem*>(pt) + std::size_t(keys / 2) * Lanes, LaneElem(0));

    const std::size_t a_stride = std::size_t(v.ld) * sizeof(StagedElem), bc_stride = Lanes * sizeof(Acc);
    const char* p2 = reinterpret_cast<const char*>(pt);
    const int steps = keys / amx::kDepth;
    const int whole = width / amx::kRows;  // Oᵀ row tiles inside ot; a partial one goes through `last`
    for_blocks(whole, [&](auto mi, auto ni, int m, int n) {
      tile_block<decltype(mi)::value, decltype(ni)::value>(reinterpret_cast<char*>(ot + m * amx::kRows * Lanes + n * amx::kRows), bc_stride, true,
                         reinterpret_cast<const char*>(v.data + m * amx::kRows * v.ld), a_stride,
                         p2 + n * amx::kRowBytes, bc_stride, steps);
    });
    if (const int left = width - whole * amx::kRows; left > 0) {
      alignas(64) Acc last[amx::kRows][amx::kRows];
      for (int n = 0; n < Lanes / amx::kRows; ++n) {
        Acc* o = ot + whole * amx::kRows * Lanes + n * amx::kRows;
        for (int r = 0; r < amx::kRows; ++r)
          for (int i = 0; i < amx::kRows; ++i) last[r][i] = r < left ? o[r * Lanes + i] : Acc(0);
        tile_block<1, 1>(reinterpret_cast<char*>(last), amx::kRowBytes, true,
                         reinterpret_cast<const char*>(v.data + whole * amx::kRows * v.ld), a_stride,
                         p2 + n * amx::kRowBytes, bc_stride, steps);
        for (int r = 0; r < left; ++r) std::memcpy(o + r * Lanes, last[r], sizeof last[r]);
      }
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

  // Calls f(mi, ni, m, n) for every block of C tiles: rows m..m+mi of m_tiles, query tiles n..n+ni, with
  // mi, ni ∈ {1, 2} as std::integral_constant (the tile registers are compile-time).
  template <class F>
  static void for_blocks(int m_tiles, F&& f) {
    constexpr int n_tiles = Lanes / amx::kRows;
    using One = std::integral_constant<int, 1>;
    using Two = std::integral_constant<int, 2>;
    int m = 0;
    for (; m + 2 <= m_tiles; m += 2) {
      int n = 0;
      for (; n + 2 <= n_tiles; n += 2) f(Two{}, Two{}, m, n);
      if (n < n_tiles) f(Two{}, One{}, m, n);
    }
    if (m < m_tiles) {
      int n = 0;
      for (; n + 2 <= n_tiles; n += 2) f(One{}, Two{}, m, n);
      if (n < n_tiles) f(One{}, One{}, m, n);
    }
  }

  // C (MI × NI tiles at c, rows c_stride bytes apart, tile (mi, ni) at mi·16 rows and ni·64 bytes)
  // (+)= Σ_s A(mi, s) · B(s, ni), where A(mi, s) starts mi·16 rows and s·64 bytes into a and B(s, ni)
  // s·16 rows and ni·64 bytes into b. Registers: C 0–3 (2·mi + ni), A 4–5, B 6–7.
  template <int MI, int NI>
  static void tile_block(char* c, std::size_t c_stride, bool accumulate, const char* a, std::size_t a_stride,
                         const char* b, std::size_t b_stride, int steps) {
    char* const c1 = c + amx::kRows * c_stride;
    if (accumulate) {
      amx::load<0>(c, c_stride);
      if constexpr (NI > 1) amx::load<1>(c + amx::kRowBytes, c_stride);
      if constexpr (MI > 1) amx::load<2>(c1, c_stride);
      if constexpr (MI > 1 && NI > 1) amx::load<3>(c1 + amx::kRowBytes, c_stride);
    } else {
      amx::zero<0>();
      if constexpr (NI > 1) amx::zero<1>();
      if constexpr (MI > 1) amx::zero<2>();
      if constexpr (MI > 1 && NI > 1) amx::zero<3>();
    }
    const char* a1 = a + amx::kRows * a_stride;
    for (int s = 0; s < steps; ++s, a += amx::kRowBytes, a1 += amx::kRowBytes, b += amx::kRows * b_stride) {
      amx::load<4>(a, a_stride);
      if constexpr (MI > 1) amx::load<5>(a1, a_stride);
      amx::load<6>(b, b_stride);
      if constexpr (NI > 1) amx::load<7>(b + amx::kRowBytes, b_stride);
      amx::dp_bf16<0, 4, 6>();
      if constexpr (NI > 1) amx::dp_bf16<1, 4, 7>();
      if constexpr (MI > 1) amx::dp_bf16<2, 5, 6>();
      if constexpr (MI > 1 && NI > 1) amx::dp_bf16<3, 5, 7>();
    }
    amx::store<0>(c, c_stride);
    if constexpr (NI > 1) amx::store<1>(c + amx::kRowBytes, c_stride);
    if constexpr (MI > 1) amx::store<2>(c1, c_stride);
    if constexpr (MI > 1 && NI > 1) amx::store<3>(c1 + amx::kRowBytes, c_stride);
  }
};

}  // namespace flashattn::cpu

#endif
