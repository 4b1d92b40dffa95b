#pragma once
// One forward program: BlockQ query rows of one (batch, head), against every key tile its mask keeps.
// It reads as Algorithm 1 of FlashAttention (2): load Q once, then per key tile S = Q·Kᵀ, mask, online
// softmax update, O += P·V, and normalise at the end. Scratch is O(BlockQ·BlockKV + (BlockQ + BlockKV)·d)
// per worker: no (seq_q × seq_k) buffer exists anywhere.

#include <algorithm>
#include <cstring>
#include <limits>

#include "flashattn/accounting.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/online_softmax.hpp"
#include "flashattn/cpu/tile_ops.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/params.hpp"

namespace flashattn::cpu {

template <class T, class TileConfig, int HeadDim>
class ForwardKernel {
 public:
  using Acc = acc_t<T>;
  static constexpr int BlockQ = TileConfig::BlockQ;
  static constexpr int BlockKV = TileConfig::BlockKV;
  using Ops = TileOps<Acc, BlockQ, HeadDim, TileConfig::isa>;
  using Softmax = OnlineSoftmax<Acc, BlockQ, TileConfig::isa>;

  // The working set of one worker, reused across its programs.
  class Scratch {
   public:
    explicit Scratch(int d)
        : qt_(std::size_t(d) * BlockQ),
          ot_(std::size_t(d) * BlockQ),
          st_(std::size_t(BlockKV) * BlockQ),
          kv_(2 * std::size_t(BlockKV) * d),
          rows_(3 * std::size_t(BlockQ)) {}

    Acc* qt() { return qt_.data(); }                 // (d, BlockQ)    Qᵀ, pre-scaled
    Acc* ot() { return ot_.data(); }                 // (d, BlockQ)    Oᵀ accumulator
    Acc* st() { return st_.data(); }                 // (BlockKV, BlockQ) Sᵀ, then Pᵀ
    Acc* k_stage() { return kv_.data(); }            // (BlockKV, d)   K tile in Acc, when staging is needed
    Acc* v_stage() { return kv_.data() + kv_.size() / 2; }
    Acc* alpha() { return rows_.data(); }            // (BlockQ)       O rescale of the current tile
    Acc* inv_l() { return rows_.data() + BlockQ; }   // (BlockQ)
    Acc* lse() { return rows_.data() + 2 * BlockQ; } // (BlockQ)

   private:
    AlignedBuffer<Acc> qt_, ot_, st_, kv_, rows_;
  };

  template <class Mask, class Accounting>
  static void run(const ForwardParams<T>& p, const Mask& mask, index_t b, index_t h, index_t q0, Scratch& s,
                  Accounting& acct) {
    const index_t q1 = std::min(q0 + BlockQ, p.q.seq);
    const int rows = int(q1 - q0);
    const int d = HeadDim > 0 ? HeadDim : int(p.q.dim);
    const index_t h_kv = p.kv_head(h);

    // Scores leave qk already in base-2 units: log2(e)·scale is folded into Q, so exp becomes exp2. A
    // score modifier sees natural units (scale·q·k) and hands back natural units.
    constexpr Acc log2e = Acc(1.4426950408889634074);
    const Acc q_scale = Acc(p.scale) * log2e;
    load_q_transposed(s.qt(), p.q, b, h, q0, rows, d, q_scale);
    acct.read(Traffic::Q, index_t(rows) * d * index_t(sizeof(T)));
    std::fill(s.ot(), s.ot() + std::size_t(d) * BlockQ, Acc(0));
    Softmax softmax;

    // Clipped to the keys that exist, so that no mask policy, however written, can make us read past K/V.
    const index_t kv_end = std::min(mask.kv_end(q0, q1), p.k.seq);
    for (index_t k0 = std::max(mask.kv_begin(q0, q1), index_t{0}); k0 < kv_end; k0 += BlockKV) {
      const index_t k1 = std::min(k0 + BlockKV, kv_end);
      const TileKind kind = mask.tile(q0, q1, k0, k1);
      if (kind == TileKind::Empty) continue;
      const int cols = int(k1 - k0);

      index_t k_ld = 0, v_ld = 0;
      const Acc* k_tile = rows_of(p.k, b, h_kv, k0, cols, d, s.k_stage(), k_ld);
      acct.read(Traffic::K, index_t(cols) * d * index_t(sizeof(T)));
      Ops::qk(s.st(), s.qt(), k_tile, k_ld, cols, d);  // Sᵀ (cols, BlockQ)

      if (kind == TileKind::Partial || Mask::modifies_scores) apply_mask(s.st(), mask, q0, rows, k0, cols);

      softmax.update(s.st(), cols, s.alpha());  // Sᵀ -> Pᵀ, alpha

      const Acc* v_tile = rows_of(p.v, b, h_kv, k0, cols, d, s.v_stage(), v_ld);
      acct.read(Traffic::V, index_t(cols) * d * index_t(sizeof(T)));
      Ops::pv(s.ot(), s.alpha(), s.st(), v_tile, v_ld, cols, d);  // Oᵀ (d, BlockQ)
    }

    softmax.finalize(s.inv_l(), s.lse());
    store_o(p.o, b, h, q0, rows, d, s.ot(), s.inv_l());
    acct.write(Traffic::O, index_t(rows) * d * index_t(sizeof(T)));
    if (!p.lse.empty()) {
      for (int i = 0; i < rows; ++i) p.lse(b, h, q0 + i) = float(s.lse()[i]);
      acct.write(Traffic::Lse, index_t(rows) * index_t(sizeof(float)));
    }
  }

