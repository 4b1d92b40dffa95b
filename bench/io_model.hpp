#pragma once
// The IO model of exact attention (FlashAttention, Dao et al. 2022, section 3.2 and Theorem 2) written
// for this library's loop order, plus the tile configurations that the IO benchmarks pick from at run time.
//
// Traffic is the bytes moved between the big arrays in main memory (Q, K, V, O, LSE; S and P for the naive
// path) and the working set in fast memory of size M. Two kinds of formula live here:
//
//  * exact counts: what the kernels report through their Accounting policy for a given tile configuration
//    (tests/test_accounting.cpp holds the kernels to them byte for byte);
//  * the paper's law: naive Θ(N·d + N²) and tiled Θ(N²·d²/M), with the tile size derived from M.
//
// Our loop order (cpu/forward_kernel.hpp): a program holds BlockQ rows of Q and their O accumulator in fast
// memory across an inner loop over all K/V tiles, so K and V are streamed once per query block:
//
//   tiled bytes = Q + O once + 2 · N_k · d · elem · ceil(N_q / BlockQ)
//
// Algorithm 1 of the paper sizes the held block as M / (4·d) rows (four d-wide blocks share fast memory);
// with BlockQ = M / (4·d·e) the K/V term is 8 · N_q · N_k · d² · e² / M: Θ(N²·d²/M).

#include <algorithm>
#include <iterator>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "flashattn/cpu/tiles.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn::bench::io {

// One head of one attention problem, as the traffic formulas see it.
struct Shape {
  index_t seq_q = 0, seq_k = 0, dim = 0;
  index_t elem = 4;      // bytes per element of Q, K, V, O (storage type)
  index_t acc_elem = 4;  // bytes per element of the accumulator type (S and P of the naive path, the tiles)
  bool lse = false;      // whether the LSE rows are written (float each)
};

inline index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }

// ---- exact counts (what the Accounting policies see) --------------------------------------------------

// Naive (reference/naive_forward.hpp): Q, K, V read once, O written once, and the (seq_q × seq_k) matrix in
// main memory: S written and read, P written and read. Θ(N·d + N²).
inline std::int64_t naive_bytes(const Shape& s) {
  const index_t qkvo = (2 * s.seq_q + 2 * s.seq_k) * s.dim * s.elem;
  return qkvo + 4 * s.seq_q * s.seq_k * s.acc_elem + (s.lse ? s.seq_q * 4 : 0);
}

// Tiled, no mask: Q and O once, K and V once per query block of block_q rows.
inline std::int64_t tiled_bytes(const Shape& s, index_t block_q) {
  const index_t q_blocks = ceil_div(s.seq_q, block_q);
  return 2 * s.seq_q * s.dim * s.elem + 2 * q_blocks * s.seq_k * s.dim * s.elem + (s.lse ? s.seq_q * 4 : 0);
}

// K rows (equally V rows) that the tiled kernel reads with a causal mask (bottom-right aligned: query i
// keeps keys j <= i + seq_k - seq_q). Query block [q0, q1) visits keys [0, q1 + seq_k - seq_q) clipped to
// [0, seq_k), in whole tiles except the last, which is clipped too.
inline index_t tiled_kv_rows_causal(const Shape& s, index_t block_q) {
  index_t rows = 0;
  for (index_t q0 = 0; q0 < s.seq_q; q0 += block_q) {
    const index_t q1 = std::min(q0 + block_q, s.seq_q);
    rows += std::clamp<index_t>(q1 + s.seq_k - s.seq_q, 0, s.seq_k);
  }
  return rows;
}

inline std::int64_t tiled_bytes_causal(const Shape& s, index_t block_q) {
  return 2 * s.seq_q * s.dim * s.elem + 2 * tiled_kv_rows_causal(s, block_q) * s.dim * s.elem +
         (s.lse ? s.seq_q * 4 : 0);
}

// Naive, blocked as the tiled kernel is (bench/io_naive.hpp, Algorithm 0 of the paper): the tiled schedule's
// traffic (Q, O once; K in pass 1 and V in pass 3 once per query block) plus S and P through main memory.
inline std::int64_t naive_blocked_bytes(const Shape& s, index_t block_q) {
  return tiled_bytes(s, block_q) + 4 * s.seq_q * s.seq_k * s.acc_elem;
}

// ---- the paper's law ----------------------------------------------------------------------------------

// Rows of the block held in fast memory across the inner loop, from Algorithm 1: M / (4·d) elements.
inline index_t ideal_block_q(std::int64_t fast_bytes, index_t dim, index_t acc_elem) {
  return std::max<index_t>(1, fast_bytes / (4 * dim * acc_elem));
}

