#pragma once
// The backward's section of the dispatch layer (included by dispatch.hpp, which stays the one place
// where runtime values become template arguments): the same mask choice from the options, head-dim
// specialisations and tile resolution as the forward's, so that a forward and its backward run the same
// tile grid (the query blocks of both start at multiples of BlockQ). One exception: a bf16 forward with
// AutoTiles on an AMX CPU takes cpu::AmxTiles, the backward the default tiles on AVX512-BF16.

#include "flashattn/backward_params.hpp"
#include "flashattn/cpu/backward_backend.hpp"
#include "flashattn/dispatch.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/options.hpp"

namespace flashattn::detail {

template <class TileConfig, class T, class Mask>
void dispatch_backward_head_dim(const BackwardParams<T>& p, const Mask& mask) {
  switch (p.q.dim) {
    case 64:
      return cpu::run_backward<T, TileConfig, 64>(p, mask);
    case 128:
      return cpu::run_backward<T, TileConfig, 128>(p, mask);
    default:
      return cpu::run_backward<T, TileConfig, 0>(p, mask);
  }
}

// With a mask policy of the caller's.
template <class TileChoice, class T, class Mask>
void dispatch_backward(const BackwardParams<T>& p, const Mask& mask) {
  dispatch_backward_head_dim<resolve_tiles<TileChoice, T>>(p, mask);
}

// With the mask the options describe (the forward's mapping, dispatch_forward).
template <class TileChoice, class T>
void dispatch_backward(const BackwardParams<T>& p, const AttentionOptions& opts) {
  using TileConfig = resolve_tiles<TileChoice, T>;
  if (opts.causal) {
    dispatch_backward_head_dim<TileConfig>(p, BandMask::window(p.q.seq, p.k.seq, opts.window_left, 0));
  } else if (opts.has_window()) {
    dispatch_backward_head_dim<TileConfig>(p, BandMask::window(p.q.seq, p.k.seq, opts.window_left, opts.window_right));
  } else {
    dispatch_backward_head_dim<TileConfig>(p, NoMask{p.k.seq});
  }
}

}  // namespace flashattn::detail
