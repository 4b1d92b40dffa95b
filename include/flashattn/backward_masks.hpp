#pragma once
// What the backward pass asks of a mask policy beyond what the forward asks (masks.hpp).
//
// Keep-masks (NoMask, BandMask, ElementMask, any policy with modifies_scores == false) need nothing more:
// a masked score has probability 0 and so gradient 0.
//
// A policy that changes scores (modifies_scores == true) maps the scaled score s = scale·q·k to
// s' = score(i, j, s), and the softmax sees s'. The chain rule then needs ds'/ds at each kept element, so
// such a policy must also provide
//
//     template <class S> S score_grad(index_t i, index_t j, S s) const;   // d score(i, j, s) / ds
//
// evaluated at the unmodified score s (natural units, like score()). ALiBi and additive biases have
// derivative 1; soft-capping c·tanh(s/c) has 1 - tanh²(s/c). The backward rejects, at compile time, a
// score-changing policy without score_grad: a gradient silently computed as if the modifier were the
// identity would be wrong. ScoreMod (masks.hpp) carries no derivative; score_mod(base, fn, grad_fn) below
// builds the policy that does. Both work with the forward unchanged.

#include <type_traits>
#include <utility>

#include "flashattn/masks.hpp"
#include "flashattn/views.hpp"

namespace flashattn {

// ScoreMod plus the derivative of its score function: grad_fn(i, j, s) = d score_fn(i, j, s) / ds.
template <class ScoreFn, class GradFn, class Base = NoMask>
struct ScoreModWithGrad : ScoreMod<ScoreFn, Base> {
  GradFn grad_fn;

  template <class S>
  FLASHATTN_HOST_DEVICE S score_grad(index_t i, index_t j, S s) const {
    return grad_fn(i, j, s);
  }
};

template <class ScoreFn, class GradFn, class Base>
ScoreModWithGrad<ScoreFn, GradFn, Base> score_mod(Base base, ScoreFn fn, GradFn grad_fn) {
  return {{std::move(base), std::move(fn)}, std::move(grad_fn)};
}

namespace detail {
template <class M, class = void>
struct has_score_grad : std::false_type {};
template <class M>
struct has_score_grad<M, std::void_t<decltype(std::declval<const M&>().score_grad(index_t{}, index_t{}, 0.0f)),
                                     decltype(std::declval<const M&>().score_grad(index_t{}, index_t{}, 0.0))>>
    : std::true_type {};
}  // namespace detail

// Whether the backward can differentiate through policy M.
template <class M>
inline constexpr bool differentiable_mask_v = !M::modifies_scores || detail::has_score_grad<M>::value;

}  // namespace flashattn
