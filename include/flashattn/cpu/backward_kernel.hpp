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
//   DqProgram  (batch, query head, query block): recomputes S, P, dP, dS against every key tile its mask
//              keeps and accumulates dQ (HeadDim, BlockQ) in registers/L1. It also produces the per-row
//              statistics (D and the LSE in base-2 units) that the other program reads.
//   DkvProgram (batch, KV head, key block): owns dK and dV (HeadDim, BlockKV) of its keys, and loops over
//              every query head of its GQA group and every query block that keeps one of its keys.
//
// dQ is a separate program rather than a by-product of DkvProgram: summing dQ's contributions from many
// key blocks would need either racing adds (not deterministic) or one partial dQ per key block (memory
// O(N²·d / BlockKV)). The price is recomputing S and dP in the dQ program: 7 tile GEMMs where the FLOP
// count credits 5 (docs/backward.md). Extra memory is the two per-row statistics, O(batch·heads·seq_q),
// plus per-worker tiles: no (seq_q × seq_k) buffer exists anywhere.
//
// Both programs use the forward's micro-kernels (tile_ops.hpp) on the transposed layout, with the roles
// of the packet dimension chosen per program: query rows in DqProgram (as in the forward), key rows in
// DkvProgram, so that each program's accumulators have the rows it owns in the packets and the rows it
// streams (K, V rows for dQ; Q, dO rows for dK, dV) are read in place by broadcasts.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "flashattn/backward_masks.hpp"
#include "flashattn/backward_params.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/convert.hpp"
#include "flashattn/cpu/simd.hpp"
#include "flashattn/cpu/tile_ops.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/masks.hpp"

namespace flashattn::cpu {

// Per query row, shared between the two programs: D = rowsum(dO ∘ O) and −LSE. Rows that kept no key
// (LSE −inf) store −LSE = −inf as well, so that their recomputed P = exp(s − LSE) is exactly 0 and their
// gradients vanish without a NaN from −inf − (−inf).
template <class Acc>
struct RowStats {
  Acc* delta = nullptr;    // (batch, heads_q, seq_q)
  Acc* neg_lse = nullptr;  // (batch, heads_q, seq_q)
  index_t heads = 0, seq = 0;

  index_t offset(index_t b, index_t h) const { return (b * heads + h) * seq; }
};

template <class T, class TileConfig, int HeadDim>
class BackwardKernel {
 public:
  using Acc = acc_t<T>;
  static constexpr int BlockQ = TileConfig::BlockQ;
  static constexpr int BlockKV = TileConfig::BlockKV;
  static constexpr Isa kIsa = TileConfig::isa;
  using V = Simd<Acc, kIsa>;
  using Reg = typename V::Reg;
  static constexpr int W = V::width;
  using OpsQ = TileOps<Acc, BlockQ, HeadDim, kIsa>;    // packets along query rows
  using OpsKV = TileOps<Acc, BlockKV, HeadDim, kIsa>;  // packets along key rows
  static_assert(BlockKV % W == 0,
                "the backward holds a key block in packets: BlockKV must be a multiple of the packet width");

  // The working set of one dQ worker, reused across its programs.
  class DqScratch {
   public:
    explicit DqScratch(int d)
        : qt_(std::size_t(d) * BlockQ),
          dot_(std::size_t(d) * BlockQ),
          dqt_(std::size_t(d) * BlockQ),
          st_(std::size_t(BlockKV) * BlockQ),
          dpt_(std::size_t(BlockKV) * BlockQ),
          gt_(std::size_t(BlockKV) * BlockQ),
          kv_(2 * std::size_t(BlockKV) * d),
          rows_(3 * std::size_t(BlockQ)) {
      // Lanes the score modifier never writes (padding rows) must multiply by a finite 0.
      std::fill(gt_.data(), gt_.data() + gt_.size(), Acc(0));
      std::fill(ones(), ones() + BlockQ, Acc(1));
    }

