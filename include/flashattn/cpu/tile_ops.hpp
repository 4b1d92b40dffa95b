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
#include <cstddef>
#include <type_traits>

#include "flashattn/cpu/convert.hpp"
#include "flashattn/cpu/prefetch.hpp"
#include "flashattn/cpu/simd.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/cpu/transpose.hpp"
#include "flashattn/views.hpp"

namespace flashattn::cpu {

template <class Acc, int BlockQ, int HeadDim, Isa isa>
struct TileOps {
  using V = Simd<Acc, isa>;
  using Reg = typename V::Reg;
  static constexpr int W = V::width;
  static constexpr int kQueryPackets = BlockQ / W;
  static_assert(BlockQ % W == 0, "BlockQ must be a multiple of the packet width");

  // Enough independent accumulators to cover FMA latency × throughput (4 cycles × 2 pipes = 8 at least),
  // few enough to leave registers for the operands: 16 of AVX-512's 32, 12 of AVX2's 16 (two query
  // packets and one broadcast take three more). Two query packets per block (NI = 2, so NJ = 8 on AVX-512,
  // 6 on AVX2). Measured (docs/performance.md): on Zen 5, 225 GFLOP/s for both qk and pv at BlockQ = 64,
  // d = 128, against 100–150 for NI = 4 (GCC spills part of the 4 × 4 block) and 78 for NI = 1; on Zen 3
  // (AVX2), 12 accumulators run the tile ~1.6× faster than 8 (those leave the FMA pipes half idle).
  static constexpr int kAccumulators = is_avx512(isa) ? 16 : 12;
  static constexpr int NI = kQueryPackets % 2 == 0 ? 2 : 1;
  static constexpr int NJ = std::max(1, kAccumulators / NI);
  static constexpr int NC = NJ;

  // st (cols, BlockQ) = K(cols, d) · Qᵀ(d, BlockQ). k: row-major, leading dimension k_ld.
  // `next` rows are prefetched alongside: row j of it with row j of k.
  static void qk(Acc* st, const Acc* qt, const Acc* k, index_t k_ld, int cols, int d, const PrefetchRows& next = {}) {
    const int depth = HeadDim > 0 ? HeadDim : d;
    int j = 0;
    for (; j + NJ <= cols; j += NJ, st += NJ * BlockQ, k += NJ * k_ld) {
      next.issue(j, j + NJ);
      qk_block<NJ>(st, qt, k, k_ld, depth);
    }
    if (j < cols) qk_tail<NJ - 1>(cols - j, st, qt, k, k_ld, depth);
  }

  // ot (d, BlockQ) = ot · diag(alpha) + Vᵀ(d, cols) · Pᵀ(cols, BlockQ). v: row-major, leading dimension v_ld.
  // `next` rows are prefetched alongside, an equal share per block of NC columns.
  static void pv(Acc* ot, const Acc* alpha, const Acc* pt, const Acc* v, index_t v_ld, int cols, int d,
                 const PrefetchRows& next = {}) {
    const int width = HeadDim > 0 ? HeadDim : d;
    const int blocks = width / NC;
    int c = 0;
    for (int block = 0; c + NC <= width; c += NC, ot += NC * BlockQ, v += NC, ++block) {
      next.issue_share(block, blocks);
      pv_block<NC>(ot, alpha, pt, v, v_ld, cols);
    }
    if (c < width) pv_tail<NC - 1>(width - c, ot, alpha, pt, v, v_ld, cols);
  }

 private:
  // The last rows (qk) or columns (pv) that do not fill a block: one block of exactly that many, chosen
  // by recursion on the compile-time size, rather than one-wide blocks that would leave all but NI
  // accumulators idle (a 6-wide block leaves 4 of 64 keys and 2 of 128 head-dim columns over on AVX2).
  template <int nj>
  static void qk_tail(int left, Acc* st, const Acc* qt, const Acc* k, index_t k_ld, int depth) {
    if constexpr (nj > 1) {
      if (left != nj) return qk_tail<nj - 1>(left, st, qt, k, k_ld, depth);
    }
    qk_block<nj>(st, qt, k, k_ld, depth);
  }
  template <int nc>
  static void pv_tail(int left, Acc* ot, const Acc* alpha, const Acc* pt, const Acc* v, index_t v_ld, int cols) {
    if constexpr (nc > 1) {
      if (left != nc) return pv_tail<nc - 1>(left, ot, alpha, pt, v, v_ld, cols);
    }
    pv_block<nc>(ot, alpha, pt, v, v_ld, cols);
  }

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

namespace flashattn::cpu {

// The tile ops as a storage type sees them: how Q, K and V tiles are staged for the micro-kernels and
// which micro-kernels multiply them. This generic version stages 16-bit (or strided) inputs into Acc
// and runs the FMA micro-kernels above; K and V that already are Acc with unit dim stride are read in
// place. Specialisations (tile_ops_bf16.hpp, tile_ops_amx.hpp) keep 16-bit data and use dot-product or
// tile instructions.
template <class T, int BlockQ, int BlockKV, int HeadDim, Isa isa, class = void>
struct StorageOps {
  using Acc = acc_t<T>;
  using Gemm = TileOps<Acc, BlockQ, HeadDim, isa>;
  using QElem = Acc;   // element of the staged Qᵀ tile
  using KvElem = Acc;  // element of a staged K or V tile

