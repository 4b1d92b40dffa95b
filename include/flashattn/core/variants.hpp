#pragma once
// Variants: what a policy does to the scores its mask keeps, apart from which it keeps (masks.hpp). A
// policy given to attention_forward_masked / attention_backward_masked is one object; beyond the mask
// members it may provide any of these hooks, each optional, each with a default that costs nothing:
//
//   static constexpr bool modifies_scores = true;     score(i, j, s) -> s' changes every kept scaled score
//   template <class S> S score(i, j, S s) const;      s = scale·q·k, natural units (ALiBi, soft-capping, bias)
//   template <class S> S score_grad(i, j, S s) const; d score / ds at s: required by the backward for a
//                                                     score-changing policy (a gradient silently computed as
//                                                     if score() were the identity would be wrong)
//   static constexpr bool lane_scores = true;         score() (and score_grad(), lane_score_grads) may be
//   static constexpr bool lane_score_grads = true;    called with Lanes (core/lanes.hpp): one of i, j a row of
//                                                     positions, s a packet; written generically with
//                                                     score_math.hpp's functions, it then runs as vector code
//   float sink_logit() const;                         the softmax state's initial value: an extra logit in
//                                                     every row's denominator that attends no value
//                                                     (attention sinks); the LSE includes it
//   template <class S> S transform_output(i, c, S o) const;   applied to each normalised output element
//   for_sequence(const SequenceInfo&)                 the policy for one (batch entry, head), with that
//   for_head(b, h)                                    entry's lengths (per-head slopes, per-request
//                                                     lengths); for_head is the older, length-less form
//
// The kernels read the hooks through the traits below, so a policy declares only what it changes.

#include <type_traits>
#include <utility>

#include "flashattn/core/lanes.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/score_math.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

namespace detail {
template <class P, class = void>
struct declares_modifies_scores : std::false_type {};
template <class P>
struct declares_modifies_scores<P, std::void_t<decltype(P::modifies_scores)>>
    : std::bool_constant<bool(P::modifies_scores)> {};

template <class P, class = void>
struct has_score_grad : std::false_type {};
template <class P>
struct has_score_grad<P, std::void_t<decltype(std::declval<const P&>().score_grad(index_t{}, index_t{}, 0.0f)),
                                     decltype(std::declval<const P&>().score_grad(index_t{}, index_t{}, 0.0))>>
    : std::true_type {};

template <class P, class = void>
struct declares_lane_scores : std::false_type {};
template <class P>
struct declares_lane_scores<P, std::void_t<decltype(P::lane_scores)>> : std::bool_constant<bool(P::lane_scores)> {};
template <class P, class = void>
struct declares_lane_score_grads : std::false_type {};
template <class P>
struct declares_lane_score_grads<P, std::void_t<decltype(P::lane_score_grads)>>
    : std::bool_constant<bool(P::lane_score_grads)> {};

template <class P, class = void>
struct has_sink_logit : std::false_type {};
template <class P>
struct has_sink_logit<P, std::void_t<decltype(float(std::declval<const P&>().sink_logit()))>> : std::true_type {};

template <class P, class = void>
struct has_output_transform : std::false_type {};
template <class P>
struct has_output_transform<
    P, std::void_t<decltype(std::declval<const P&>().transform_output(index_t{}, index_t{}, 0.0f))>> : std::true_type {
};

template <class P, class = void>
struct has_for_sequence : std::false_type {};
template <class P>
struct has_for_sequence<P, std::void_t<decltype(std::declval<const P&>().for_sequence(SequenceInfo{}))>>
    : std::true_type {};

template <class P, class = void>
struct has_for_head : std::false_type {};
template <class P>
struct has_for_head<P, std::void_t<decltype(std::declval<const P&>().for_head(index_t{}, index_t{}))>>
    : std::true_type {};
}  // namespace detail

// Whether the policy changes kept scores (calls to score() are made only then).
template <class P>
inline constexpr bool modifies_scores_v = detail::declares_modifies_scores<P>::value;
// Whether score() / score_grad() may be called on Lanes (a backend then evaluates them a packet at a time).
template <class P>
inline constexpr bool lane_scores_v = modifies_scores_v<P>&& detail::declares_lane_scores<P>::value;
template <class P>
inline constexpr bool lane_score_grads_v = lane_scores_v<P>&& detail::declares_lane_score_grads<P>::value;
// Whether the policy adds a sink logit to every row's softmax.
template <class P>
inline constexpr bool has_sink_v = detail::has_sink_logit<P>::value;
// Whether the policy transforms the normalised output.
template <class P>
inline constexpr bool transforms_output_v = detail::has_output_transform<P>::value;
// Whether the backward can differentiate through the policy.
template <class P>
inline constexpr bool differentiable_mask_v = !modifies_scores_v<P> || detail::has_score_grad<P>::value;

