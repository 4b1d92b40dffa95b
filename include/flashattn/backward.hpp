#pragma once
// The backward pass: the gradients of attention_forward's output with respect to q, k and v.
//
//   attention_backward(q, k, v, o, d_o, lse, dq, dk, dv, options)
//   attention_backward_masked(q, k, v, o, d_o, lse, dq, dk, dv, mask, options)
//
// q, k, v, options (or mask): exactly those of the forward call; o and lse: its output and saved
// log-sum-exp (the LSE is required: the probabilities are recomputed tile by tile from it, FlashAttention
// 2's algorithm, so no (seq_q × seq_k) matrix is ever stored); d_o: dLoss/dO, shaped like o. dq, dk, dv
// receive dLoss/dq, dLoss/dk, dLoss/dv (overwritten, not accumulated), shaped like q, k, v; with grouped-
// query attention dk and dv are summed over the query heads that share each KV head.
//
// Deterministic: the result has the same bits for any options.num_threads. Extra memory: two numbers per
// query row plus a few tiles per worker. Score-changing mask policies must provide score_grad (see
// backward_masks.hpp). Algorithm, cost and measurements: docs/backward.md.

#include "flashattn/attention.hpp"
#include "flashattn/backward_masks.hpp"
#include "flashattn/backward_params.hpp"
#include "flashattn/dispatch.hpp"
#include "flashattn/errors.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/options.hpp"
#include "flashattn/validate_backward.hpp"
#include "flashattn/views.hpp"

namespace flashattn {

template <class Tiles = AutoTiles, class T>
void attention_backward(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                        detail::nondeduced<TensorView<const T>> v, detail::nondeduced<TensorView<const T>> o,
                        detail::nondeduced<TensorView<const T>> d_o, LseView lse, TensorView<T> dq,
                        detail::nondeduced<TensorView<T>> dk, detail::nondeduced<TensorView<T>> dv,
                        const AttentionOptions& options = {}) {
  const BackwardParams<T> p = make_backward_params<T>(q, k, v, o, d_o, lse, dq, dk, dv, options);
  if (p.q.batch == 0) return;  // nothing to compute: a defined no-op
  detail::dispatch_backward<Tiles>(p, options);
}

// As attention_backward, with the mask policy the forward was given (attention_forward_masked).
template <class Tiles = AutoTiles, class T, class Mask>
void attention_backward_masked(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                               detail::nondeduced<TensorView<const T>> v, detail::nondeduced<TensorView<const T>> o,
                               detail::nondeduced<TensorView<const T>> d_o, LseView lse, TensorView<T> dq,
                               detail::nondeduced<TensorView<T>> dk, detail::nondeduced<TensorView<T>> dv,
                               const Mask& mask, const AttentionOptions& options = {}) {
  if (options.has_window())
    throw InvalidArgument(
        "options.causal / options.window_* cannot be combined with a mask policy: compose a BandMask into the "
        "policy instead (e.g. score_mod(BandMask::causal(seq_q, seq_k), fn, grad_fn))");
  const BackwardParams<T> p = make_backward_params<T>(q, k, v, o, d_o, lse, dq, dk, dv, options);
  if (p.q.batch == 0) return;
  detail::dispatch_backward<Tiles>(p, mask);
}

}  // namespace flashattn
