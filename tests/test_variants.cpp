// Variant hooks of a policy (core/variants.hpp) beyond its mask: an attention sink (sink_logit(), one more
// logit in every row's softmax denominator that attends no value, counted in the LSE) and an output
// transform (transform_output(i, c, o), applied to each normalised output element).
//
// Sinks are checked against an fp64 reference computed here, under the tolerance rule of tolerance.hpp:
//   L = log(exp(sink) + Σ_j exp(s_j)) over the kept keys j,  o = Σ_j p_j v_j with p_j = exp(s_j − L),
// for fp32 with sizes around and off the 64-key tiles, causal and not, on one and two threads, and with
// few enough query blocks that the keys are split into ranges (split-KV, whose partial softmax states are
// merged: the sink must be counted once). A row that keeps no key attends only the sink: output 0, LSE sink.
// The output transform must give exactly the bits of the same call without it, transformed afterwards.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn/backward.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/score_variants.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/instrument/accounting.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// ---- Policies --------------------------------------------------------------------------------------------

// The mask members of a base policy (a BandMask, an ElementMask, ...), forwarded: what a policy that adds
// variant hooks to a mask is made of.
template <class Base>
struct Masked {
  Base base;
  index_t kv_begin(index_t q0, index_t q1) const { return base.kv_begin(q0, q1); }
  index_t kv_end(index_t q0, index_t q1) const { return base.kv_end(q0, q1); }
  TileKind tile(index_t q0, index_t q1, index_t k0, index_t k1) const { return base.tile(q0, q1, k0, k1); }
  bool keep(index_t i, index_t j) const { return base.keep(i, j); }
};

// The base's mask with an attention sink.
template <class Base>
struct WithSink : Masked<Base> {
  float sink = 0.0f;
  float sink_logit() const { return sink; }
};

// o -> 2·o + 1, plus terms of the row and the column, so that the indices the kernel passes are checked as
// well. Every product is by a power of two (exact), so the result has the same bits whether or not a
// compiler fuses a multiply and an add.
template <class S>
S affine(index_t i, index_t c, S o) {
  return S(2) * o + S(1) + S(i % 3) + S(0.5) * S(c % 2);
}

template <class Base>
struct WithTransform : Masked<Base> {
  template <class S>
  S transform_output(index_t i, index_t c, S o) const {
    return affine(i, c, o);
  }
};

template <class Base>
struct WithSinkAndTransform : WithSink<Base> {
  template <class S>
  S transform_output(index_t i, index_t c, S o) const {
    return affine(i, c, o);
  }
};

// One sink per query head (as gpt-oss learns them), through for_sequence.
struct SinkPerHead {
  const std::vector<float>* sinks;
  bool causal;
  WithSink<BandMask> for_sequence(const SequenceInfo& s) const {
    const BandMask band = causal ? BandMask::causal(s.seq_q, s.seq_k) : BandMask::window(s.seq_q, s.seq_k, -1, -1);
    return {{band}, (*sinks)[std::size_t(s.head)]};
  }
};

// Rows i with i % every == first keep no key; the others keep about two keys in three.
struct SkipRows {
  index_t every, first;
  bool operator()(index_t i, index_t j) const { return i % every != first && (i * 7 + j * 5) % 3 != 0; }
};

static_assert(has_sink_v<WithSink<BandMask>> && has_sink_v<WithSinkAndTransform<BandMask>>);
static_assert(!has_sink_v<BandMask> && !has_sink_v<NoMask> && !has_sink_v<WithTransform<BandMask>>);
static_assert(transforms_output_v<WithTransform<BandMask>> && transforms_output_v<WithSinkAndTransform<BandMask>>);
static_assert(!transforms_output_v<BandMask> && !transforms_output_v<WithSink<BandMask>>);
static_assert(!modifies_scores_v<WithSink<BandMask>> && !modifies_scores_v<WithSinkAndTransform<BandMask>>);
static_assert(has_sink_v<decltype(policy_for(SinkPerHead{}, SequenceInfo{}))>);

// ---- The reference ---------------------------------------------------------------------------------------