// The mask members of `base`, forwarded, including the optional interval members where the base has them
// (so that a variant over a band is still masked by ranges), and its sink where it has one. Its score
// hooks are not forwarded: a variant over a base composes them itself (base_score, base_score_grad).
template <class Base>
struct ForwardsMask {
  Base base;

  FLASHATTN_HOST_DEVICE index_t kv_begin(index_t q0, index_t q1) const { return base.kv_begin(q0, q1); }
  FLASHATTN_HOST_DEVICE index_t kv_end(index_t q0, index_t q1) const { return base.kv_end(q0, q1); }
  FLASHATTN_HOST_DEVICE TileKind tile(index_t q0, index_t q1, index_t k0, index_t k1) const {
    return base.tile(q0, q1, k0, k1);
  }
  FLASHATTN_HOST_DEVICE bool keep(index_t i, index_t j) const { return base.keep(i, j); }
  template <class B = Base>
  FLASHATTN_HOST_DEVICE auto lowest_query(index_t j) const -> decltype(std::declval<const B&>().lowest_query(j)) {
    return base.lowest_query(j);
  }
  template <class B = Base>
  FLASHATTN_HOST_DEVICE auto highest_query(index_t j) const -> decltype(std::declval<const B&>().highest_query(j)) {
    return base.highest_query(j);
  }
  template <class B = Base>
  FLASHATTN_HOST_DEVICE auto lowest_key(index_t i) const -> decltype(std::declval<const B&>().lowest_key(i)) {
    return base.lowest_key(i);
  }
  template <class B = Base>
  FLASHATTN_HOST_DEVICE auto highest_key(index_t i) const -> decltype(std::declval<const B&>().highest_key(i)) {
    return base.highest_key(i);
  }
  template <class B = Base>
  FLASHATTN_HOST_DEVICE auto sink_logit() const -> decltype(float(std::declval<const B&>().sink_logit())) {
    return float(base.sink_logit());
  }
};

// ---- Score tables ------------------------------------------------------------------------------------
// A policy whose score reads a matrix of per-(i, j) terms (bias(...) in score_variants.hpp) holds it as a
// ScoreTable named `table` and declares `reads_score_table`. Read a packet of consecutive queries at one key
// (how a backend whose score tiles run along queries evaluates it), the matrix gives one element per row,
// seq_k floats apart: a gather that would cost more than the tile's arithmetic. So such a backend copies
// the policy (a few words), transposes the tile it is about to score into scratch of its own (reading
// the matrix's rows in order) and binds that tile on the copy (score_table_of finds the table under any
// variants); each packet is then one contiguous load. Unbound, every read is bounds-checked (per lane):
// lanes past a tile's edge (whose results a backend discards) read 0, never past the matrix.
struct ScoreTable {
  const float* values = nullptr;  // element (i, j) at values[i·stride + j], for i < rows and j < cols
  index_t stride = 0, rows = 0, cols = 0;
  // Where bound: element (i, j) of the tile at tile[(j − tile_k0)·tile_ld + (i − tile_q0)].
  const float* tile = nullptr;
  index_t tile_q0 = 0, tile_k0 = 0, tile_ld = 0;

  FLASHATTN_HOST_DEVICE float at(index_t i, index_t j) const {
    return i >= 0 && i < rows && j >= 0 && j < cols ? values[i * stride + j] : 0.0f;
  }
  template <int W>  // queries on lanes
  Lanes<float, W> at(const Positions<W>& i, index_t j) const {
    if (tile != nullptr && i.step == 1)
      return Lanes<float, W>::load(tile + (j - tile_k0) * tile_ld + (i.base - tile_q0));
    Lanes<float, W> r;
    for (int l = 0; l < W; ++l) {
      const index_t q = i.base + i.step * l;
      r.v[l] = q >= 0 && q < rows ? values[q * stride + j] : 0.0f;
    }
    return r;
  }
  template <int W>  // keys on lanes
  Lanes<float, W> at(index_t i, const Positions<W>& j) const {
    const float* row = values + i * stride;
    if (j.step == 1 && j.base >= 0 && j.base + W <= cols) return Lanes<float, W>::load(row + j.base);
    Lanes<float, W> r;
    for (int l = 0; l < W; ++l) {
      const index_t k = j.base + j.step * l;
      r.v[l] = k >= 0 && k < cols ? row[k] : 0.0f;
    }
    return r;
  }
};

namespace detail {
template <class P, class = void>
struct declares_score_table : std::false_type {};
template <class P>
struct declares_score_table<P, std::void_t<decltype(P::reads_score_table)>>
    : std::bool_constant<bool(P::reads_score_table)> {};

template <class P>
constexpr bool holds_score_table() {
  if constexpr (declares_score_table<P>::value) {
    return true;
  } else if constexpr (has_base_member<P>::value) {
    return holds_score_table<std::remove_cv_t<decltype(std::declval<const P&>().base)>>();
  } else {
    return false;
  }
}
}  // namespace detail

