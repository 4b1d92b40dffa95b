// The structured masks beyond a band (core/masks.hpp, built by core/score_variants.hpp): chunked local
// attention (causal or not), prefix-LM, and StreamingLLM's sink tokens plus a window. Their policy answers
// against brute force on small grids (keep against an independent definition; tile() never wrong and, for
// the interval masks, exact; kv_begin/kv_end covering every kept key; the query and key intervals exact),
// then forward and gradients against the fp64 reference for every dtype, one and two threads, and the
// builders' bad arguments.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "expect_invalid.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/core/score_variants.hpp"
#include "flashattn/forward.hpp"
#include "grad_problem.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// One mask of one sequence, with the definition of keep it must agree with (p: the query's position
// on the bottom-right diagonal, i + seq_k − seq_q).
template <class Mask>
struct Case {
  Mask mask;
  std::function<bool(index_t p, index_t j)> defined;
  bool exact_tiles;  // the interval masks answer tile() exactly; the streaming mask may say Partial
  std::string what;
};

template <class Mask>
void check_policy(const Case<Mask>& c, index_t sq, index_t sk) {
  SCOPED_TRACE(c.what + " seq_q=" + std::to_string(sq) + " seq_k=" + std::to_string(sk));
  const Mask& m = c.mask;
  const index_t off = sk - sq;
  for (index_t i = 0; i < sq; ++i)
    for (index_t j = 0; j < sk; ++j) ASSERT_EQ(m.keep(i, j), c.defined(i + off, j)) << "keep(" << i << ", " << j << ")";
  for (index_t q0 = 0; q0 < sq; ++q0)
    for (index_t q1 = q0 + 1; q1 <= sq; ++q1) {
      const index_t begin = m.kv_begin(q0, q1), end = m.kv_end(q0, q1);
      for (index_t i = q0; i < q1; ++i)
        for (index_t j = 0; j < sk; ++j)
          if (m.keep(i, j)) {
            ASSERT_TRUE(j >= begin && j < end) << "kept key " << j << " outside kv range";
          }
      for (index_t k0 = 0; k0 < sk; ++k0)
        for (index_t k1 = k0 + 1; k1 <= sk; ++k1) {
          bool any = false, all = true;
          for (index_t i = q0; i < q1; ++i)
            for (index_t j = k0; j < k1; ++j) any = any || m.keep(i, j), all = all && m.keep(i, j);
          const TileKind want = !any ? TileKind::Empty : all ? TileKind::Full : TileKind::Partial;
          const TileKind got = m.tile(q0, q1, k0, k1);
          if (c.exact_tiles) {
            ASSERT_EQ(int(got), int(want)) << "tile rows [" << q0 << "," << q1 << ") keys [" << k0 << "," << k1 << ")";
          } else {
            ASSERT_TRUE(got == want || got == TileKind::Partial)
                << "tile rows [" << q0 << "," << q1 << ") keys [" << k0 << "," << k1 << ")";
          }
        }
    }
  if constexpr (has_query_range<Mask>::value && has_key_range<Mask>::value) {
    for (index_t j = 0; j < sk; ++j) {
      const RowSpan span = rows_keeping_key(m, j, 0, sq);
      for (index_t i = 0; i < sq; ++i)
        ASSERT_EQ(m.keep(i, j), i >= span.first && i < span.last) << "query range of key " << j << ", row " << i;
    }
    for (index_t i = 0; i < sq; ++i)
      for (index_t j = 0; j < sk; ++j)
        ASSERT_EQ(m.keep(i, j), j >= m.lowest_key(i) && j <= m.highest_key(i)) << "key range of row " << i;
  }
}

template <class EachSequence, class Defined>
void check_each_shape(const EachSequence& each, Defined defined, bool exact, const std::string& what) {
  for (index_t sq : {1, 5, 13, 20})
    for (index_t sk : {1, 6, 13, 21}) {
      const auto m = policy_for(each, SequenceInfo{0, 0, sq, sk});
      check_policy(Case<decltype(m)>{m, defined, exact, what}, sq, sk);
    }
}

index_t chunk_of(index_t p, index_t c) { return p >= 0 ? p / c : -((-p + c - 1) / c); }

