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

// Tiles used when the caller does not choose. Every query block streams all of K and V once, so a taller
// block (more query rows) reads K/V from L3 or DRAM proportionally less often, at the price of a larger
// working set (Qᵀ and Oᵀ grow with BlockQ). Measured (docs/performance.md, bench/tile_sweep): on Zen 5
// (1 MiB L2) 64 × 64 is fastest or within a few percent at d = 64–256 and 128-row blocks lose 3–7 % at
// d ≥ 128; on a Sapphire-Rapids-class Xeon (2 MiB L2, slower L3) 128-row blocks win. TallTiles take the
// tall block's K/V traffic with the short block's L1 working set: 128-row programs of two 64-row panels
// (PanelQ above), which on the Xeon ran 1–6 % faster than 128 × 64 unpanelled at N = 4096, d = 128, where
// one head's K and V (4 MiB) stream from L3 for every program. On Zen 5 they ran level with 64 × 64 within
// ±3 % (alternated with OpenBLAS, bench_forward's vs_sgemm), so its default stays. The forward dispatch
// picks between the two at run time by the L2 size (tall_query_blocks()), and takes TallTiles only for
// unmasked attention (dispatch.hpp says why). Both give the same bits unless a call is also split over
// keys (few programs, cpu/backend.hpp): a 64-row panel meets the keys in the same 64-key tiles either way.
// FLASHATTN_TALL_TILES (BlockQ, BlockKV, PanelQ) overrides TallTiles, for sweeps.
template <class T>
using DefaultTiles = Tiles<64, 64>;
#ifndef FLASHATTN_TALL_TILES
#define FLASHATTN_TALL_TILES 128, 64, 64
#endif
template <int BlockQ, int BlockKV, int PanelQ>
using PanelTiles = Tiles<BlockQ, BlockKV, kBestIsa, PanelQ>;
template <class T>
using TallTiles = PanelTiles<FLASHATTN_TALL_TILES>;
// Taller still, for fp32 calls whose K and V of one head are larger than L2: every program then streams
// them from L3, and 256-row programs (four 64-row panels) halve that stream against TallTiles. On the Xeon
// (2 MiB L2), N = 4096, d = 128 (K + V 4 MiB): +2 to +8 % on one thread (two runs, both layouts), +3 to
// +5 % on 16. At d = 64 (K + V 2 MiB, L2's size) one thread ran −1 % three times and −15 % once, and at
// N = 1024 (K/V in L2) 256-row programs were 5–20 % slower (docs/performance.md): hence the strict size
// rule below. FLASHATTN_TALLER_TILES overrides them (128, 64, 64 turns the rule off), for A/B runs.
#ifndef FLASHATTN_TALLER_TILES
#define FLASHATTN_TALLER_TILES 256, 64, 64
#endif
template <class T>
using TallerTiles = PanelTiles<FLASHATTN_TALLER_TILES>;
// bf16 on the AMX tile unit (tile_ops_amx.hpp), chosen at run time where the OS allows AMX, for every mask.
// 32 × 128 was first or level among eight shapes against PyTorch on the Xeon (docs/performance.md): a
// short block keeps Oᵀ in L1 while the tile unit loads and stores it per key tile, a wide key block
// spreads that cost. FLASHATTN_AMX_TILES (e.g. -DFLASHATTN_AMX_TILES=64,64) overrides it, for such sweeps
// (bench/device_variants.sh).
#ifndef FLASHATTN_AMX_TILES
#define FLASHATTN_AMX_TILES 32, 128
#endif
template <class T>
using AmxTiles = Tiles<FLASHATTN_AMX_TILES, Isa::Amx>;

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

// Whether TallTiles should replace DefaultTiles on this CPU: when its L2 holds the taller working set.
inline bool tall_query_blocks() { return l2_cache_bytes() >= (2L << 20); }

// Whether one head's K and V (seq_k rows of d, both in the accumulator type) are larger than this CPU's
// L2, so that they stream from L3 for every query block (the case for TallerTiles).
inline bool kv_head_exceeds_l2(long long seq_k, long long d, long long acc_bytes) {
  return 2 * seq_k * d * acc_bytes > l2_cache_bytes();
}

}  // namespace flashattn::cpu
