#pragma once
// Built-in score variants, each a one-line policy over a mask (variants.hpp describes the hooks):
//   soft_cap(cap, mask)        s -> cap·tanh(s / cap)               (Gemma 2, Grok)
//   alibi(slopes, mask)        s -> s − slope_h·|i + off − j|       (ALiBi; off = seq_k − seq_q, per sequence)
// `mask` is any mask policy, or one built per sequence from its lengths: causal_mask(), window_mask(l, r),
// no_mask() (the masks AttentionOptions describe, bottom-right aligned). Both variants are written
// generically (lane_scores), so the CPU backend evaluates them a packet at a time, and both give the
// backward their derivative.

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

// The mask members of `base`, forwarded, including the optional interval members where the base has them
// (so that a variant over a band is still masked by ranges).
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
};

namespace detail {
template <class P>
inline constexpr bool per_sequence_v = has_for_sequence<P>::value || has_for_head<P>::value;
}  // namespace detail

// ---- Soft-capping --------------------------------------------------------------------------------------------

template <class Base>
struct SoftCap : ForwardsMask<Base> {
  static constexpr bool modifies_scores = true;
  static constexpr bool lane_scores = true;
  static constexpr bool lane_score_grads = true;
  // Held in double: a double computation must not see the cap rounded to float (the fuzzer found the
  // 1e-8 that costs); S(cap) rounds it once for float.
  double cap = 1.0;
  double inv_cap = 1.0;

  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score(I, J, S s) const {
    return S(cap) * flashattn::tanh(s * S(inv_cap));
  }
  // d/ds cap·tanh(s/cap) = 1 − tanh²(s/cap).
  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score_grad(I, J, S s) const {
    const S t = flashattn::tanh(s * S(inv_cap));
    return S(1) - t * t;
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
  static constexpr bool lane_scores = true;
  static constexpr bool lane_score_grads = true;
  float slope = 0.0f;
  index_t offset = 0;  // seq_k − seq_q: query i's diagonal key is i + offset

  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score(I i, J j, S s) const {
    // The distance in the score type, i converted alone: on query lanes that is one conversion and no
    // 64-bit lane arithmetic. Exact while positions and distances stay below 2^24 (16 M tokens) in float;
    // the scalar path evaluates the same expression, so both give the same bits at any length.
    return s - S(slope) * flashattn::abs(S(i) + S(offset - j));
  }
  template <class I, class J, class S>
  FLASHATTN_HOST_DEVICE S score_grad(I, J, S) const {
    return S(1);
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

}  // namespace flashattn
