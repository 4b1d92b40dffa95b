#pragma once
// The public entry points. Each validates its arguments (throwing flashattn::InvalidArgument, a
// std::invalid_argument, with a message naming the argument and values), then dispatches.
//
//   attention_forward(q, k, v, o, options, lse)          softmax(scale·Q·Kᵀ + mask)·V into o
//   attention_forward_masked(q, k, v, o, mask, options, lse)   with a mask policy of the caller's
//
// Tile sizes can be chosen explicitly: attention_forward<cpu::Tiles<32, 64>>(...). Calls are thread-safe:
// no state is shared between calls.

#include <type_traits>

#include "flashattn/accounting.hpp"
#include "flashattn/dispatch.hpp"
#include "flashattn/errors.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/options.hpp"
#include "flashattn/validate.hpp"
#include "flashattn/views.hpp"

namespace flashattn {

namespace detail {
// Keeps q, k, v out of template argument deduction, so that views of non-const data convert to
// TensorView<const T> and T is taken from the output.
template <class X>
struct identity {
  using type = X;
};
template <class X>
using nondeduced = typename identity<X>::type;
}  // namespace detail

// q: (batch, seq_q, heads_q, dim), k and v: (batch, seq_k, heads_kv, dim), o: like q. heads_q must be a
// multiple of heads_kv (grouped-query / multi-query attention). lse, when given: (batch, heads_q, seq_q).
// `acct` receives the bytes moved between main memory and the tiles (see accounting.hpp).
template <class Tiles = AutoTiles, class T, class Accounting = NoAccounting>
void attention_forward(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                       detail::nondeduced<TensorView<const T>> v, TensorView<T> o,
                       const AttentionOptions& options = {}, LseView lse = {},
                       Accounting&& acct = Accounting{}) {
  const ForwardParams<T> p = make_forward_params<T>(q, k, v, o, lse, options);
  if (p.q.batch == 0 || p.q.seq == 0) return;  // nothing to compute: a defined no-op
  detail::dispatch_forward<Tiles>(p, options, acct);
}

// As attention_forward, with a mask policy (see masks.hpp) instead of options.causal / options.window_*:
// ElementMask, ScoreMod, or any type with the same members.
template <class Tiles = AutoTiles, class T, class Mask, class Accounting = NoAccounting>
void attention_forward_masked(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                              detail::nondeduced<TensorView<const T>> v, TensorView<T> o, const Mask& mask,
                              const AttentionOptions& options = {}, LseView lse = {},
                              Accounting&& acct = Accounting{}) {
  if (options.has_window())
    throw InvalidArgument(
        "options.causal / options.window_* cannot be combined with a mask policy: compose a BandMask into the "
        "policy instead (e.g. score_mod(BandMask::causal(seq_q, seq_k), fn))");
  const ForwardParams<T> p = make_forward_params<T>(q, k, v, o, lse, options);
  if (p.q.batch == 0 || p.q.seq == 0) return;
  detail::dispatch_forward<Tiles>(p, mask, acct);
}

}  // namespace flashattn