// The tolerance rule (tolerance.hpp) against the reference (reference.hpp, which counts the sink): the output's and the LSE's max error
// against fp64 at most twice that of the same computation in fp32, plus a few float ulps.
template <class Policy>
::testing::AssertionResult matches_sink_reference(const TensorView<const float>& q, const TensorView<const float>& k,
                                                  const TensorView<const float>& v, const TensorView<const float>& o,
                                                  const LseView& lse, double scale, const Policy& policy) {
  const ReferenceResult exact = reference_attention<double>(q, k, v, scale, policy);
  const ReferenceResult naive = reference_attention<float, float>(q, k, v, scale, policy);
  const ToleranceCheck out = check_output<float>(to_double(o), naive.o, exact.o);
  const ToleranceCheck l = check_lse(to_double(lse), naive.lse, exact.lse);
  ::testing::AssertionResult result =
      out.ok() && l.ok() ? ::testing::AssertionSuccess() : ::testing::AssertionFailure();
  return result << out.describe("o") << "; " << l.describe("lse");
}

// ---- Problems --------------------------------------------------------------------------------------------

struct Shape {
  index_t batch, seq_q, seq_k, heads_q, heads_kv, dim;
  std::string describe() const {
    std::ostringstream s;
    s << "batch=" << batch << " seq_q=" << seq_q << " seq_k=" << seq_k << " heads=" << heads_q << "/" << heads_kv
      << " dim=" << dim;
    return s.str();
  }
};

struct Problem {
  Shape shape;
  HostTensor<float> q, k, v, o;
  HostLse lse;
  explicit Problem(const Shape& s, std::uint32_t seed = 5)
      : shape(s),
        q(Layout::Bshd, s.batch, s.seq_q, s.heads_q, s.dim),
        k(Layout::Bshd, s.batch, s.seq_k, s.heads_kv, s.dim),
        v(Layout::Bshd, s.batch, s.seq_k, s.heads_kv, s.dim),
        o(Layout::Bshd, s.batch, s.seq_q, s.heads_q, s.dim, std::numeric_limits<float>::quiet_NaN()),
        lse(s.batch, s.heads_q, s.seq_q) {
    fill_normal(q.view(), seed);
    fill_normal(k.view(), seed + 1);
    fill_normal(v.view(), seed + 2);
  }
  double scale() const { return 1.0 / std::sqrt(double(shape.dim)); }

  // One masked call into fresh o and lse (NaN first, so that an unwritten element fails). Returns the
  // bytes the call reported as partial states of key ranges: > 0 exactly when it split the keys.
  template <class Context, class Policy>
  std::int64_t run(const Context& ctx, const Policy& policy) {
    std::fill(o.storage().begin(), o.storage().end(), std::numeric_limits<float>::quiet_NaN());
    for (index_t b = 0; b < shape.batch; ++b)
      for (index_t h = 0; h < shape.heads_q; ++h)
        for (index_t i = 0; i < shape.seq_q; ++i) lse.view()(b, h, i) = std::numeric_limits<float>::quiet_NaN();
    ByteCounter counter;
    attention_forward_masked(ctx, q.cview(), k.cview(), v.cview(), o.view(), policy, AttentionOptions{}, lse.view(),
                             counter);
    return counter.written_bytes(Traffic::Partial);
  }
  std::vector<float> out() { return o.storage(); }
  std::vector<float> lses() const {
    std::vector<float> l;
    for (double x : to_double(lse.view())) l.push_back(float(x));
    return l;
  }
};

