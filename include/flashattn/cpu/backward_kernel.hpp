#pragma once
// The two backward programs of FlashAttention 2 (Algorithm 2 of the FA2 paper), recomputing the
// probabilities tile by tile from the forward's saved log-sum-exp instead of storing P:
//
//   P  = exp(S - LSE)        S = scale·Q·Kᵀ (+ mask / score modifier), recomputed per tile
//   dV = Pᵀ·dO               dP = dO·Vᵀ
//   dS = P ∘ (dP - D)        D = rowsum(dO ∘ O), one number per query row, computed once
//   dQ = scale·dS·K          dK = scale·dSᵀ·Q
//
// Every gradient element is owned by exactly one program, which accumulates it in a fixed order, so the
// result has the same bits whatever the thread count (no atomics, no racing adds):
//
//   run_dq  (batch, query head, query block): recomputes S, P, dP, dS against every key tile its mask
//           keeps and accumulates dQ (HeadDim, BlockQ) in registers/L1. It also produces the per-row
//           statistics (D and −LSE) that run_dkv reads.
//   run_dkv (batch, KV head, key block): owns dK and dV (HeadDim, BlockKV) of its keys, and loops over
//           every query head of its GQA group and every query block that keeps one of its keys.
//
// dQ is a separate program rather than a by-product of run_dkv: summing dQ's contributions from many
// key blocks would need either racing adds (not deterministic) or one partial dQ per key block (memory
// O(N²·d / BlockKV)). The price is recomputing S and dP in the dQ program: 7 tile GEMMs where the FLOP
// count credits 5 (docs/backward.md). Extra memory is the two per-row statistics, O(batch·heads·seq_q),
// plus per-worker tiles: no (seq_q × seq_k) buffer exists anywhere.
//
// Both programs run the forward's tile GEMMs (TileOps of tile_ops.hpp: the FMA micro-kernels on the
// transposed layout, or the bf16 dot-product ones of tile_ops_bf16.hpp) with the roles of its operands
// chosen per program, so that the accumulators hold the rows the program owns in packets and the rows it
// streams are read as the forward reads K and V:
//
//   run_dq  (packets along query rows)   "Q" operand: Qᵀ, dOᵀ     streamed: K, V rows
//     Sᵀ  = qk(Qᵀ; K)      dPᵀ = qk(dOᵀ; V)      dQᵀ += pv(dSᵀ; K)
//   run_dkv (packets along key rows)     "Q" operand: Kᵀ, Vᵀ      streamed: Q, dO rows
//     S   = qk(Kᵀ; Q)      dP  = qk(Vᵀ; dO)      dVᵀ += pv(P; dO)      dKᵀ += pv(dS; Q)
//
// For bf16 that means P and dS enter their GEMMs rounded to bf16, as in FlashAttention 2 on GPUs (and
// in the naive bf16 backward of the tolerance rule); every sum is fp32.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "flashattn/core/backward_params.hpp"
#include "flashattn/core/kv_source.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/prefetch.hpp"
#include "flashattn/cpu/score_table.hpp"
#include "flashattn/cpu/simd.hpp"
#include "flashattn/cpu/tile_ops.hpp"
#include "flashattn/cpu/tile_ops_bf16.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/cpu/transpose.hpp"

namespace flashattn::cpu {

// Per query row, shared between the two programs: D = rowsum(dO ∘ O) and −LSE. Rows that kept no key
// (LSE −inf) store −LSE = −inf as well, so that their recomputed P = exp(s − LSE) is exactly 0 and their
// gradients vanish without a NaN from −inf − (−inf). Indexed (head, the sequence layout's row).
template <class Acc>
struct RowStats {
  Acc* delta = nullptr;    // (heads_q, layout rows)
  Acc* neg_lse = nullptr;  // (heads_q, layout rows)
  index_t rows_per_head = 0;

  // The first row of sequence `seq` of head h; `row0` is the layout's row of its query 0.
  index_t offset(index_t h, index_t row0) const { return h * rows_per_head + row0; }
};

template <class T, class TileConfig, int HeadDim>
class BackwardKernel {
 public:
  using Acc = acc_t<T>;
  static constexpr int BlockQ = TileConfig::BlockQ;
  static constexpr int BlockKV = TileConfig::BlockKV;
  // The backward has no AMX kernels (its scratch sets up no tile state): Isa::Amx tiles run AVX512-BF16.
  static constexpr Isa kIsa = TileConfig::isa == Isa::Amx ? Isa::Avx512Bf16 : TileConfig::isa;
  using V = Simd<Acc, kIsa>;
  using Reg = typename V::Reg;
  static constexpr int W = V::width;
  // The forward's tile GEMMs, once with query rows in the packets (BlockQ wide, streaming key tiles of
  // BlockKV rows), once with key rows in the packets (BlockKV wide, streaming query tiles of BlockQ rows).
  using OpsQ = TileOps<T, BlockQ, BlockKV, HeadDim, kIsa>;
  using OpsKV = TileOps<T, BlockKV, BlockQ, HeadDim, kIsa>;
  static_assert(BlockKV % W == 0,
                "the backward holds a key block in packets: BlockKV must be a multiple of the packet width");

