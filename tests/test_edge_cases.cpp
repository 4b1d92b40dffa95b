// Edge cases of the forward pass, through the public API with the default tiles, for every scalar type:
// empty problems, rows that keep no key, NaN propagation, huge scores, and results that do not depend on
// the number of threads.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "configs.hpp"
#include "expect_invalid.hpp"
#include "flashattn/core/fused_qkv.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

template <class T>
class EdgeCases : public ::testing::Test {
 protected:
  static T nan() { return T(std::numeric_limits<float>::quiet_NaN()); }
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  struct Problem {
    HostTensor<T> q, k, v, o;
    HostLse lse;
    Problem(index_t batch, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, std::uint32_t seed = 7)
        : q(Layout::Bshd, batch, sq, hq, d),
          k(Layout::Bshd, batch, sk, hkv, d),
          v(Layout::Bshd, batch, sk, hkv, d),
          o(Layout::Bshd, batch, sq, hq, d, nan()),
          lse(batch, hq, sq) {
      fill_normal(q.view(), seed);
      fill_normal(k.view(), seed + 1);
      fill_normal(v.view(), seed + 2);
    }
    void run(const AttentionOptions& opts = {}, const cpu::Context<>& ctx = {}) {
      attention_forward(ctx, q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
    }
    std::vector<double> out() const { return to_double(o.cview()); }
    std::vector<double> lses() const { return to_double(lse.view()); }
  };
};

using Scalars = ::testing::Types<float, double, Eigen::half, Eigen::bfloat16>;
struct ScalarName {
  template <class T>
  static std::string GetName(int) {
    return scalar_name<T>();
  }
};
TYPED_TEST_SUITE(EdgeCases, Scalars, ScalarName);

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <class Problem>
::testing::AssertionResult matches_reference_for(const Problem& pr, const AttentionOptions& opts, double ulps = 4.0) {
  return matches_reference_for_options(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), opts,
                                       ulps);
}

// ---- Empty problems ----------------------------------------------------------------------------------------

// seq_q = 0 or batch = 0: a no-op that touches nothing, even with null data behind the empty views.
TYPED_TEST(EdgeCases, EmptyQueriesOrBatchAreNoOps) {
  using T = TypeParam;
  std::vector<T> kv(2 * 3 * 2 * 8, T(1.0f));
  for (const index_t batch : {0, 2}) {
    const index_t sq = batch == 0 ? 4 : 0;
    // Built with the layout helpers, as a caller would: their strides are 0 where an extent is 0.
    const TensorView<T> q = bshd<T>(nullptr, batch, sq, 2, 8), o = bhsd<T>(nullptr, batch, 2, sq, 8);
    const LseView lse = lse_bhs(nullptr, batch, 2, sq);
    const TensorView<const T> kb = bshd<const T>(kv.data(), batch, 3, 2, 8);
    EXPECT_NO_THROW(attention_forward(q, kb, kb, o, {}, lse)) << "batch=" << batch << " seq_q=" << sq;
    AttentionOptions causal;
    causal.causal = true;
    EXPECT_NO_THROW(attention_forward(q, kb, kb, o, causal, lse));
  }
  for (const T& x : kv) EXPECT_EQ(float(x), 1.0f);
}

// seq_k = 0 with queries: there is no key to attend to, so every row is fully masked: output 0, LSE −inf.
TYPED_TEST(EdgeCases, NoKeysGivesZeroAndMinusInfinity) {
  using T = TypeParam;
  HostTensor<T> q(Layout::Bshd, 2, 5, 4, 16), o(Layout::Bshd, 2, 5, 4, 16, this->nan());
  fill_normal(q.view(), 3);
  const TensorView<const T> kv{nullptr, 2, 0, 2, 16, 0, 32, 16, 1};
  HostLse lse(2, 4, 5);
  for (bool causal : {false, true}) {
    AttentionOptions opts;
    opts.causal = causal;
    attention_forward(q.cview(), kv, kv, o.view(), opts, lse.view());
    for (double x : to_double(o.cview())) ASSERT_EQ(x, 0.0);
    for (double x : to_double(lse.view())) ASSERT_EQ(x, double(this->kNegInf));
  }
}

// ---- Fully masked rows ---------------------------------------------------------------------------------