template <class Policy>
::testing::AssertionResult matches_reference(const Problem& p, const Policy& policy) {
  return matches_sink_reference(p.q.cview(), p.k.cview(), p.v.cview(), p.o.cview(), p.lse.view(), p.scale(), policy);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

BandMask band(bool causal, index_t seq_q, index_t seq_k) {
  return causal ? BandMask::causal(seq_q, seq_k) : BandMask::window(seq_q, seq_k, -1, -1);
}

WithSink<BandMask> sink_on_band(bool causal, index_t seq_q, index_t seq_k, float sink) {
  return {{band(causal, seq_q, seq_k)}, sink};
}

// Panels: 48-row programs of three 16-row panels, each starting its softmax from the sink.
using PanelTiles = cpu::Tiles<48, 32, cpu::kBestIsa, 16>;

const index_t kLengths[] = {1, 63, 65, 200};
const float kSinks[] = {-2.5f, 0.0f, 0.75f, 3.0f};

// ---- Sinks against the reference -------------------------------------------------------------------------

TEST(Sinks, MatchReferenceOverLengthsMasksAndThreads) {
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) {
      const index_t sq = kLengths[a], sk = kLengths[b];
      const float sink = kSinks[(a + b) % 4];  // each sink with every seq_q and every seq_k once
      for (bool causal : {false, true}) {
        const Shape shape{2, sq, sk, 4, 2, 64};
        Problem p(shape, std::uint32_t(sq * 1000 + sk));
        const auto policy = sink_on_band(causal, sq, sk, sink);
        for (int threads : {1, 2}) {
          // The prefill kernel's own finalize (no key split for these sizes), then the decode kernel's
          // path for seq_q <= 16 (partial states merged with the sink).
          cpu::Context<> prefill{threads};
          prefill.decode_kernel = false;
          const std::int64_t partial = p.run(prefill, policy);
          EXPECT_EQ(partial, 0) << "no key split expected here: " << shape.describe();
          EXPECT_TRUE(matches_reference(p, policy))
              << shape.describe() << " causal=" << causal << " sink=" << sink << " threads=" << threads;
          p.run(cpu::Context<>{threads}, policy);
          EXPECT_TRUE(matches_reference(p, policy)) << shape.describe() << " causal=" << causal << " sink=" << sink
                                                    << " threads=" << threads << " (decode path where seq_q <= 16)";
        }
      }
    }
}

// A runtime head dim, and programs of several panels.
TEST(Sinks, MatchReferenceWithRuntimeHeadDimAndPanels) {
  for (index_t d : {40, 64})
    for (bool causal : {false, true})
      for (float sink : {-1.0f, 2.0f}) {
        const Shape shape{1, 65, 200, 2, 1, d};
        Problem p(shape, std::uint32_t(d));
        const auto policy = sink_on_band(causal, shape.seq_q, shape.seq_k, sink);
        p.run(cpu::Context<>{2}, policy);
        EXPECT_TRUE(matches_reference(p, policy)) << shape.describe() << " causal=" << causal << " sink=" << sink;
        p.run(cpu::Context<PanelTiles>{2}, policy);
        EXPECT_TRUE(matches_reference(p, policy))
            << "panels: " << shape.describe() << " causal=" << causal << " sink=" << sink;
      }
}

// One query block against 2048 keys: the keys are split into ranges whose partial states are merged; the
// sink belongs to one range only, so it is counted once. Same bits on one and two threads.
TEST(Sinks, MatchReferenceWhenTheKeysAreSplit) {
  for (index_t sq = 1; sq <= 4; ++sq)
    for (bool causal : {false, true})
      for (float sink : kSinks) {
        const Shape shape{1, sq, 2048, 1, 1, 64};
        Problem p(shape, std::uint32_t(40 + sq));
        const auto policy = sink_on_band(causal, sq, shape.seq_k, sink);
        std::vector<float> first, first_lse;
        for (int threads : {1, 2}) {
          const std::int64_t partial = p.run(cpu::Context<>{threads}, policy);
          EXPECT_GT(partial, 0) << "expected a key split: " << shape.describe();
          EXPECT_TRUE(matches_reference(p, policy))
              << shape.describe() << " causal=" << causal << " sink=" << sink << " threads=" << threads;
          if (threads == 1) {
            first = p.out();
            first_lse = p.lses();
          } else {
            EXPECT_TRUE(same_bits(p.out(), first) && same_bits(p.lses(), first_lse))
                << "thread count changed the bits: " << shape.describe() << " sink=" << sink;
          }
        }
      }
}

// Sinks that differ per query head, through for_sequence.
TEST(Sinks, PerHeadSinksThroughForSequence) {
  const std::vector<float> sinks{-3.0f, 0.5f, 1.25f, 4.0f};
  for (bool causal : {false, true}) {
    const Shape shape{2, 65, 63, 4, 2, 64};
    Problem p(shape, 77);
    const SinkPerHead policy{&sinks, causal};
    p.run(cpu::Context<>{2}, policy);
    EXPECT_TRUE(matches_reference(p, policy)) << "causal=" << causal;
  }
}

