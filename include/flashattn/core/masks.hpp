#pragma once
// Masks describe structure: which keys each query may attend, with index math only (no Eigen, no
// intrinsics, so a CUDA kernel can take the same types). A mask policy answers
//   per block:   which key columns a block of query rows can keep at all, [kv_begin, kv_end), and for a
//                tile of them whether it is Empty (skip), Full (no element test) or Partial (test each);
//   per element: keep(i, j).
// The kernel visits only [kv_begin, kv_end), asks tile() once per tile, and calls keep() only where tile()
// said Partial. A policy whose kept queries for a key form one interval may say so (lowest_query(j),
// highest_query(j), as BandMask does), and one whose kept keys for a query form one interval likewise
// (lowest_key(i), highest_key(i)): kernels then mask a Partial tile by ranges instead of per element.
// What a policy does to the scores it keeps (ALiBi, soft-capping, sinks, ...) is a variant: variants.hpp.
// New masks are new policy types; the kernel does not change.

#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "flashattn/core/errors.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/validate.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

enum class TileKind { Empty, Partial, Full };

// No mask: every key for every query.
struct NoMask {
  index_t seq_k = 0;

  FLASHATTN_HOST_DEVICE index_t kv_begin(index_t /*q0*/, index_t /*q1*/) const { return 0; }
  FLASHATTN_HOST_DEVICE index_t kv_end(index_t /*q0*/, index_t /*q1*/) const { return seq_k; }
  FLASHATTN_HOST_DEVICE TileKind tile(index_t, index_t, index_t, index_t) const { return TileKind::Full; }
  FLASHATTN_HOST_DEVICE bool keep(index_t, index_t) const { return true; }
};

// A band around the bottom-right-aligned diagonal j = i + offset, offset = seq_k - seq_q. Query i keeps
// keys j with i + offset - left <= j <= i + offset + right. Causal is the band with left unbounded and
// right = 0; sliding-window attention bounds both sides.
struct BandMask {
  // Stands in for an unbounded side; small enough that i + offset ± kUnbounded cannot overflow.
  static constexpr index_t kUnbounded = std::numeric_limits<index_t>::max() / 4;

  index_t seq_k = 0;
  index_t offset = 0;  // seq_k - seq_q
  index_t left = kUnbounded;
  index_t right = kUnbounded;

  FLASHATTN_HOST_DEVICE static BandMask causal(index_t seq_q, index_t seq_k) {
    return {seq_k, seq_k - seq_q, kUnbounded, 0};
  }
  // Negative window sizes mean unbounded on that side (AttentionOptions' convention).
  FLASHATTN_HOST_DEVICE static BandMask window(index_t seq_q, index_t seq_k, index_t left, index_t right) {
    return {seq_k, seq_k - seq_q, bound(left), bound(right)};
  }

  FLASHATTN_HOST_DEVICE index_t lowest_key(index_t i) const { return i + offset - left; }
  FLASHATTN_HOST_DEVICE index_t highest_key(index_t i) const { return i + offset + right; }

  FLASHATTN_HOST_DEVICE bool keep(index_t i, index_t j) const { return j >= lowest_key(i) && j <= highest_key(i); }

  // The same band seen from key j: the queries that keep it, [lowest_query(j), highest_query(j)].
  FLASHATTN_HOST_DEVICE index_t lowest_query(index_t j) const { return j - offset - right; }
  FLASHATTN_HOST_DEVICE index_t highest_query(index_t j) const { return j - offset + left; }