    Acc* qt() { return qt_.data(); }                   // (d, BlockQ)       Qᵀ
    Acc* dot() { return dot_.data(); }                 // (d, BlockQ)       dOᵀ
    Acc* dqt() { return dqt_.data(); }                 // (d, BlockQ)       dQᵀ accumulator
    Acc* st() { return st_.data(); }                   // (BlockKV, BlockQ) Sᵀ = K·Qᵀ (unscaled), then Pᵀ
    Acc* dpt() { return dpt_.data(); }                 // (BlockKV, BlockQ) dPᵀ, then dSᵀ
    Acc* gt() { return gt_.data(); }                   // (BlockKV, BlockQ) d score'/d score (score modifiers)
    Acc* k_stage() { return kv_.data(); }              // (BlockKV, d)      K tile in Acc, when staging is needed
    Acc* v_stage() { return kv_.data() + kv_.size() / 2; }
    Acc* delta() { return rows_.data(); }              // (BlockQ)          D; 0 in padding rows
    Acc* neg_lse() { return rows_.data() + BlockQ; }   // (BlockQ)          −LSE; −inf in padding rows
    Acc* ones() { return rows_.data() + 2 * BlockQ; }  // (BlockQ)          pv's rescale factors: none here

   private:
    AlignedBuffer<Acc> qt_, dot_, dqt_, st_, dpt_, gt_, kv_, rows_;
  };

  // The working set of one dK/dV worker.
  class DkvScratch {
   public:
    explicit DkvScratch(int d)
        : kt_(std::size_t(d) * BlockKV),
          vt_(std::size_t(d) * BlockKV),
          dkt_(std::size_t(d) * BlockKV),
          dvt_(std::size_t(d) * BlockKV),
          s_(std::size_t(BlockQ) * BlockKV),
          dp_(std::size_t(BlockQ) * BlockKV),
          g_(std::size_t(BlockQ) * BlockKV),
          qo_(2 * std::size_t(BlockQ) * d),
          ones_(std::size_t(BlockKV)) {
      std::fill(g_.data(), g_.data() + g_.size(), Acc(0));
      std::fill(ones_.data(), ones_.data() + BlockKV, Acc(1));
    }

    Acc* kt() { return kt_.data(); }                // (d, BlockKV)      Kᵀ
    Acc* vt() { return vt_.data(); }                // (d, BlockKV)      Vᵀ
    Acc* dkt() { return dkt_.data(); }              // (d, BlockKV)      dKᵀ accumulator (unscaled)
    Acc* dvt() { return dvt_.data(); }              // (d, BlockKV)      dVᵀ accumulator
    Acc* s() { return s_.data(); }                  // (BlockQ, BlockKV) S = Q·Kᵀ (unscaled), then P
    Acc* dp() { return dp_.data(); }                // (BlockQ, BlockKV) dP, then dS
    Acc* g() { return g_.data(); }                  // (BlockQ, BlockKV) d score'/d score (score modifiers)
    Acc* q_stage() { return qo_.data(); }           // (BlockQ, d)       Q rows in Acc, when staging is needed
    Acc* do_stage() { return qo_.data() + qo_.size() / 2; }
    Acc* ones() { return ones_.data(); }            // (BlockKV)

   private:
    AlignedBuffer<Acc> kt_, vt_, dkt_, dvt_, s_, dp_, g_, qo_, ones_;
  };

