#pragma once
// The forward entry points. Each validates its arguments (throwing flashattn::InvalidArgument, a
// std::invalid_argument, with a message naming the argument and values), then hands the call to the
// backend its context names (cpu::Context<> when none is given).
//
//   attention_forward([ctx,] q, k, v, o, options, lse, acct)          softmax(scale·Q·Kᵀ + mask)·V into o
//   attention_forward_masked([ctx,] q, k, v, o, policy, options, lse, acct)   with a policy of the caller's
//
// k and v may store another element type than q and o (mixed precision): fp32 queries and outputs
// against fp16 or bf16 K/V, the usual KV-cache setup. The K/V elements are widened exactly and every sum
// is fp32, so the result is that of the fp32 call on the widened K/V. Other pairs do not compile
// (the backend's dispatch names the ones it runs).
//
// Calls are thread-safe: no state is shared between calls.

#include <string>
#include <type_traits>
#include <utility>

#include "flashattn/core/context.hpp"
#include "flashattn/core/errors.hpp"
#include "flashattn/core/forward_params.hpp"
#include "flashattn/core/forward_validate.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/static_checks.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/forward_dispatch.hpp"
#include "flashattn/instrument/accounting.hpp"

namespace flashattn {

namespace detail {
template <class Context>
using if_context = std::enable_if_t<is_backend_context_v<Context>>;
// Overloads for K/V stored in another type than Q/O: enabled only when the types differ, so a call of one
// type never sees two candidates. KvElem may be const-qualified (views of const or mutable data).
// (Not for a const T: a view of const output goes to the one-type overload, whose check names the mistake.)
template <class T, class KvElem>
using if_mixed_kv = std::enable_if_t<!std::is_const_v<T> && !std::is_same_v<T, std::remove_const_t<KvElem>>>;

// `example`: how to compose the band into a policy, e.g. "score_mod(BandMask::causal(seq_q, seq_k), fn)".
[[noreturn]] inline void reject_window_with_policy(const char* example) {
  throw InvalidArgument(
      std::string("options.causal / options.window_* cannot be combined with a mask policy: compose a BandMask "
                  "into the policy instead (e.g. ") + example + ")");
}
}  // namespace detail

// q: (batch, seq_q, heads_q, dim), k and v: (batch, seq_k, heads_kv, dim), o: like q. heads_q must be a
// multiple of heads_kv (grouped-query / multi-query attention). lse, when given: (batch, heads_q, seq_q).
// `acct` receives the bytes moved between main memory and the tiles (instrument/accounting.hpp).
template <class Context, class T, class Accounting = NoAccounting, class = detail::if_context<Context>>
void attention_forward(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                       detail::nondeduced<TensorView<const T>> k, detail::nondeduced<TensorView<const T>> v,
                       TensorView<T> o, const AttentionOptions& options = {}, LseView lse = {},
                       Accounting&& acct = Accounting{}) {
  if constexpr (detail::check_element_type<T>::value) {
    const ForwardParams<T> p = make_forward_params<T>(q, k, v, o, lse, options);
    validate_context(ctx, p.head_dim(), p.value_dim());
    if (p.batch() == 0 || p.q.seq == 0) return;  // nothing to compute: a defined no-op
    dispatch_forward(ctx, p, options, acct);
  }
}

template <class T, class Accounting = NoAccounting>
void attention_forward(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                       detail::nondeduced<TensorView<const T>> v, TensorView<T> o,
                       const AttentionOptions& options = {}, LseView lse = {}, Accounting&& acct = Accounting{}) {
  attention_forward<cpu::Context<>, T>(cpu::Context<>{}, q, k, v, o, options, lse, std::forward<Accounting>(acct));
}

// Mixed precision: q and o of type T, k and v of another (both views of one element type).
template <class Context, class T, class KvElem, class Accounting = NoAccounting, class = detail::if_context<Context>,
          class = detail::if_mixed_kv<T, KvElem>>
void attention_forward(const Context& ctx, detail::nondeduced<TensorView<const T>> q, TensorView<KvElem> k,
                       TensorView<KvElem> v, TensorView<T> o, const AttentionOptions& options = {}, LseView lse = {},
                       Accounting&& acct = Accounting{}) {
  using E = std::remove_const_t<KvElem>;
  const auto p = make_forward_params<T, E>(q, k, v, o, lse, options);
  validate_context(ctx, p.head_dim(), p.value_dim());
  if (p.batch() == 0 || p.q.seq == 0) return;
  dispatch_forward(ctx, p, options, acct);
}

template <class T, class KvElem, class Accounting = NoAccounting, class = detail::if_mixed_kv<T, KvElem>>
void attention_forward(detail::nondeduced<TensorView<const T>> q, TensorView<KvElem> k, TensorView<KvElem> v,
                       TensorView<T> o, const AttentionOptions& options = {}, LseView lse = {},
                       Accounting&& acct = Accounting{}) {
  attention_forward<cpu::Context<>, T, KvElem>(cpu::Context<>{}, q, k, v, o, options, lse,
                                               std::forward<Accounting>(acct));
}

// As attention_forward, with a policy (core/masks.hpp, core/variants.hpp) instead of options.causal /
// options.window_*: ElementMask, ScoreMod, or any type with the same members.
template <class Context, class T, class Mask, class Accounting = NoAccounting, class = detail::if_context<Context>>
void attention_forward_masked(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                              detail::nondeduced<TensorView<const T>> k, detail::nondeduced<TensorView<const T>> v,
                              TensorView<T> o, const Mask& mask, const AttentionOptions& options = {},
                              LseView lse = {}, Accounting&& acct = Accounting{}) {
  if constexpr (detail::check_element_type<T>::value && detail::check_policy_type<Mask>::value) {
    if (options.has_window()) detail::reject_window_with_policy("score_mod(BandMask::causal(seq_q, seq_k), fn)");
    const ForwardParams<T> p = make_forward_params<T>(q, k, v, o, lse, options);
    validate_context(ctx, p.head_dim(), p.value_dim());
    check_policy_lengths(mask, q.seq, k.seq);
    check_policy_heads(mask, q.heads);
    check_policy_shape(mask, q.batch, q.heads);
    check_policy_reads(mask, {{"o", detail::check_view("o", o)}, {"lse", detail::lse_span(lse)}});
    if (p.batch() == 0 || p.q.seq == 0) return;
    dispatch_forward(ctx, p, mask, acct);
  }
}

template <class T, class Mask, class Accounting = NoAccounting>
void attention_forward_masked(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                              detail::nondeduced<TensorView<const T>> v, TensorView<T> o, const Mask& mask,
                              const AttentionOptions& options = {}, LseView lse = {},
                              Accounting&& acct = Accounting{}) {
  attention_forward_masked<cpu::Context<>, T>(cpu::Context<>{}, q, k, v, o, mask, options, lse,
                                              std::forward<Accounting>(acct));
}

}  // namespace flashattn