  // The working set of one dQ worker, reused across its programs.
  // dk: the head dim of Q, K (and dQ, dK); dv: of V, O, dO (and dV). Staging slots fit either.
  class DqScratch {
   public:
    DqScratch(int dk, int dv)
        : qt_(OpsQ::lane_elems(dk)),
          dot_(OpsQ::lane_elems(dv)),
          stage_(3 * std::max(OpsQ::stage_elems(dk), OpsQ::stage_elems(dv))),
          dqt_(std::size_t(dk) * BlockQ),
          st_(std::size_t(BlockKV) * BlockQ),
          dpt_(std::size_t(BlockKV) * BlockQ),
          gt_(std::size_t(BlockKV) * BlockQ),
          rows_(3 * std::size_t(BlockQ) + std::size_t(std::max(dk, dv))),
          stage_elems_(std::max(OpsQ::stage_elems(dk), OpsQ::stage_elems(dv))) {
      // Lanes the score modifier never writes (padding rows) must multiply by a finite 0.
      std::fill(gt_.data(), gt_.data() + gt_.size(), Acc(0));
      std::fill(ones(), ones() + BlockQ, Acc(1));
    }

    typename OpsQ::LaneElem* qt() { return qt_.data(); }                                // Qᵀ, OpsQ's layout
    typename OpsQ::LaneElem* dot() { return dot_.data(); }                              // dOᵀ, OpsQ's layout
    typename OpsQ::StagedElem* k_stage() { return stage_.data(); }                      // K tile as qk reads it
    typename OpsQ::StagedElem* v_stage() { return stage_.data() + stage_elems_; }       // V tile as qk reads it
    typename OpsQ::StagedElem* kv_stage() { return stage_.data() + 2 * stage_elems_; }  // K tile as pv reads it
    Acc* dqt() { return dqt_.data(); }                    // (dk, BlockQ)      dQᵀ accumulator
    Acc* st() { return st_.data(); }                      // (BlockKV, BlockQ) Sᵀ = K·Qᵀ (unscaled), then Pᵀ
    Acc* dpt() { return dpt_.data(); }                    // (BlockKV, BlockQ) dPᵀ, then dSᵀ
    Acc* gt() { return gt_.data(); }                      // (BlockKV, BlockQ) d score'/d score (score modifiers)
    Acc* delta() { return rows_.data(); }                 // (BlockQ)          D; 0 in padding rows
    Acc* neg_lse() { return rows_.data() + BlockQ; }      // (BlockQ)          −LSE; −inf in padding rows
    Acc* ones() { return rows_.data() + 2 * BlockQ; }     // (BlockQ)          pv's rescale factors: none here
    Acc* row_buf() { return rows_.data() + 3 * BlockQ; }  // (max(dk, dv))  one converted input row
    float* table_tile() { return table_tile_.get(); }     // (BlockKV, BlockQ) a score table's tile, transposed

   private:
    AlignedBuffer<typename OpsQ::LaneElem> qt_, dot_;
    AlignedBuffer<typename OpsQ::StagedElem> stage_;
    AlignedBuffer<Acc> dqt_, st_, dpt_, gt_, rows_;
    std::size_t stage_elems_;
    TableTileBuffer<BlockKV, BlockQ> table_tile_;
  };

  // The working set of one dK/dV worker.
  class DkvScratch {
   public:
    DkvScratch(int dk, int dv)
        : kt_(OpsKV::lane_elems(dk)),
          vt_(OpsKV::lane_elems(dv)),
          stage_(4 * std::max(OpsKV::stage_elems(dk), OpsKV::stage_elems(dv))),
          dkt_(std::size_t(dk) * BlockKV),
          dvt_(std::size_t(dv) * BlockKV),
          s_(std::size_t(BlockQ) * BlockKV),
          dp_(std::size_t(BlockQ) * BlockKV),
          g_(std::size_t(BlockQ) * BlockKV),
          rows_(std::size_t(BlockKV) + std::size_t(std::max(dk, dv))),
          stage_elems_(std::max(OpsKV::stage_elems(dk), OpsKV::stage_elems(dv))) {
      std::fill(g_.data(), g_.data() + g_.size(), Acc(0));
      std::fill(ones(), ones() + BlockKV, Acc(1));
    }