// A sink of −inf weighs nothing: the result of the mask alone.
TEST(Sinks, MinusInfinitySinkIsNoSink) {
  const Shape shape{1, 65, 200, 2, 2, 64};
  Problem p(shape, 91);
  for (bool causal : {false, true}) {
    const auto policy = sink_on_band(causal, shape.seq_q, shape.seq_k, -std::numeric_limits<float>::infinity());
    p.run(cpu::Context<>{1}, policy);
    EXPECT_TRUE(matches_reference(p, policy)) << "causal=" << causal;
    AttentionOptions opts;  // the same mask, described by options: reference.hpp's sink-less reference
    opts.causal = causal;
    EXPECT_TRUE(matches_reference_for_options<float>(p.q.cview(), p.k.cview(), p.v.cview(), p.o.cview(),
                                                     p.lse.view(), opts))
        << "causal=" << causal;
  }
}

// ---- Rows that keep no key --------------------------------------------------------------------------------

// Checks that rows `masked(b, h, i)` are exactly 0 with the sink as LSE (to rounding), and the whole result matches
// the reference.
template <class Policy, class Masked>
void expect_sink_only_rows(Problem& p, const Policy& policy, float sink, Masked masked, const std::string& what) {
  const Shape& s = p.shape;
  index_t rows = 0;
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t h = 0; h < s.heads_q; ++h)
      for (index_t i = 0; i < s.seq_q; ++i) {
        if (!masked(b, h, i)) continue;
        ++rows;
        // The softmax state is kept in base-2 units, so the sink comes back through sink·log2(e)·ln(2): two
        // roundings, within 2 epsilon of the sink (exact for some values, 1 ulp off for others).
        const float lse = p.lse.view()(b, h, i);
        EXPECT_LE(std::fabs(lse - sink), 2 * std::numeric_limits<float>::epsilon() * std::max(1.0f, std::fabs(sink)))
            << std::setprecision(9) << what << " row (" << b << ", " << h << ", " << i << "): lse " << lse
            << " vs sink " << sink;
        for (index_t c = 0; c < s.dim; ++c)
          ASSERT_EQ(p.o.view()(b, i, h, c), 0.0f) << what << " row (" << b << ", " << h << ", " << i << ") col " << c;
      }
  EXPECT_GT(rows, 0) << what << ": the case has no row without keys";
  EXPECT_TRUE(matches_reference(p, policy)) << what;
}

TEST(Sinks, RowsWithoutKeysAttendOnlyTheSink) {
  for (float sink : kSinks)
    for (int threads : {1, 2}) {
      const std::string what = "sink=" + std::to_string(sink) + " threads=" + std::to_string(threads);
      {  // causal with seq_q > seq_k: the first seq_q − seq_k rows keep no key
        const Shape shape{2, 200, 63, 4, 2, 64};
        Problem p(shape, 3);
        const auto policy = sink_on_band(true, shape.seq_q, shape.seq_k, sink);
        p.run(cpu::Context<>{threads}, policy);
        expect_sink_only_rows(p, policy, sink, [](index_t, index_t, index_t i) { return i < 200 - 63; },
                              "causal 200 x 63, " + what);
      }
      {  // an element mask that leaves every other row without keys, with and without a key split
        for (index_t sk : {index_t(65), index_t(2048)}) {
          const Shape shape{1, 4, sk, 1, 1, 64};
          Problem p(shape, 4);
          const WithSink<ElementMask<SkipRows>> policy{{element_mask(sk, SkipRows{2, 1})}, sink};
          cpu::Context<> prefill{threads};  // the prefill kernel: its own finalize, or a key split
          prefill.decode_kernel = false;
          const std::int64_t partial = p.run(prefill, policy);
          EXPECT_EQ(partial > 0, sk == 2048) << "seq_k=" << sk;
          expect_sink_only_rows(p, policy, sink, [](index_t, index_t, index_t i) { return i % 2 == 1; },
                                "element mask, seq_k=" + std::to_string(sk) + ", " + what);
          p.run(cpu::Context<>{threads}, policy);  // the decode kernel (seq_q = 4)
          expect_sink_only_rows(p, policy, sink, [](index_t, index_t, index_t i) { return i % 2 == 1; },
                                "decode path, element mask, seq_k=" + std::to_string(sk) + ", " + what);
        }
      }
      {  // no keys at all
        const Shape shape{1, 65, 0, 2, 1, 64};
        Problem p(shape, 5);
        const auto policy = sink_on_band(false, shape.seq_q, 0, sink);
        p.run(cpu::Context<>{threads}, policy);
        expect_sink_only_rows(p, policy, sink, [](index_t, index_t, index_t) { return true; }, "seq_k=0, " + what);
      }
    }
}