  // dQ of query rows [q0, q0 + BlockQ) of head h, and the rows' statistics (written to `stats`).
  template <class Mask>
  static void run_dq(const BackwardParams<T>& p, const Mask& mask, index_t b, index_t h, index_t q0, DqScratch& s,
                     const RowStats<Acc>& stats) {
    require_score_grad<Mask>();
    const index_t q1 = std::min(q0 + BlockQ, p.q.seq);
    const int rows = int(q1 - q0);
    const int d = HeadDim > 0 ? HeadDim : int(p.q.dim);
    const index_t h_kv = p.kv_head(h);

    load_transposed<BlockQ>(s.qt(), p.q, b, h, q0, rows, d);
    load_transposed<BlockQ>(s.dot(), p.d_o, b, h, q0, rows, d);
    row_statistics(p, b, h, q0, rows, d, s.delta(), s.neg_lse());

    // Clipped to the keys that exist, so that no mask policy, however written, can make us read past K/V.
    // The tiles start at kv_begin, as in the forward, so that the same tiles are asked the same questions.
    const index_t kv_begin = std::max(mask.kv_begin(q0, q1), index_t{0});
    const index_t kv_end = std::min(mask.kv_end(q0, q1), p.k.seq);
    if constexpr (std::is_same_v<Acc, double>) refine_lse(p, mask, b, h_kv, q0, rows, d, kv_begin, kv_end, s);
    std::copy(s.delta(), s.delta() + rows, stats.delta + stats.offset(b, h) + q0);
    std::copy(s.neg_lse(), s.neg_lse() + rows, stats.neg_lse + stats.offset(b, h) + q0);

    std::fill(s.dqt(), s.dqt() + std::size_t(d) * BlockQ, Acc(0));
    for (index_t k0 = kv_begin; k0 < kv_end; k0 += BlockKV) {
      const index_t k1 = std::min(k0 + BlockKV, kv_end);
      const TileKind kind = mask.tile(q0, q1, k0, k1);
      if (kind == TileKind::Empty) continue;
      const int cols = int(k1 - k0);

      index_t k_ld = 0, v_ld = 0;
      const Acc* k_tile = rows_of(p.k, b, h_kv, k0, cols, d, s.k_stage(), k_ld);
      OpsQ::qk(s.st(), s.qt(), k_tile, k_ld, cols, d);  // Sᵀ (cols, BlockQ)
      if (kind == TileKind::Partial || Mask::modifies_scores)
        mask_transposed(s.st(), s.gt(), mask, Acc(p.scale), q0, rows, k0, cols);

      const Acc* v_tile = rows_of(p.v, b, h_kv, k0, cols, d, s.v_stage(), v_ld);
      OpsQ::qk(s.dpt(), s.dot(), v_tile, v_ld, cols, d);  // dPᵀ (cols, BlockQ) = V·dOᵀ

      // Sᵀ -> Pᵀ (kept in st) and dPᵀ -> dSᵀ (in dpt).
      probabilities_and_ds_transposed<Mask::modifies_scores>(s.st(), s.dpt(), s.gt(), cols, score_scale<Mask>(p),
                                                             s.delta(), s.neg_lse());

      OpsQ::pv(s.dqt(), s.ones(), s.dpt(), k_tile, k_ld, cols, d);  // dQᵀ (d, BlockQ) += Kᵀ·dSᵀ
    }
    store_transposed<BlockQ>(p.dq, b, h, q0, rows, d, s.dqt(), Acc(p.scale));
  }

