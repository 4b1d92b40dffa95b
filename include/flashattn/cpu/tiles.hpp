#pragma once
// Tile configurations of the CPU kernels: the block of query rows a program owns (BlockQ), the key/value
// rows per inner step (BlockKV), and the instruction set of the micro-kernels.

#include <type_traits>

#include "flashattn/cpu/isa.hpp"

namespace flashattn::cpu {

template <int BlockQ_, int BlockKV_, Isa Isa_ = kBestIsa>
struct Tiles {
  static constexpr int BlockQ = BlockQ_;
  static constexpr int BlockKV = BlockKV_;
  static constexpr Isa isa = Isa_;
  static_assert(BlockQ > 0 && BlockKV > 0, "tile sizes must be positive");
  static_assert(is_compiled(Isa_), "this instruction set is not enabled for this translation unit");
};

// The accumulator type: fp32 for fp32 and the 16-bit storage types, fp64 for double.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<std::remove_cv_t<T>, double>, double, float>;

// Tiles used when the caller does not choose. Measured on Zen 5 (docs/performance.md): fp32 BlockQ 32–64
// with BlockKV 64–128 all run within a few percent of each other at d = 64–256; 64 × 64 keeps the
// working set (Qᵀ, Oᵀ, Sᵀ, a K/V tile) within L2 up to d = 256.
template <class T>
using DefaultTiles = Tiles<64, 64>;

}  // namespace flashattn::cpu