// The LSE of a row that keeps no key is the sink itself, exactly, whatever its value: the sink is the
// row's only logit. (The sinks above are also exact through the kernel's base-2 round trip,
// sink·log2(e)·ln(2); these are sinks that are not, e.g. 0.9f and -30.0f.)
TEST(Sinks, RowsWithoutKeysHaveTheSinkAsLseForAnySink) {
  for (float sink : {0.1f, 0.9f, 1.3f, -30.0f})
    for (index_t sk : {index_t(63), index_t(2048)}) {  // without and with a key split
      const Shape shape{1, 4, sk, 1, 1, 64};
      Problem p(shape, 6);
      const WithSink<ElementMask<SkipRows>> policy{{element_mask(sk, SkipRows{2, 1})}, sink};
      p.run(cpu::Context<>{1}, policy);
      expect_sink_only_rows(p, policy, sink, [](index_t, index_t, index_t i) { return i % 2 == 1; },
                            "sink=" + std::to_string(sink) + " seq_k=" + std::to_string(sk));
    }
}

// A row that keeps no key is exactly 0 even when a key it does not keep has a non-finite V entry in its
// tile: the 0 weight times inf is NaN in the accumulator, and only ℓ = 0 (no kept key, the sink merged in
// after) may say "no key" (found by the fuzzer: a sink made the row's ℓ 1 and let the NaN through).
TEST(Sinks, RowsWithoutKeysStayZeroBesideNonFiniteValues) {
  for (float sink : {-2.5f, 0.75f})
    for (index_t sk : {index_t(1), index_t(63), index_t(2048)}) {  // the last splits the keys
      const Shape shape{1, 4, sk, 1, 1, 32};
      Problem p(shape, 8);
      for (index_t j = 0; j < sk; j += 7) p.v.view()(0, j, 0, 3) = -std::numeric_limits<float>::infinity();
      const WithSink<ElementMask<SkipRows>> policy{{element_mask(sk, SkipRows{2, 1})}, sink};
      const std::string what = "sink=" + std::to_string(sink) + " seq_k=" + std::to_string(sk);
      p.run(cpu::Context<>{1}, policy);
      for (index_t i = 1; i < shape.seq_q; i += 2) {  // SkipRows{2, 1}: odd rows keep no key
        for (index_t c = 0; c < shape.dim; ++c)
          ASSERT_EQ(p.o.view()(0, i, 0, c), 0.0f) << what << " row " << i << " col " << c;
        const float lse = p.lse.view()(0, 0, i);
        EXPECT_LE(std::fabs(lse - sink), 2 * std::numeric_limits<float>::epsilon() * std::max(1.0f, std::fabs(sink)))
            << what << " row " << i;
      }
    }
}

// A sink far above every score scales a row's keys down to a factor of +0 (2^(m − sink) underflows): the
// row still kept keys, so a NaN in a kept key's V must reach it (NaN propagates), while its finite
// entries come out 0 — unlike a row that kept no key, written as exactly 0 (found by the fuzzer in CI).
TEST(Sinks, ADominantSinkStillPropagatesNaN) {
  for (index_t sk : {index_t(63), index_t(2048)}) {  // the second splits the keys
    const Shape shape{1, 4, sk, 1, 1, 32};
    Problem p(shape, 9);
    p.v.view()(0, 0, 0, 3) = std::numeric_limits<float>::quiet_NaN();
    const WithSink<BandMask> policy{{BandMask::window(shape.seq_q, sk, -1, -1)}, 200.0f};
    p.run(cpu::Context<>{1}, policy);
    const std::string what = "seq_k=" + std::to_string(sk);
    for (index_t i = 0; i < shape.seq_q; ++i)
      for (index_t c = 0; c < shape.dim; ++c) {
        const float x = p.o.view()(0, i, 0, c);
        if (c == 3) {
          EXPECT_TRUE(std::isnan(x)) << what << " row " << i << ": " << x;
        } else {
          EXPECT_EQ(x, 0.0f) << what << " row " << i << " col " << c;
        }
      }
  }
}