  // dK and dV of key rows [k0, k0 + BlockKV) of KV head h_kv, summed over the query heads of its group.
  // Reads the row statistics that every run_dq has written.
  template <class Mask>
  static void run_dkv(const BackwardParams<T>& p, const Mask& mask, index_t b, index_t h_kv, index_t k0,
                      DkvScratch& s, const RowStats<Acc>& stats) {
    const index_t k1 = std::min(k0 + BlockKV, p.k.seq);
    const int cols = int(k1 - k0);
    const int d = HeadDim > 0 ? HeadDim : int(p.q.dim);

    load_transposed<BlockKV>(s.kt(), p.k, b, h_kv, k0, cols, d);
    load_transposed<BlockKV>(s.vt(), p.v, b, h_kv, k0, cols, d);
    std::fill(s.dkt(), s.dkt() + std::size_t(d) * BlockKV, Acc(0));
    std::fill(s.dvt(), s.dvt() + std::size_t(d) * BlockKV, Acc(0));

    const index_t q_blocks = (p.q.seq + BlockQ - 1) / BlockQ;
    for (index_t h = h_kv * p.group; h < (h_kv + 1) * p.group; ++h) {
      const auto head_mask = mask_for_head(mask, b, h);
      using HeadMask = std::remove_cv_t<decltype(head_mask)>;
      require_score_grad<HeadMask>();
      const Acc* delta = stats.delta + stats.offset(b, h);
      const Acc* neg_lse = stats.neg_lse + stats.offset(b, h);

      for (index_t qb = 0; qb < q_blocks; ++qb) {
        const index_t q0 = qb * BlockQ, q1 = std::min(q0 + BlockQ, p.q.seq);
        // The keys of this block that the query block can keep, on the forward's terms: inside the
        // block's [kv_begin, kv_end) and in a tile the policy does not call Empty.
        const index_t lo = std::max({head_mask.kv_begin(q0, q1), k0, index_t{0}});
        const index_t hi = std::min({head_mask.kv_end(q0, q1), k1});
        if (lo >= hi) continue;
        const TileKind kind = head_mask.tile(q0, q1, lo, hi);
        if (kind == TileKind::Empty) continue;
        const bool partial = kind == TileKind::Partial || lo > k0 || hi < k1;
        const int rows = int(q1 - q0);

        index_t q_ld = 0, do_ld = 0;
        const Acc* q_rows = rows_of(p.q, b, h, q0, rows, d, s.q_stage(), q_ld);
        const Acc* do_rows = rows_of(p.d_o, b, h, q0, rows, d, s.do_stage(), do_ld);
        OpsKV::qk(s.s(), s.kt(), q_rows, q_ld, rows, d);  // S (rows, BlockKV)
        if (partial || HeadMask::modifies_scores || cols < BlockKV)
          mask_rows(s.s(), s.g(), head_mask, Acc(p.scale), partial, q0, rows, k0, cols, lo, hi);
        OpsKV::qk(s.dp(), s.vt(), do_rows, do_ld, rows, d);  // dP (rows, BlockKV) = dO·Vᵀ

        // S -> P (in s) and dP -> dS (in dp).
        probabilities_and_ds_rows<HeadMask::modifies_scores>(s.s(), s.dp(), s.g(), rows, score_scale<HeadMask>(p),
                                                             delta + q0, neg_lse + q0);

        OpsKV::pv(s.dvt(), s.ones(), s.s(), do_rows, do_ld, rows, d);  // dVᵀ (d, BlockKV) += dOᵀ·P
        OpsKV::pv(s.dkt(), s.ones(), s.dp(), q_rows, q_ld, rows, d);   // dKᵀ (d, BlockKV) += Qᵀ·dS
      }
    }
    store_transposed<BlockKV>(p.dk, b, h_kv, k0, cols, d, s.dkt(), Acc(p.scale));
    store_transposed<BlockKV>(p.dv, b, h_kv, k0, cols, d, s.dvt(), Acc(1));
  }

 private:
  static constexpr Acc kLog2e = Acc(1.4426950408889634074);
  static constexpr Acc kInf = std::numeric_limits<Acc>::infinity();

  template <class Mask>
  static void require_score_grad() {
    static_assert(differentiable_mask_v<Mask>,
                  "flashattn: the backward differentiates through a score-changing mask policy (modifies_scores) "
                  "only if it provides score_grad(i, j, s) = d score(i, j, s)/ds; build it with "
                  "score_mod(base, fn, grad_fn) (backward_masks.hpp)");
  }

  // What multiplies a score tile on its way into the softmax: the tiles hold unscaled q·k, except under a
  // score modifier, which has already turned them into natural-unit scores s' = score(scale·q·k).
  template <class Mask>
  static Acc score_scale(const BackwardParams<T>& p) {
    return Mask::modifies_scores ? Acc(1) : Acc(p.scale);
  }

  // P = exp(scale·s − LSE), computed as 2^(fma(s, scale, −LSE)·log2(e)). The fused multiply-subtract
  // rounds once, and only the (small, for every P that matters) difference is scaled by log2(e): folding
  // scale·log2(e) into Q and the LSE, as the forward does with its running max, would round both large
  // terms before they cancel, costing P several ulps that the gradients then carry.
  static Reg probability(Reg s, Reg scale, Reg neg_lse) {
    return V::exp2_nonpositive(V::mul(V::fma(s, scale, neg_lse), V::set1(kLog2e)));
  }

