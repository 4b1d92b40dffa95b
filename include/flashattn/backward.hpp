#pragma once
// The backward entry points: the gradients of attention_forward's output with respect to q, k and v.
//
//   attention_backward([ctx,] q, k, v, o, d_o, lse, dq, dk, dv, options[, extras])
//   attention_backward_masked([ctx,] q, k, v, o, d_o, lse, dq, dk, dv, policy, options[, extras])
//
// extras (optional, core/backward_params.hpp): dLoss/dLSE as an input, and the sink logits' gradient as
// an output for a policy with sinks.
//
// q, k, v, options (or policy): exactly those of the forward call; o and lse: its output and saved
// log-sum-exp (the LSE is required: the probabilities are recomputed tile by tile from it, FlashAttention
// 2's algorithm, so no (seq_q × seq_k) matrix is ever stored); d_o: dLoss/dO, shaped like o. dq, dk, dv
// receive dLoss/dq, dLoss/dk, dLoss/dv (overwritten, not accumulated), shaped like q, k, v; with grouped-
// query attention dk and dv are summed over the query heads that share each KV head.
//
// Deterministic: the result has the same bits for any number of threads. Extra memory: two numbers per
// query row plus a few tiles per worker. Score-changing policies must provide score_grad
// (core/variants.hpp). Algorithm, cost and measurements: docs/backward.md.

#include <algorithm>
#include <utility>

#include "flashattn/core/backward_params.hpp"
#include "flashattn/core/backward_validate.hpp"
#include "flashattn/core/context.hpp"
#include "flashattn/core/errors.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/score_variants.hpp"
#include "flashattn/core/static_checks.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/backward_dispatch.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"

namespace flashattn {

template <class Context, class T, class = detail::if_context<Context>>
void attention_backward(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                        detail::nondeduced<TensorView<const T>> k, detail::nondeduced<TensorView<const T>> v,
                        detail::nondeduced<TensorView<const T>> o, detail::nondeduced<TensorView<const T>> d_o,
                        LseView lse, TensorView<T> dq, detail::nondeduced<TensorView<T>> dk,
                        detail::nondeduced<TensorView<T>> dv, const AttentionOptions& options = {},
                        const BackwardExtras& extras = {}) {
  if constexpr (detail::check_element_type<T>::value) {
    const BackwardParams<T> p = make_backward_params<T>(q, k, v, o, d_o, lse, dq, dk, dv, options, extras);
    validate_context(ctx, p.q.dim, p.v.dim);
    if (p.q.batch == 0) return;  // nothing to compute: a defined no-op
    dispatch_backward(ctx, p, options);
  }
}

template <class T>
void attention_backward(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                        detail::nondeduced<TensorView<const T>> v, detail::nondeduced<TensorView<const T>> o,
                        detail::nondeduced<TensorView<const T>> d_o, LseView lse, TensorView<T> dq,
                        detail::nondeduced<TensorView<T>> dk, detail::nondeduced<TensorView<T>> dv,
                        const AttentionOptions& options = {}, const BackwardExtras& extras = {}) {
  attention_backward<cpu::Context<>, T>(cpu::Context<>{}, q, k, v, o, d_o, lse, dq, dk, dv, options, extras);
}

// As attention_backward, with the policy the forward was given (attention_forward_masked).
template <class Context, class T, class Mask, class = detail::if_context<Context>>
void attention_backward_masked(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                               detail::nondeduced<TensorView<const T>> k, detail::nondeduced<TensorView<const T>> v,
                               detail::nondeduced<TensorView<const T>> o, detail::nondeduced<TensorView<const T>> d_o,
                               LseView lse, TensorView<T> dq, detail::nondeduced<TensorView<T>> dk,
                               detail::nondeduced<TensorView<T>> dv, const Mask& mask,
                               const AttentionOptions& options = {}, const BackwardExtras& extras = {}) {
  if constexpr (detail::check_element_type<T>::value && detail::check_backward_policy_type<Mask>::value) {
    if (options.has_window())
      detail::reject_window_with_policy("score_mod(BandMask::causal(seq_q, seq_k), fn, grad_fn)");
    constexpr bool has_sink = has_sink_v<decltype(policy_for(mask, SequenceInfo{}))>;
    const BackwardParams<T> p =
        make_backward_params<T>(q, k, v, o, d_o, lse, dq, dk, dv, options, extras, has_sink, bias_in_policy(mask));
    validate_context(ctx, p.q.dim, p.v.dim);
    check_policy_lengths(mask, q.seq, k.seq);
    check_policy_heads(mask, q.heads);
    check_policy_shape(mask, q.batch, q.heads);
    check_policy_reads(mask, {{"dq", detail::check_view("dq", dq)},
                              {"dk", detail::check_view("dk", dk)},
                              {"dv", detail::check_view("dv", dv)}});
    if (p.q.batch == 0) {  // nothing to compute; a bias's gradient is a sum over no entries
      if (p.d_bias.data != nullptr)
        std::fill(p.d_bias.data, p.d_bias.data + p.d_bias.batch * p.d_bias.heads * q.seq * k.seq, 0.0f);
      return;
    }
    dispatch_backward(ctx, p, mask);
  }
}

template <class T, class Mask>
void attention_backward_masked(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                               detail::nondeduced<TensorView<const T>> v, detail::nondeduced<TensorView<const T>> o,
                               detail::nondeduced<TensorView<const T>> d_o, LseView lse, TensorView<T> dq,
                               detail::nondeduced<TensorView<T>> dk, detail::nondeduced<TensorView<T>> dv,
                               const Mask& mask, const AttentionOptions& options = {},
                               const BackwardExtras& extras = {}) {
  attention_backward_masked<cpu::Context<>, T>(cpu::Context<>{}, q, k, v, o, d_o, lse, dq, dk, dv, mask, options,
                                               extras);
}

}  // namespace flashattn