TEST(StructuredMasks, ChunkedAgainstBruteForce) {
  for (index_t c : {1, 3, 4, 7, 64})
    for (bool causal : {true, false})
      check_each_shape(
          chunked_mask(c, causal),
          [=](index_t p, index_t j) { return chunk_of(p, c) == chunk_of(j, c) && (!causal || j <= p); }, true,
          "chunk " + std::to_string(c) + (causal ? " causal" : ""));
}

TEST(StructuredMasks, PrefixLmAgainstBruteForce) {
  for (index_t prefix : {0, 1, 4, 30})
    check_each_shape(
        prefix_lm_mask(prefix), [=](index_t p, index_t j) { return j < prefix || j <= p; }, true,
        "prefix " + std::to_string(prefix));
}

TEST(StructuredMasks, StreamingAgainstBruteForce) {
  for (index_t sinks_n : {0, 1, 3})
    for (index_t window : {-1, 0, 2, 5})
      check_each_shape(
          streaming_mask(sinks_n, window),
          [=](index_t p, index_t j) { return j <= p && (j < sinks_n || window < 0 || j >= p - window); }, false,
          "sink tokens " + std::to_string(sinks_n) + " window " + std::to_string(window));
}

// The kernel's own grid: 64-row blocks against 64-key tiles skip what the mask excludes (a chunk of 128
// at N = 512: a quarter of the causal tiles).
TEST(StructuredMasks, ChunkedSkipsOtherChunksTiles) {
  const auto m = policy_for(chunked_mask(128), SequenceInfo{0, 0, 512, 512});
  int visited = 0;
  for (index_t q0 = 0; q0 < 512; q0 += 64)
    for (index_t k0 = m.kv_begin(q0, q0 + 64); k0 < m.kv_end(q0, q0 + 64); k0 += 64)
      visited += m.tile(q0, q0 + 64, k0, k0 + 64) != TileKind::Empty;
  EXPECT_EQ(visited, 4 * 3);  // per chunk of two row blocks: 1 + 2 tiles
}

// ---- Forward and gradients against the reference --------------------------------------------------------------

template <class T>
void check_masks_numerically() {
  const index_t b = 2, hq = 4, hkv = 2, d = 48;
  const auto run = [&](const auto& policy, index_t sq, index_t sk, const std::string& what) {
    SCOPED_TRACE(what + " seq_q=" + std::to_string(sq) + " seq_k=" + std::to_string(sk));
    for (int threads : {1, 2}) {
      GradProblem<T> pr(Layout::Bshd, b, sq, sk, hq, hkv, d, 61);
      attention_forward_masked(cpu::Context<>{threads}, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(),
                               policy, {}, pr.lse.view());
      const double scale = 1.0 / std::sqrt(double(d));
      EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                    policy));
      pr.backward_masked(policy, {}, {}, threads);
      EXPECT_TRUE(grads_match(pr, scale, policy));
    }
  };
  run(chunked_mask(32), 150, 150, "chunk 32");
  run(chunked_mask(50, false), 130, 170, "chunk 50 bidirectional");
  run(prefix_lm_mask(70), 140, 140, "prefix 70");
  run(prefix_lm_mask(20), 90, 150, "prefix 20");
  run(streaming_mask(4, 40), 200, 200, "4 sink tokens, window 40");
  run(streaming_mask(70, 64), 130, 190, "70 sink tokens, window 64");
  // With a variant over them (fp32 only, to keep the build short: the composition is dtype-free code).
  if constexpr (std::is_same_v<T, float>) run(soft_cap(2.0, chunked_mask(64)), 140, 140, "soft-cap over chunk 64");
}
TEST(StructuredMasks, MatchReferenceFp32) { check_masks_numerically<float>(); }
TEST(StructuredMasks, MatchReferenceBf16) { check_masks_numerically<Eigen::bfloat16>(); }
TEST(StructuredMasks, MatchReferenceFp64) { check_masks_numerically<double>(); }

TEST(StructuredMasks, BadArguments) {
  expect_invalid([] { chunked_mask(0); }, "chunked_mask: chunk must be >= 1, got chunk=0");
  expect_invalid([] { prefix_lm_mask(-2); }, "prefix_lm_mask: prefix must be >= 0, got prefix=-2");
  expect_invalid([] { streaming_mask(-1, 10); }, "streaming_mask: sink_tokens must be >= 0, got sink_tokens=-1");
}

}  // namespace
}  // namespace flashattn::testing