// Rows that keep no key: output exactly 0 and LSE −inf, no NaN anywhere, and the other rows still match
// the reference. Even a NaN in V cannot reach a row that keeps nothing.
TYPED_TEST(EdgeCases, FullyMaskedRows) {
  struct Shape {
    index_t sq, sk;
    bool causal;
    index_t left, right;
    index_t masked_rows;  // the first `masked_rows` rows keep no key
  };
  const Shape shapes[] = {
      {70, 20, true, -1, -1, 50},  // causal, seq_q > seq_k: the first seq_q - seq_k rows
      {90, 30, false, 0, 0, 60},   // a zero-width window on the bottom-right diagonal
      {60, 20, false, 3, 0, 40},   // a causal window of 4 keys, seq_q > seq_k
  };
  for (const Shape& sh : shapes) {
    typename TestFixture::Problem pr(1, sh.sq, sh.sk, 2, 1, 16);
    AttentionOptions opts;
    opts.causal = sh.causal;
    opts.window_left = sh.left;
    opts.window_right = sh.right;
    const index_t masked = sh.masked_rows;
    pr.run(opts);
    for (index_t h = 0; h < 2; ++h)
      for (index_t i = 0; i < sh.sq; ++i) {
        const float l = pr.lse.view()(0, h, i);
        ASSERT_FALSE(std::isnan(l)) << "row " << i;
        if (i < masked) {
          ASSERT_EQ(l, this->kNegInf) << "row " << i;
        }
        for (index_t c = 0; c < 16; ++c) {
          const float x = float(pr.o.view()(0, i, h, c));
          ASSERT_FALSE(std::isnan(x)) << "row " << i;
          if (i < masked) {
            ASSERT_EQ(x, 0.0f) << "row " << i;
          }
        }
      }
    EXPECT_TRUE(matches_reference_for(pr, opts)) << "seq_q=" << sh.sq << " seq_k=" << sh.sk;

    // NaN in every value row: the masked rows stay exactly 0.
    for (index_t j = 0; j < sh.sk; ++j) pr.v.view()(0, j, 0, 3) = this->nan();
    pr.run(opts);
    for (index_t i = 0; i < masked; ++i)
      for (index_t c = 0; c < 16; ++c) ASSERT_EQ(float(pr.o.view()(0, i, 0, c)), 0.0f) << "row " << i;
  }
}

// ---- NaN propagation ------------------------------------------------------------------------------------

// Runs `pr` clean, then with `poison` applied, and checks each output row: NaN where `touched(b, i, h)`,
// bit-identical to the clean run elsewhere. The LSE of a row is NaN where `lse_touched(b, i, h)`.
template <class Problem, class Poison, class Touched, class LseTouched>
void check_nan_propagation(Problem& pr, const AttentionOptions& opts, Poison poison, Touched touched,
                           LseTouched lse_touched) {
  pr.run(opts);
  const std::vector<double> clean = pr.out(), clean_lse = pr.lses();
  poison();
  pr.run(opts);
  const std::vector<double> dirty = pr.out(), dirty_lse = pr.lses();
  const auto o = pr.o.view();
  std::size_t n = 0;
  for (index_t b = 0; b < o.batch; ++b)
    for (index_t i = 0; i < o.seq; ++i)
      for (index_t h = 0; h < o.heads; ++h) {
        bool any_nan = false;
        for (index_t c = 0; c < o.dim; ++c, ++n) {
          if (touched(b, i, h)) {
            any_nan = any_nan || std::isnan(dirty[n]);
          } else {
            ASSERT_TRUE(same_bits(dirty[n], clean[n])) << "untouched output (" << b << ", " << i << ", " << h << ", "
                                                       << c << ") changed: " << dirty[n] << " vs " << clean[n];
          }
        }
        if (touched(b, i, h)) {
          ASSERT_TRUE(any_nan) << "output row (" << b << ", " << i << ", " << h << ") lost the NaN";
        }
        const std::size_t l = std::size_t((b * o.heads + h) * o.seq + i);
        if (lse_touched(b, i, h)) {
          ASSERT_TRUE(std::isnan(dirty_lse[l])) << "lse (" << b << ", " << h << ", " << i << ")";
        } else {
          ASSERT_TRUE(same_bits(dirty_lse[l], clean_lse[l])) << "lse (" << b << ", " << h << ", " << i << ")";
        }
      }
}

// NaN in one query row: exactly that output row (every element) and its LSE.
TYPED_TEST(EdgeCases, NanInQueryRow) {
  for (bool causal : {false, true}) {
    typename TestFixture::Problem pr(2, 77, 90, 4, 2, 16);
    AttentionOptions opts;
    opts.causal = causal;
    const auto touched = [](index_t b, index_t i, index_t h) { return b == 1 && i == 40 && h == 2; };
    check_nan_propagation(
        pr, opts, [&] { pr.q.view()(1, 40, 2, 5) = TestFixture::nan(); }, touched, touched);
    for (index_t c = 0; c < 16; ++c) EXPECT_TRUE(std::isnan(float(pr.o.view()(1, 40, 2, c))));
  }
}