// Whether a (per-head) policy reads a score table, itself or in a base under it.
template <class P>
inline constexpr bool holds_score_table_v = detail::holds_score_table<P>();

// That table, on a policy the backend owns (a copy).
template <class P>
ScoreTable& score_table_of(P& policy) {
  if constexpr (detail::declares_score_table<P>::value) {
    return policy.table;
  } else {
    return score_table_of(policy.base);
  }
}

// Whether a variant over `Base` may run on lanes: the base changes no score, or does so on lanes too.
template <class Base>
inline constexpr bool base_allows_lanes_v = !modifies_scores_v<Base> || lane_scores_v<Base>;
template <class Base>
inline constexpr bool base_allows_lane_grads_v = !modifies_scores_v<Base> || lane_score_grads_v<Base>;

// A variant over a base policy applies the base's score change first (the identity where the base only
// masks) and multiplies the derivatives (chain rule).
template <class Base, class I, class J, class S>
FLASHATTN_HOST_DEVICE S base_score(const Base& base, I i, J j, S s) {
  if constexpr (modifies_scores_v<Base>) {
    return S(base.score(i, j, s));
  } else {
    (void)base, (void)i, (void)j;
    return s;
  }
}
template <class Base, class I, class J, class S>
FLASHATTN_HOST_DEVICE S base_score_grad(const Base& base, I i, J j, S s) {
  if constexpr (modifies_scores_v<Base>) {
    return S(base.score_grad(i, j, s));
  } else {
    (void)base, (void)i, (void)j, (void)s;
    return S(1);
  }
}

// The policy to use for one sequence of one head: for_sequence(info) where the policy has it, else
// for_head(batch, head), else the policy itself.
template <class P>
FLASHATTN_HOST_DEVICE auto policy_for(const P& policy, const SequenceInfo& seq) {
  if constexpr (detail::has_for_sequence<P>::value) {
    return policy.for_sequence(seq);
  } else if constexpr (detail::has_for_head<P>::value) {
    return policy.for_head(seq.batch, seq.head);
  } else {
    (void)seq;
    return policy;
  }
}

// A functor marked as generic over lanes (vectorized(fn)): it is a template in i, j and s, uses only
// arithmetic, comparisons with flashattn::select, and score_math.hpp's functions, so that a backend may call
// it with Lanes. Calling it on scalars is calling fn.
template <class Fn>
struct Vectorized {
  Fn fn;
  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE auto operator()(I i, J j, S s) const {
    return fn(i, j, s);
  }
};
template <class Fn>
Vectorized<Fn> vectorized(Fn fn) {
  return {std::move(fn)};
}

namespace detail {
template <class Fn>
struct is_vectorized : std::false_type {};
template <class Fn>
struct is_vectorized<Vectorized<Fn>> : std::true_type {};
}  // namespace detail

// A user-written score modifier: score(i, j, s) -> s' applied to every scaled score (s = scale·q·k)
// before the softmax, e.g. ALiBi (s - slope·|i - j|), soft-capping (c·tanh(s/c)) or an additive bias.
// Composes with a mask policy `Base` (NoMask, BandMask, ...), whose tile structure it keeps, or with a
// variant, whose score change it applies first.
template <class ScoreFn, class Base = NoMask>
struct ScoreMod : ForwardsMask<Base> {
  static constexpr bool modifies_scores = true;
  static constexpr bool lane_scores = detail::is_vectorized<ScoreFn>::value && base_allows_lanes_v<Base>;
  ScoreFn score_fn;

  // I, J: index_t, or (for a vectorized functor) one of them lanes of positions. score_fn sees the score
  // after the base's own change, if any (base_score).
  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score(I i, J j, S s) const {
    return S(score_fn(i, j, base_score(this->base, i, j, s)));
  }
};

template <class ScoreFn, class Base>
ScoreMod<ScoreFn, Base> score_mod(Base base, ScoreFn fn) {
  return {{std::move(base)}, std::move(fn)};
}

// ScoreMod plus the derivative of its score function, grad_fn(i, j, s) = d score_fn(i, j, s) / ds, for
// the backward. ALiBi and additive biases have derivative 1; soft-capping c·tanh(s/c) has 1 - tanh²(s/c).
template <class ScoreFn, class GradFn, class Base = NoMask>
struct ScoreModWithGrad : ScoreMod<ScoreFn, Base> {
  static constexpr bool lane_score_grads = detail::is_vectorized<GradFn>::value && base_allows_lane_grads_v<Base>;
  GradFn grad_fn;

  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score_grad(I i, J j, S s) const {
    return S(grad_fn(i, j, base_score(this->base, i, j, s))) * base_score_grad(this->base, i, j, s);
  }
};

template <class ScoreFn, class GradFn, class Base>
ScoreModWithGrad<ScoreFn, GradFn, Base> score_mod(Base base, ScoreFn fn, GradFn grad_fn) {
  return {{{std::move(base)}, std::move(fn)}, std::move(grad_fn)};
}

}  // namespace flashattn