    typename OpsKV::LaneElem* kt() { return kt_.data(); }                                   // Kᵀ, OpsKV's layout
    typename OpsKV::LaneElem* vt() { return vt_.data(); }                                   // Vᵀ, OpsKV's layout
    typename OpsKV::StagedElem* q_stage() { return stage_.data(); }                         // Q rows as qk reads them
    typename OpsKV::StagedElem* do_stage() { return stage_.data() + stage_elems_; }         // dO rows as qk reads them
    typename OpsKV::StagedElem* q_pv_stage() { return stage_.data() + 2 * stage_elems_; }   // Q rows as pv reads them
    typename OpsKV::StagedElem* do_pv_stage() { return stage_.data() + 3 * stage_elems_; }  // dO rows as pv reads them
    Acc* dkt() { return dkt_.data(); }                 // (dk, BlockKV)     dKᵀ accumulator (unscaled)
    Acc* dvt() { return dvt_.data(); }                 // (dv, BlockKV)     dVᵀ accumulator
    Acc* s() { return s_.data(); }                     // (BlockQ, BlockKV) S = Q·Kᵀ (unscaled), then P
    Acc* dp() { return dp_.data(); }                   // (BlockQ, BlockKV) dP, then dS
    Acc* g() { return g_.data(); }                     // (BlockQ, BlockKV) d score'/d score (score modifiers)
    Acc* ones() { return rows_.data(); }               // (BlockKV)
    Acc* row_buf() { return rows_.data() + BlockKV; }  // (max(dk, dv))

   private:
    AlignedBuffer<typename OpsKV::LaneElem> kt_, vt_;
    AlignedBuffer<typename OpsKV::StagedElem> stage_;
    AlignedBuffer<Acc> dkt_, dvt_, s_, dp_, g_, rows_;
    std::size_t stage_elems_;
  };

  // dQ of query rows [q0, q0 + BlockQ) of head h, and the rows' statistics (written to `stats`).
  // d_bias_rows: where row q0's dS is added (row q0 + r at d_bias_rows + r·seq_k, key j at + j), or null.
  template <class Layout, class Mask>
  static void run_dq(const BackwardParams<T, Layout>& whole, const Mask& mask, const SequenceInfo& seq, index_t q0,
                     DqScratch& s, const RowStats<Acc>& stats, float* d_bias_rows = nullptr) {
    require_score_grad<Mask>();
    const index_t b = seq.batch, h = seq.head;
    const BackwardParams<T, Layout> p = whole.entry(b);
    const index_t q1 = std::min(q0 + BlockQ, seq.seq_q);
    const int rows = int(q1 - q0);
    const int dk = head_dim(p), dv = value_dim(p);
    const index_t h_kv = p.kv_head(h);
    const auto k_rows = dense_kv(p.k), v_rows = dense_kv(p.v);
    const index_t stat0 = stats.offset(h, p.seqs.q_row(b, 0));

    OpsQ::load_lanes(s.qt(), s.row_buf(), p.q, b, h, q0, rows, dk);
    OpsQ::load_lanes(s.dot(), s.row_buf(), p.d_o, b, h, q0, rows, dv);
    row_statistics(p, b, h, q0, rows, dv, s.delta(), s.neg_lse());

    // Clipped to the keys that exist, so that no mask policy, however written, can make us read past K/V.
    // The tiles start at kv_begin, as in the forward, so that the same tiles are asked the same questions.
    const index_t kv_begin = std::max(mask.kv_begin(q0, q1), index_t{0});
    const index_t kv_end = std::min(mask.kv_end(q0, q1), seq.seq_k);
    if constexpr (std::is_same_v<Acc, double>) refine_lse(p, mask, b, h_kv, q0, rows, dk, kv_begin, kv_end, s);
    std::copy(s.delta(), s.delta() + rows, stats.delta + stat0 + q0);
    std::copy(s.neg_lse(), s.neg_lse() + rows, stats.neg_lse + stat0 + q0);

    // The policy that scores the tiles: a copy for one that reads a score table (score_table.hpp).
    std::conditional_t<holds_score_table_v<Mask>, Mask, const Mask&> scoring = mask;
    std::fill(s.dqt(), s.dqt() + std::size_t(dk) * BlockQ, Acc(0));
    for (index_t k0 = kv_begin; k0 < kv_end; k0 += BlockKV) {
      const index_t k1 = std::min(k0 + BlockKV, kv_end);
      const TileKind kind = mask.tile(q0, q1, k0, k1);
      if (kind == TileKind::Empty) continue;
      const int cols = int(k1 - k0);

      const auto k_tile = OpsQ::stage_for_qk(s.k_stage(), k_rows, b, h_kv, k0, cols, dk);
      // Sᵀ (cols, BlockQ) = K·Qᵀ, while this tile's V rows are fetched.
      OpsQ::qk(s.st(), s.qt(), k_tile, cols, dk, prefetch_rows(v_rows, b, h_kv, k0, cols, dv));
      if (kind == TileKind::Partial || modifies_scores_v<Mask>) {
        if constexpr (holds_score_table_v<Mask>)  // score_table.hpp
          bind_table_tile<kIsa>(scoring, s.table_tile(), BlockQ, q0, rows, k0, cols);
        mask_tile<QueryLanes>(s.st(), s.gt(), scoring, Acc(p.scale), TileSpan{q0, rows, k0, cols, true, k0, k1});
      }

      const auto v_tile = OpsQ::stage_for_qk(s.v_stage(), v_rows, b, h_kv, k0, cols, dv);
      OpsQ::qk(s.dpt(), s.dot(), v_tile, cols, dv);  // dPᵀ (cols, BlockQ) = V·dOᵀ

      // Sᵀ -> Pᵀ (kept in st) and dPᵀ -> dSᵀ (in dpt).
      probabilities_and_ds<QueryLanes, modifies_scores_v<Mask>>(s.st(), s.dpt(), s.gt(), cols, score_scale<Mask>(p),
                                                                s.delta(), s.neg_lse());
      if (d_bias_rows != nullptr) add_scores_transposed(d_bias_rows + k0, seq.seq_k, s.dpt(), cols, rows);

      // dQᵀ (dk, BlockQ) += Kᵀ·dSᵀ, while the next tile's K rows are fetched.
      const auto k_as_v = OpsQ::stage_for_pv(s.kv_stage(), k_rows, b, h_kv, k0, cols, dk);
      const int next_cols = int(std::min<index_t>(BlockKV, kv_end - k1));
      OpsQ::pv(s.dqt(), s.ones(), s.dpt(), k_as_v, cols, dk, prefetch_rows(k_rows, b, h_kv, k1, next_cols, dk));
    }
    store_transposed<BlockQ>(p.dq, b, h, q0, rows, dk, s.dqt(), Acc(p.scale));
  }