// NaN in one key row of KV head 1, batch 0: every query row of query heads 2 and 3 (the heads that share
// KV head 1) that attends to that key; nothing in the other heads or the other batch entry.
TYPED_TEST(EdgeCases, NanInKeyRow) {
  const index_t sq = 77, sk = 90, key = 30, offset = sk - sq;
  for (bool causal : {false, true}) {
    typename TestFixture::Problem pr(2, sq, sk, 4, 2, 16);
    AttentionOptions opts;
    opts.causal = causal;
    const auto touched = [&](index_t b, index_t i, index_t h) {
      return b == 0 && h / 2 == 1 && (!causal || key <= i + offset);
    };
    check_nan_propagation(
        pr, opts, [&] { pr.k.view()(0, key, 1, 7) = TestFixture::nan(); }, touched, touched);
  }
}

// NaN in one value row: the outputs of every row that attends to it (the LSE is not affected). Rows of
// the same head that do not attend to it are not asserted on: a masked key still meets them as 0 · NaN
// inside a shared tile product, as in any GEMM-based attention.
TYPED_TEST(EdgeCases, NanInValueRow) {
  const index_t sq = 77, sk = 90, key = 30, offset = sk - sq;
  for (bool causal : {false, true}) {
    typename TestFixture::Problem pr(2, sq, sk, 4, 2, 16);
    AttentionOptions opts;
    opts.causal = causal;
    pr.run(opts);
    const std::vector<double> clean = pr.out(), clean_lse = pr.lses();
    pr.v.view()(1, key, 0, 9) = TestFixture::nan();
    pr.run(opts);
    const auto o = pr.o.view();
    for (index_t b = 0; b < 2; ++b)
      for (index_t i = 0; i < sq; ++i)
        for (index_t h = 0; h < 4; ++h) {
          const double x = double(o(b, i, h, 9));
          if (b == 1 && h / 2 == 0) {
            if (!causal || key <= i + offset) {
              ASSERT_TRUE(std::isnan(x)) << "row " << i << " head " << h;
            }
          } else {
            for (index_t c = 0; c < 16; ++c)
              ASSERT_TRUE(same_bits(double(o(b, i, h, c)), clean[std::size_t(((b * sq + i) * 4 + h) * 16 + c)]))
                  << "unrelated output (" << b << ", " << i << ", " << h << ", " << c << ") changed";
          }
        }
    const std::vector<double> lse = pr.lses();
    for (std::size_t n = 0; n < lse.size(); ++n) ASSERT_TRUE(same_bits(lse[n], clean_lse[n])) << n;
  }
}

// ---- Numerics and determinism ----------------------------------------------------------------------------

// Scores in the hundreds: exp would overflow without the running max; the result still matches the
// reference.
TYPED_TEST(EdgeCases, HugeScoresStayFinite) {
  typename TestFixture::Problem pr(1, 70, 150, 2, 2, 16);
  AttentionOptions opts;
  opts.scale = 40.0;
  for (bool causal : {false, true}) {
    opts.causal = causal;
    pr.run(opts);
    for (double x : pr.out()) ASSERT_TRUE(std::isfinite(x));
    EXPECT_TRUE(matches_reference_for(pr, opts)) << "causal=" << causal;
  }
}

// The same bits on 1, 2 or 3 threads, and with the default count: each output row is computed by one
// program whatever thread runs it, and the key split does not depend on the thread count.
TYPED_TEST(EdgeCases, ThreadCountDoesNotChangeResults) {
  struct Shape {
    index_t batch, sq, sk, hq, hkv, d;
    bool causal;
  };
  // Many (batch, head, block) items; and one query block against many keys (split into key ranges).
  const Shape shapes[] = {{2, 150, 170, 4, 2, 64, false}, {2, 150, 170, 4, 2, 64, true},
                          {1, 40, 3000, 1, 1, 64, false}, {1, 40, 3000, 1, 1, 80, true}};
  for (const Shape& sh : shapes) {
    typename TestFixture::Problem pr(sh.batch, sh.sq, sh.sk, sh.hq, sh.hkv, sh.d);
    AttentionOptions opts;
    opts.causal = sh.causal;
    pr.run(opts, cpu::Context<>{1});
    const std::vector<double> one = pr.out(), one_lse = pr.lses();
    for (int threads : {2, 3, 0}) {
      pr.run(opts, cpu::Context<>{threads});
      const std::vector<double> many = pr.out(), many_lse = pr.lses();
      ASSERT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(double)), 0)
          << threads << " threads, seq_q=" << sh.sq << " seq_k=" << sh.sk;
      ASSERT_EQ(std::memcmp(one_lse.data(), many_lse.data(), one_lse.size() * sizeof(double)), 0) << threads;
    }
  }
}