// ---- The output transform --------------------------------------------------------------------------------

// The transformed call gives exactly transform(the plain call's output), element by element, and the
// same LSE bits.
template <class Context, class Plain, class Transformed>
void expect_transform_exact(Problem& p, const Context& ctx, const Plain& plain, const Transformed& transformed,
                            const std::string& what) {
  const std::int64_t plain_partial = p.run(ctx, plain);
  std::vector<float> want = p.out();
  const std::vector<float> plain_lse = p.lses();
  const Shape& s = p.shape;
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t i = 0; i < s.seq_q; ++i)
      for (index_t h = 0; h < s.heads_q; ++h)
        for (index_t c = 0; c < s.dim; ++c) {
          float& x = want[std::size_t(((b * s.seq_q + i) * s.heads_q + h) * s.dim + c)];
          x = affine(i, c, x);
        }
  const std::int64_t transformed_partial = p.run(ctx, transformed);
  EXPECT_EQ(plain_partial, transformed_partial) << what;
  const std::vector<float> got = p.out();
  ASSERT_EQ(got.size(), want.size());
  std::size_t differing = 0, first = 0;
  for (std::size_t n = 0; n < got.size(); ++n)
    if (std::memcmp(&got[n], &want[n], sizeof(float)) != 0 && differing++ == 0) first = n;
  EXPECT_EQ(differing, 0u) << what << ": first at element " << first << ": " << got[first] << " vs " << want[first];
  EXPECT_TRUE(same_bits(p.lses(), plain_lse)) << what << ": the transform changed the LSE";
}

TEST(OutputTransform, IsExactlyTheTransformOfThePlainOutput) {
  for (index_t sq : kLengths)
    for (index_t sk : kLengths)
      for (bool causal : {false, true})
        for (int threads : {1, 2}) {
          const Shape shape{2, sq, sk, 4, 2, 64};
          Problem p(shape, std::uint32_t(sq + sk));
          const BandMask mask = band(causal, sq, sk);
          expect_transform_exact(p, cpu::Context<>{threads}, mask, WithTransform<BandMask>{{mask}},
                                 shape.describe() + " causal=" + std::to_string(causal) +
                                     " threads=" + std::to_string(threads));
        }
}

TEST(OutputTransform, WithSinksPanelsAndSplitKeys) {
  for (bool causal : {false, true})
    for (int threads : {1, 2}) {
      const std::string what = "causal=" + std::to_string(causal) + " threads=" + std::to_string(threads);
      for (const Shape& shape : {Shape{2, 200, 65, 4, 2, 64}, Shape{1, 63, 200, 2, 1, 40}}) {
        Problem p(shape, 12);
        const auto plain = sink_on_band(causal, shape.seq_q, shape.seq_k, 0.75f);
        const WithSinkAndTransform<BandMask> transformed{plain};
        expect_transform_exact(p, cpu::Context<>{threads}, plain, transformed, shape.describe() + " " + what);
        expect_transform_exact(p, cpu::Context<PanelTiles>{threads}, plain, transformed,
                               "panels " + shape.describe() + " " + what);
      }
      for (index_t sq = 1; sq <= 4; ++sq) {  // split keys: the transform applies to the merged output
        const Shape shape{1, sq, 2048, 1, 1, 64};
        Problem p(shape, 13);
        const BandMask mask = band(causal, sq, shape.seq_k);
        expect_transform_exact(p, cpu::Context<>{threads}, mask, WithTransform<BandMask>{{mask}},
                               "split " + shape.describe() + " " + what);
        const auto plain = sink_on_band(causal, sq, shape.seq_k, -2.5f);
        expect_transform_exact(p, cpu::Context<>{threads}, plain, WithSinkAndTransform<BandMask>{plain},
                               "split with sink " + shape.describe() + " " + what);
        EXPECT_GT(p.run(cpu::Context<>{threads}, plain), 0) << "expected a key split: " << shape.describe();
      }
    }
}

// ---- The backward with a sink -----------------------------------------------------------------------------

