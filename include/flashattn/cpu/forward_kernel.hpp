#pragma once
// One forward program: BlockQ query rows of one (batch, head), against every key tile its mask keeps.
// It reads as Algorithm 1 of FlashAttention (2): load Q once, then per key tile S = Q·Kᵀ, mask, online
// softmax update, O += P·V, and normalise at the end. The rows are worked on in panels of PanelQ
// (tiles.hpp), each panel taking its turn on a K/V tile while that tile is in cache. Scratch is
// O(PanelQ·BlockKV + (BlockQ + BlockKV)·d) per worker (d: Q/K's head dim dk or V/O's dv, which may
// differ), plus the staged K/V tiles a worker keeps for its next query blocks of the same head (at most kStagedTileCacheBytes, staged_tile_cache.hpp): no (seq_q × seq_k)
// buffer exists anywhere.

#include <algorithm>
#include <limits>
#include <type_traits>

#include "flashattn/core/forward_params.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/forward_epilogue.hpp"
#include "flashattn/cpu/online_softmax.hpp"
#include "flashattn/cpu/prefetch.hpp"
#include "flashattn/cpu/score_table.hpp"
#include "flashattn/cpu/staged_tile_cache.hpp"
#include "flashattn/cpu/tile_ops.hpp"
#include "flashattn/cpu/tile_ops_amx.hpp"
#include "flashattn/cpu/tile_ops_bf16.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/instrument/accounting.hpp"

namespace flashattn::cpu {

template <class T, class TileConfig, int HeadDim>
class ForwardKernel {
 public:
  using Acc = acc_t<T>;
  static constexpr int BlockQ = TileConfig::BlockQ;
  static constexpr int BlockKV = TileConfig::BlockKV;
  static constexpr int PanelQ = TileConfig::PanelQ;
  static constexpr int kPanels = BlockQ / PanelQ;
  using Ops = TileOps<T, PanelQ, BlockKV, HeadDim, TileConfig::isa>;
  using Softmax = OnlineSoftmax<Acc, PanelQ, TileConfig::isa>;
  using Epilogue = ForwardEpilogue<T, Acc, PanelQ, TileConfig::isa>;
  static constexpr Acc kLog2e = Acc(1.4426950408889634074);
  static constexpr int kLaneWidth = Simd<Acc, TileConfig::isa>::width;  // score modifiers' packets
  using StagedTile = typename Ops::StagedTile;
  using TileCache = StagedTileCache<StagedTile, typename Ops::StagedElem>;

  // The working set of one worker, reused across its programs of one call (the K/V tiles it keeps are
  // that call's data: a new call takes a new Scratch). Created and destroyed on the worker's thread, so
  // that it can also hold what the micro-kernels need set up on that thread (worker_setup_t).
  class Scratch {
   public:
    // dk: the head dim of Q and K; dv: of V and O.
    Scratch(int dk, int dv)
        : setup_(),
          q_elems_(Ops::lane_elems(dk)),
          o_elems_(std::size_t(dv) * PanelQ),
          qt_(kPanels * q_elems_),
          k_stage_(Ops::stage_elems(dk)),
          v_stage_(Ops::stage_elems(dv)),
          ot_(kPanels * o_elems_),
          st_(std::size_t(BlockKV) * PanelQ),
          rows_(3 * std::size_t(PanelQ) + std::size_t(std::max(dk, dv))),
          tile_cache_(std::max(Ops::stage_elems(dk), Ops::stage_elems(dv))) {}

    typename Ops::LaneElem* qt(int g) { return qt_.data() + g * q_elems_; }  // panel g's Qᵀ tile, Ops' layout
    typename Ops::StagedElem* k_stage() { return k_stage_.data(); }
    typename Ops::StagedElem* v_stage() { return v_stage_.data(); }
    Acc* ot(int g) { return ot_.data() + g * o_elems_; }  // (dv, PanelQ)      panel g's Oᵀ accumulator
    Acc* st() { return st_.data(); }                      // (BlockKV, PanelQ) Sᵀ, then Pᵀ, of one panel
    Acc* alpha() { return rows_.data(); }                 // (PanelQ) O rescale of the current tile
    Acc* inv_l() { return rows_.data() + PanelQ; }        // (PanelQ)
    Acc* lse() { return rows_.data() + 2 * PanelQ; }      // (PanelQ)
    Acc* row_buf() { return rows_.data() + 3 * PanelQ; }  // (dk) one converted input row
    TileCache& tile_cache() { return tile_cache_; }       // staged tiles kept for the head's next blocks
    float* table_tile() { return table_tile_.get(); }     // (BlockKV, PanelQ) a score table's tile, transposed