  // Rows [q0, q1) together keep keys in [lowest_key(q0), highest_key(q1 - 1)], clipped to [0, seq_k).
  FLASHATTN_HOST_DEVICE index_t kv_begin(index_t q0, index_t /*q1*/) const {
    return clamp_key(lowest_key(q0));
  }
  FLASHATTN_HOST_DEVICE index_t kv_end(index_t q0, index_t q1) const {
    return std::max(kv_begin(q0, q1), clamp_key(highest_key(q1 - 1) + 1));
  }
  // A tile is Full when its first key is kept by the last row (whose window starts latest) and its last
  // key by the first row (whose window ends earliest); Empty when it lies wholly outside the union.
  FLASHATTN_HOST_DEVICE TileKind tile(index_t q0, index_t q1, index_t k0, index_t k1) const {
    if (k1 - 1 < lowest_key(q0) || k0 > highest_key(q1 - 1)) return TileKind::Empty;
    if (k0 >= lowest_key(q1 - 1) && k1 - 1 <= highest_key(q0)) return TileKind::Full;
    return TileKind::Partial;
  }

 private:
  FLASHATTN_HOST_DEVICE static index_t bound(index_t w) { return w < 0 || w > kUnbounded ? kUnbounded : w; }
  FLASHATTN_HOST_DEVICE index_t clamp_key(index_t j) const { return std::min(std::max(j, index_t{0}), seq_k); }
};

// A mask whose kept keys for query i form one interval of key positions, [rule.lo(p), rule.hi(p)] with
// p = i + offset the query's position on the bottom-right diagonal (offset = seq_k − seq_q), where lo and
// hi never decrease as p grows. Then a block of rows keeps keys within [lo(first row), hi(last row)], a
// tile is Full exactly when its last row keeps its first key and its first row its last key, and the
// queries that keep key j form one interval too, positions [rule.first(j), rule.last(j)], which the rule
// gives: kernels skip and mask by ranges, as for a band. Chunked and prefix-LM attention are such rules.
template <class Rule>
struct RangeMask {
  Rule rule;
  index_t seq_k = 0;
  index_t offset = 0;  // seq_k − seq_q

  FLASHATTN_HOST_DEVICE index_t lowest_key(index_t i) const { return rule.lo(i + offset); }
  FLASHATTN_HOST_DEVICE index_t highest_key(index_t i) const { return rule.hi(i + offset); }
  FLASHATTN_HOST_DEVICE bool keep(index_t i, index_t j) const { return j >= lowest_key(i) && j <= highest_key(i); }
  FLASHATTN_HOST_DEVICE index_t lowest_query(index_t j) const { return rule.first(j) - offset; }
  FLASHATTN_HOST_DEVICE index_t highest_query(index_t j) const { return rule.last(j) - offset; }

  FLASHATTN_HOST_DEVICE index_t kv_begin(index_t q0, index_t /*q1*/) const { return clamp_key(lowest_key(q0)); }
  FLASHATTN_HOST_DEVICE index_t kv_end(index_t q0, index_t q1) const {
    return std::max(kv_begin(q0, q1), clamp_key(highest_key(q1 - 1) + 1));
  }
  FLASHATTN_HOST_DEVICE TileKind tile(index_t q0, index_t q1, index_t k0, index_t k1) const {
    if (k1 - 1 < lowest_key(q0) || k0 > highest_key(q1 - 1)) return TileKind::Empty;
    if (k0 >= lowest_key(q1 - 1) && k1 - 1 <= highest_key(q0)) return TileKind::Full;
    return TileKind::Partial;
  }

 private:
  FLASHATTN_HOST_DEVICE index_t clamp_key(index_t j) const { return std::min(std::max(j, index_t{0}), seq_k); }
};

// Chunked local attention (Llama 4): positions are cut into chunks of `chunk`, and a query keeps the keys
// of its own chunk only, those at or before it when `causal`.
struct ChunkRule {
  index_t chunk = 1;  // >= 1
  bool causal = true;

  FLASHATTN_HOST_DEVICE index_t start(index_t p) const {  // the first position of p's chunk (floor division)
    const index_t q = p / chunk;
    return (q - (p % chunk != 0 && p < 0 ? 1 : 0)) * chunk;
  }
  FLASHATTN_HOST_DEVICE index_t lo(index_t p) const { return start(p); }
  FLASHATTN_HOST_DEVICE index_t hi(index_t p) const { return causal ? p : start(p) + chunk - 1; }
  FLASHATTN_HOST_DEVICE index_t first(index_t j) const { return causal ? j : start(j); }
  FLASHATTN_HOST_DEVICE index_t last(index_t j) const { return start(j) + chunk - 1; }
};

