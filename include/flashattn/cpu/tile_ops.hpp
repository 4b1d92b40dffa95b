#pragma once
// The two tile GEMMs of attention as register-blocked micro-kernels over the packet layer.
//
// Layout (the reason for it): a query block is held transposed, Qᵀ as (HeadDim, BlockQ), and so are the
// scores Sᵀ (BlockKV, BlockQ) and the output accumulator Oᵀ (HeadDim, BlockQ). Then a packet always holds
// consecutive query rows, K and V are read in their own row-major layout by scalar broadcasts (no packing
// or transposing of K or V, whatever their strides), and the softmax reductions over keys are lane-wise.
//
//   qk: Sᵀ[j][i] = Σ_c K[j][c] · Qᵀ[c][i]                          (BlockKV × BlockQ, depth HeadDim)
//   pv: Oᵀ[c][i] = alpha[i] · Oᵀ[c][i] + Σ_j V[j][c] · Pᵀ[j][i]    (HeadDim × BlockQ, depth BlockKV)
//
// Each micro-kernel keeps a block of kAccumulators packets in registers: NI packets along the query rows
// times NJ key rows (qk) or NC head-dim columns (pv), so each loaded packet feeds NJ (or NC) FMAs and each
// broadcast feeds NI.

#include <algorithm>

#include "flashattn/cpu/simd.hpp"
#include "flashattn/views.hpp"

// Register blocks live in small arrays indexed by compile-time loops; unrolling those loops is what puts
// them in registers. GCC unrolls them on its own only at -O3, so the loops ask for it (at -O2 the
// micro-kernels otherwise run at a third of their speed).
#if defined(__clang__)
#define FLASHATTN_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define FLASHATTN_UNROLL _Pragma("GCC unroll 16")
#else
#define FLASHATTN_UNROLL
#endif

namespace flashattn::cpu {

template <class Acc, int BlockQ, int HeadDim, Isa isa>
struct TileOps {
  using V = Simd<Acc, isa>;
  using Reg = typename V::Reg;
  static constexpr int W = V::width;
  static constexpr int kQueryPackets = BlockQ / W;
  static_assert(BlockQ % W == 0, "BlockQ must be a multiple of the packet width");

  // Enough independent accumulators to cover FMA latency × throughput, few enough to leave registers for
  // the operands (16 of 32 zmm; 8 of 16 ymm). Two query packets per block (NI = 2, so NJ = 8 on AVX-512)
  // measured fastest on Zen 5: 225 GFLOP/s for both qk and pv at BlockQ = 64, d = 128, against 100–150
  // for NI = 4 (GCC spills part of the 4 × 4 block) and 78 for NI = 1 (docs/performance.md).
  static constexpr int kAccumulators = isa == Isa::Avx512 ? 16 : 8;
  static constexpr int NI = kQueryPackets % 2 == 0 ? 2 : 1;
  static constexpr int NJ = std::max(1, kAccumulators / NI);
  static constexpr int NC = NJ;

  // st (cols, BlockQ) = K(cols, d) · Qᵀ(d, BlockQ). k: row-major, leading dimension k_ld.
  static void qk(Acc* st, const Acc* qt, const Acc* k, index_t k_ld, int cols, int d) {
    const int depth = HeadDim > 0 ? HeadDim : d;
    int j = 0;
    for (; j + NJ <= cols; j += NJ, st += NJ * BlockQ, k += NJ * k_ld) qk_block<NJ>(st, qt, k, k_ld, depth);
    for (; j < cols; ++j, st += BlockQ, k += k_ld) qk_block<1>(st, qt, k, k_ld, depth);
  }

  // ot (d, BlockQ) = ot · diag(alpha) + Vᵀ(d, cols) · Pᵀ(cols, BlockQ). v: row-major, leading dimension v_ld.
  static void pv(Acc* ot, const Acc* alpha, const Acc* pt, const Acc* v, index_t v_ld, int cols, int d) {
    const int width = HeadDim > 0 ? HeadDim : d;
    int c = 0;
    for (; c + NC <= width; c += NC, ot += NC * BlockQ, v += NC) pv_block<NC>(ot, alpha, pt, v, v_ld, cols);
    for (; c < width; ++c, ot += BlockQ, ++v) pv_block<1>(ot, alpha, pt, v, v_ld, cols);
  }

 private:
  template <int nj>
  static void qk_block(Acc* st, const Acc* qt, const Acc* k, index_t k_ld, int depth) {
    for (int i0 = 0; i0 < kQueryPackets; i0 += NI) {
      Reg acc[nj][NI];
      FLASHATTN_UNROLL
      for (int jj = 0; jj < nj; ++jj)
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) acc[jj][ii] = V::zero();
      const Acc* q_col = qt + i0 * W;
      for (int c = 0; c < depth; ++c, q_col += BlockQ) {
        Reg q[NI];
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) q[ii] = V::load(q_col + ii * W);
        FLASHATTN_UNROLL
        for (int jj = 0; jj < nj; ++jj) {
          const Reg kb = V::set1(k[jj * k_ld + c]);
          FLASHATTN_UNROLL
          for (int ii = 0; ii < NI; ++ii) acc[jj][ii] = V::fma(kb, q[ii], acc[jj][ii]);
        }
      }
      FLASHATTN_UNROLL
      for (int jj = 0; jj < nj; ++jj)
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) V::store(st + jj * BlockQ + (i0 + ii) * W, acc[jj][ii]);
    }
  }

  template <int nc>
  static void pv_block(Acc* ot, const Acc* alpha, const Acc* pt, const Acc* v, index_t v_ld, int cols) {
    for (int i0 = 0; i0 < kQueryPackets; i0 += NI) {
      Reg acc[nc][NI];
      FLASHATTN_UNROLL
      for (int ii = 0; ii < NI; ++ii) {
        const Reg a = V::load(alpha + (i0 + ii) * W);
        FLASHATTN_UNROLL
        for (int cc = 0; cc < nc; ++cc) acc[cc][ii] = V::mul(V::load(ot + cc * BlockQ + (i0 + ii) * W), a);
      }
      const Acc* p_row = pt + i0 * W;
      const Acc* v_row = v;
      for (int j = 0; j < cols; ++j, p_row += BlockQ, v_row += v_ld) {
        Reg p[NI];
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) p[ii] = V::load(p_row + ii * W);
        FLASHATTN_UNROLL
        for (int cc = 0; cc < nc; ++cc) {
          const Reg vb = V::set1(v_row[cc]);
          FLASHATTN_UNROLL
          for (int ii = 0; ii < NI; ++ii) acc[cc][ii] = V::fma(vb, p[ii], acc[cc][ii]);
        }
      }
      FLASHATTN_UNROLL
      for (int cc = 0; cc < nc; ++cc)
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) V::store(ot + cc * BlockQ + (i0 + ii) * W, acc[cc][ii]);
    }
  }
};

}  // namespace flashattn::cpu