   private:
    worker_setup_t<Ops> setup_;  // first: set up before, and torn down after, everything that uses it
    std::size_t q_elems_, o_elems_;
    AlignedBuffer<typename Ops::LaneElem> qt_;
    AlignedBuffer<typename Ops::StagedElem> k_stage_, v_stage_;
    AlignedBuffer<Acc> ot_, st_, rows_;
    TileCache tile_cache_;
    TableTileBuffer<BlockKV, PanelQ> table_tile_;
  };

  // Query rows [q0, q0 + BlockQ) of sequence `seq` (a batch entry and head), against all its keys: the final
  // O and LSE rows.
  template <class Kv, class Layout, class Mask, class Accounting>
  static void run(const ForwardParams<T, Kv, Layout>& p, const Mask& mask, const SequenceInfo& seq, index_t q0,
                  Scratch& s, Accounting& acct) {
    const int dv = value_dim(p);
    Softmax softmax[kPanels];
    const int panels = attend(p, mask, seq, q0, 0, seq.seq_k, s, softmax, acct);

    for (int g = 0; g < panels; ++g) {
      const index_t qg = q0 + g * PanelQ;
      const int rows = int(std::min<index_t>(PanelQ, seq.seq_q - qg));
      if constexpr (has_sink_v<Mask>) {  // the sink joins the state at the end (online_softmax.hpp)
        softmax[g].finalize_with_sink(s.inv_l(), s.lse(), Acc(mask.sink_logit()) * kLog2e);
      } else {
        softmax[g].finalize(s.inv_l(), s.lse());
      }
      Epilogue::store_o(p.o_rows(seq.batch), mask, seq, qg, rows, dv, s.ot(g), s.inv_l());
      acct.write(Traffic::O, rows * dv * index_t(sizeof(T)));
      if (!p.lse.empty()) {
        const LseView lse = p.lse_rows(seq.batch);
        for (int i = 0; i < rows; ++i) lse(seq.batch, seq.head, qg + i) = float(s.lse()[i]);
        acct.write(Traffic::Lse, index_t(rows) * index_t(sizeof(float)));
      }
    }
  }

  // The same rows against keys [kv_lo, kv_hi) only, for split-KV: writes the unnormalised O rows and the
  // softmax state (running max in base-2 units, running sum) to `part` (rows of dv, rows, rows).
  // A variant's sink and output transform (core/variants.hpp) apply to the merged output
  // (forward_scheduler.hpp).
  template <class Kv, class Layout, class Mask, class Accounting>
  static void run_partial(const ForwardParams<T, Kv, Layout>& p, const Mask& mask, const SequenceInfo& seq, index_t q0,
                          index_t kv_lo, index_t kv_hi, Scratch& s, Acc* part_o, Acc* part_m, Acc* part_l,
                          Accounting& acct) {
    const int dv = value_dim(p);
    Softmax softmax[kPanels];
    const int panels = attend(p, mask, seq, q0, kv_lo, kv_hi, s, softmax, acct);
    for (int g = 0; g < panels; ++g) {
      const int r0 = g * PanelQ;
      const int rows = int(std::min<index_t>(PanelQ, seq.seq_q - q0 - r0));
      Epilogue::store_partial(softmax[g], s.ot(g), rows, dv, part_o + std::size_t(r0) * dv, part_m + r0, part_l + r0);
    }
  }

  // The head dims of a call: compile-time (HeadDim, when Q/K's and V's agree) or its own.
  template <class Params>
  static int head_dim(const Params& p) {
    return HeadDim > 0 ? HeadDim : int(p.head_dim());
  }
  template <class Params>
  static int value_dim(const Params& p) {
    return HeadDim > 0 ? HeadDim : int(p.value_dim());
  }

