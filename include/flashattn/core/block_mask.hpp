#pragma once
// Block-sparse masks: a keep(i, j) mask with a map of its (block_q × block_k) cells, each Empty, Full or
// Partial, built once and shared by every call that uses the same mask (all heads and layers of a model
// with document masking, say). The kernels already skip Empty tiles and run Full ones without per-element
// tests (masks.hpp); what an element mask lacks is the knowledge of which tiles those are, since every
// answer of ElementMask is Partial. BlockMask answers tile() from the map instead, so the work follows the
// kept cells (FlexAttention's BlockMask is the model).
//
// A kernel tile need not line up with the cells: tile(q0, q1, k0, k1) combines every cell the rectangle
// touches (all Empty: Empty; all Full: Full; else Partial), which is exact for aligned tiles and safe for
// any. Results are the bits of element_mask(seq_k, keep) with the same keep: a skipped tile is one whose
// scores would all have been −inf, which changes neither the running max nor the sum nor (with finite V)
// the output, and the key range (kv_begin, kv_end) is the element mask's, so the tiles fall on the same grid.
//
// Building evaluates keep() once per (query, key) pair, O(seq_q · seq_k) calls; a map known in advance
// (from document boundaries, say) can be given directly as cells instead.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/core/errors.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

// The cell map alone: which (block_q × block_k) cells of a (seq_q, seq_k) score grid keep all, some or
// none of their pairs. Row-major over (query block, key block); the last row and column of cells may be
// cut short by the grid's edge.
class BlockMap {
 public:
  BlockMap() = default;

  // A map of given cells (q_blocks · k_blocks entries, row-major), checked for its shape.
  BlockMap(index_t seq_q, index_t seq_k, index_t block_q, index_t block_k, std::vector<TileKind> cells)
      : seq_q_(seq_q), seq_k_(seq_k), block_q_(block_q), block_k_(block_k), cells_(std::move(cells)) {
    check_shape();
  }

  // The map of keep(i, j) over the grid, one call per pair.
  template <class KeepFn>
  static BlockMap build(index_t seq_q, index_t seq_k, index_t block_q, index_t block_k, const KeepFn& keep) {
    BlockMap m;
    m.seq_q_ = seq_q, m.seq_k_ = seq_k, m.block_q_ = block_q, m.block_k_ = block_k;
    m.check_extents();
    m.cells_.resize(std::size_t(m.q_blocks() * m.k_blocks()));
    for (index_t qb = 0; qb < m.q_blocks(); ++qb)
      for (index_t kb = 0; kb < m.k_blocks(); ++kb) {
        bool any = false, all = true;
        const index_t i1 = std::min(seq_q, (qb + 1) * block_q), j1 = std::min(seq_k, (kb + 1) * block_k);
        for (index_t i = qb * block_q; i < i1; ++i)
          for (index_t j = kb * block_k; j < j1; ++j) {
            const bool kept = keep(i, j);
            any = any || kept;
            all = all && kept;
          }
        m.cells_[std::size_t(qb * m.k_blocks() + kb)] = !any ? TileKind::Empty : all ? TileKind::Full : TileKind::Partial;
      }
    return m;
  }

  index_t seq_q() const { return seq_q_; }
  index_t seq_k() const { return seq_k_; }
  index_t block_q() const { return block_q_; }
  index_t block_k() const { return block_k_; }
  index_t q_blocks() const { return (seq_q_ + block_q_ - 1) / block_q_; }
  index_t k_blocks() const { return (seq_k_ + block_k_ - 1) / block_k_; }
  TileKind cell(index_t qb, index_t kb) const { return cells_[std::size_t(qb * k_blocks() + kb)]; }

  // The kept share of the grid's cells, counting a Partial cell as kept: how much of the dense work a
  // kernel that skips Empty cells does.
  double density() const {
    if (cells_.empty()) return 0.0;
    const auto kept = std::count_if(cells_.begin(), cells_.end(), [](TileKind k) { return k != TileKind::Empty; });
    return double(kept) / double(cells_.size());
  }

