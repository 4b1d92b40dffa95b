#pragma once
// Operand staging: the tile ops as a storage type sees them. How the operands of the two tile GEMMs are
// brought into the layouts the micro-kernels read, and which micro-kernels multiply them.
//
// Two roles, whatever the pass (the forward, or one of the backward's two programs):
//   the packet operand  (`Lanes` rows, e.g. the forward's query rows) is loaded once per program,
//                       transposed, so that a packet holds consecutive rows: load_lanes;
//   the streamed rows   (`Streamed` rows per tile, e.g. the forward's keys) are read tile by tile from a
//                       row source (core/kv_source.hpp), in place where possible: stage_for_qk for the
//                       first GEMM's operand, stage_for_pv for the second's.
//
// This generic version stages 16-bit (or strided) inputs into the accumulator type and runs the FMA
// micro-kernels (microkernel_fma.hpp); rows that already are Acc with unit dim stride are read in place.
// The streamed rows' element type is the row source's (kv_elem_t), which may differ from T: fp32 queries
// against a 16-bit KV cache stage its tiles widened to fp32, as a 16-bit T would.
// Specialisations (tile_ops_bf16.hpp, tile_ops_amx.hpp) keep 16-bit data and use dot-product or tile
// instructions.

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "flashattn/core/kv_source.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/convert.hpp"
#include "flashattn/cpu/microkernel_fma.hpp"
#include "flashattn/cpu/prefetch.hpp"
#include "flashattn/cpu/simd.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/cpu/transpose.hpp"

namespace flashattn::cpu {


template <class T, int Lanes, int Streamed, int HeadDim, Isa isa, class = void>
struct TileOps {
  using Acc = acc_t<T>;
  using Gemm = FmaMicroKernel<Acc, Lanes, HeadDim, isa>;
  using LaneElem = Acc;   // element of the staged Qᵀ tile
  using StagedElem = Acc;  // element of a staged K or V tile

  struct StagedTile {
    const StagedElem* data;
    index_t ld;  // elements between consecutive rows
  };

  static std::size_t lane_elems(int d) { return std::size_t(d) * Lanes; }
  static std::size_t stage_elems(int d) { return std::size_t(Streamed) * d; }

  // qt (d, Lanes) = Q[q0 : q0 + rows]ᵀ, zero in the padding rows of a tail block.
  static void load_lanes(LaneElem* qt, Acc* row_buf, const TensorView<const T>& q, index_t b, index_t h, index_t q0,
                     int rows, int d) {
    const bool done = q.stride_dim == 1;  // rows of unit stride: one converting transpose
    if (done) transpose<isa>(q.row(b, q0, h), q.stride_seq, qt, Lanes, rows, d);
    for (int i = 0; i < rows && !done; ++i) {
      load_row(row_buf, q.row(b, q0 + i, h), q.stride_dim, d);
      for (int c = 0; c < d; ++c) qt[c * Lanes + i] = row_buf[c];
    }
    for (int c = 0; c < d; ++c)
      for (int i = rows; i < Lanes; ++i) qt[c * Lanes + i] = Acc(0);
  }

  // Rows [k0, k0 + cols) of one head of a row source (core/kv_source.hpp) as a row-major Acc matrix: in
  // place when possible (unless `copy`), else converted into `stage`.
  template <class Rows>
  static StagedTile stage_for_qk(StagedElem* stage, const Rows& k, index_t b, index_t h, index_t k0, int cols, int d,
                        bool copy = false) {
    return stage_rows(stage, k, b, h, k0, cols, d, copy);
  }
  template <class Rows>
  static StagedTile stage_for_pv(StagedElem* stage, const Rows& v, index_t b, index_t h, index_t k0, int cols, int d,
                        bool copy = false) {
    return stage_rows(stage, v, b, h, k0, cols, d, copy);
  }

  // Whether staged tiles of K (or V) are worth keeping for a head's later query blocks (staged_tile_cache.hpp):
  // when staging converts or gathers, and when rows read in place would not be contiguous.
  template <class Rows>
  static bool keeps_qk_tiles(const Rows& k, int d) { return !contiguous_rows(k, d); }
  template <class Rows>
  static bool keeps_pv_tiles(const Rows& v, int d) { return !contiguous_rows(v, d); }

  // st (cols, Lanes) = raw scores K·Qᵀ.
  // `next`: rows to prefetch meanwhile (the V tile, during qk; the next K tile, during pv).
  static void qk(Acc* st, const LaneElem* qt, StagedTile k, int cols, int d, const PrefetchRows& next = {}) {
    Gemm::qk(st, qt, k.data, k.ld, cols, d, next);
  }

  // ot (d, Lanes) = ot · diag(alpha) + Vᵀ·Pᵀ, with pt (cols, Lanes) the probabilities.
  static void pv(Acc* ot, const Acc* alpha, Acc* pt, StagedTile v, int cols, int d, const PrefetchRows& next = {}) {
    Gemm::pv(ot, alpha, pt, v.data, v.ld, cols, d, next);
  }

 private:
  template <class Rows>
  static bool contiguous_rows(const Rows& x, int d) {
    return std::is_same_v<kv_elem_t<Rows>, Acc> && x.dim_stride() == 1 && x.row_stride() == d;
  }

  template <class Rows>
  static StagedTile stage_rows(StagedElem* stage, const Rows& x, index_t b, index_t h, index_t k0, int cols, int d,
                           bool copy) {
    if constexpr (std::is_same_v<kv_elem_t<Rows>, Acc>) {  // the source's elements: K/V may be 16-bit under fp32 Q
      if (x.dim_stride() == 1 && !copy && x.even_run(b, h, k0) >= cols) return {x.row(b, h, k0), x.row_stride()};
    }
    for (int j = 0; j < cols; ++j) load_row(stage + std::size_t(j) * d, x.row(b, h, k0 + j), x.dim_stride(), d);
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