// Prefix-LM: the first `prefix` keys are seen by every query (a bidirectional prefix), the rest causally.
struct PrefixLmRule {
  index_t prefix = 0;  // >= 0

  FLASHATTN_HOST_DEVICE index_t lo(index_t) const { return 0; }
  FLASHATTN_HOST_DEVICE index_t hi(index_t p) const { return std::max(prefix - 1, p); }
  FLASHATTN_HOST_DEVICE index_t first(index_t j) const { return j < prefix ? -BandMask::kUnbounded : j; }
  FLASHATTN_HOST_DEVICE index_t last(index_t) const { return BandMask::kUnbounded; }
};

// StreamingLLM: the first `sink_tokens` keys plus a causal window of `band`, each causal. The kept keys
// of a query are two intervals, so a Partial tile is masked per element; tiles between the sink tokens and
// the window are Empty and skipped.
struct StreamingMask {
  BandMask band;  // causal window: right = 0
  index_t sink_tokens = 0;

  FLASHATTN_HOST_DEVICE bool keep(index_t i, index_t j) const {
    return band.keep(i, j) || (j < sink_tokens && j <= i + band.offset);
  }
  FLASHATTN_HOST_DEVICE index_t kv_begin(index_t q0, index_t q1) const {
    return sink_tokens > 0 ? 0 : band.kv_begin(q0, q1);
  }
  FLASHATTN_HOST_DEVICE index_t kv_end(index_t q0, index_t q1) const {
    return std::max(kv_begin(q0, q1), band.kv_end(q0, q1));
  }
  FLASHATTN_HOST_DEVICE TileKind tile(index_t q0, index_t q1, index_t k0, index_t k1) const {
    const TileKind window = band.tile(q0, q1, k0, k1);
    if (window == TileKind::Full || k0 >= sink_tokens) return window;
    // Keys [k0, min(k1, sink_tokens)) are sink tokens, each kept by the rows at or after it.
    const index_t first_pos = q0 + band.offset, last_pos = q1 - 1 + band.offset;
    if (k1 <= sink_tokens && k1 - 1 <= first_pos) return TileKind::Full;
    if (k0 > last_pos && window == TileKind::Empty) return TileKind::Empty;
    return TileKind::Partial;
  }
};

// Whether a policy names, for each key j, the one interval of queries that keep it (lowest_query(j),
// highest_query(j)).
template <class Mask, class = void>
struct has_query_range : std::false_type {};
template <class Mask>
struct has_query_range<Mask, std::void_t<decltype(std::declval<const Mask&>().lowest_query(index_t{})),
                                         decltype(std::declval<const Mask&>().highest_query(index_t{}))>>
    : std::true_type {};

// For a policy with has_query_range: the rows [first, last) of a block of `rows` query rows starting at q0
// that keep key j (first == last when none does). What the forward and the backward mask by ranges with.
struct RowSpan {
  index_t first, last;
};
template <class Mask>
FLASHATTN_HOST_DEVICE RowSpan rows_keeping_key(const Mask& mask, index_t j, index_t q0, index_t rows) {
  const index_t first = std::min(std::max(mask.lowest_query(j) - q0, index_t{0}), rows);
  const index_t last = std::min(std::max(mask.highest_query(j) - q0 + 1, first), rows);
  return {first, last};
}

// Whether a policy names, for each query i, the one interval of keys it keeps (lowest_key(i),
// highest_key(i)).
template <class Mask, class = void>
struct has_key_range : std::false_type {};
template <class Mask>
struct has_key_range<Mask, std::void_t<decltype(std::declval<const Mask&>().lowest_key(index_t{})),
                                       decltype(std::declval<const Mask&>().highest_key(index_t{}))>>
    : std::true_type {};