  // D_i = Σ_c dO[i][c]·O[i][c] and −LSE_i (−inf where the row kept no key). Padding rows get D = 0 and
  // −LSE = −inf, so their P and dS are exactly 0.
  static void row_statistics(const BackwardParams<T>& p, index_t b, index_t h, index_t q0, int rows, int d,
                             Acc* delta, Acc* neg_lse) {
    for (int i = 0; i < rows; ++i) {
      const T* o_row = p.o.row(b, q0 + i, h);
      const T* do_row = p.d_o.row(b, q0 + i, h);
      Acc sum = 0;
      for (int c = 0; c < d; ++c) sum += Acc(o_row[c * p.o.stride_dim]) * Acc(do_row[c * p.d_o.stride_dim]);
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
  template <class Mask>
  static void refine_lse(const BackwardParams<T>& p, const Mask& mask, index_t b, index_t h_kv, index_t q0, int rows,
                         int d, index_t kv_begin, index_t kv_end, DqScratch& s) {
    alignas(64) Acc sums[BlockQ] = {};
    const index_t q1 = q0 + rows;
    const Reg scale = V::set1(score_scale<Mask>(p));
    for (index_t k0 = kv_begin; k0 < kv_end; k0 += BlockKV) {
      const index_t k1 = std::min(k0 + BlockKV, kv_end);
      const TileKind kind = mask.tile(q0, q1, k0, k1);
      if (kind == TileKind::Empty) continue;
      const int cols = int(k1 - k0);
      index_t k_ld = 0;
      const Acc* k_tile = rows_of(p.k, b, h_kv, k0, cols, d, s.k_stage(), k_ld);
      OpsQ::qk(s.st(), s.qt(), k_tile, k_ld, cols, d);
      if (kind == TileKind::Partial || Mask::modifies_scores)
        mask_transposed(s.st(), s.gt(), mask, Acc(p.scale), q0, rows, k0, cols);
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

  // Sᵀ (cols, BlockQ) -> Pᵀ and dPᵀ -> dSᵀ = Pᵀ ∘ (dPᵀ − D) [∘ Gᵀ]: lane-wise, since a packet holds
  // consecutive query rows.
  template <bool kScoreGrad>
  static void probabilities_and_ds_transposed(Acc* st, Acc* dpt, const Acc* gt, int cols, Acc score_scale,
                                              const Acc* delta, const Acc* neg_lse) {
    const Reg scale = V::set1(score_scale);
    for (int i = 0; i < BlockQ; i += W) {
      const Reg shift = V::load(neg_lse + i);
      const Reg dl = V::load(delta + i);
      for (int j = 0; j < cols; ++j) {
        const int at = j * BlockQ + i;
        const Reg pr = probability(V::load(st + at), scale, shift);
        Reg ds = V::mul(pr, V::sub(V::load(dpt + at), dl));
        if constexpr (kScoreGrad) ds = V::mul(ds, V::load(gt + at));
        V::store(st + at, pr);
        V::store(dpt + at, ds);
      }
    }
  }

  // S (rows, BlockKV) -> P and dP -> dS, row by row: the row's −LSE and D are broadcasts.
  template <bool kScoreGrad>
  static void probabilities_and_ds_rows(Acc* s, Acc* dp, const Acc* g, int rows, Acc score_scale, const Acc* delta,
                                        const Acc* neg_lse) {
    const Reg scale = V::set1(score_scale);
    for (int i = 0; i < rows; ++i) {
      const Reg shift = V::set1(neg_lse[i]);
      const Reg dl = V::set1(delta[i]);
      Acc* s_row = s + i * BlockKV;
      Acc* dp_row = dp + i * BlockKV;
      const Acc* g_row = g + i * BlockKV;
      for (int j = 0; j < BlockKV; j += W) {
        const Reg pr = probability(V::load(s_row + j), scale, shift);
        Reg ds = V::mul(pr, V::sub(V::load(dp_row + j), dl));
        if constexpr (kScoreGrad) ds = V::mul(ds, V::load(g_row + j));
        V::store(s_row + j, pr);
        V::store(dp_row + j, ds);
      }
    }
  }

  // Partial or score-modified tiles of the dQ program, on Sᵀ (cols, BlockQ): masked scores become −inf
  // (P exactly 0) with gradient factor 0; kept ones get the modifier (natural units) and its derivative.
  template <class Mask>
  static void mask_transposed(Acc* st, Acc* gt, const Mask& mask, Acc scale, index_t q0, int rows, index_t k0,
                              int cols) {
    for (int j = 0; j < cols; ++j) {
      Acc* s_row = st + j * BlockQ;
      Acc* g_row = gt + j * BlockQ;
      for (int i = 0; i < rows; ++i)
        modify(s_row[i], g_row[i], mask, scale, mask.keep(q0 + i, k0 + j), q0 + i, k0 + j);
    }
  }

  // The same for S (rows, BlockKV) of the dK/dV program. Keys outside [lo, hi) are masked (the forward
  // never visited them for this query block), and so are the padding columns of a tail key block, so
  // that nothing but exact zeros reaches the discarded lanes.
  template <class Mask>
  static void mask_rows(Acc* s, Acc* g, const Mask& mask, Acc scale, bool partial, index_t q0, int rows, index_t k0,
                        int cols, index_t lo, index_t hi) {
    for (int i = 0; i < rows; ++i) {
      Acc* s_row = s + i * BlockKV;
      Acc* g_row = g + i * BlockKV;
      for (int j = 0; j < cols; ++j) {
        const index_t key = k0 + j;
        const bool keep = !partial || (key >= lo && key < hi && mask.keep(q0 + i, key));
        modify(s_row[j], g_row[j], mask, scale, keep, q0 + i, key);
      }
      for (int j = cols; j < BlockKV; ++j) s_row[j] = -kInf;
    }
  }

  // One element: −inf (and gradient factor 0) if masked; under a score modifier, the natural-unit score
  // s' = score(scale·s) and its derivative.
  template <class Mask>
  static void modify(Acc& s, Acc& g, const Mask& mask, Acc scale, bool keep, index_t i, index_t j) {
    if (!keep) {
      s = -kInf;
      g = Acc(0);
    } else if constexpr (Mask::modifies_scores) {
      const Acc natural = s * scale;
      s = Acc(mask.score(i, j, natural));
      g = Acc(mask.score_grad(i, j, natural));
    }
  }

  // dst (d, Block) = X[r0 : r0 + n]ᵀ for one head, zero in the padding columns of a tail block.
  template <int Block>
  static void load_transposed(Acc* dst, const TensorView<const T>& x, index_t b, index_t h, index_t r0, int n,
                              int d) {
    for (int i = 0; i < n; ++i) {
      const T* row = x.row(b, r0 + i, h);
      for (int c = 0; c < d; ++c) dst[c * Block + i] = Acc(row[c * x.stride_dim]);
    }
    for (int c = 0; c < d; ++c)
      for (int i = n; i < Block; ++i) dst[c * Block + i] = Acc(0);
  }

  // X[r0 : r0 + n] of one head as a row-major Acc matrix: in place when the storage already is Acc with
  // unit dim stride, else converted into `stage` (once per tile, amortised over the other block's rows).
  static const Acc* rows_of(const TensorView<const T>& x, index_t b, index_t h, index_t r0, int n, int d, Acc* stage,
                            index_t& ld) {
    if constexpr (std::is_same_v<T, Acc>) {
      if (x.stride_dim == 1) {
        ld = x.stride_seq;
        return x.row(b, r0, h);
      }
    }
    for (int j = 0; j < n; ++j) load_row(stage + std::size_t(j) * d, x.row(b, r0 + j, h), x.stride_dim, d);
    ld = d;
    return stage;
  }

  // out[r0 + i][c] = scale · src[c][i] for the n real rows of a block.
  template <int Block>
  static void store_transposed(const TensorView<T>& out, index_t b, index_t h, index_t r0, int n, int d,
                               const Acc* src, Acc scale) {
    for (int i = 0; i < n; ++i) {
      T* row = out.row(b, r0 + i, h);
      for (int c = 0; c < d; ++c) row[c * out.stride_dim] = T(src[c * Block + i] * scale);
    }
  }
};

}  // namespace flashattn::cpu
