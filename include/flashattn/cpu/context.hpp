#pragma once
// How the CPU backend runs a call: its threads and its tiles. The options (core/options.hpp) say what to
// compute; a context says how, and which backend: the public entry points take one as their optional
// first argument, and a call without one runs on cpu::Context<> (every hardware thread, the tiles this
// CPU and scalar type run best).
//
//   flashattn::attention_forward(q, k, v, o, options);                                 // the defaults
//   flashattn::attention_forward(flashattn::cpu::Context<>{1}, q, k, v, o, options);   // one thread
//   flashattn::attention_forward(flashattn::cpu::Context<flashattn::cpu::Tiles<32, 64>>{}, q, k, v, o);

#include <string>

#include "flashattn/core/context.hpp"
#include "flashattn/core/errors.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn::cpu {

// Tile choice meaning "the backend's default for this CPU, scalar type and mask" (forward_dispatch.hpp).
struct AutoTiles {};

// Largest head dim the CPU kernels take: a worker's scratch grows as BlockQ·head_dim, and beyond this its
// tiles no longer fit the L2 of current CPUs.
inline constexpr index_t kMaxHeadDim = 576;  // absorbed MLA's q/k

template <class TileChoice = AutoTiles>
struct Context {
  static constexpr const char* backend = "cpu";

  // Worker threads for this call. 0: the default (every hardware thread, or OpenMP's
  // omp_get_max_threads() when compiled with OpenMP). 1: run on the calling thread only. Results do not
  // depend on it: every count gives the same bits.
  int num_threads = 0;

  // Calls of at most 16 query rows per sequence (decoding) run the decode kernel (decode_kernel.hpp); false
  // sends them through the prefill kernel instead, as before 0.3 (for comparisons).
  bool decode_kernel = true;

  using Tiles = TileChoice;  // AutoTiles, or a cpu::Tiles<...> configuration
};

// The backend's own limits, checked by every entry point after the core's validation and before any
// work (so that an empty call with a bad context fails as a non-empty one does).
template <class TileChoice>
void validate_context(const Context<TileChoice>& ctx, index_t head_dim, index_t value_dim = 0) {
  if (ctx.num_threads < 0)
    throw InvalidArgument("context.num_threads must be >= 0, got " + std::to_string(ctx.num_threads));
  if (head_dim > kMaxHeadDim)
    throw InvalidArgument("head dim " + std::to_string(head_dim) + " is larger than the supported maximum " +
                          std::to_string(kMaxHeadDim));
  if (value_dim > kMaxHeadDim)
    throw InvalidArgument("head dim of v " + std::to_string(value_dim) + " is larger than the supported maximum " +
                          std::to_string(kMaxHeadDim));
}

}  // namespace flashattn::cpu