namespace detail {
// Whether a policy is built over another (a variant over its mask, a bias over a band): `base`.
template <class P, class = void>
struct has_base_member : std::false_type {};
template <class P>
struct has_base_member<P, std::void_t<decltype(std::declval<const P&>().base)>> : std::true_type {};

// Calls f on the policy and on every policy under it (its base, the base's base, ...): the entry points'
// checks below look at every level, so that a variant around a bias or a block mask still checks them.
template <class Mask, class F>
void for_each_policy_level(const Mask& mask, F&& f) {
  f(mask);
  if constexpr (has_base_member<Mask>::value) for_each_policy_level(mask.base, f);
}
}  // namespace detail

// Whether a policy was built for one (seq_q, seq_k) grid and says so (mask_seq_q(), mask_seq_k()), as a
// BlockMask's map is: the entry points then check it against the call's lengths (check_policy_lengths).
template <class Mask, class = void>
struct has_mask_lengths : std::false_type {};
template <class Mask>
struct has_mask_lengths<Mask, std::void_t<decltype(std::declval<const Mask&>().mask_seq_q()),
                                          decltype(std::declval<const Mask&>().mask_seq_k())>> : std::true_type {};

// The entry points' check of such a policy: its grid must be the call's, or its answers would describe
// other rows and keys (and a map would be read out of bounds).
template <class Mask>
void check_policy_lengths(const Mask& mask, index_t seq_q, index_t seq_k) {
  detail::for_each_policy_level(mask, [&](const auto& m) {
    if constexpr (has_mask_lengths<std::decay_t<decltype(m)>>::value) {
      if (m.mask_seq_q() != seq_q || m.mask_seq_k() != seq_k)
        throw InvalidArgument("mask policy: built for seq_q=" + std::to_string(m.mask_seq_q()) +
                              " seq_k=" + std::to_string(m.mask_seq_k()) + ", but the call has seq_q=" +
                              std::to_string(seq_q) + " seq_k=" + std::to_string(seq_k));
    }
  });
}

// Whether a policy holds one parameter per query head (ALiBi slopes, sinks) and says for how many heads
// (policy_heads()): the entry points check it against q's heads.
template <class Mask, class = void>
struct has_policy_heads : std::false_type {};
template <class Mask>
struct has_policy_heads<Mask, std::void_t<decltype(std::declval<const Mask&>().policy_heads())>> : std::true_type {};

template <class Mask>
void check_policy_heads(const Mask& mask, index_t heads) {
  detail::for_each_policy_level(mask, [&](const auto& m) {
    if constexpr (has_policy_heads<std::decay_t<decltype(m)>>::value) {
      if (m.policy_heads() != heads)
        throw InvalidArgument("mask policy: has per-head parameters for " + std::to_string(m.policy_heads()) +
                              " heads, but q has heads=" + std::to_string(heads));
    }
  });
}

// Whether a policy checks the call's batch and heads itself (check_call_shape(batch, heads), throwing
// InvalidArgument), as a bias tensor that broadcasts does: the entry points call it.
template <class Mask, class = void>
struct has_call_shape_check : std::false_type {};
template <class Mask>
struct has_call_shape_check<Mask, std::void_t<decltype(std::declval<const Mask&>().check_call_shape(index_t{}, index_t{}))>>
    : std::true_type {};

template <class Mask>
void check_policy_shape(const Mask& mask, index_t batch, index_t heads) {
  detail::for_each_policy_level(mask, [&](const auto& m) {
    if constexpr (has_call_shape_check<std::decay_t<decltype(m)>>::value) m.check_call_shape(batch, heads);
  });
}

// Whether a policy reads caller memory while the kernels write the call's outputs (a bias tensor) and says
// which (reads(): a PolicyReads): the entry points check that no output overlaps it.
struct PolicyReads {
  const char* what = "";
  detail::ByteSpan span;
};
template <class Mask, class = void>
struct has_policy_reads : std::false_type {};
template <class Mask>
struct has_policy_reads<Mask, std::void_t<decltype(PolicyReads(std::declval<const Mask&>().reads()))>>
    : std::true_type {};

