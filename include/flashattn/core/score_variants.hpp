#pragma once
// Built-in score variants, each a one-line policy over a mask (variants.hpp describes the hooks):
//   soft_cap(cap, mask)        s -> cap·tanh(s / cap)               (Gemma 2, Grok)
//   alibi(slopes, mask)        s -> s − slope_h·|i + off − j|       (ALiBi; off = seq_k − seq_q, per sequence)
//   sinks(logits, mask)        one more logit, logits[h], in every row's softmax denominator (gpt-oss);
//                              its gradient: BackwardExtras::d_sinks
//   bias(view, mask)           s -> s + bias[b, h, i, j]            (a BiasView, broadcast over batch / heads);
//                              its gradient: BackwardExtras::d_bias
// Each takes another variant as its `mask` too (sinks(logits, soft_cap(30, causal_mask()))): the inner
// score change applies first.
// `mask` is any mask policy, or one built per sequence from its lengths: causal_mask(), window_mask(l, r),
// no_mask() (the masks AttentionOptions describe, bottom-right aligned), chunked_mask(chunk[, causal]),
// prefix_lm_mask(prefix), streaming_mask(sink_tokens, window_left). Both variants are written
// generically (lane_scores), so the CPU backend evaluates them a packet at a time, and both give the
// backward their derivative.

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "flashattn/core/backward_params.hpp"
#include "flashattn/core/errors.hpp"
#include "flashattn/core/lanes.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/score_math.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"

namespace flashattn {

// The masks of AttentionOptions as per-sequence policies.
inline NoMaskEachSequence no_mask() { return {}; }
inline BandEachSequence causal_mask() { return {-1, 0}; }
inline BandEachSequence window_mask(index_t left, index_t right) { return {left, right}; }
// Queries keep only the keys of their own chunk of `chunk` positions (at or before them when causal).
inline ChunkedEachSequence chunked_mask(index_t chunk, bool causal = true) {
  if (chunk < 1) throw InvalidArgument("chunked_mask: chunk must be >= 1, got chunk=" + std::to_string(chunk));
  return {{chunk, causal}};
}
// The first `prefix` keys seen by every query, the rest causally.
inline PrefixLmEachSequence prefix_lm_mask(index_t prefix) {
  if (prefix < 0) throw InvalidArgument("prefix_lm_mask: prefix must be >= 0, got prefix=" + std::to_string(prefix));
  return {{prefix}};
}
// The first `sink_tokens` keys and the `window_left` keys before each query (and itself), causally
// (StreamingLLM). window_left < 0: unbounded (plain causal).
inline StreamingEachSequence streaming_mask(index_t sink_tokens, index_t window_left) {
  if (sink_tokens < 0)
    throw InvalidArgument("streaming_mask: sink_tokens must be >= 0, got sink_tokens=" + std::to_string(sink_tokens));
  return {sink_tokens, window_left};
}

namespace detail {
template <class P>
inline constexpr bool per_sequence_v = has_for_sequence<P>::value || has_for_head<P>::value;
}  // namespace detail

// ---- Soft-capping --------------------------------------------------------------------------------------------

template <class Base>
struct SoftCap : ForwardsMask<Base> {
  static constexpr bool modifies_scores = true;
  static constexpr bool lane_scores = base_allows_lanes_v<Base>;
  static constexpr bool lane_score_grads = base_allows_lane_grads_v<Base>;
  // Held in double: a double computation must not see the cap rounded to float (the fuzzer found the
  // 1e-8 that costs); S(cap) rounds it once for float.
  double cap = 1.0;
  double inv_cap = 1.0;