  // dK and dV of key rows [k0, k0 + BlockKV) of KV head h_kv in batch entry b, summed over the query
  // heads of its group (each with its own policy: core/variants.hpp's policy_for). Reads the row
  // statistics that every run_dq has written.
  template <class Layout, class Mask>
  static void run_dkv(const BackwardParams<T, Layout>& whole, const Mask& mask, index_t b, index_t h_kv, index_t k0,
                      DkvScratch& s, const RowStats<Acc>& stats) {
    const BackwardParams<T, Layout> p = whole.entry(b);
    const index_t seq_q = p.seqs.q_len(b);
    const index_t k1 = std::min(k0 + BlockKV, p.seqs.kv_len(b));
    const int cols = int(k1 - k0);
    const int dk = head_dim(p), dv = value_dim(p);
    const auto q_rows_src = dense_kv(p.q), do_rows_src = dense_kv(p.d_o);

    OpsKV::load_lanes(s.kt(), s.row_buf(), p.k, b, h_kv, k0, cols, dk);
    OpsKV::load_lanes(s.vt(), s.row_buf(), p.v, b, h_kv, k0, cols, dv);
    std::fill(s.dkt(), s.dkt() + std::size_t(dk) * BlockKV, Acc(0));
    std::fill(s.dvt(), s.dvt() + std::size_t(dv) * BlockKV, Acc(0));

    const index_t q_blocks = (seq_q + BlockQ - 1) / BlockQ;
    for (index_t h = h_kv * p.group; h < (h_kv + 1) * p.group; ++h) {
      const auto head_mask = policy_for(mask, sequence_info(p.seqs, b, h));
      using HeadMask = std::remove_cv_t<decltype(head_mask)>;
      require_score_grad<HeadMask>();
      const Acc* delta = stats.delta + stats.offset(h, p.seqs.q_row(b, 0));
      const Acc* neg_lse = stats.neg_lse + stats.offset(h, p.seqs.q_row(b, 0));

      for (index_t qb = 0; qb < q_blocks; ++qb) {
        const index_t q0 = qb * BlockQ, q1 = std::min(q0 + BlockQ, seq_q);
        // The keys of this block that the query block can keep, on the forward's terms: inside the
        // block's [kv_begin, kv_end) and in a tile the policy does not call Empty.
        const index_t lo = std::max({head_mask.kv_begin(q0, q1), k0, index_t{0}});
        const index_t hi = std::min({head_mask.kv_end(q0, q1), k1});
        if (lo >= hi) continue;
        const TileKind kind = head_mask.tile(q0, q1, lo, hi);
        if (kind == TileKind::Empty) continue;
        const bool partial = kind == TileKind::Partial || lo > k0 || hi < k1;
        const int rows = int(q1 - q0);

        const auto q_rows = OpsKV::stage_for_qk(s.q_stage(), q_rows_src, b, h, q0, rows, dk);
        // S (rows, BlockKV) = Q·Kᵀ, while this block's dO rows are fetched.
        OpsKV::qk(s.s(), s.kt(), q_rows, rows, dk, prefetch_rows(do_rows_src, b, h, q0, rows, dv));
        if (partial || modifies_scores_v<HeadMask> || cols < BlockKV)
          mask_tile<KeyLanes>(s.s(), s.g(), head_mask, Acc(p.scale), TileSpan{q0, rows, k0, cols, partial, lo, hi});
        const auto do_rows = OpsKV::stage_for_qk(s.do_stage(), do_rows_src, b, h, q0, rows, dv);
        OpsKV::qk(s.dp(), s.vt(), do_rows, rows, dv);  // dP (rows, BlockKV) = dO·Vᵀ

        // S -> P (in s) and dP -> dS (in dp).
        probabilities_and_ds<KeyLanes, modifies_scores_v<HeadMask>>(s.s(), s.dp(), s.g(), rows,
                                                                    score_scale<HeadMask>(p), delta + q0, neg_lse + q0);

        const auto do_as_v = OpsKV::stage_for_pv(s.do_pv_stage(), do_rows_src, b, h, q0, rows, dv);
        OpsKV::pv(s.dvt(), s.ones(), s.s(), do_as_v, rows, dv);  // dVᵀ (dv, BlockKV) += dOᵀ·P
        const auto q_as_v = OpsKV::stage_for_pv(s.q_pv_stage(), q_rows_src, b, h, q0, rows, dk);
        const int next_rows = int(std::min<index_t>(BlockQ, seq_q - q1));
        OpsKV::pv(s.dkt(), s.ones(), s.dp(), q_as_v, rows, dk,
                  prefetch_rows(q_rows_src, b, h, q1, next_rows, dk));  // dKᵀ (dk, BlockKV) += Qᵀ·dS
      }
    }
    store_transposed<BlockKV>(p.dk, b, h_kv, k0, cols, dk, s.dkt(), Acc(p.scale));
    store_transposed<BlockKV>(p.dv, b, h_kv, k0, cols, dv, s.dvt(), Acc(1));
  }

