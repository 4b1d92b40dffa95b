#pragma once
// Tile configurations of the CPU kernels: the block of query rows a program owns (BlockQ), the key/value
// rows per inner step (BlockKV), and the instruction set of the micro-kernels.

#include <type_traits>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "flashattn/cpu/isa.hpp"

namespace flashattn::cpu {

// PanelQ: the query rows the micro-kernels and the softmax work on at a time. A program of BlockQ rows is
// BlockQ / PanelQ panels that share each K/V tile while it is in cache (one stream of K and V per BlockQ
// rows), each with its own Qᵀ, Oᵀ and softmax state (the L1 working set of PanelQ rows).
template <int BlockQ_, int BlockKV_, Isa Isa_ = kBestIsa, int PanelQ_ = BlockQ_>
struct Tiles {
  static constexpr int BlockQ = BlockQ_;
  static constexpr int BlockKV = BlockKV_;
  static constexpr Isa isa = Isa_;
  static constexpr int PanelQ = PanelQ_;
  static_assert(BlockQ > 0 && BlockKV > 0 && PanelQ > 0, "tile sizes must be positive");
  static_assert(BlockQ % PanelQ == 0, "BlockQ must be a whole number of panels");
  static_assert(is_compiled(Isa_), "this instruction set is not enabled for this translation unit");
};

// The accumulator type: fp32 for fp32 and the 16-bit storage types, fp64 for double.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<std::remove_cv_t<T>, double>, double, float>;

// The configurations the AutoTiles rule (choose_forward_tiles, below) picks from. Why each, and the runs
// that chose them: docs/performance.md, "Why it is fast", tile height, and "Long context".
//  - DefaultTiles: 64 × 64, every query block streams its head's K and V once.
//  - TallTiles: 128-row programs of two 64-row panels: the K/V traffic of a tall block with the L1
//    working set of a short one, for CPUs whose L2 holds it (tall_query_blocks()). Both give the same
//    bits unless a call is also split over keys: a 64-row panel meets the keys in the same 64-key tiles.
//  - TallerTiles: 256-row programs of four panels, for calls whose K and V of one head exceed L2 (every
//    type but bf16 on AMX, every mask; strictly: at L2's size and below they lost), so that they stream
//    from L3 a quarter as often as 64-row programs read them.
//  - AmxTiles: bf16 on the AMX tile unit, 32 × 128: a short block keeps Oᵀ in L1 while the tile unit
//    loads and stores it per key tile, a wide key block spreads that cost.
//  - AmxTallerTiles: the same 32-row panels in 256-row programs, for bf16 on AMX when one head's K and V
//    exceed L2: K and V stream from L3 an eighth as often, and V tiles past the staged tile cache's budget
//    are transposed once per 256 query rows instead of once per 32.
// FLASHATTN_TALL_TILES, FLASHATTN_TALLER_TILES, FLASHATTN_AMX_TILES and FLASHATTN_AMX_TALLER_TILES
// (BlockQ, BlockKV[, PanelQ]) override them, for sweeps and A/B runs (FLASHATTN_TALLER_TILES=128,64,64
// turns that rule off).
template <class T>
using DefaultTiles = Tiles<64, 64>;
#ifndef FLASHATTN_TALL_TILES
#define FLASHATTN_TALL_TILES 128, 64, 64
#endif
template <int BlockQ, int BlockKV, int PanelQ>
using PanelTiles = Tiles<BlockQ, BlockKV, kBestIsa, PanelQ>;
template <class T>
using TallTiles = PanelTiles<FLASHATTN_TALL_TILES>;
#ifndef FLASHATTN_TALLER_TILES
#define FLASHATTN_TALLER_TILES 256, 64, 64
#endif
template <class T>
using TallerTiles = PanelTiles<FLASHATTN_TALLER_TILES>;
template <int BlockQ, int BlockKV, int PanelQ = BlockQ>
using AmxPanelTiles = Tiles<BlockQ, BlockKV, Isa::Amx, PanelQ>;
#ifndef FLASHATTN_AMX_TILES
#define FLASHATTN_AMX_TILES 32, 128
#endif
template <class T>
using AmxTiles = AmxPanelTiles<FLASHATTN_AMX_TILES>;
#ifndef FLASHATTN_AMX_TALLER_TILES
#define FLASHATTN_AMX_TALLER_TILES 256, 128, 32
#endif
template <class T>
using AmxTallerTiles = AmxPanelTiles<FLASHATTN_AMX_TALLER_TILES>;

// This CPU's L2 cache per core, in bytes (1 MiB when the system does not say), read once.
inline long l2_cache_bytes() {
  static const long bytes = [] {
    long b = 0;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return b > 0 ? b : 1L << 20;
  }();
  return bytes;
}

// Whether TallTiles should replace DefaultTiles on a CPU with this L2: when it holds the taller working set.
inline bool tall_query_blocks(long l2_bytes = l2_cache_bytes()) { return l2_bytes >= (2L << 20); }

// Whether one head's K and V (seq_k rows of d, elem_bytes each as stored) are larger than L2, so that they
// stream from L3 for every query block (the case for the taller programs). Strict: at L2's size and
// below, 256-row programs ran level or slower.
inline bool kv_head_exceeds_l2(long long seq_k, long long d, long long elem_bytes, long l2_bytes = l2_cache_bytes()) {
  return 2 * seq_k * d * elem_bytes > l2_bytes;
}

// The shapes the AutoTiles rule chooses between (forward_dispatch.hpp maps each to its configuration).
enum class TileShape { Default, Tall, Taller, Amx, AmxTaller };

// What the rule looks at, for one forward call.
struct TileRuleInput {
  bool amx = false;              // bf16 on an AMX tile unit this build has and the CPU and OS allow
  bool decode = false;           // the call takes the decode kernel (which has tiles of its own)
  bool masked = true;            // any mask but none: TallTiles is for unmasked calls only
  long long seq_k = 0;           // the longest key sequence
  long long head_dim = 0;
  long long kv_elem_bytes = 4;   // K and V as stored
  long l2_bytes = l2_cache_bytes();
};

// The AutoTiles rule, one place for every dtype, mask and instruction set; tests/test_tile_rule.cpp
// walks its boundaries at several cache sizes. Why each branch: forward_dispatch.hpp, and the
// measurements in docs/performance.md ("Why it is fast", tile height; "Long context").
inline TileShape choose_forward_tiles(const TileRuleInput& in) {
  const bool long_kv = !in.decode && kv_head_exceeds_l2(in.seq_k, in.head_dim, in.kv_elem_bytes, in.l2_bytes);
  if (in.amx) return long_kv ? TileShape::AmxTaller : TileShape::Amx;
  if (long_kv) return TileShape::Taller;
  if (!in.decode && !in.masked && tall_query_blocks(in.l2_bytes)) return TileShape::Tall;
  return TileShape::Default;
}

}  // namespace flashattn::cpu