 private:
  // The body of Algorithm 1 for one query block over keys [kv_lo, kv_hi): leaves each panel's unnormalised
  // Oᵀ in s.ot(g) and its running max and sum in softmax[g]. Returns the number of panels the block has
  // (fewer than kPanels in a short last block).
  template <class Kv, class Layout, class Mask, class Accounting>
  static int attend(const ForwardParams<T, Kv, Layout>& p, const Mask& mask, const SequenceInfo& seq, index_t q0,
                    index_t kv_lo, index_t kv_hi, Scratch& s, Softmax* softmax, Accounting& acct) {
    const index_t b = seq.batch, h = seq.head, seq_k = seq.seq_k;
    const index_t q1 = std::min(q0 + BlockQ, seq.seq_q);
    const int panels = int((q1 - q0 + PanelQ - 1) / PanelQ);
    const auto panel_end = [&](int g) { return std::min(q0 + (g + 1) * PanelQ, q1); };
    const int dk = head_dim(p), dv = value_dim(p);
    const index_t h_kv = p.kv_head(h);
    const index_t k_row_bytes = dk * index_t(sizeof(kv_elem_t<Kv>));
    const index_t v_row_bytes = dv * index_t(sizeof(kv_elem_t<Kv>));

    // Raw scores become base-2 logits inside the softmax (exp2 instead of exp). A score modifier sees,
    // and returns, natural units scale·q·k, so then only log2(e) remains to apply.
    const Acc score_scale = modifies_scores_v<Mask> ? kLog2e : Acc(p.scale) * kLog2e;

    const bool keep_k = kStagedTileCacheBytes > 0 && Ops::keeps_qk_tiles(p.k, dk);
    const bool keep_v = kStagedTileCacheBytes > 0 && Ops::keeps_pv_tiles(p.v, dv);
    if (keep_k || keep_v) s.tile_cache().keep_head(b, h_kv, (seq_k + BlockKV - 1) / BlockKV);

    for (int g = 0; g < panels; ++g) {
      const index_t qg = q0 + g * PanelQ;
      const int rows = int(panel_end(g) - qg);
      Ops::load_lanes(s.qt(g), s.row_buf(), p.q_rows(b), b, h, qg, rows, dk);
      acct.read(Traffic::Q, rows * dk * index_t(sizeof(T)));
      std::fill(s.ot(g), s.ot(g) + std::size_t(dv) * PanelQ, Acc(0));
    }

    // The policy that scores the tiles: for one that reads a score table, this program's own copy, on which
    // each tile's transposed block is bound (score_table.hpp); otherwise the policy itself.
    std::conditional_t<holds_score_table_v<Mask>, Mask, const Mask&> scoring = mask;

    // Clipped to the keys that exist, so that no mask policy, however written, can make us read past K/V.
    const index_t kv_end = std::min({mask.kv_end(q0, q1), kv_hi, seq_k});
    for (index_t k0 = std::max({mask.kv_begin(q0, q1), kv_lo, index_t{0}}); k0 < kv_end; k0 += BlockKV) {
      const index_t k1 = std::min(k0 + BlockKV, kv_end);
      const TileKind kind = mask.tile(q0, q1, k0, k1);
      if (kind == TileKind::Empty) continue;
      const int cols = int(k1 - k0);
      // A whole tile of the key grid can be kept for the head's next query blocks; a tile cut short by a
      // mask's edge is staged for this block only.
      const bool grid_tile = k0 % BlockKV == 0 && k1 == std::min<index_t>(k0 + BlockKV, seq_k);
      const index_t t = k0 / BlockKV;

      const StagedTile k_tile = tile(s, TileCache::K, keep_k && grid_tile, t, s.k_stage(), cols, dk, acct,
                                     [&](typename Ops::StagedElem* dst, bool copy) {
                                       return Ops::stage_for_qk(dst, p.k, b, h_kv, k0, cols, dk, copy);
                                     });
      acct.read(Traffic::K, cols * k_row_bytes);
      StagedTile v_tile{nullptr, 0};
      const int next_cols = int(std::min<index_t>(BlockKV, kv_end - k1));

      for (int g = 0; g < panels; ++g) {
        const index_t qg = q0 + g * PanelQ, qg1 = panel_end(g);
        const TileKind panel_kind = kPanels == 1 ? kind : mask.tile(qg, qg1, k0, k1);
        if (panel_kind == TileKind::Empty) continue;
        // While Q·Kᵀ runs, V's rows of this tile are fetched; while P·V runs, K's rows of the next.
        Ops::qk(s.st(), s.qt(g), k_tile, cols, dk, prefetch_rows(p.v, b, h_kv, k0, cols, dv));  // Sᵀ (cols, PanelQ)

        if (panel_kind == TileKind::Partial || modifies_scores_v<Mask>) {
          if constexpr (holds_score_table_v<Mask>)  // score_table.hpp
            bind_table_tile<TileConfig::isa>(scoring, s.table_tile(), PanelQ, qg, int(qg1 - qg), k0, cols);
          apply_mask(s.st(), scoring, qg, int(qg1 - qg), k0, cols, Acc(p.scale), panel_kind == TileKind::Partial);
        }

        softmax[g].update(s.st(), cols, score_scale, s.alpha());  // Sᵀ -> Pᵀ, alpha

        if (v_tile.data == nullptr) {  // staged for the first panel that uses it
          v_tile = tile(s, TileCache::V, keep_v && grid_tile, t, s.v_stage(), cols, dv, acct,
                        [&](typename Ops::StagedElem* dst, bool copy) {
                          return Ops::stage_for_pv(dst, p.v, b, h_kv, k0, cols, dv, copy);
                        });
          acct.read(Traffic::V, cols * v_row_bytes);
        }
        Ops::pv(s.ot(g), s.alpha(), s.st(), v_tile, cols, dv,
                prefetch_rows(p.k, b, h_kv, k1, next_cols, dk));  // Oᵀ (dv, PanelQ)
      }
    }
    return panels;
  }