  // Over the base's score change where the base has one (soft_cap(cap, alibi(...)) caps the biased score).
  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score(I i, J j, S s) const {
    return S(cap) * flashattn::tanh(base_score(this->base, i, j, s) * S(inv_cap));
  }
  // d/ds cap·tanh(s/cap) = 1 − tanh²(s/cap), times the base's derivative.
  // (Declared only where the base is differentiable, so the backward's check names the policy at fault.)
  template <class I, class J, class S, class B = Base>
  FLASHATTN_HOST_DEVICE std::enable_if_t<differentiable_mask_v<B>, S> score_grad(I i, J j, S s) const {
    const S t = flashattn::tanh(base_score(this->base, i, j, s) * S(inv_cap));
    if constexpr (modifies_scores_v<Base>) {
      return (S(1) - t * t) * base_score_grad(this->base, i, j, s);
    } else {
      return S(1) - t * t;
    }
  }
  // A per-sequence base gives a per-sequence soft cap.
  template <class B = Base, class = std::enable_if_t<detail::per_sequence_v<B>>>
  auto for_sequence(const SequenceInfo& s) const {
    using Mask = decltype(policy_for(this->base, s));
    return SoftCap<Mask>{{policy_for(this->base, s)}, cap, inv_cap};
  }
};

// cap > 0 and finite, else InvalidArgument.
template <class Mask>
SoftCap<Mask> soft_cap(double cap, Mask mask) {
  if (!(cap > 0.0) || !std::isfinite(cap))
    throw InvalidArgument("soft_cap: cap must be positive and finite, got cap=" + std::to_string(cap));
  return {{std::move(mask)}, cap, 1.0 / cap};
}

// ---- ALiBi ----------------------------------------------------------------------------------------------------

// One head of one sequence: its slope and its diagonal's offset.
template <class Base>
struct AlibiHead : ForwardsMask<Base> {
  static constexpr bool modifies_scores = true;
  static constexpr bool lane_scores = base_allows_lanes_v<Base>;
  static constexpr bool lane_score_grads = base_allows_lane_grads_v<Base>;
  float slope = 0.0f;
  index_t offset = 0;  // seq_k − seq_q: query i's diagonal key is i + offset

  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score(I i, J j, S s) const {
    // The distance in the score type, i converted alone: on query lanes that is one conversion and no
    // 64-bit lane arithmetic. Exact while positions and distances stay below 2^24 (16 M tokens) in float;
    // the scalar path evaluates the same expression, so both give the same bits at any length.
    return base_score(this->base, i, j, s) - S(slope) * flashattn::abs(S(i) + S(offset - j));
  }
  // (Declared only where the base is differentiable, so the backward's check names the policy at fault.)
  template <class I, class J, class S, class B = Base>
  FLASHATTN_HOST_DEVICE std::enable_if_t<differentiable_mask_v<B>, S> score_grad(I i, J j, S s) const {
    return base_score_grad(this->base, i, j, s);
  }
};

// Slopes per query head (slopes[h] for head h; the ALiBi paper's are 2^(−8(h+1)/H)), over a mask or a
// per-sequence mask. The slopes are not copied: they must outlive the calls. Calls check that there is one
// slope per query head.
template <class Base>
struct Alibi {
  Base base;
  const float* slopes = nullptr;
  index_t heads = 0;

  auto for_sequence(const SequenceInfo& s) const {
    using Mask = decltype(policy_for(base, s));
    return AlibiHead<Mask>{{policy_for(base, s)}, slopes[s.head], s.seq_k - s.seq_q};
  }
  index_t policy_heads() const { return heads; }
};

template <class Mask>
Alibi<Mask> alibi(const float* slopes, index_t heads, Mask mask) {
  if (heads > 0 && slopes == nullptr) throw InvalidArgument("alibi: slopes is null for heads=" + std::to_string(heads));
  return {std::move(mask), slopes, heads};
}
template <class Mask>
Alibi<Mask> alibi(const std::vector<float>& slopes, Mask mask) {
  return alibi(slopes.data(), index_t(slopes.size()), std::move(mask));
}

// The ALiBi paper's slopes for `heads` heads: 2^(−8(h+1)/H) for a power of two H, and for other H the
// powers-of-two set's slopes followed by every other one of the next power's, as the paper's code does.
inline std::vector<float> alibi_slopes(index_t heads) {
  std::vector<float> out;
  if (heads <= 0) return out;
  index_t pow2 = 1;
  while (pow2 * 2 <= heads) pow2 *= 2;
  for (index_t h = 0; h < pow2; ++h) out.push_back(float(std::exp2(-8.0 * double(h + 1) / double(pow2))));
  for (index_t h = 0; index_t(out.size()) < heads; ++h)
    out.push_back(float(std::exp2(-8.0 * double(2 * h + 1) / double(2 * pow2))));
  return out;
}

// ---- Attention sinks -------------------------------------------------------------------------------------------

// One head's sink: a logit that joins every row's softmax denominator and attends no value, so a row may
// put weight on "nothing" (gpt-oss; StreamingLLM's learned variant). The LSE includes it.
template <class Base>
struct SinkHead : ForwardsMask<Base> {
  static constexpr bool modifies_scores = modifies_scores_v<Base>;
  static constexpr bool lane_scores = lane_scores_v<Base>;
  static constexpr bool lane_score_grads = lane_score_grads_v<Base>;
  float logit = 0.0f;