  // The head dims of a call: compile-time (HeadDim, when Q/K's and V's agree) or its own.
  template <class Params>
  static int head_dim(const Params& p) {
    return HeadDim > 0 ? HeadDim : int(p.q.dim);
  }
  template <class Params>
  static int value_dim(const Params& p) {
    return HeadDim > 0 ? HeadDim : int(p.v.dim);
  }

 private:
  static constexpr Acc kLog2e = Acc(1.4426950408889634074);
  static constexpr Acc kInf = std::numeric_limits<Acc>::infinity();

  template <class Mask>
  static void require_score_grad() {
    static_assert(differentiable_mask_v<Mask>,
                  "flashattn: the backward differentiates through a score-changing mask policy (modifies_scores) "
                  "only if it provides score_grad(i, j, s) = d score(i, j, s)/ds; build it with "
                  "score_mod(base, fn, grad_fn) (core/variants.hpp)");
    static_assert(!transforms_output_v<Mask>,
                  "flashattn: the backward does not differentiate through an output transform (transform_output)");
  }

  // What multiplies a score tile on its way into the softmax: the tiles hold unscaled q·k, except under a
  // score modifier, which has already turned them into natural-unit scores s' = score(scale·q·k).
  template <class Mask, class Layout>
  static Acc score_scale(const BackwardParams<T, Layout>& p) {
    return modifies_scores_v<Mask> ? Acc(1) : Acc(p.scale);
  }

  // P = exp(scale·s − LSE), computed as 2^(fma(s, scale, −LSE)·log2(e)). The fused multiply-subtract
  // rounds once, and only the (small, for every P that matters) difference is scaled by log2(e): folding
  // scale·log2(e) into Q and the LSE, as the forward does with its running max, would round both large
  // terms before they cancel, costing P several ulps that the gradients then carry.
  static Reg probability(Reg s, Reg scale, Reg neg_lse) {
    return V::exp2_nonpositive(V::mul(V::fma(s, scale, neg_lse), V::set1(kLog2e)));
  }