// dQ, dK, dV of a call with a sink against an fp64 reference: P_ij = exp(s_ij − L_i) with L_i the LSE of
// the row including the sink, dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)), dQ = scale·dS·K, dK = scale·dSᵀ·Q,
// dV = Pᵀ·dO. The sink attends no value, so it enters only through L. (The double path refines the float
// LSE it is given with its own sweep, which must count the sink's term as well.)
template <class T>
void expect_sink_gradients(index_t seq_q, index_t seq_k, index_t d, bool causal, float sink, int threads,
                           double tolerance) {
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<T> q(std::size_t(seq_q * d)), k(std::size_t(seq_k * d)), v(k.size()), d_o(q.size()), o(q.size()),
      dq(q.size()), dk(k.size()), dv(k.size());
  for (std::size_t n = 0; n < q.size(); ++n) q[n] = T(std::sin(0.3 * double(n))), d_o[n] = T(std::cos(0.17 * double(n)));
  for (std::size_t n = 0; n < k.size(); ++n) k[n] = T(std::cos(0.21 * double(n))), v[n] = T(std::sin(0.07 * double(n) + 1));
  std::vector<float> lse(static_cast<std::size_t>(seq_q));
  const auto view = [&](std::vector<T>& x, index_t seq) { return bshd(x.data(), 1, seq, 1, d); };
  const auto cview = [&](std::vector<T>& x, index_t seq) { return bshd<const T>(x.data(), 1, seq, 1, d); };
  const BandMask band = causal ? BandMask::causal(seq_q, seq_k) : BandMask::window(seq_q, seq_k, -1, -1);
  const WithSink<BandMask> policy{{band}, sink};
  const cpu::Context<> ctx{threads};
  attention_forward_masked(ctx, cview(q, seq_q), cview(k, seq_k), cview(v, seq_k), view(o, seq_q), policy, {},
                           lse_bhs(lse.data(), 1, 1, seq_q));
  attention_backward_masked(ctx, cview(q, seq_q), cview(k, seq_k), cview(v, seq_k), cview(o, seq_q),
                            cview(d_o, seq_q), lse_bhs(lse.data(), 1, 1, seq_q), view(dq, seq_q), view(dk, seq_k),
                            view(dv, seq_k), policy);

  std::vector<double> ref_dq(q.size()), ref_dk(k.size()), ref_dv(k.size()), p(static_cast<std::size_t>(seq_k));
  for (index_t i = 0; i < seq_q; ++i) {
    double m = sink;
    for (index_t j = 0; j < seq_k; ++j) {
      double dot = 0;
      for (index_t c = 0; c < d; ++c) dot += double(q[i * d + c]) * double(k[j * d + c]);
      p[j] = band.keep(i, j) ? dot * scale : -std::numeric_limits<double>::infinity();
      m = std::max(m, p[j]);
    }
    double l = std::exp(double(sink) - m);
    for (index_t j = 0; j < seq_k; ++j) l += std::exp(p[j] - m);
    std::vector<double> out(static_cast<std::size_t>(d), 0.0);
    for (index_t j = 0; j < seq_k; ++j) {
      p[j] = std::exp(p[j] - m) / l;
      for (index_t c = 0; c < d; ++c) out[c] += p[j] * double(v[j * d + c]);
    }
    double delta = 0;
    for (index_t c = 0; c < d; ++c) delta += double(d_o[i * d + c]) * out[c];
    for (index_t j = 0; j < seq_k; ++j) {
      double dp = 0;
      for (index_t c = 0; c < d; ++c) {
        dp += double(d_o[i * d + c]) * double(v[j * d + c]);
        ref_dv[j * d + c] += p[j] * double(d_o[i * d + c]);
      }
      const double ds = p[j] * (dp - delta);
      for (index_t c = 0; c < d; ++c) {
        ref_dq[i * d + c] += scale * ds * double(k[j * d + c]);
        ref_dk[j * d + c] += scale * ds * double(q[i * d + c]);
      }
    }
  }
  const auto worst = [](const std::vector<T>& got, const std::vector<double>& want) {
    double e = 0;
    for (std::size_t n = 0; n < got.size(); ++n) e = std::max(e, std::fabs(double(got[n]) - want[n]));
    return e;
  };
  const std::string what = "seq " + std::to_string(seq_q) + " x " + std::to_string(seq_k) + ", d " +
                           std::to_string(d) + (causal ? ", causal" : "") + ", sink " + std::to_string(sink) +
                           ", threads " + std::to_string(threads);
  EXPECT_LE(worst(dq, ref_dq), tolerance) << "dq, " << what;
  EXPECT_LE(worst(dk, ref_dk), tolerance) << "dk, " << what;
  EXPECT_LE(worst(dv, ref_dv), tolerance) << "dv, " << what;
}