  // Tile t of K or V for the micro-kernels: kept from an earlier query block of this head, or staged now
  // into its kept slot (`keep`, within budget), or else read in place or staged into `stage` for this
  // block only. stage(dst, copy) stages into dst; copy: never return the rows in place.
  template <class Stage, class Accounting>
  static StagedTile tile(Scratch& s, typename TileCache::Matrix m, bool keep, index_t t,
                         typename Ops::StagedElem* stage, int cols, int d, Accounting& acct, Stage&& stage_fn) {
    if (keep) {
      const StagedTile kept = s.tile_cache().get(m, t, [&](typename Ops::StagedElem* slot) {
        acct.write(Traffic::StagedTiles, index_t(cols) * d * index_t(sizeof(typename Ops::StagedElem)));
        return stage_fn(slot, true);
      });
      if (kept.data != nullptr) return kept;
    }
    return stage_fn(stage, false);
  }

  // Partial tiles: masked scores become −inf (probability exactly 0). Score modifiers are applied here, in
  // natural units. A mask that names the interval of queries keeping each key (has_query_range) is
  // applied by ranges: a row of Sᵀ is one key, so the masked part of it is a prefix and a suffix, filled
  // with vector stores instead of PanelQ calls to keep(): along a causal diagonal the Partial tiles are a
  // large share of the work at moderate N.
  template <class Mask>
  static void apply_mask(Acc* st, const Mask& mask, index_t q0, int rows, index_t k0, int cols, Acc scale,
                         bool partial) {
    constexpr Acc neg_inf = -std::numeric_limits<Acc>::infinity();
    if constexpr (lane_scores_v<Mask>) {
      // A score modifier written for lanes (core/lanes.hpp): each row of Sᵀ is one key against PanelQ
      // consecutive queries, so it is evaluated a packet of queries at a time, then masked.
      using L = Lanes<Acc, kLaneWidth>;
      const L natural(scale);
      for (int j = 0; j < cols; ++j) {
        Acc* s_row = st + j * PanelQ;
        for (int l = 0; l < rows; l += kLaneWidth)
          L(mask.score(Positions<kLaneWidth>{q0 + l, 1}, k0 + j, L::load(s_row + l) * natural)).store(s_row + l);
        if (!partial) continue;
        if constexpr (has_query_range<Mask>::value) {
          const RowSpan kept = rows_keeping_key(mask, k0 + j, q0, rows);
          std::fill(s_row, s_row + kept.first, neg_inf);
          std::fill(s_row + kept.last, s_row + rows, neg_inf);
        } else {
          for (int i = 0; i < rows; ++i)
            if (!mask.keep(q0 + i, k0 + j)) s_row[i] = neg_inf;
        }
      }
      return;
    }
    if constexpr (has_query_range<Mask>::value && !modifies_scores_v<Mask>) {
      for (int j = 0; j < cols; ++j) {
        Acc* s_row = st + j * PanelQ;
        const RowSpan kept = rows_keeping_key(mask, k0 + j, q0, rows);
        std::fill(s_row, s_row + kept.first, neg_inf);
        std::fill(s_row + kept.last, s_row + rows, neg_inf);
      }
      return;
    }
    for (int j = 0; j < cols; ++j) {
      Acc* s_row = st + j * PanelQ;
      for (int i = 0; i < rows; ++i) {
        if (!mask.keep(q0 + i, k0 + j)) {
          s_row[i] = neg_inf;
        } else if constexpr (modifies_scores_v<Mask>) {
          s_row[i] = Acc(mask.score(q0 + i, k0 + j, s_row[i] * scale));
        }
      }
    }
  }
};

}  // namespace flashattn::cpu