 private:
  // qt (d, BlockQ) = scale · Q[q0 : q0 + rows]ᵀ, zero in the padding rows of a tail block.
  static void load_q_transposed(Acc* qt, const TensorView<const T>& q, index_t b, index_t h, index_t q0, int rows,
                                int d, Acc scale) {
    for (int i = 0; i < rows; ++i) {
      const T* row = q.row(b, q0 + i, h);
      for (int c = 0; c < d; ++c) qt[c * BlockQ + i] = Acc(row[c * q.stride_dim]) * scale;
    }
    for (int c = 0; c < d; ++c)
      for (int i = rows; i < BlockQ; ++i) qt[c * BlockQ + i] = Acc(0);
  }

  // Rows [k0, k0 + cols) of one head of K or V as a row-major Acc matrix. Read in place when the storage
  // already is Acc with unit dim stride; otherwise converted into `stage` (once per tile, amortised over
  // BlockQ query rows).
  static const Acc* rows_of(const TensorView<const T>& x, index_t b, index_t h, index_t k0, int cols, int d,
                            Acc* stage, index_t& ld) {
    if constexpr (std::is_same_v<T, Acc>) {
      if (x.stride_dim == 1) {
        ld = x.stride_seq;
        return x.row(b, k0, h);
      }
    }
    for (int j = 0; j < cols; ++j) {
      const T* row = x.row(b, k0 + j, h);
      for (int c = 0; c < d; ++c) stage[j * d + c] = Acc(row[c * x.stride_dim]);
    }
    ld = d;
    return stage;
  }

  // Partial tiles: masked scores become −inf (probability exactly 0). Score modifiers are applied here in
  // natural units.
  template <class Mask>
  static void apply_mask(Acc* st, const Mask& mask, index_t q0, int rows, index_t k0, int cols) {
    constexpr Acc neg_inf = -std::numeric_limits<Acc>::infinity();
    constexpr Acc ln2 = Acc(0.6931471805599453094);
    constexpr Acc log2e = Acc(1.4426950408889634074);
    for (int j = 0; j < cols; ++j) {
      Acc* s_row = st + j * BlockQ;
      for (int i = 0; i < rows; ++i) {
        if (!mask.keep(q0 + i, k0 + j)) {
          s_row[i] = neg_inf;
        } else if constexpr (Mask::modifies_scores) {
          s_row[i] = Acc(mask.score(q0 + i, k0 + j, s_row[i] * ln2)) * log2e;
        }
      }
    }
  }

  static void store_o(const TensorView<T>& o, index_t b, index_t h, index_t q0, int rows, int d, const Acc* ot,
                      const Acc* inv_l) {
    for (int i = 0; i < rows; ++i) {
      T* row = o.row(b, q0 + i, h);
      const Acc scale = inv_l[i];
      // A row that kept no key is exactly 0, even if a NaN in V reached its accumulator through a 0 weight.
      for (int c = 0; c < d; ++c) row[c * o.stride_dim] = scale == Acc(0) ? T(0) : T(ot[c * BlockQ + i] * scale);
    }
  }
};

}  // namespace flashattn::cpu
