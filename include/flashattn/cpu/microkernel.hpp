#pragma once
// The register-blocked skeleton of the two tile GEMMs, written once and parameterised by its dot step:
// the FMA step (microkernel_fma.hpp: one fp32 or fp64 multiply-add per lane) and the bf16 dot step
// (bf16_pairs.hpp: vdpbf16ps, a pair of bf16 products per lane). The AMX kernels (tile_ops_amx.hpp)
// block whole 16 × 16 tiles in the tile unit's registers instead, and keep their own loop.
//
// In the transposed layout (tile_ops.hpp) the packet operand holds `Lanes` rows in packets of W lanes and
// the streamed operand is read row by row with broadcasts:
//   qk_block<nj>: out (nj, Lanes)  = Σ_u   broadcast(stream row jj, unit u) · lanes(unit u)
//   pv_block<nc>: out (nc, Lanes)  = alpha ∘ out + Σ_r broadcast(stream row r, column cc) · lanes(row r)
// A block keeps nj (or nc) × NI accumulators in registers: NI packets along the lanes times nj streamed
// rows (qk) or nc columns (pv), so that each loaded packet feeds nj FMAs and each broadcast NI.
//
// A dot step provides:
//   Acc, Reg, W        the accumulator type, its packet and lanes per packet
//   LaneElem, Operand  an element of the packet operand in memory, and that operand as a register
//   StreamElem, kUnit  an element of the streamed operand, and how many of them one depth step consumes
//   zero(), load(const Acc*), store(Acc*, Reg), mul(Reg, Reg)
//   load_lanes(const LaneElem*) -> Operand, broadcast(const StreamElem*) -> Operand
//   madd(Reg acc, Operand lanes, Operand broadcast) -> acc + lanes · broadcast (per lane)

#include "flashattn/core/views.hpp"
#include "flashattn/cpu/simd.hpp"

namespace flashattn::cpu {

template <class Step, int Lanes, int NI>
struct RegisterBlocked {
  using Acc = typename Step::Acc;
  using Reg = typename Step::Reg;
  using Operand = typename Step::Operand;
  using LaneElem = typename Step::LaneElem;
  using StreamElem = typename Step::StreamElem;
  static constexpr int W = Step::W;
  static constexpr int kPackets = Lanes / W;
  static_assert(Lanes % W == 0, "Lanes must be a multiple of the packet width");
  static_assert(kPackets % NI == 0, "the lane packets must split into blocks of NI");

  // out (nj, Lanes) = stream rows [0, nj) (ld apart) · lanes, over `depth` steps of kUnit elements.
  template <int nj>
  static void qk_block(Acc* out, const LaneElem* lanes, const StreamElem* stream, index_t ld, int depth) {
    for (int i0 = 0; i0 < kPackets; i0 += NI) {
      Reg acc[nj][NI];
      FLASHATTN_UNROLL
      for (int jj = 0; jj < nj; ++jj)
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) acc[jj][ii] = Step::zero();
      const LaneElem* lane_col = lanes + i0 * W;
      for (int u = 0; u < depth; ++u, lane_col += Lanes) {
        Operand a[NI];
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) a[ii] = Step::load_lanes(lane_col + ii * W);
        FLASHATTN_UNROLL
        for (int jj = 0; jj < nj; ++jj) {
          const Operand b = Step::broadcast(stream + jj * ld + u * Step::kUnit);
          FLASHATTN_UNROLL
          for (int ii = 0; ii < NI; ++ii) acc[jj][ii] = Step::madd(acc[jj][ii], a[ii], b);
        }
      }
      FLASHATTN_UNROLL
      for (int jj = 0; jj < nj; ++jj)
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) Step::store(out + jj * Lanes + (i0 + ii) * W, acc[jj][ii]);
    }
  }

  // out (nc, Lanes) = out · diag(alpha) + Σ_r stream row r (ld apart), columns [0, nc) · lanes row r.
  template <int nc>
  static void pv_block(Acc* out, const Acc* alpha, const LaneElem* lanes, const StreamElem* stream, index_t ld,
                       int rows) {
    for (int i0 = 0; i0 < kPackets; i0 += NI) {
      Reg acc[nc][NI];
      FLASHATTN_UNROLL
      for (int ii = 0; ii < NI; ++ii) {
        const Reg scale = Step::load(alpha + (i0 + ii) * W);
        FLASHATTN_UNROLL
        for (int cc = 0; cc < nc; ++cc) acc[cc][ii] = Step::mul(Step::load(out + cc * Lanes + (i0 + ii) * W), scale);
      }
      const LaneElem* lane_row = lanes + i0 * W;
      const StreamElem* stream_row = stream;
      for (int r = 0; r < rows; ++r, lane_row += Lanes, stream_row += ld) {
        Operand a[NI];
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) a[ii] = Step::load_lanes(lane_row + ii * W);
        FLASHATTN_UNROLL
        for (int cc = 0; cc < nc; ++cc) {
          const Operand b = Step::broadcast(stream_row + cc * Step::kUnit);
          FLASHATTN_UNROLL
          for (int ii = 0; ii < NI; ++ii) acc[cc][ii] = Step::madd(acc[cc][ii], a[ii], b);
        }
      }
      FLASHATTN_UNROLL
      for (int cc = 0; cc < nc; ++cc)
        FLASHATTN_UNROLL
        for (int ii = 0; ii < NI; ++ii) Step::store(out + cc * Lanes + (i0 + ii) * W, acc[cc][ii]);
    }
  }
};

}  // namespace flashattn::cpu
