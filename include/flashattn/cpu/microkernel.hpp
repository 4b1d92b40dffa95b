#pragma once
// The register-blocked skeleton of the two tile GEMMs, written once and parameterised by its dot step:
// the FMA step (microkernel_fma.hpp: one fp32 or fp64 multiply-add per lane), the bf16 dot step
// (bf16_pairs.hpp: vdpbf16ps, a pair of bf16 products per lane) and the AMX step (tile_ops_amx.hpp: one
// TDPBF16PS per 16 × 16 tile of accumulators).
//
// Both GEMMs have one shape in the transposed layout (tile_ops.hpp): an output of `groups` groups of
// Step::kRows rows × Lanes lanes, row-major with Lanes elements between rows, is
//   out(g, ·) = start(g) + Σ_u stream(g, u) · lanes(u)       (u < steps)
// where lanes(u) is a depth step of the packet operand (Qᵀ in qk, Pᵀ in pv; Step::kLaneRows rows of Lanes
// elements) and stream(g, u) the matching part of the streamed operand (K in qk, V in pv), reached through
// a StreamWalk. qk starts from zero; pv from the output scaled per lane by alpha (the online softmax's
// rescale), or as it is when the step scales it beforehand.
//
// A block keeps nj groups × NI lane packets of accumulators in registers, so that each loaded lane packet
// feeds nj products and each streamed operand NI. The accumulators belong to the step:
//   - a value per packet for the SIMD steps (RegisterAccumulators below);
//   - a tile register per 16 × 16 block for AMX, whose register numbers are instruction immediates, which
//     is why a block's size is a template parameter rather than a loop bound.
//
// A dot step provides:
//   Acc, LaneElem, StreamElem  the accumulator type; elements of the packet and of the streamed operand
//   W, kRows, kLaneRows        lanes per packet; output rows per group; packet-operand rows per depth step
//   Accumulators<nj, NI>       zero(); load(out, ld); load_scaled(out, ld, alpha); store(out, ld);
//                              madd(lanes, lanes_ld, stream, walk): one depth step of the whole block

#include "flashattn/core/views.hpp"
#include "flashattn/cpu/simd.hpp"

namespace flashattn::cpu {

// Where the streamed operand's part for group g and depth step u starts: stream + g·group + u·step
// elements. ld: elements between the rows of one group (steps whose groups have several rows read it).
struct StreamWalk {
  index_t group;
  index_t step;
  index_t ld;
};

// How a block's accumulators start: from zero, from the output as it is, or from the output times alpha
// per lane.
enum class Start { kZero, kLoad, kScale };

// No work between blocks.
struct NothingBetweenBlocks {
  void operator()(int /*g0*/, int /*g1*/, int /*block*/, int /*blocks*/) const {}
};

template <class Step, int Lanes, int NI, int NJ>
struct RegisterBlocked {
  using Acc = typename Step::Acc;
  using LaneElem = typename Step::LaneElem;
  using StreamElem = typename Step::StreamElem;
  static constexpr int W = Step::W;
  static constexpr int kPackets = Lanes / W;
  static constexpr index_t kGroupElems = index_t(Step::kRows) * Lanes;  // output elements per group
  static_assert(Lanes % W == 0, "Lanes must be a multiple of the packet width");
  static_assert(kPackets % NI == 0, "the lane packets must split into blocks of NI");
  static_assert(NJ >= 1, "a block holds at least one group");

  // All `groups` groups: blocks of NJ, then one block of exactly the groups left (chosen by recursion on the
  // compile-time size, rather than one-group blocks that would leave all but NI accumulators idle).
  // before_block(g0, g1, block, blocks) runs before each whole block (the prefetch hook), not before the
  // last partial one.
  template <Start start, class BeforeBlock = NothingBetweenBlocks>
  static void run(Acc* out, const Acc* alpha, const LaneElem* lanes, const StreamElem* stream, StreamWalk walk,
                  int groups, int steps, BeforeBlock&& before_block = {}) {
    const int blocks = groups / NJ;
    int g = 0;
    for (int block_index = 0; block_index < blocks; ++block_index, g += NJ) {
      before_block(g, g + NJ, block_index, blocks);
      block<NJ, start>(out + g * kGroupElems, alpha, lanes, stream + g * walk.group, walk, steps);
    }
    if (g < groups) tail<NJ - 1, start>(groups - g, out + g * kGroupElems, alpha, lanes, stream + g * walk.group, walk, steps);
  }

