#pragma once
// Staged K/V tiles that a worker keeps for its later query blocks of the same head.
//
// Every query block of a head streams all of that head's K and V. Some tiles must be staged before the
// micro-kernels read them: converted from 16-bit storage, gathered from a strided head dim, interleaved
// into bf16 pairs, or copied because their rows lie heads·dim elements apart (BSHD), a multiple of 4 KiB
// at common sizes, so that the rows of one tile map to the same few L1 sets and evict each other
// (docs/performance.md measures it). Staging a tile again for
// every query block repeats that work seq_q / BlockQ times. A worker runs the query blocks of one head
// back to back (work_items.hpp numbers them so), so it keeps the staged tiles of its
// current (batch, KV head) and stages each tile once per head instead.
//
// Memory: at most kStagedTileCacheBytes per worker, allocated on the first tile kept, released with the
// worker's scratch at the end of the call. A head whose tiles do not all fit that budget keeps none: its
// tiles are staged per query block, as without the cache. Such a head is long (K and V past L2), so its
// query blocks are the tall programs of the long-context rule (tiles.hpp), which stage each tile once per
// 256 rows; keeping the first share of its tiles would cost every worker the whole budget (16 workers:
// 128 MiB at 1M tokens) for little (docs/performance.md, "Long context"). Results do not change: a kept
// tile holds exactly what staging it again would produce.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/core/views.hpp"

// Bytes of kept K and V tiles per worker; 0 turns the cache off. 8 MiB keeps every tile of a head at
// seq_k = 8192, d = 128 in fp32 (two 4 MiB matrices), or seq_k = 4096 at d = 256.
// FLASHATTN_KV_CACHE_BYTES is this switch's name before 0.2, still read.
#ifndef FLASHATTN_STAGED_TILE_CACHE_BYTES
#ifdef FLASHATTN_KV_CACHE_BYTES
#define FLASHATTN_STAGED_TILE_CACHE_BYTES FLASHATTN_KV_CACHE_BYTES
#else
#define FLASHATTN_STAGED_TILE_CACHE_BYTES (8L << 20)
#endif
#endif

namespace flashattn::cpu {

inline constexpr long kStagedTileCacheBytes = FLASHATTN_STAGED_TILE_CACHE_BYTES;

// StagedTile: {const Elem* data; index_t ld;} as the storage ops stage it; `data == nullptr` means "not kept".
template <class StagedTile, class Elem>
class StagedTileCache {
 public:
  enum Matrix { K = 0, V = 1 };

  // tile_elems: elements of one staged K or V tile (TileOps::stage_elems).
  explicit StagedTileCache(std::size_t tile_elems) : tile_elems_(tile_elems) {}

  // From now on keep the tiles of head h in batch b, which has `tiles` key tiles, forgetting any other
  // head's. Cheap when (b, h) is the head already kept.
  void keep_head(index_t b, index_t h, index_t tiles) {
    if (b == b_ && h == h_ && tiles == tiles_) return;
    b_ = b;
    h_ = h;
    tiles_ = tiles;
    const index_t affordable = index_t(std::size_t(kStagedTileCacheBytes) / (2 * tile_elems_ * sizeof(Elem)));
    capacity_ = tiles <= affordable ? tiles : 0;
    const std::size_t elems = 2 * std::size_t(capacity_) * tile_elems_;
    if (elems > 0 && (!slots_ || slots_->size() < elems)) {
      slots_.reset();  // release the smaller buffer before taking the larger
      slots_ = std::make_unique<AlignedBuffer<Elem>>(elems);
    }
    for (auto& kept : kept_) kept.assign(std::size_t(capacity_), StagedTile{nullptr, 0});
  }

  // Tile t of matrix m: the kept one, or stage(slot) into its slot first (stage returns the tile as it
  // lies in the slot). {nullptr, 0} when tile t is past the budget: the caller stages it as usual.
  template <class Stage>
  StagedTile get(Matrix m, index_t t, Stage&& stage) {
    if (t >= capacity_) return StagedTile{nullptr, 0};
    StagedTile& kept = kept_[m][std::size_t(t)];
    if (kept.data == nullptr) kept = stage(slots_->data() + (2 * std::size_t(t) + std::size_t(m)) * tile_elems_);
    return kept;
  }

 private:
  std::size_t tile_elems_;
  index_t b_ = -1, h_ = -1, tiles_ = -1, capacity_ = 0;
  std::unique_ptr<AlignedBuffer<Elem>> slots_;
  std::vector<StagedTile> kept_[2];
};

}  // namespace flashattn::cpu
