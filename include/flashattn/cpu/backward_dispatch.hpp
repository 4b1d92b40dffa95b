#pragma once
// The CPU backend's backward dispatch: the forward's tile resolution, head-dim specialisations and mask
// mapping (forward_dispatch.hpp, core/masks.hpp's with_options_mask), so that a forward and its backward
// run the same tile grid (the query blocks of both start at multiples of BlockQ). One exception: where a
// bf16 forward with AutoTiles takes cpu::AmxTiles, the backward takes the default tiles on AVX512-BF16.

#include <type_traits>

#include "flashattn/core/backward_params.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/cpu/backward_scheduler.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/tiles.hpp"

namespace flashattn::cpu {

template <class TileChoice, class T, class Layout, class Mask>
void dispatch_backward(const Context<TileChoice>& ctx, const BackwardParams<T, Layout>& p, const Mask& mask) {
  using TileConfig = std::conditional_t<std::is_same_v<TileChoice, AutoTiles>, DefaultTiles<T>, TileChoice>;
  // One compile-time head dim covers Q/K and V alike; unequal dims (MLA) run with runtime ones.
  switch (p.q.dim == p.v.dim ? p.q.dim : 0) {
    case 64:
      return run_backward<T, TileConfig, 64>(ctx.num_threads, p, mask);
    case 128:
      return run_backward<T, TileConfig, 128>(ctx.num_threads, p, mask);
    default:
      return run_backward<T, TileConfig, 0>(ctx.num_threads, p, mask);
  }
}

// With the mask the options describe.
template <class TileChoice, class T, class Layout>
void dispatch_backward(const Context<TileChoice>& ctx, const BackwardParams<T, Layout>& p,
                       const AttentionOptions& opts) {
  with_options_mask(opts, [&](const auto& mask) { dispatch_backward(ctx, p, mask); });
}

}  // namespace flashattn::cpu
