#pragma once
// The CPU backend's forward dispatch, the one place where its runtime values become template arguments:
// the tile configuration (the context's, or for AutoTiles the rule below), the head dim (compile-time
// for the common sizes, so that the micro-kernels' depth loops unroll; runtime otherwise) and the mask
// policy (the caller's, or the one the options describe: core/masks.hpp's with_options_mask).

#include <type_traits>

#include "flashattn/core/errors.hpp"
#include "flashattn/core/forward_params.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/cpu/amx.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/convert.hpp"
#include "flashattn/cpu/forward_scheduler.hpp"
#include "flashattn/cpu/tiles.hpp"

namespace flashattn::cpu {

namespace detail {

// f(std::integral_constant<int, HeadDim>): the head dims the kernels unroll at compile time (64, 128), or
// 0 for a runtime one.
template <class F>
void with_head_dim(index_t d, F&& f) {
  switch (d) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return f(std::integral_constant<int, 0>{});
  }
}

template <class TileConfig, class T, class Kv, class Layout, class Mask, class Accounting>
void forward_with_head_dim(const Context<TileConfig>& ctx, const ForwardParams<T, Kv, Layout>& p, const Mask& mask,
                           Accounting& acct) {
  if constexpr (TileConfig::isa == Isa::Amx && is_bf16<T>) {  // other types run AVX-512 packets
    if (!amx::usable())
      throw InvalidArgument("tiles: the instruction set is Isa::Amx, but this CPU or operating system does not "
                            "allow AMX tile instructions (use AutoTiles to pick the best usable path)");
  }
  const bool decode = ctx.decode_kernel && DecodeKernel<T, 0, TileConfig::isa>::takes(p.seqs.max_q_len());
  // One compile-time head dim covers Q/K and V/O alike; unequal dims (MLA) run with runtime ones.
  with_head_dim(p.head_dim() == p.value_dim() ? p.head_dim() : 0, [&](auto head_dim) {
    constexpr int HeadDim = decltype(head_dim)::value;
    if (decode) return run_decode<T, TileConfig, HeadDim>(ctx.num_threads, p, mask, acct);
    run_forward<T, TileConfig, HeadDim>(ctx.num_threads, p, mask, acct);
  });
}

template <class TileConfig, class T, class Kv, class Layout, class Mask, class Accounting>
void forward_with_tiles(const Context<AutoTiles>& auto_ctx, const ForwardParams<T, Kv, Layout>& p, const Mask& mask,
                        Accounting& acct) {
  Context<TileConfig> ctx;
  ctx.num_threads = auto_ctx.num_threads;
  ctx.decode_kernel = auto_ctx.decode_kernel;
  forward_with_head_dim(ctx, p, mask, acct);
}

}  // namespace detail

// The tile rule for AutoTiles (tiles.hpp's choose_forward_tiles; the measurements behind it:
// docs/performance.md, "Why it is fast", tile height, and "Long context"; docs/io.md, long context):
//  - bf16 on the AMX tile unit where this build has it and the CPU and OS allow it, for every mask
//    (AmxTallerTiles when K and V outgrow L2, as below);
//  - calls that take the decode kernel (at most 16 query rows) DefaultTiles: that kernel has tiles of its
//    own, and one instantiation of it is enough;
//  - calls whose K and V of one head (as stored) outgrow L2, masked or not, TallerTiles: every query
//    block re-reads them from L3 or memory, and 256-row programs do that a quarter as often as 64-row
//    ones (an eighth as often as AMX's 32-row ones; docs/performance.md, "Long context", measures it);
//  - unmasked calls on CPUs whose L2 holds the taller working set (tall_query_blocks()) TallTiles;
//  - everything else DefaultTiles.
template <class TileChoice, class T, class Kv, class Layout, class Mask, class Accounting>
void dispatch_forward(const Context<TileChoice>& ctx, const ForwardParams<T, Kv, Layout>& p, const Mask& mask,
                      Accounting& acct) {
  // The mixed precision this backend runs: fp32 Q/O with K/V widened from fp16 or bf16 on the way in
  // (tile_ops.hpp's staging, decode_kernel.hpp's packet loads).
  using E = kv_elem_t<Kv>;
  static_assert(std::is_same_v<T, E> || (std::is_same_v<T, float> && (is_bf16<E> || is_fp16<E>)),
                "flashattn (CPU backend): K/V of another type than Q/O are supported for fp32 Q/O with fp16 or "
                "bf16 K/V only; convert the other pairs to one type");
  if constexpr (std::is_same_v<TileChoice, AutoTiles>) {
    constexpr bool kAmxType = is_bf16<T> && is_compiled(Isa::Amx);
    constexpr bool kUnmasked = std::is_same_v<Mask, NoMaskEachSequence>;
    TileRuleInput rule;
    if constexpr (kAmxType) rule.amx = amx::usable();
    rule.decode = ctx.decode_kernel && DecodeKernel<T, 0, DefaultTiles<T>::isa>::takes(p.seqs.max_q_len());
    rule.masked = !kUnmasked;
    rule.seq_k = p.seqs.max_kv_len();
    rule.head_dim = p.head_dim();
    rule.kv_elem_bytes = sizeof(E);
    // Each configuration is instantiated only where the rule can pick it: AMX for bf16 where compiled,
    // TallTiles for unmasked calls.
    switch (choose_forward_tiles(rule)) {
      case TileShape::AmxTaller:
        if constexpr (kAmxType) return detail::forward_with_tiles<AmxTallerTiles<T>>(ctx, p, mask, acct);
        break;
      case TileShape::Amx:
        if constexpr (kAmxType) return detail::forward_with_tiles<AmxTiles<T>>(ctx, p, mask, acct);
        break;
      case TileShape::Taller:
        return detail::forward_with_tiles<TallerTiles<T>>(ctx, p, mask, acct);
      case TileShape::Tall:
        if constexpr (kUnmasked) return detail::forward_with_tiles<TallTiles<T>>(ctx, p, mask, acct);
        break;
      case TileShape::Default:
        break;
    }
    return detail::forward_with_tiles<DefaultTiles<T>>(ctx, p, mask, acct);
  } else {
    return detail::forward_with_head_dim(ctx, p, mask, acct);
  }
}

// With the mask the options describe.
template <class TileChoice, class T, class Kv, class Layout, class Accounting>
void dispatch_forward(const Context<TileChoice>& ctx, const ForwardParams<T, Kv, Layout>& p, const AttentionOptions& opts,
                      Accounting& acct) {
  with_options_mask(opts, [&](const auto& mask) { dispatch_forward(ctx, p, mask, acct); });
}

}  // namespace flashattn::cpu
