#pragma once
// The two tile GEMMs of attention as register-blocked FMA micro-kernels over the packet layer (fp32 and
// fp64 accumulators; any storage type staged into them by tile_ops.hpp). Lanes: the rows held in packets
// (query rows in the forward).
//
// Layout (the reason for it): a query block is held transposed, Qᵀ as (HeadDim, Lanes), and so are the
// scores Sᵀ (BlockKV, Lanes) and the output accumulator Oᵀ (HeadDim, Lanes). Then a packet always holds
// consecutive query rows, K and V are read in their own row-major layout by scalar broadcasts (no packing
// or transposing of K or V, whatever their strides), and the softmax reductions over keys are lane-wise.
//
//   qk: Sᵀ[j][i] = Σ_c K[j][c] · Qᵀ[c][i]                          (BlockKV × Lanes, depth HeadDim)
//   pv: Oᵀ[c][i] = alpha[i] · Oᵀ[c][i] + Σ_j V[j][c] · Pᵀ[j][i]    (HeadDim × Lanes, depth BlockKV)
//
// Each micro-kernel keeps a block of kAccumulators packets in registers: NI packets along the query rows
// times NJ key rows (qk) or head-dim columns (pv), so each loaded packet feeds NJ FMAs and each broadcast
// feeds NI. The loops are microkernel.hpp's skeleton: a group there is one key row (qk) or one head-dim
// column (pv).

#include <algorithm>
#include <cstddef>

#include "flashattn/core/views.hpp"
#include "flashattn/cpu/microkernel.hpp"
#include "flashattn/cpu/prefetch.hpp"
#include "flashattn/cpu/simd.hpp"

namespace flashattn::cpu {

// The FMA dot step of microkernel.hpp's skeleton: fp32 (or fp64) lanes times a broadcast element.
template <class Acc_, Isa isa>
struct FmaStep {
  using V = Simd<Acc_, isa>;
  using Acc = Acc_;
  using Reg = typename V::Reg;
  using Operand = Reg;
  using LaneElem = Acc;
  using StreamElem = Acc;
  static constexpr int W = V::width;
  static constexpr int kRows = 1;      // output rows per group
  static constexpr int kLaneRows = 1;  // Qᵀ (or Pᵀ) rows per depth step
  static constexpr int kUnit = 1;      // streamed elements per depth step
  template <int NJ, int NI>
  using Accumulators = RegisterAccumulators<FmaStep, NJ, NI>;
  static Reg zero() { return V::zero(); }
  static Reg load(const Acc* p) { return V::load(p); }
  static void store(Acc* p, Reg x) { V::store(p, x); }
  static Reg mul(Reg a, Reg b) { return V::mul(a, b); }
  static Reg load_lanes(const Acc* p) { return V::load(p); }
  static Reg broadcast(const Acc* p) { return V::set1(*p); }
  static Reg madd(Reg acc, Reg lanes, Reg b) { return V::fma(b, lanes, acc); }
};

template <class Acc, int Lanes, int HeadDim, Isa isa>
struct FmaMicroKernel {
  using V = Simd<Acc, isa>;
  using Reg = typename V::Reg;
  static constexpr int W = V::width;
  static constexpr int kQueryPackets = Lanes / W;
  static_assert(Lanes % W == 0, "Lanes must be a multiple of the packet width");

  // Enough independent accumulators to cover FMA latency × throughput (4 cycles × 2 pipes = 8 at least),
  // few enough to leave registers for the operands: 16 of AVX-512's 32, 12 of AVX2's 16 (two query
  // packets and one broadcast take three more). Two query packets per block (NI = 2, so NJ = 8 on AVX-512,
  // 6 on AVX2): NI = 4 makes GCC spill part of the block, NI = 1 leaves the broadcasts the bottleneck, and on
  // AVX2 8 accumulators leave the FMA pipes half idle (docs/performance.md, "Why it is fast").
  static constexpr int kAccumulators = is_avx512(isa) ? 16 : 12;
  static constexpr int NI = kQueryPackets % 2 == 0 ? 2 : 1;
  static constexpr int NJ = std::max(1, kAccumulators / NI);
  using Blocked = RegisterBlocked<FmaStep<Acc, isa>, Lanes, NI, NJ>;

  // st (cols, Lanes) = K(cols, d) · Qᵀ(d, Lanes). k: row-major, leading dimension k_ld.
  // `next` rows are prefetched alongside: row j of it with row j of k.
  static void qk(Acc* st, const Acc* qt, const Acc* k, index_t k_ld, int cols, int d, const PrefetchRows& next = {}) {
    const int depth = HeadDim > 0 ? HeadDim : d;
    Blocked::template run<Start::kZero>(st, nullptr, qt, k, StreamWalk{k_ld, 1, k_ld}, cols, depth,
                                        [&](int j0, int j1, int, int) { next.issue(j0, j1); });
  }

  // ot (d, Lanes) = ot · diag(alpha) + Vᵀ(d, cols) · Pᵀ(cols, Lanes). v: row-major, leading dimension v_ld.
  // `next` rows are prefetched alongside, an equal share per block of NJ columns.
  static void pv(Acc* ot, const Acc* alpha, const Acc* pt, const Acc* v, index_t v_ld, int cols, int d,
                 const PrefetchRows& next = {}) {
    const int width = HeadDim > 0 ? HeadDim : d;
    Blocked::template run<Start::kScale>(ot, alpha, pt, v, StreamWalk{1, v_ld, v_ld}, width, cols,
                                         [&](int, int, int block, int blocks) { next.issue_share(block, blocks); });
  }
};

}  // namespace flashattn::cpu