// ---- Views of a fused QKV projection (core/fused_qkv.hpp) -------------------------------------------------------

// The three views of one [q | k | v] buffer (GQA, a padded row) give the bits of the same call on separate
// contiguous copies, and every element they name is the one the layout puts there.
TEST(FusedQkv, ViewsAreTheSlicesOfEachRow) {
  const index_t b = 2, s = 37, hq = 4, hkv = 2, d = 24, pad = 5, row = (hq + 2 * hkv) * d + pad;
  std::vector<float> fused(std::size_t(b * s * row));
  for (std::size_t i = 0; i < fused.size(); ++i) fused[i] = float(std::sin(0.1 * double(i)));
  const QkvViews<const float> v3 = fused_qkv_bshd<const float>(fused.data(), b, s, hq, hkv, d, row);
  std::vector<float> q(std::size_t(b * s * hq * d)), k(std::size_t(b * s * hkv * d)), v(k.size());
  for (index_t bb = 0; bb < b; ++bb)
    for (index_t t = 0; t < s; ++t) {
      const float* r = fused.data() + (bb * s + t) * row;
      for (index_t e = 0; e < hq * d; ++e) q[std::size_t((bb * s + t) * hq * d + e)] = r[e];
      for (index_t e = 0; e < hkv * d; ++e) {
        k[std::size_t((bb * s + t) * hkv * d + e)] = r[hq * d + e];
        v[std::size_t((bb * s + t) * hkv * d + e)] = r[(hq + hkv) * d + e];
      }
    }
  for (index_t bb = 0; bb < b; ++bb)
    for (index_t t = 0; t < s; t += 7)
      for (index_t h = 0; h < hkv; ++h) {
        EXPECT_EQ(&v3.q(bb, t, 2 * h + 1, 3), fused.data() + (bb * s + t) * row + (2 * h + 1) * d + 3);
        EXPECT_EQ(&v3.v(bb, t, h, d - 1), fused.data() + (bb * s + t) * row + (hq + hkv + h) * d + d - 1);
      }
  AttentionOptions opts;
  opts.causal = true;
  std::vector<float> o_fused(q.size()), o_copies(q.size());
  attention_forward<float>(v3.q, v3.k, v3.v, bshd(o_fused.data(), b, s, hq, d), opts);
  attention_forward<float>(bshd<const float>(q.data(), b, s, hq, d), bshd<const float>(k.data(), b, s, hkv, d),
                           bshd<const float>(v.data(), b, s, hkv, d), bshd(o_copies.data(), b, s, hq, d), opts);
  EXPECT_EQ(0, std::memcmp(o_fused.data(), o_copies.data(), o_fused.size() * sizeof(float)));
  // Without padding, row_stride 0 means the packed row.
  const QkvViews<float> packed = fused_qkv_bshd(fused.data(), b, s, hq, hkv, d);
  EXPECT_EQ(packed.k.stride_seq, (hq + 2 * hkv) * d);
  EXPECT_EQ(packed.k.data, fused.data() + hq * d);
}

TEST(FusedQkv, BadArgumentsAreNamed) {
  std::vector<float> x(1024);
  expect_invalid([&] { fused_qkv_bshd(x.data(), 1, 4, 4, 2, 8, 60); },
                 "row_stride 60 is shorter than a row of (heads_q + 2·heads_kv)·dim = (4 + 2·2)·8 = 64 elements");
  expect_invalid([&] { fused_qkv_bshd(x.data(), 1, 4, 3, 2, 8); }, "heads_q must be a multiple of heads_kv, got 3 and 2");
  expect_invalid([&] { fused_qkv_bshd(x.data(), 1, 4, 4, 0, 8); }, "heads_kv=0");
  expect_invalid([&] { fused_qkv_bshd(x.data(), -1, 4, 4, 2, 8); }, "batch=-1");
}

}  // namespace
}  // namespace flashattn::testing