TEST(Sinks, BackwardGradientsMatchTheReference) {
  for (float sink : {-2.5f, 0.75f, 3.0f})
    for (bool causal : {false, true})
      for (int threads : {1, 2}) {
        // fp32: the gradients' entries are O(1) sums of ~100 terms, so a few 1e-6 of rounding.
        expect_sink_gradients<float>(70, 90, 32, causal, sink, threads, 2e-5);
        expect_sink_gradients<float>(130, 65, 64, causal, sink, threads, 2e-5);
        // fp64: the same to double rounding (the sink's term in the refined LSE is checked here).
        expect_sink_gradients<double>(70, 90, 32, causal, sink, threads, 1e-9);
        expect_sink_gradients<double>(1, 200, 40, causal, sink, threads, 1e-9);
      }
}


// ---- A policy declared inside a function ---------------------------------------------------------------------

// C++ allows a local class neither member templates nor static data members; a policy can still be one
// (docs/usage.md §5): its flag an enumerator, its score and derivative plain functions of double. It must
// give what the built-in alibi gives, forward and backward.
TEST(LocalClassPolicy, MatchesBuiltinAlibi) {
  const index_t sq = 45, sk = 70, d = 24;
  struct LocalAlibi : BandMask {
    enum : bool { modifies_scores = true };
    float slope = 0;
    double score(index_t i, index_t j, double s) const { return s - double(slope) * double(i + offset - j); }
    double score_grad(index_t, index_t, double) const { return 1.0; }
  };
  const LocalAlibi local{{BandMask::causal(sq, sk)}, 0.375f};
  const std::vector<float> slopes = {0.375f};  // alibi keeps a pointer: the slopes outlive the calls
  const auto builtin = alibi(slopes, causal_mask());

  std::vector<float> q(std::size_t(sq * d)), k(std::size_t(sk * d)), v(k.size()), d_o(q.size());
  std::uint32_t state = 7;
  for (auto* x : {&q, &k, &v, &d_o})
    for (float& e : *x) e = float((state = state * 1664525u + 1013904223u) >> 8) / float(1 << 24) * 2.0f - 1.0f;
  struct Out {
    std::vector<float> o, lse, dq, dk, dv;
  };
  const auto run = [&](const auto& policy) {
    Out r{std::vector<float>(q.size()), std::vector<float>(std::size_t(sq)), std::vector<float>(q.size()),
          std::vector<float>(k.size()), std::vector<float>(k.size())};
    const auto in = [](const std::vector<float>& x, index_t s) { return bshd<const float>(x.data(), 1, s, 1, 24); };
    attention_forward_masked<float>(in(q, sq), in(k, sk), in(v, sk), bshd(r.o.data(), 1, sq, 1, d), policy, {},
                                    lse_bhs(r.lse.data(), 1, 1, sq));
    attention_backward_masked<float>(in(q, sq), in(k, sk), in(v, sk), in(r.o, sq), in(d_o, sq),
                                     lse_bhs(r.lse.data(), 1, 1, sq), bshd(r.dq.data(), 1, sq, 1, d),
                                     bshd(r.dk.data(), 1, sk, 1, d), bshd(r.dv.data(), 1, sk, 1, d), policy);
    return r;
  };
  const Out a = run(local), b = run(builtin);
  const auto close = [](const std::vector<float>& x, const std::vector<float>& y, const char* what) {
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(x[i], y[i], 2e-5 * std::max(1.0f, std::abs(y[i]))) << what << "[" << i << "]";
  };
  close(a.o, b.o, "o");
  close(a.lse, b.lse, "lse");
  close(a.dq, b.dq, "dq");
  close(a.dk, b.dk, "dk");
  close(a.dv, b.dv, "dv");
}

}  // namespace
}  // namespace flashattn::testing
