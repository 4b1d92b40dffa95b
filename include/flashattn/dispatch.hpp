#pragma once
// The one place where runtime values become template arguments: the backend, the mask policy (from the
// options, or the caller's own), the head dim (compile-time for the common sizes, so the micro-kernels'
// depth loops unroll; runtime otherwise) and the tile configuration (the caller's, or the default for
// the scalar type).

#include <type_traits>

#include "flashattn/accounting.hpp"
#include "flashattn/cpu/backend.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/options.hpp"
#include "flashattn/params.hpp"

namespace flashattn {

// Tile-configuration argument meaning "the backend's default for this scalar type".
struct AutoTiles {};

namespace detail {

template <class TileChoice, class T>
using resolve_tiles = std::conditional_t<std::is_same_v<TileChoice, AutoTiles>, cpu::DefaultTiles<T>, TileChoice>;

template <class TileConfig, class T, class Mask, class Accounting>
void dispatch_head_dim(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  switch (p.q.dim) {
    case 64:
      return cpu::run_forward<T, TileConfig, 64>(p, mask, acct);
    case 128:
      return cpu::run_forward<T, TileConfig, 128>(p, mask, acct);
    default:
      return cpu::run_forward<T, TileConfig, 0>(p, mask, acct);
  }
}

// The tile configuration: the caller's, or for AutoTiles the default chosen by this CPU's L2 size and the
// mask. Tall blocks for full attention only. Unpanelled, their masked work along a causal diagonal grew
// with the block height (64-row blocks were 10–25 % faster causal at N = 1024 on the Xeon); TallTiles'
// 64-row panels remove that: causal on one thread was then level or faster at N = 4096 but mixed at
// N = 1024 (−16 to +12 %), and 16 threads at N = 1024 ran 1–14 % slower (half as many programs to balance),
// so masks keep 64-row programs, which also spares every masked call a second kernel instantiation
// (docs/performance.md).
// bf16 goes to the AMX tile unit where this build has it and the CPU and OS allow it (cpu/amx.hpp).
template <class TileChoice, class T, class Mask, class Accounting>
void dispatch_tiles(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  if constexpr (std::is_same_v<TileChoice, AutoTiles>) {
    if constexpr (cpu::is_bf16<T> && cpu::is_compiled(cpu::Isa::Amx)) {
      if (cpu::amx::usable()) return dispatch_head_dim<cpu::AmxTiles<T>>(p, mask, acct);
    }
    if constexpr (std::is_same_v<Mask, NoMask>) {  // masked calls never instantiate the tall kernels
      if (cpu::tall_query_blocks()) {
        // fp32 only: the one type measured with them, and the other types spare the instantiation.
        if constexpr (std::is_same_v<T, float>) {
          if (cpu::kv_head_exceeds_l2(p.k.seq, p.q.dim, sizeof(float)))
            return dispatch_head_dim<cpu::TallerTiles<T>>(p, mask, acct);
        }
        return dispatch_head_dim<cpu::TallTiles<T>>(p, mask, acct);
      }
    }
    return dispatch_head_dim<cpu::DefaultTiles<T>>(p, mask, acct);
  } else {
    return dispatch_head_dim<TileChoice>(p, mask, acct);
  }
}

// With a mask policy of the caller's.
template <class TileChoice, class T, class Mask, class Accounting>
void dispatch_forward(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  dispatch_tiles<TileChoice>(p, mask, acct);
}

// With the mask the options describe.
template <class TileChoice, class T, class Accounting>
void dispatch_forward(const ForwardParams<T>& p, const AttentionOptions& opts, Accounting& acct) {
  if (opts.causal) {
    dispatch_tiles<TileChoice>(p, BandMask::window(p.q.seq, p.k.seq, opts.window_left, 0), acct);
  } else if (opts.has_window()) {
    dispatch_tiles<TileChoice>(p, BandMask::window(p.q.seq, p.k.seq, opts.window_left, opts.window_right), acct);
  } else {
    dispatch_tiles<TileChoice>(p, NoMask{p.k.seq}, acct);
  }
}

}  // namespace detail
}  // namespace flashattn

// The backward's section of the dispatch layer (same tiles, head dims and mask mapping as above).
#include "flashattn/dispatch_backward.hpp"