  FLASHATTN_HOST_DEVICE float sink_logit() const { return logit; }
  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score(I i, J j, S s) const {
    return base_score(this->base, i, j, s);
  }
  // (Declared only where the base is differentiable, so the backward's check names the policy at fault.)
  template <class I, class J, class S, class B = Base>
  FLASHATTN_HOST_DEVICE std::enable_if_t<differentiable_mask_v<B>, S> score_grad(I i, J j, S s) const {
    return base_score_grad(this->base, i, j, s);
  }
};

// Sink logits per query head (logits[h] for head h, natural-log units like the scaled scores), over a mask,
// a per-sequence mask or another variant. Not copied: the logits must outlive the calls (a training loop
// updates them in place). Calls check that there is one logit per query head.
template <class Base>
struct Sinks {
  Base base;
  const float* logits = nullptr;
  index_t heads = 0;

  auto for_sequence(const SequenceInfo& s) const {
    using Inner = decltype(policy_for(base, s));
    return SinkHead<Inner>{{policy_for(base, s)}, logits[s.head]};
  }
  index_t policy_heads() const { return heads; }
};

// No logit may be NaN (a −inf logit is no sink); a base with its own per-head parameters must have as many.
template <class Mask>
Sinks<Mask> sinks(const float* logits, index_t heads, Mask mask) {
  if (heads > 0 && logits == nullptr) throw InvalidArgument("sinks: logits is null for heads=" + std::to_string(heads));
  for (index_t h = 0; h < heads; ++h)
    if (std::isnan(logits[h])) throw InvalidArgument("sinks: logits[" + std::to_string(h) + "] is NaN");
  if constexpr (has_policy_heads<Mask>::value) {
    if (mask.policy_heads() != heads)
      throw InvalidArgument("sinks: " + std::to_string(heads) + " logits, but the inner policy has parameters for " +
                            std::to_string(mask.policy_heads()) + " heads");
  }
  return {std::move(mask), logits, heads};
}
template <class Mask>
Sinks<Mask> sinks(const std::vector<float>& logits, Mask mask) {
  return sinks(logits.data(), index_t(logits.size()), std::move(mask));
}

// ---- Additive bias --------------------------------------------------------------------------------------------

// An additive bias tensor (BiasView, core/views.hpp: relative-position biases, padding as −inf) over a
// base: score(i, j, s) = base's score + bias[b, h, i, j]. Its gradient: BackwardExtras::d_bias.

// One (batch entry, head)'s bias matrix over a base.
template <class Base>
struct BiasHead : ForwardsMask<Base> {
  static constexpr bool modifies_scores = true;
  static constexpr bool lane_scores = base_allows_lanes_v<Base>;
  static constexpr bool lane_score_grads = base_allows_lane_grads_v<Base>;
  static constexpr bool reads_score_table = true;
  ScoreTable table;  // this head's (seq_q, seq_k) matrix (core/variants.hpp: how backends read it)

  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score(I i, J j, S s) const {
    return base_score(this->base, i, j, s) + S(table.at(i, j));
  }
  template <class I, class J, class S, class B = Base>
  FLASHATTN_HOST_DEVICE std::enable_if_t<differentiable_mask_v<B>, S> score_grad(I i, J j, S s) const {
    return base_score_grad(this->base, i, j, s);
  }
};

template <class Base>
struct Bias {
  Base base;
  BiasView view;