// Tiled traffic with the ideal (continuous) block size: Q + O once + 8·N_q·N_k·d²·e·e_acc / M.
inline double tiled_model_bytes(const Shape& s, std::int64_t fast_bytes) {
  const double block_q = double(fast_bytes) / (4.0 * double(s.dim) * double(s.acc_elem));
  const double q_blocks = std::max(1.0, double(s.seq_q) / block_q);
  return 2.0 * double(s.seq_q * s.dim * s.elem) + 2.0 * q_blocks * double(s.seq_k * s.dim * s.elem) +
         (s.lse ? double(s.seq_q) * 4.0 : 0.0);
}

// Naive traffic does not depend on M (as long as S does not fit in it).
inline double naive_model_bytes(const Shape& s) { return double(naive_bytes(s)); }

// ---- compiled tile configurations ---------------------------------------------------------------------

// BlockQ from 16 to 2048 rows (each a multiple of the widest float packet, 16 on AVX-512) times BlockKV in
// {16, 32, 64}: the IO benchmarks pick one at run time from M (select_tiles).
inline constexpr int kIoBlockQs[] = {16, 32, 64, 128, 256, 512, 1024, 2048};
inline constexpr int kIoBlockKVs[] = {16, 32, 64};

namespace detail {
template <int BlockQ>
using IoTilesRow = std::tuple<cpu::Tiles<BlockQ, 16>, cpu::Tiles<BlockQ, 32>, cpu::Tiles<BlockQ, 64>>;
}  // namespace detail

using IoTileConfigs = decltype(std::tuple_cat(detail::IoTilesRow<16>{}, detail::IoTilesRow<32>{}, detail::IoTilesRow<64>{},
                                              detail::IoTilesRow<128>{}, detail::IoTilesRow<256>{},
                                              detail::IoTilesRow<512>{}, detail::IoTilesRow<1024>{},
                                              detail::IoTilesRow<2048>{}));
static_assert(std::tuple_size_v<IoTileConfigs> == std::size(kIoBlockQs) * std::size(kIoBlockKVs),
              "one configuration per (BlockQ, BlockKV)");

struct TileChoice {
  int block_q, block_kv;
};

// Tiles for a fast memory of `fast_bytes`, as Algorithm 1 sizes them. The held block gets M/4 per d-wide
// block: BlockQ is the largest compiled size not above M / (4·d·e), so Q and O take at most M/2. The
// streamed side gets a quarter: BlockKV is the largest compiled size whose K and V tiles and score tile,
// (2·d + BlockQ)·BlockKV·e, fit in M/4. The last quarter is slack for what else lives in the cache (the
// row statistics, the stack, the lines of the next K/V tile). Below the smallest sizes, the smallest.
inline TileChoice select_tiles(std::int64_t fast_bytes, index_t dim, index_t acc_elem) {
  const index_t ideal = ideal_block_q(fast_bytes, dim, acc_elem);
  TileChoice t{kIoBlockQs[0], kIoBlockKVs[0]};
  for (int b : kIoBlockQs)
    if (b <= ideal) t.block_q = b;
  for (int kv : kIoBlockKVs)
    if ((2 * dim + t.block_q) * kv * acc_elem <= fast_bytes / 4) t.block_kv = kv;
  return t;
}

// What select_tiles returns for d ∈ {64, 128} and M = 64 KiB … 8 MiB (powers of two; tests check it).
// Binaries that only run those pass this list to with_tiles and compile 11 configurations, not 24.
using IoSweepTileConfigs =
    std::tuple<cpu::Tiles<32, 16>, cpu::Tiles<64, 16>, cpu::Tiles<128, 32>, cpu::Tiles<256, 32>, cpu::Tiles<256, 64>,
               cpu::Tiles<512, 32>, cpu::Tiles<512, 64>, cpu::Tiles<1024, 32>, cpu::Tiles<1024, 64>,
               cpu::Tiles<2048, 32>, cpu::Tiles<2048, 64>>;

namespace detail {
template <class Configs, std::size_t I = 0, class F>
void with_tiles_impl(TileChoice t, F&& f) {
  if constexpr (I == std::tuple_size_v<Configs>) {
    throw std::invalid_argument("no compiled tile configuration " + std::to_string(t.block_q) + " x " +
                                std::to_string(t.block_kv));
  } else {
    using Config = std::tuple_element_t<I, Configs>;
    if (Config::BlockQ == t.block_q && Config::BlockKV == t.block_kv) return f(Config{});
    with_tiles_impl<Configs, I + 1>(t, std::forward<F>(f));
  }
}
}  // namespace detail

// Calls f(cpu::Tiles<block_q, block_kv>{}) for that configuration out of `Configs` (a std::tuple of Tiles;
// all of IoTileConfigs by default): the one place where the IO benchmarks turn a runtime M into template
// arguments. Each configuration in the list instantiates the kernels once more, so binaries that need only
// a few M pass only the configurations those M select.
template <class Configs = IoTileConfigs, class F>
void with_tiles(TileChoice t, F&& f) {
  detail::with_tiles_impl<Configs>(t, std::forward<F>(f));
}

}  // namespace flashattn::bench::io