// outputs: the call's outputs, as (name, span) pairs.
template <class Mask, std::size_t N>
void check_policy_reads(const Mask& mask, const std::pair<const char*, detail::ByteSpan> (&outputs)[N]) {
  detail::for_each_policy_level(mask, [&](const auto& m) {
    if constexpr (has_policy_reads<std::decay_t<decltype(m)>>::value) {
      const PolicyReads r = m.reads();
      for (const auto& [name, span] : outputs)
        if (span.overlaps(r.span)) throw InvalidArgument(std::string(name) + " overlaps the memory of " + r.what);
    }
  });
}

// A user-written element mask: `keep(i, j)` from any callable. Every tile is Partial, so the callable is
// asked for every score; write a full policy (kv_begin/kv_end/tile) when the structure lets tiles be
// skipped.
template <class KeepFn>
struct ElementMask {
  index_t seq_k = 0;
  KeepFn keep_fn;

  FLASHATTN_HOST_DEVICE index_t kv_begin(index_t, index_t) const { return 0; }
  FLASHATTN_HOST_DEVICE index_t kv_end(index_t, index_t) const { return seq_k; }
  FLASHATTN_HOST_DEVICE TileKind tile(index_t, index_t, index_t, index_t) const { return TileKind::Partial; }
  FLASHATTN_HOST_DEVICE bool keep(index_t i, index_t j) const { return keep_fn(i, j); }
};

template <class KeepFn>
ElementMask<KeepFn> element_mask(index_t seq_k, KeepFn fn) {
  return {seq_k, std::move(fn)};
}

// The masks AttentionOptions describe, built per sequence from its lengths (variants.hpp's policy_for):
// no mask, or the band options.causal / options.window_* give (bottom-right aligned in each sequence).
struct NoMaskEachSequence {
  FLASHATTN_HOST_DEVICE NoMask for_sequence(const SequenceInfo& s) const { return {s.seq_k}; }
};
struct BandEachSequence {
  index_t left = -1, right = -1;  // AttentionOptions' convention: negative is unbounded
  FLASHATTN_HOST_DEVICE BandMask for_sequence(const SequenceInfo& s) const {
    return BandMask::window(s.seq_q, s.seq_k, left, right);
  }
};

// Chunked, prefix-LM and streaming masks per sequence (score_variants.hpp's chunked_mask, prefix_lm_mask,
// streaming_mask), bottom-right aligned like the band.
struct ChunkedEachSequence {
  ChunkRule rule;
  FLASHATTN_HOST_DEVICE RangeMask<ChunkRule> for_sequence(const SequenceInfo& s) const {
    return {rule, s.seq_k, s.seq_k - s.seq_q};
  }
};
struct PrefixLmEachSequence {
  PrefixLmRule rule;
  FLASHATTN_HOST_DEVICE RangeMask<PrefixLmRule> for_sequence(const SequenceInfo& s) const {
    return {rule, s.seq_k, s.seq_k - s.seq_q};
  }
};
struct StreamingEachSequence {
  index_t sink_tokens = 0, window_left = -1;
  FLASHATTN_HOST_DEVICE StreamingMask for_sequence(const SequenceInfo& s) const {
    return {BandMask::window(s.seq_q, s.seq_k, window_left, 0), sink_tokens};
  }
};

// Calls f(mask) with the mask the options describe: every backend's forward and backward map options to
// masks here, so that a forward and its backward see the same mask.
template <class F>
decltype(auto) with_options_mask(const AttentionOptions& opts, F&& f) {
  if (opts.has_window()) return f(BandEachSequence{opts.window_left, opts.causal ? 0 : opts.window_right});
  return f(NoMaskEachSequence{});
}

}  // namespace flashattn