  // Rows [q0, q1) against keys [k0, k1) (non-empty, inside the grid): the cells they touch, combined.
  TileKind tile(index_t q0, index_t q1, index_t k0, index_t k1) const {
    bool any = false, all = true;
    for (index_t qb = q0 / block_q_; qb <= (q1 - 1) / block_q_; ++qb)
      for (index_t kb = k0 / block_k_; kb <= (k1 - 1) / block_k_; ++kb) {
        const TileKind c = cell(qb, kb);
        any = any || c != TileKind::Empty;
        all = all && c == TileKind::Full;
        if (any && !all) return TileKind::Partial;
      }
    return !any ? TileKind::Empty : all ? TileKind::Full : TileKind::Partial;
  }

 private:
  void check_extents() const {
    if (seq_q_ < 0 || seq_k_ < 0)
      throw InvalidArgument("block map: seq_q and seq_k must be >= 0, got seq_q=" + std::to_string(seq_q_) +
                            " seq_k=" + std::to_string(seq_k_));
    if (block_q_ < 1 || block_k_ < 1)
      throw InvalidArgument("block map: block_q and block_k must be >= 1, got block_q=" + std::to_string(block_q_) +
                            " block_k=" + std::to_string(block_k_));
  }
  void check_shape() const {
    check_extents();
    if (index_t(cells_.size()) != q_blocks() * k_blocks())
      throw InvalidArgument("block map: cells must hold q_blocks * k_blocks = " + std::to_string(q_blocks()) + " * " +
                            std::to_string(k_blocks()) + " = " + std::to_string(q_blocks() * k_blocks()) +
                            " entries for seq_q=" + std::to_string(seq_q_) + " seq_k=" + std::to_string(seq_k_) +
                            " block_q=" + std::to_string(block_q_) + " block_k=" + std::to_string(block_k_) +
                            ", got " + std::to_string(cells_.size()));
  }

  index_t seq_q_ = 0, seq_k_ = 0, block_q_ = 1, block_k_ = 1;
  std::vector<TileKind> cells_;
};

// A mask policy: keep(i, j) for the Partial cells, the shared map for everything else. Copies share the
// map (the kernels copy policies per sequence). Calls check that the map was built for their lengths.
template <class KeepFn>
struct BlockMask {
  std::shared_ptr<const BlockMap> map;
  KeepFn keep_fn;

  index_t kv_begin(index_t, index_t) const { return 0; }
  index_t kv_end(index_t, index_t) const { return map->seq_k(); }
  TileKind tile(index_t q0, index_t q1, index_t k0, index_t k1) const { return map->tile(q0, q1, k0, k1); }
  bool keep(index_t i, index_t j) const { return keep_fn(i, j); }

  // The lengths the map covers, for validation (attention_forward_masked checks them against the call's).
  index_t mask_seq_q() const { return map->seq_q(); }
  index_t mask_seq_k() const { return map->seq_k(); }
};

// The default cell: 64 × 64, a multiple of no kernel tile in particular but small enough that a kernel tile
// rarely straddles a kept and an empty cell without reason, and large enough that the map of a 128k × 128k
// grid is 4 M entries.
inline constexpr index_t kBlockMaskCell = 64;

// block_mask(seq_q, seq_k, keep): the map built from keep (O(seq_q · seq_k) calls, once), as a policy.
template <class KeepFn>
BlockMask<KeepFn> block_mask(index_t seq_q, index_t seq_k, KeepFn keep, index_t block_q = kBlockMaskCell,
                             index_t block_k = kBlockMaskCell) {
  auto map = std::make_shared<const BlockMap>(BlockMap::build(seq_q, seq_k, block_q, block_k, keep));
  return {std::move(map), std::move(keep)};
}

// The same with a map given (or shared with another policy): keep must agree with it (a Full cell keeps
// every pair, an Empty one none), which is the caller's promise; the map's shape is checked.
template <class KeepFn>
BlockMask<KeepFn> block_mask(std::shared_ptr<const BlockMap> map, KeepFn keep) {
  if (!map) throw InvalidArgument("block_mask: map is null");
  return {std::move(map), std::move(keep)};
}

}  // namespace flashattn