  // One block of nj groups, all Lanes lanes (NI packets at a time).
  template <int nj, Start start>
  static void block(Acc* out, const Acc* alpha, const LaneElem* lanes, const StreamElem* stream, StreamWalk walk,
                    int steps) {
    for (int i0 = 0; i0 < kPackets; i0 += NI) {
      typename Step::template Accumulators<nj, NI> acc;
      Acc* o = out + i0 * W;
      if constexpr (start == Start::kZero) {
        acc.zero();
      } else if constexpr (start == Start::kLoad) {
        acc.load(o, Lanes);
      } else {
        acc.load_scaled(o, Lanes, alpha + i0 * W);
      }
      const LaneElem* lane = lanes + i0 * W;
      const StreamElem* s = stream;
      for (int u = 0; u < steps; ++u, lane += Step::kLaneRows * Lanes, s += walk.step) acc.madd(lane, Lanes, s, walk);
      acc.store(o, Lanes);
    }
  }

 private:
  template <int nj, Start start>
  static void tail(int left, Acc* out, const Acc* alpha, const LaneElem* lanes, const StreamElem* stream,
                   StreamWalk walk, int steps) {
    if constexpr (nj > 1) {
      if (left != nj) return tail<nj - 1, start>(left, out, alpha, lanes, stream, walk, steps);
    }
    if constexpr (nj >= 1) block<nj, start>(out, alpha, lanes, stream, walk, steps);
  }
};

// The accumulators of a SIMD dot step: one register per (group, lane packet), a group being one row.
// The step provides Reg, Operand, zero(), load(const Acc*), store(Acc*, Reg), mul(Reg, Reg),
// load_lanes(const LaneElem*) -> Operand, broadcast(const StreamElem*) -> Operand and
// madd(Reg acc, Operand lanes, Operand broadcast) -> acc + lanes · broadcast (per lane).
template <class Step, int NJ, int NI>
struct RegisterAccumulators {
  using Acc = typename Step::Acc;
  using Reg = typename Step::Reg;
  using Operand = typename Step::Operand;
  static constexpr int W = Step::W;
  Reg acc[NJ][NI];

  void zero() {
    FLASHATTN_UNROLL
    for (int jj = 0; jj < NJ; ++jj)
      FLASHATTN_UNROLL
      for (int ii = 0; ii < NI; ++ii) acc[jj][ii] = Step::zero();
  }
  void load(const Acc* out, index_t ld) {
    FLASHATTN_UNROLL
    for (int jj = 0; jj < NJ; ++jj)
      FLASHATTN_UNROLL
      for (int ii = 0; ii < NI; ++ii) acc[jj][ii] = Step::load(out + jj * ld + ii * W);
  }
  void load_scaled(const Acc* out, index_t ld, const Acc* alpha) {
    FLASHATTN_UNROLL
    for (int ii = 0; ii < NI; ++ii) {
      const Reg scale = Step::load(alpha + ii * W);
      FLASHATTN_UNROLL
      for (int jj = 0; jj < NJ; ++jj) acc[jj][ii] = Step::mul(Step::load(out + jj * ld + ii * W), scale);
    }
  }
  void store(Acc* out, index_t ld) const {
    FLASHATTN_UNROLL
    for (int jj = 0; jj < NJ; ++jj)
      FLASHATTN_UNROLL
      for (int ii = 0; ii < NI; ++ii) Step::store(out + jj * ld + ii * W, acc[jj][ii]);
  }
  template <class LaneElem, class StreamElem>
  void madd(const LaneElem* lanes, index_t /*lanes_ld*/, const StreamElem* stream, StreamWalk walk) {
    Operand a[NI];
    FLASHATTN_UNROLL
    for (int ii = 0; ii < NI; ++ii) a[ii] = Step::load_lanes(lanes + ii * W);
    FLASHATTN_UNROLL
    for (int jj = 0; jj < NJ; ++jj) {
      const Operand b = Step::broadcast(stream + jj * walk.group);
      FLASHATTN_UNROLL
      for (int ii = 0; ii < NI; ++ii) acc[jj][ii] = Step::madd(acc[jj][ii], a[ii], b);
    }
  }
};

}  // namespace flashattn::cpu