  auto for_sequence(const SequenceInfo& s) const {
    using Inner = decltype(policy_for(base, s));
    const index_t b = view.batch == 1 ? 0 : s.batch, h = view.heads == 1 ? 0 : s.head;
    return BiasHead<Inner>{
        {policy_for(base, s)},
        ScoreTable{view.data + b * view.stride_batch + h * view.stride_head, view.stride_q, view.seq_q, view.seq_k}};
  }
  // The entry points check the call against these (masks.hpp's check_policy_lengths, check_policy_shape).
  index_t mask_seq_q() const { return view.seq_q; }
  index_t mask_seq_k() const { return view.seq_k; }
  // The bias's memory, which no output of the call may overlap (masks.hpp's check_policy_reads).
  PolicyReads reads() const {
    if (view.batch == 0 || view.heads == 0 || view.seq_q == 0 || view.seq_k == 0) return {"the bias", {}};
    const auto begin = reinterpret_cast<std::uintptr_t>(view.data);
    const index_t last = (view.batch - 1) * view.stride_batch + (view.heads - 1) * view.stride_head +
                         (view.seq_q - 1) * view.stride_q + view.seq_k;
    return {"the bias", {begin, begin + std::uintptr_t(last) * sizeof(float)}};
  }
  void check_call_shape(index_t batch, index_t heads) const {
    if ((view.batch != 1 && view.batch != batch) || (view.heads != 1 && view.heads != heads))
      throw InvalidArgument("bias: batch=" + std::to_string(view.batch) + " heads=" + std::to_string(view.heads) +
                            " must each be 1 (broadcast) or the call's (batch=" + std::to_string(batch) +
                            ", heads=" + std::to_string(heads) + ")");
  }
};

template <class Mask>
Bias<Mask> bias(const BiasView& view, Mask mask) {
  if (view.batch < 1 || view.heads < 1 || view.seq_q < 0 || view.seq_k < 0)
    throw InvalidArgument("bias: batch and heads must be >= 1 and seq_q, seq_k >= 0, got batch=" +
                          std::to_string(view.batch) + " heads=" + std::to_string(view.heads) +
                          " seq_q=" + std::to_string(view.seq_q) + " seq_k=" + std::to_string(view.seq_k));
  if (view.stride_batch < 0 || view.stride_head < 0 || view.stride_q < view.seq_k)
    throw InvalidArgument("bias: strides must be >= 0 and stride_q >= seq_k, got stride_batch=" +
                          std::to_string(view.stride_batch) + " stride_head=" + std::to_string(view.stride_head) +
                          " stride_q=" + std::to_string(view.stride_q) + " seq_k=" + std::to_string(view.seq_k));
  if (view.data == nullptr && view.seq_q > 0 && view.seq_k > 0) throw InvalidArgument("bias: data is null");
  return {std::move(mask), view};
}

// The bias(...) inside a policy, itself or under other variants (soft_cap(c, bias(...)), ...), for the
// backward's d_bias (BiasInPolicy, core/backward_params.hpp). The bias's gradient is the score gradient dS
// wherever its own base leaves scores unchanged (a mask): the variants around it differentiate the biased
// score as a whole. Under a base that changes scores it is not (the base's derivative would have to be
// divided out again), so that case is reported, not computed.
namespace detail {
template <class P>
struct is_bias : std::false_type {};
template <class B>
struct is_bias<Bias<B>> : std::true_type {};
}  // namespace detail

template <class Policy>
BiasInPolicy bias_in_policy(const Policy& policy) {
  if constexpr (detail::is_bias<Policy>::value) {
    using BaseHead = decltype(policy_for(policy.base, SequenceInfo{}));
    return {&policy.view, modifies_scores_v<BaseHead>};
  } else if constexpr (detail::has_base_member<Policy>::value) {
    return bias_in_policy(policy.base);
  } else {
    (void)policy;
    return {};
  }
}

}  // namespace flashattn