  // D_i = Σ_c dO[i][c]·O[i][c] − dLSE_i (dLSE: BackwardExtras, 0 without it) and −LSE_i (−inf where the
  // row kept no key). dS_ij = P_ij·(dP_ij − D_i): the LSE's own gradient reaches s_ij through
  // ∂LSE_i/∂s_ij = P_ij, which is −dLSE_i inside the bracket. Padding rows get D = 0 and −LSE = −inf, so
  // their P and dS are exactly 0.
  template <class Layout>
  static void row_statistics(const BackwardParams<T, Layout>& p, index_t b, index_t h, index_t q0, int rows, int d,
                             Acc* delta, Acc* neg_lse) {
    for (int i = 0; i < rows; ++i) {
      const T* o_row = p.o.row(b, q0 + i, h);
      const T* do_row = p.d_o.row(b, q0 + i, h);
      Acc sum = 0;
      for (int c = 0; c < d; ++c) sum += Acc(o_row[c * p.o.stride_dim]) * Acc(do_row[c * p.d_o.stride_dim]);
      if (!p.d_lse.empty()) sum -= Acc(p.d_lse(b, h, q0 + i));
      delta[i] = sum;
      const float l = p.lse(b, h, q0 + i);
      neg_lse[i] = l == -std::numeric_limits<float>::infinity() ? -kInf : -Acc(l);
    }
    std::fill(delta + rows, delta + BlockQ, Acc(0));
    std::fill(neg_lse + rows, neg_lse + BlockQ, -kInf);
  }

  // The LSE is stored as float whatever T is; for double that would cap the gradients' accuracy at
  // float's. So the double path refines it: with the stored value as the shift (within float rounding of
  // the true LSE, so nothing overflows), one more sweep sums ℓ = Σ_j exp(s_j − LSE) in double, and
  // LSE += log(ℓ). One extra Q·Kᵀ per tile: double is the accuracy reference, not a speed target.
  template <class Mask, class Layout>
  static void refine_lse(const BackwardParams<T, Layout>& p, const Mask& mask, index_t b, index_t h_kv, index_t q0,
                         int rows, int d, index_t kv_begin, index_t kv_end, DqScratch& s) {
    alignas(64) Acc sums[BlockQ] = {};
    // A sink (core/variants.hpp) is one more term of every row's sum: exp(sink − LSE).
    if constexpr (has_sink_v<Mask>) {
      for (int i = 0; i < rows; ++i) {
        const Acc neg_lse = s.neg_lse()[i];
        if (neg_lse != -kInf) sums[i] = std::exp(Acc(mask.sink_logit()) + neg_lse);
      }
    }
    const index_t q1 = q0 + rows;
    const Reg scale = V::set1(score_scale<Mask>(p));
    for (index_t k0 = kv_begin; k0 < kv_end; k0 += BlockKV) {
      const index_t k1 = std::min(k0 + BlockKV, kv_end);
      const TileKind kind = mask.tile(q0, q1, k0, k1);
      if (kind == TileKind::Empty) continue;
      const int cols = int(k1 - k0);
      const auto k_tile = OpsQ::stage_for_qk(s.k_stage(), dense_kv(p.k), b, h_kv, k0, cols, d);
      OpsQ::qk(s.st(), s.qt(), k_tile, cols, d);
      if (kind == TileKind::Partial || modifies_scores_v<Mask>)
        mask_tile<QueryLanes>(s.st(), s.gt(), mask, Acc(p.scale), TileSpan{q0, rows, k0, cols, true, k0, k1});
      for (int i = 0; i < BlockQ; i += W) {
        const Reg shift = V::load(s.neg_lse() + i);
        Reg sum = V::load(sums + i);
        for (int j = 0; j < cols; ++j) sum = V::add(sum, probability(V::load(s.st() + j * BlockQ + i), scale, shift));
        V::store(sums + i, sum);
      }
    }
    for (int i = 0; i < rows; ++i) {
      Acc& neg_lse = s.neg_lse()[i];
      if (neg_lse == -kInf) continue;
      neg_lse = sums[i] > Acc(0) ? neg_lse - std::log(sums[i]) : -kInf;
    }
  }

  // The part of the score grid a score tile covers: query rows [q0, q0 + rows), key columns
  // [k0, k0 + cols), of which only [lo, hi) can be kept (the forward visited no other key for this query
  // block); `partial`: some element of it may be masked.
  struct TileSpan {
    index_t q0;
    int rows;
    index_t k0;
    int cols;
    bool partial;
    index_t lo, hi;
  };