  struct KvTile {
    const KvElem* data;
    index_t ld;  // elements between consecutive rows
  };

  static std::size_t q_elems(int d) { return std::size_t(d) * BlockQ; }
  static std::size_t kv_stage_elems(int d) { return std::size_t(BlockKV) * d; }

  // qt (d, BlockQ) = Q[q0 : q0 + rows]ᵀ, zero in the padding rows of a tail block.
  static void load_q(QElem* qt, Acc* row_buf, const TensorView<const T>& q, index_t b, index_t h, index_t q0,
                     int rows, int d) {
    const bool done = q.stride_dim == 1;  // rows of unit stride: one converting transpose
    if (done) transpose<isa>(q.row(b, q0, h), q.stride_seq, qt, BlockQ, rows, d);
    for (int i = 0; i < rows && !done; ++i) {
      load_row(row_buf, q.row(b, q0 + i, h), q.stride_dim, d);
      for (int c = 0; c < d; ++c) qt[c * BlockQ + i] = row_buf[c];
    }
    for (int c = 0; c < d; ++c)
      for (int i = rows; i < BlockQ; ++i) qt[c * BlockQ + i] = Acc(0);
  }

  // Rows [k0, k0 + cols) of one head of K or V as a row-major Acc matrix: in place when possible (unless
  // `copy`), else converted into `stage`.
  static KvTile stage_k(KvElem* stage, const TensorView<const T>& k, index_t b, index_t h, index_t k0, int cols,
                        int d, bool copy = false) {
    return stage_rows(stage, k, b, h, k0, cols, d, copy);
  }
  static KvTile stage_v(KvElem* stage, const TensorView<const T>& v, index_t b, index_t h, index_t k0, int cols,
                        int d, bool copy = false) {
    return stage_rows(stage, v, b, h, k0, cols, d, copy);
  }

  // Whether staged tiles of K (or V) are worth keeping for a head's later query blocks (kv_tile_cache.hpp):
  // when staging converts or gathers, and when rows read in place would not be contiguous.
  static bool keeps_k(const TensorView<const T>& k, int d) { return !contiguous_rows(k, d); }
  static bool keeps_v(const TensorView<const T>& v, int d) { return !contiguous_rows(v, d); }

  // st (cols, BlockQ) = raw scores K·Qᵀ.
  // `next`: rows to prefetch meanwhile (the V tile, during qk; the next K tile, during pv).
  static void qk(Acc* st, const QElem* qt, KvTile k, int cols, int d, const PrefetchRows& next = {}) {
    Gemm::qk(st, qt, k.data, k.ld, cols, d, next);
  }

  // ot (d, BlockQ) = ot · diag(alpha) + Vᵀ·Pᵀ, with pt (cols, BlockQ) the probabilities.
  static void pv(Acc* ot, const Acc* alpha, Acc* pt, KvTile v, int cols, int d, const PrefetchRows& next = {}) {
    Gemm::pv(ot, alpha, pt, v.data, v.ld, cols, d, next);
  }

 private:
  static bool contiguous_rows(const TensorView<const T>& x, int d) {
    return std::is_same_v<T, Acc> && x.stride_dim == 1 && x.stride_seq == d;
  }

  static KvTile stage_rows(KvElem* stage, const TensorView<const T>& x, index_t b, index_t h, index_t k0, int cols,
                           int d, bool copy) {
    if constexpr (std::is_same_v<T, Acc>) {
      if (x.stride_dim == 1 && !copy) return {x.row(b, k0, h), x.stride_seq};
    }
    for (int j = 0; j < cols; ++j) load_row(stage + std::size_t(j) * d, x.row(b, k0 + j, h), x.stride_dim, d);
    return {stage, d};
  }
};

// What a worker's thread must hold while it runs a storage type's micro-kernels: Ops::WorkerSetup where
// the ops declare one (AMX: the thread's tile configuration, amx.hpp), else nothing.
namespace detail {
struct NoWorkerSetup {};
template <class Ops, class = void>
struct WorkerSetupOf {
  using type = NoWorkerSetup;
};
template <class Ops>
struct WorkerSetupOf<Ops, std::void_t<typename Ops::WorkerSetup>> {
  using type = typename Ops::WorkerSetup;
};
}  // namespace detail
template <class Ops>
using worker_setup_t = typename detail::WorkerSetupOf<Ops>::type;

}  // namespace flashattn::cpu