  // The two layouts of a score tile (S, then P; dP, then dS; the score modifier's derivatives G), as
  // types. A tile row holds `Lanes` consecutive entries of one index, in packets:
  //   QueryLanes, the dQ program's Sᵀ (BlockKV, BlockQ): a row per key, the queries along the lanes;
  //   KeyLanes, the dK/dV program's S (BlockQ, BlockKV): a row per query, the keys along the lanes.
  // A query's statistics (D, −LSE) are then a packet of the lanes or one broadcast per row, and a mask
  // applied by ranges uses the interval of queries keeping each key (has_query_range) or of keys kept by
  // each query (has_key_range).
  struct QueryLanes {
    static constexpr int Lanes = BlockQ;
    static int tile_rows(const TileSpan& t) { return t.cols; }
    static int lanes_used(const TileSpan& t) { return t.rows; }
    static index_t query(const TileSpan& t, int /*row*/, int lane) { return t.q0 + lane; }
    static index_t key(const TileSpan& t, int row, int /*lane*/) { return t.k0 + row; }
    // The same for a packet of lanes from `lane` on: the queries a row of positions, the key one index.
    static Positions<W> query_at(const TileSpan& t, int /*row*/, int lane) { return {t.q0 + lane, 1}; }
    static index_t key_at(const TileSpan& t, int row, int /*lane*/) { return t.k0 + row; }
    static Reg query_stat(const Acc* stat, int /*row*/, int lane) { return V::load(stat + lane); }
    template <class Mask>
    static constexpr bool by_ranges = has_query_range<Mask>::value;
    template <class Mask>
    static RowSpan kept_lanes(const Mask& mask, const TileSpan& t, int row) {
      return rows_keeping_key(mask, t.k0 + row, t.q0, t.rows);
    }
  };
  struct KeyLanes {
    static constexpr int Lanes = BlockKV;
    static int tile_rows(const TileSpan& t) { return t.rows; }
    static int lanes_used(const TileSpan& t) { return t.cols; }
    static index_t query(const TileSpan& t, int row, int /*lane*/) { return t.q0 + row; }
    static index_t key(const TileSpan& t, int /*row*/, int lane) { return t.k0 + lane; }
    static index_t query_at(const TileSpan& t, int row, int /*lane*/) { return t.q0 + row; }
    static Positions<W> key_at(const TileSpan& t, int /*row*/, int lane) { return {t.k0 + lane, 1}; }
    static Reg query_stat(const Acc* stat, int row, int /*lane*/) { return V::set1(stat[row]); }
    template <class Mask>
    static constexpr bool by_ranges = has_key_range<Mask>::value;
    template <class Mask>
    static RowSpan kept_lanes(const Mask& mask, const TileSpan& t, int row) {
      if (!t.partial) return {0, t.cols};
      const index_t i = t.q0 + row;
      const index_t first = std::clamp<index_t>(std::max(t.lo, mask.lowest_key(i)) - t.k0, 0, t.cols);
      return {first, std::clamp<index_t>(std::min(t.hi, mask.highest_key(i) + 1) - t.k0, first, t.cols)};
    }
  };

  // S -> P and dP -> dS = P ∘ (dP − D) [∘ G], on a tile of either layout, for its first `tile_rows` rows.
  template <class Layout, bool kScoreGrad>
  static void probabilities_and_ds(Acc* s, Acc* dp, const Acc* g, int tile_rows, Acc score_scale, const Acc* delta,
                                   const Acc* neg_lse) {
    const Reg scale = V::set1(score_scale);
    for (int r = 0; r < tile_rows; ++r) {
      for (int l = 0; l < Layout::Lanes; l += W) {
        const int at = r * Layout::Lanes + l;
        const Reg pr = probability(V::load(s + at), scale, Layout::query_stat(neg_lse, r, l));
        Reg ds = V::mul(pr, V::sub(V::load(dp + at), Layout::query_stat(delta, r, l)));
        if constexpr (kScoreGrad) ds = V::mul(ds, V::load(g + at));
        V::store(s + at, pr);
        V::store(dp + at, ds);
      }
    }
  }

  // out[r·stride + c] += tile[c·BlockQ + r] for the tile's `rows` queries and `cols` keys: a transposed
  // (keys, BlockQ) score tile added into a row-major (queries, keys) matrix (d_bias).
  static void add_scores_transposed(float* out, index_t stride, const Acc* tile, int cols, int rows) {
    for (int r = 0; r < rows; ++r) {
      float* row = out + r * stride;
      for (int c = 0; c < cols; ++c) row[c] += float(tile[c * BlockQ + r]);
    }
  }

  // Partial or score-modified tiles, of either layout: masked scores become −inf (P exactly 0) with
  // gradient factor 0, and so do keys outside [lo, hi); kept ones get the modifier (natural units) and
  // its derivative. A keep-mask that names the layout's intervals (Layout::by_ranges) is applied by
  // ranges, as the forward's apply_mask: the masked part of a tile row is a prefix and a suffix. Lanes
  // past the tile's last key (KeyLanes' padding columns) are masked too, so that nothing but exact
  // zeros reaches the discarded lanes; past its last query (QueryLanes' padding rows) −LSE = −inf does
  // that.
  template <class Layout, class Mask>
  static void mask_tile(Acc* s, Acc* g, const Mask& mask, Acc scale, const TileSpan& t) {
    const int lanes = Layout::lanes_used(t);
    if constexpr (lane_scores_v<Mask>) {
      mask_tile_by_lanes<Layout>(s, g, mask, scale, t, lanes);
      return;
    }
    for (int r = 0; r < Layout::tile_rows(t); ++r) {
      Acc* s_row = s + r * Layout::Lanes;
      if constexpr (Layout::template by_ranges<Mask> && !modifies_scores_v<Mask>) {
        const RowSpan kept = Layout::kept_lanes(mask, t, r);
        mask_outside(s_row, kept.first, kept.last, lanes);
      } else {
        Acc* g_row = g + r * Layout::Lanes;
        for (int l = 0; l < lanes; ++l) {
          const index_t i = Layout::query(t, r, l), j = Layout::key(t, r, l);
          const bool keep = !t.partial || (j >= t.lo && j < t.hi && mask.keep(i, j));
          modify(s_row[l], g_row[l], mask, scale, keep, i, j);
        }
      }
      if constexpr (std::is_same_v<Layout, KeyLanes>) std::fill(s_row + lanes, s_row + Layout::Lanes, -kInf);
    }
  }

  // mask_tile for a score modifier written for lanes (core/lanes.hpp): the modifier and its derivative a
  // packet of the layout's lanes at a time, then the mask. Lanes past the tile's used ones (padding rows or
  // columns) are set to −inf with derivative 0, so that whatever the modifier made of them stays out.
  template <class Layout, class Mask>
  static void mask_tile_by_lanes(Acc* s, Acc* g, const Mask& mask, Acc scale, const TileSpan& t, int lanes) {
    using L = Lanes<Acc, W>;
    const L natural(scale);
    for (int r = 0; r < Layout::tile_rows(t); ++r) {
      Acc* s_row = s + r * Layout::Lanes;
      Acc* g_row = g + r * Layout::Lanes;
      for (int l = 0; l < lanes; l += W) {
        const L x = L::load(s_row + l) * natural;
        const auto i = Layout::query_at(t, r, l);
        const auto j = Layout::key_at(t, r, l);
        L(mask.score(i, j, x)).store(s_row + l);
        if constexpr (lane_score_grads_v<Mask>) {
          L(mask.score_grad(i, j, x)).store(g_row + l);
        } else {
          for (int u = 0; u < W; ++u)
            g_row[l + u] = Acc(mask.score_grad(Layout::query(t, r, l + u), Layout::key(t, r, l + u), x.v[u]));
        }
      }
      if (t.partial) {
        for (int l = 0; l < lanes; ++l) {
          const index_t i = Layout::query(t, r, l), j = Layout::key(t, r, l);
          if (!(j >= t.lo && j < t.hi && mask.keep(i, j))) s_row[l] = -kInf, g_row[l] = Acc(0);
        }
      }
      std::fill(s_row + lanes, s_row + Layout::Lanes, -kInf);
      std::fill(g_row + lanes, g_row + Layout::Lanes, Acc(0));
    }
  }

  // Scores [0, lo) and [hi, n) of a row masked (−inf). Only for keep-masks, whose gradient factors are
  // never read (probabilities_and_ds uses them under a score modifier only).
  static void mask_outside(Acc* s, index_t lo, index_t hi, index_t n) {
    std::fill(s, s + lo, -kInf);
    std::fill(s + hi, s + n, -kInf);
  }

  // One element: −inf (and gradient factor 0) if masked; under a score modifier, the natural-unit score
  // s' = score(scale·s) and its derivative.
  template <class Mask>
  static void modify(Acc& s, Acc& g, const Mask& mask, Acc scale, bool keep, index_t i, index_t j) {
    if (!keep) {
      s = -kInf;
      g = Acc(0);
    } else if constexpr (modifies_scores_v<Mask>) {
      const Acc natural = s * scale;
      s = Acc(mask.score(i, j, natural));
      g = Acc(mask.score_grad(i, j, natural));
    }
  }

  // out[r0 + i][c] = T(scale · src[c][i]) for the n real rows of a block. src is consumed: with unit dim
  // stride it is scaled in place and moved by the forward's 16 × 16 (converting) transposes, which give
  // the same bits as the element loop.
  template <int Block>
  static void store_transposed(const TensorView<T>& out, index_t b, index_t h, index_t r0, int n, int d, Acc* src,
                               Acc scale) {
    if (out.stride_dim == 1) {
      if (scale != Acc(1))
        for (int c = 0; c < d; ++c)
          for (int i = 0; i < n; ++i) src[c * Block + i] *= scale;
      transpose<kIsa>(src, Block, out.row(b, r0, h), out.stride_seq, d, n);
      return;
    }
    for (int i = 0; i < n; ++i) {
      T* row = out.row(b, r0 + i, h);
      for (int c = 0; c < d; ++c) row[c * out.stride_dim] = T(src[c * Block + i] * scale);
    }
  }
};

}  // namespace flashattn::cpu
