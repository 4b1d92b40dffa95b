// Numerical edge cases of the forward pass (issue 5): logits up to ±1e4, 16-bit inputs whose products or
// sums overflow 16-bit arithmetic, fully masked rows and tiles (0 and LSE −inf, never NaN), NaN and ±inf
// propagation as documented (docs/robustness.md), tiny and huge magnitudes.
//
// Results are compared with the fp64 reference under the tolerance rule of tolerance.hpp. For the 16-bit
// types the "naive in the same precision" side of the rule accumulates in fp32 and rounds only its output
// to T: that is the precision the library promises for them (a naive implementation storing its scores in
// T is shown to fail where it matters).

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "configs.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

template <class T>
constexpr bool is_16bit = sizeof(T) == 2;

// The tolerance rule, with an fp32-accumulating naive side for the 16-bit types (see the file comment).
template <class T, class Mask>
::testing::AssertionResult close_to_reference(const TensorView<const T>& q, const TensorView<const T>& k,
                                              const TensorView<const T>& v, const TensorView<const T>& o,
                                              const LseView& lse, double scale, const Mask& mask) {
  if constexpr (!is_16bit<T>) {
    return matches_reference(q, k, v, o, lse, scale, mask);
  } else {
    const ReferenceResult exact = reference_attention<double>(q, k, v, scale, mask);
    ReferenceResult naive = reference_attention<float, float>(q, k, v, scale, mask);
    for (double& x : naive.o) x = double(float(T(float(x))));  // stored to T, as the kernel stores o
    const ToleranceCheck out = check_output<T>(to_double(o), naive.o, exact.o);
    ::testing::AssertionResult r = out.ok() ? ::testing::AssertionSuccess() : ::testing::AssertionFailure();
    r << out.describe("o");
    if (!lse.empty()) {
      const ToleranceCheck l = check_lse(to_double(lse), naive.lse, exact.lse);
      if (!l.ok()) r = ::testing::AssertionFailure() << out.describe("o");
      r << "; " << l.describe("lse");
    }
    return r;
  }
}

template <class T>
void fill_uniform(const TensorView<T>& x, std::uint32_t seed, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h)
        for (index_t d = 0; d < x.dim; ++d) x(b, s, h, d) = T(float(dist(rng)));
}

template <class T>
void fill_constant(const TensorView<T>& x, double value) {
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h)
        for (index_t d = 0; d < x.dim; ++d) x(b, s, h, d) = T(float(value));
}

// Largest |scale·q·k| over all (query, key) pairs, in double.
template <class T>
double max_abs_logit(const TensorView<const T>& q, const TensorView<const T>& k, double scale) {
  double m = 0;
  const index_t group = q.heads / k.heads;
  for (index_t b = 0; b < q.batch; ++b)
    for (index_t h = 0; h < q.heads; ++h)
      for (index_t i = 0; i < q.seq; ++i)
        for (index_t j = 0; j < k.seq; ++j) {
          double dot = 0;
          for (index_t c = 0; c < q.dim; ++c) dot += double(q(b, i, h, c)) * double(k(b, j, h / group, c));
          m = std::max(m, std::abs(scale * dot));
        }
  return m;
}

template <class T>
bool all_finite(const TensorView<T>& x) {
  for (double e : to_double(x))
    if (!std::isfinite(e)) return false;
  return true;
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
class NumericsTyped : public ::testing::Test {};

struct ScalarName {
  template <class T>
  static std::string GetName(int) {
    return scalar_name<T>();
  }
};
using Scalars = ::testing::Types<float, double, Eigen::half, Eigen::bfloat16>;
TYPED_TEST_SUITE(NumericsTyped, Scalars, ScalarName);

// ---- large logits -------------------------------------------------------------------------------------

// Scores spread over ±1e4 after scaling: exp(1e4) overflows every floating type, so only a softmax that
// subtracts the running maximum (and rescales earlier tiles by 2^(m_old − m_new), which is 0 for jumps
// of thousands) gets these right.
TYPED_TEST(NumericsTyped, LogitsUpTo1e4DoNotOverflow) {
  using T = TypeParam;
  for (bool causal : {false, true}) {
    HostTensor<T> q(Layout::Bshd, 1, 150, 2, 64), k(Layout::Bshd, 1, 150, 2, 64), v(Layout::Bshd, 1, 150, 2, 64);
    HostTensor<T> o(Layout::Bshd, 1, 150, 2, 64, T(kNan));
    HostLse lse(1, 2, 150);
    fill_normal(q.view(), 11, 50.0);
    fill_normal(k.view(), 12, 50.0);
    fill_normal(v.view(), 13);
    const double scale = 0.125;
    const double reach = max_abs_logit(q.cview(), k.cview(), scale);
    ASSERT_GT(reach, 5e3);
    ASSERT_LT(reach, 2e4);
    AttentionOptions opts;
    opts.causal = causal;
    attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
    EXPECT_TRUE(all_finite(o.view()));
    if constexpr (std::is_same_v<T, double>) {
      // For double the 2x-naive rule alone is too tight here: it is the conditioning, not the kernel. A
      // logit of ~4e3 built from products of ~2500 carries a rounding error of a few ulps of 4e3 in any
      // summation order (our FMA chain and the naive loop round differently; the naive happened to land
      // within 1.9e-14 of the 80-bit reference, the FMA chain 6.5e-13 away: bench-checked by recomputing
      // the row both ways in scalar code). So the bound adds 4 ulps of the largest logit.
      const auto mask = causal ? BandMask::causal(150, 150) : BandMask::window(150, 150, -1, -1);
      const ReferenceResult exact = reference_attention<long double>(q.cview(), k.cview(), v.cview(), scale, mask);
      const ReferenceResult naive = reference_attention<double>(q.cview(), k.cview(), v.cview(), scale, mask);
      const double conditioning = 4.0 * std::numeric_limits<double>::epsilon() * reach;
      EXPECT_LE(max_abs_error(to_double(o.cview()), exact.o), 2.0 * max_abs_error(naive.o, exact.o) + conditioning);
    } else if (causal) {
      EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), scale,
                                     BandMask::causal(150, 150)));
    } else {
      EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), scale, NoMask{150}));
    }
  }
}

// Every score of a row near +1e4 (or every one near −1e4) with small differences between them: the
// softmax depends only on the differences, which must survive.
TYPED_TEST(NumericsTyped, RowsOfHugeLogitsOfOneSign) {
  using T = TypeParam;
  const index_t n = 100, d = 64;
  const double c = std::sqrt(1e4 / (0.125 * double(d)));  // scale·d·c² = 1e4
  HostTensor<T> q(Layout::Bshd, 1, n, 1, d), k(Layout::Bshd, 1, n, 1, d), v(Layout::Bshd, 1, n, 1, d);
  HostTensor<T> o(Layout::Bshd, 1, n, 1, d, T(kNan));
  HostLse lse(1, 1, n);
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0.0, 0.05);
  for (index_t i = 0; i < n; ++i)
    for (index_t x = 0; x < d; ++x) {
      q.view()(0, i, 0, x) = T(float(i % 2 == 0 ? c : -c));
      k.view()(0, i, 0, x) = T(float(c + noise(rng)));
    }
  fill_normal(v.view(), 6);
  ASSERT_GT(max_abs_logit(q.cview(), k.cview(), 0.125), 9e3);
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), AttentionOptions{}, lse.view());
  EXPECT_TRUE(all_finite(o.view()));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 0.125, NoMask{n}));
  EXPECT_GT(lse.view()(0, 0, 0), 9e3f);   // an even row: logits near +1e4
  EXPECT_LT(lse.view()(0, 0, 1), -9e3f);  // an odd row: logits near −1e4
}

// Logits far beyond ±1e4 (1e10 for the fp32-accumulated types, 1e25 for double): the largest score of a
// row must still weigh exactly 1 before normalisation. Regression test of a fuzzer finding: the softmax
// computed fma(s, c, −round(max s·c)), whose value for the largest score is a rounding residual of up to
// half an ulp of the max, which beyond |logit| ~ 2^31 overflowed 2^x or underflowed the whole row to 0
// (o = 0, LSE ±inf: a row silently treated as fully masked).
TYPED_TEST(NumericsTyped, LogitsBeyondTwoToThe31StillNormalise) {
  using T = TypeParam;
  const index_t n = 40, d = 16;
  const double scale = std::is_same_v<T, double> ? 1e24 : 1e9;
  for (bool causal : {false, true}) {
    HostTensor<T> q(Layout::Bshd, 1, n, 2, d), k(Layout::Bshd, 1, n, 2, d), v(Layout::Bshd, 1, n, 2, d);
    HostTensor<T> o(Layout::Bshd, 1, n, 2, d, T(kNan));
    HostLse lse(1, 2, n);
    fill_normal(q.view(), 15);
    fill_normal(k.view(), 16);
    fill_normal(v.view(), 17);
    AttentionOptions opts;
    opts.scale = scale;
    opts.causal = causal;
    attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
    EXPECT_TRUE(all_finite(o.view()));
    for (double x : to_double(lse.view())) EXPECT_TRUE(std::isfinite(x)) << x;
    if (causal) {
      EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), scale,
                                     BandMask::causal(n, n)));
    } else {
      EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), scale, NoMask{n}));
    }
  }
}

// The LSE is stored as float whatever T is. For double inputs whose log-sum-exp lies beyond float's
// range (±3.4e38) it is stored as ±inf, while o is unaffected (a fuzzer case; docs/robustness.md).
TEST(Numerics, DoubleLseBeyondFloatRangeIsInfinite) {
  const index_t n = 20, d = 8;
  for (double sign : {1.0, -1.0}) {
    HostTensor<double> q(Layout::Bshd, 1, n, 1, d), k(Layout::Bshd, 1, n, 1, d), v(Layout::Bshd, 1, n, 1, d);
    HostTensor<double> o(Layout::Bshd, 1, n, 1, d, double(kNan));
    HostLse lse(1, 1, n);
    fill_uniform(q.view(), 161, 1.0, 2.0);
    fill_constant(k.view(), sign);  // every key alike: each row averages V uniformly
    fill_normal(v.view(), 163);
    const double scale = 1e39;  // scores ~ ±1e40
    AttentionOptions opts;
    opts.scale = scale;
    attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
    EXPECT_TRUE(all_finite(o.view()));
    for (double x : to_double(lse.view())) EXPECT_EQ(x, sign * double(kInf));
    const ReferenceResult exact = reference_attention<long double>(q.cview(), k.cview(), v.cview(), scale, NoMask{n});
    const ReferenceResult naive = reference_attention<double>(q.cview(), k.cview(), v.cview(), scale, NoMask{n});
    const ToleranceCheck out = check_output<double>(to_double(o.view()), naive.o, exact.o);
    EXPECT_TRUE(out.ok()) << out.describe("o");
  }
}

// ---- 16-bit inputs ------------------------------------------------------------------------------------

// fp16 values around 300: products (up to 9e4) and dot products (up to ~1e6) are far beyond fp16's
// 65504, so arithmetic in fp16 gives inf; accumulated in fp32 they are exact or nearly so.
TEST(Numerics, HalfProductsOverflowSixteenBit) {
  using T = Eigen::half;
  const index_t n = 130, d = 64;
  HostTensor<T> q(Layout::Bshd, 1, n, 2, d), k(Layout::Bshd, 1, n, 2, d), v(Layout::Bshd, 1, n, 2, d);
  HostTensor<T> o(Layout::Bshd, 1, n, 2, d, T(kNan));
  HostLse lse(1, 2, n);
  fill_uniform(q.view(), 21, -300, 300);
  fill_uniform(k.view(), 22, -300, 300);
  fill_normal(v.view(), 23);
  const double scale = 4e-5;  // logits of a few units to a few tens
  double max_product = 0;
  for (index_t c = 0; c < d; ++c)
    max_product = std::max(max_product, std::abs(double(q.view()(0, 0, 0, c)) * double(k.view()(0, 0, 0, c))));
  ASSERT_GT(max_product, 65504.0);  // the premise: 16-bit products overflow
  AttentionOptions opts;
  opts.scale = scale;
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  EXPECT_TRUE(all_finite(o.view()));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), scale, NoMask{n}));
  // A naive implementation that stores its scores in fp16 does not survive this input.
  const ReferenceResult in_half = reference_attention<float, T>(q.cview(), k.cview(), v.cview(), scale, NoMask{n});
  bool half_failed = false;
  for (double x : in_half.o) half_failed = half_failed || !std::isfinite(x);
  EXPECT_TRUE(half_failed);
}

// fp16 values near the top of its range: each output is a convex combination of V rows and fits in
// fp16, but the unnormalised sums Σ p·v (up to seq_k·max|v|) do not; they live in fp32.
TEST(Numerics, HalfValuesWhoseSumsOverflowSixteenBit) {
  using T = Eigen::half;
  const index_t n = 600, d = 32;
  HostTensor<T> q(Layout::Bshd, 1, 40, 2, d), k(Layout::Bshd, 1, n, 2, d), v(Layout::Bshd, 1, n, 2, d);
  HostTensor<T> o(Layout::Bshd, 1, 40, 2, d, T(kNan));
  HostLse lse(1, 2, 40);
  fill_normal(q.view(), 31, 0.1);  // nearly uniform attention: every p close to the largest
  fill_normal(k.view(), 32, 0.1);
  fill_uniform(v.view(), 33, 3e4, 6e4);
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), AttentionOptions{}, lse.view());
  EXPECT_TRUE(all_finite(o.view()));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 1.0 / std::sqrt(double(d)),
                                 NoMask{n}));
}

// bf16 keeps fp32's range but only 8 significant bits: the product of two bf16 values needs up to 16,
// so an implementation that rounds its scores to bf16 is off by ~2^-9 relative; accumulating in fp32
// makes the error that of fp32 summation.
TEST(Numerics, Bfloat16ProductsKeepFp32Precision) {
  using T = Eigen::bfloat16;
  const index_t n = 130, d = 64;
  HostTensor<T> q(Layout::Bshd, 1, n, 1, d), k(Layout::Bshd, 1, n, 1, d), v(Layout::Bshd, 1, n, 1, d);
  HostTensor<T> o(Layout::Bshd, 1, n, 1, d, T(kNan));
  HostLse lse(1, 1, n);
  fill_uniform(q.view(), 41, -8, 8);
  fill_uniform(k.view(), 42, -8, 8);
  fill_normal(v.view(), 43);
  const double scale = 0.25;  // logits of tens to ~150, where bf16's spacing is 0.25 to 1
  AttentionOptions opts;
  opts.scale = scale;
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), scale, NoMask{n}));
  const ReferenceResult exact = reference_attention<double>(q.cview(), k.cview(), v.cview(), scale, NoMask{n});
  const ReferenceResult in_bf16 = reference_attention<float, T>(q.cview(), k.cview(), v.cview(), scale, NoMask{n});
  const double ours = max_abs_error(to_double(o.view()), exact.o);
  const double rounded_scores = max_abs_error(in_bf16.o, exact.o);
  EXPECT_LT(ours * 10, rounded_scores) << "ours " << ours << ", bf16 scores " << rounded_scores;
}

// ---- fully masked rows and tiles ----------------------------------------------------------------------

// Causal with seq_q > seq_k (bottom-right aligned): the first seq_q − seq_k queries keep no key. 260 of
// 300 rows: whole query blocks are empty, others are mixed.
TYPED_TEST(NumericsTyped, CausalRowsWithoutKeysAreZeroWithLseMinusInf) {
  using T = TypeParam;
  const index_t sq = 300, sk = 40, d = 32;
  HostTensor<T> q(Layout::Bshd, 2, sq, 2, d), k(Layout::Bshd, 2, sk, 1, d), v(Layout::Bshd, 2, sk, 1, d);
  HostTensor<T> o(Layout::Bshd, 2, sq, 2, d, T(kNan));
  HostLse lse(2, 2, sq);
  fill_normal(q.view(), 51);
  fill_normal(k.view(), 52);
  fill_normal(v.view(), 53);
  AttentionOptions opts;
  opts.causal = true;
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < 2; ++h)
      for (index_t i = 0; i < sq - sk; ++i) {
        ASSERT_EQ(lse.view()(b, h, i), -kInf) << "row " << i;
        for (index_t c = 0; c < d; ++c) ASSERT_EQ(double(o.view()(b, i, h, c)), 0.0) << "row " << i;
      }
  EXPECT_TRUE(all_finite(o.view()));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 1.0 / std::sqrt(double(d)),
                                 BandMask::causal(sq, sk)));
}

// An element mask with empty rows, a whole empty block of rows and a key range nobody keeps.
TEST(Numerics, ElementMaskEmptyRowsAndTiles) {
  const index_t n = 200, d = 48;
  HostTensor<float> q(Layout::Bshd, 1, n, 2, d), k(Layout::Bshd, 1, n, 2, d), v(Layout::Bshd, 1, n, 2, d);
  HostTensor<float> o(Layout::Bshd, 1, n, 2, d, kNan);
  HostLse lse(1, 2, n);
  fill_normal(q.view(), 61);
  fill_normal(k.view(), 62);
  fill_normal(v.view(), 63);
  std::vector<std::uint8_t> bits(std::size_t(n * n));
  std::mt19937 rng(64);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j) {
      const bool empty_row = i % 13 == 0 || (i >= 64 && i < 128);
      const bool dead_key = j >= 128 && j < 192;
      bits[std::size_t(i * n + j)] = !empty_row && !dead_key && rng() % 2 == 0;
    }
  const auto mask = element_mask(n, [&](index_t i, index_t j) { return bits[std::size_t(i * n + j)] != 0; });
  attention_forward_masked(q.cview(), k.cview(), v.cview(), o.view(), mask, AttentionOptions{}, lse.view());
  for (index_t h = 0; h < 2; ++h)
    for (index_t i = 0; i < n; ++i) {
      if (!(i % 13 == 0 || (i >= 64 && i < 128))) continue;
      EXPECT_EQ(lse.view()(0, h, i), -kInf) << "row " << i;
      for (index_t c = 0; c < d; ++c) EXPECT_EQ(o.view()(0, i, h, c), 0.0f) << "row " << i;
    }
  EXPECT_TRUE(all_finite(o.view()));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 1.0 / std::sqrt(double(d)),
                                 mask));
}

// A sliding window that misses every key for most queries (seq_q ≫ seq_k).
TEST(Numerics, WindowThatMissesEveryKey) {
  const index_t sq = 100, sk = 10, d = 16;
  HostTensor<float> q(Layout::Bshd, 1, sq, 1, d), k(Layout::Bshd, 1, sk, 1, d), v(Layout::Bshd, 1, sk, 1, d);
  HostTensor<float> o(Layout::Bshd, 1, sq, 1, d, kNan);
  HostLse lse(1, 1, sq);
  fill_normal(q.view(), 71);
  fill_normal(k.view(), 72);
  fill_normal(v.view(), 73);
  AttentionOptions opts;
  opts.window_left = 2;
  opts.window_right = 2;
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  // Query i sees keys i − 90 − 2 ... i − 90 + 2: rows below 88 see none.
  for (index_t i = 0; i < 88; ++i) {
    EXPECT_EQ(lse.view()(0, 0, i), -kInf) << "row " << i;
    for (index_t c = 0; c < d; ++c) EXPECT_EQ(o.view()(0, i, 0, c), 0.0f);
  }
  EXPECT_TRUE(std::isfinite(lse.view()(0, 0, 88)));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 0.25,
                                 BandMask::window(sq, sk, 2, 2)));
}

// seq_k = 0: every row keeps no key (null K and V data are fine for empty views).
TYPED_TEST(NumericsTyped, NoKeysAtAllGivesZeroAndLseMinusInf) {
  using T = TypeParam;
  HostTensor<T> q(Layout::Bshd, 2, 70, 3, 24), o(Layout::Bshd, 2, 70, 3, 24, T(kNan));
  HostLse lse(2, 3, 70);
  fill_normal(q.view(), 81);
  const TensorView<const T> none{nullptr, 2, 0, 3, 24, 0, 0, 0, 1};
  attention_forward(q.cview(), none, none, o.view(), AttentionOptions{}, lse.view());
  for (double x : to_double(o.view())) ASSERT_EQ(x, 0.0);
  for (double x : to_double(lse.view())) ASSERT_EQ(x, -double(kInf));
}

// One long row block split into key ranges (split-KV: few work items, many keys): ranges that keep no
// key must weigh nothing in the merge, and rows that keep none at all are 0 / −inf.
TEST(Numerics, SplitKeyRangesWithoutKeys) {
  const index_t sq = 24, sk = 4096, d = 32;
  HostTensor<float> q(Layout::Bshd, 1, sq, 1, d), k(Layout::Bshd, 1, sk, 1, d), v(Layout::Bshd, 1, sk, 1, d);
  HostTensor<float> o(Layout::Bshd, 1, sq, 1, d, kNan);
  HostLse lse(1, 1, sq);
  fill_normal(q.view(), 91);
  fill_normal(k.view(), 92);
  fill_normal(v.view(), 93);
  const auto keep = [=](index_t i, index_t j) {
    if (i % 5 == 0) return false;                 // no key at all
    if (i == 23) return j == sk - 1;              // only the very last key
    const index_t lo = (i * 170) % sk;            // one short range somewhere
    return j >= lo && j < lo + 50;
  };
  const auto mask = element_mask(sk, keep);
  attention_forward_masked(q.cview(), k.cview(), v.cview(), o.view(), mask, AttentionOptions{}, lse.view());
  for (index_t i = 0; i < sq; i += 5) {
    EXPECT_EQ(lse.view()(0, 0, i), -kInf);
    for (index_t c = 0; c < d; ++c) EXPECT_EQ(o.view()(0, i, 0, c), 0.0f);
  }
  // Row 23 keeps one key: its output is exactly that value row (rounding aside), its LSE that score.
  for (index_t c = 0; c < d; ++c) EXPECT_NEAR(o.view()(0, 23, 0, c), v.view()(0, sk - 1, 0, c), 1e-6);
  EXPECT_TRUE(all_finite(o.view()));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 1.0 / std::sqrt(double(d)),
                                 mask));
}

// Rows that keep no key are 0 / −inf even when every K and V element is NaN or infinite: nothing of a
// key a row does not keep may reach it.
TYPED_TEST(NumericsTyped, FullyMaskedRowsIgnoreNonFiniteKeysAndValues) {
  using T = TypeParam;
  const index_t sq = 100, sk = 20, d = 16;
  for (float poison : {kNan, kInf, -kInf}) {
    HostTensor<T> q(Layout::Bshd, 1, sq, 1, d), k(Layout::Bshd, 1, sk, 1, d, T(poison)),
        v(Layout::Bshd, 1, sk, 1, d, T(poison));
    HostTensor<T> o(Layout::Bshd, 1, sq, 1, d, T(kNan));
    HostLse lse(1, 1, sq);
    fill_normal(q.view(), 101);
    AttentionOptions opts;
    opts.causal = true;  // rows 0 .. 79 keep no key
    attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
    for (index_t i = 0; i < sq - sk; ++i) {
      ASSERT_EQ(lse.view()(0, 0, i), -kInf) << "row " << i << ", poison " << poison;
      for (index_t c = 0; c < d; ++c) ASSERT_EQ(double(o.view()(0, i, 0, c)), 0.0) << "row " << i;
    }
  }
}

// ---- NaN propagation ----------------------------------------------------------------------------------
// Documented semantics (docs/robustness.md): a NaN in q row i, or in k row j for a key that row i keeps,
// makes row i of o and its LSE NaN; a NaN in v[j][c] makes column c NaN in every row that keeps key j,
// and may also reach column c of rows in the same query block that mask j (0·NaN = NaN, as in PyTorch's
// SDPA), never rows whose query block skips j's key tile; nothing else changes, bit for bit.

struct NanProblem {
  static constexpr index_t n = 130, d = 32;
  HostTensor<float> q{Layout::Bshd, 1, n, 1, d}, k{Layout::Bshd, 1, n, 1, d}, v{Layout::Bshd, 1, n, 1, d};
  HostTensor<float> o{Layout::Bshd, 1, n, 1, d, kNan}, clean{Layout::Bshd, 1, n, 1, d, kNan};
  HostLse lse{1, 1, n}, clean_lse{1, 1, n};
  NanProblem() {
    fill_normal(q.view(), 111);
    fill_normal(k.view(), 112);
    fill_normal(v.view(), 113);
  }
  // Runs the clean problem, then the one with `x(0, row, 0, col) = NaN`.
  template <class Tiles = cpu::AutoTiles>
  void run(HostTensor<float>& x, index_t row, index_t col, const AttentionOptions& opts) {
    attention_forward(cpu::Context<Tiles>{}, q.cview(), k.cview(), v.cview(), clean.view(), opts, clean_lse.view());
    x.view()(0, row, 0, col) = kNan;
    attention_forward(cpu::Context<Tiles>{}, q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  }
  bool row_nan(index_t i) const {
    for (index_t c = 0; c < d; ++c)
      if (!std::isnan(o.view()(0, i, 0, c))) return false;
    return std::isnan(lse.view()(0, 0, i));
  }
  bool row_clean(index_t i) const {
    for (index_t c = 0; c < d; ++c)
      if (!same_bits(o.view()(0, i, 0, c), clean.view()(0, i, 0, c))) return false;
    return same_bits(lse.view()(0, 0, i), clean_lse.view()(0, 0, i));
  }
};

TEST(NanPropagation, QueryNanPoisonsOnlyItsRow) {
  NanProblem p;
  p.run(p.q, 70, 3, AttentionOptions{});
  for (index_t i = 0; i < p.n; ++i) {
    if (i == 70) EXPECT_TRUE(p.row_nan(i));
    else EXPECT_TRUE(p.row_clean(i)) << "row " << i;
  }
}

TEST(NanPropagation, KeyNanPoisonsExactlyTheRowsThatKeepIt) {
  NanProblem p;
  AttentionOptions opts;
  opts.causal = true;  // row i keeps key 100 iff i >= 100
  p.run(p.k, 100, 7, opts);
  for (index_t i = 0; i < p.n; ++i) {
    if (i >= 100) EXPECT_TRUE(p.row_nan(i)) << "row " << i;
    else EXPECT_TRUE(p.row_clean(i)) << "row " << i;
  }
}

TEST(NanPropagation, ValueNanPoisonsItsColumnInRowsThatKeepIt) {
  NanProblem p;
  AttentionOptions opts;
  opts.causal = true;
  using Tiles = cpu::Tiles<16, 16>;  // query blocks of 16 rows: [96, 112) holds key 100's tile
  p.run<Tiles>(p.v, 100, 5, opts);
  for (index_t i = 0; i < p.n; ++i) {
    for (index_t c = 0; c < p.d; ++c) {
      const float x = p.o.view()(0, i, 0, c);
      if (c != 5) {
        EXPECT_TRUE(same_bits(x, p.clean.view()(0, i, 0, c))) << "row " << i << " col " << c;
      } else if (i >= 100) {
        EXPECT_TRUE(std::isnan(x)) << "row " << i;
      } else if (i < 96) {
        // Query blocks that end before key 100 never visit its tile.
        EXPECT_TRUE(same_bits(x, p.clean.view()(0, i, 0, c))) << "row " << i;
      }
    }
    EXPECT_TRUE(same_bits(p.lse.view()(0, 0, i), p.clean_lse.view()(0, 0, i)));  // V never reaches the LSE
  }
}

// One head of few queries against many keys (so that the backend splits the keys), normal values drawn
// from seeds `seed`, `seed + 1`, `seed + 2` for q, k, v.
struct SplitKvProblem {
  HostTensor<float> q, k, v, o;
  HostLse lse;
  SplitKvProblem(index_t sq, index_t sk, index_t d, std::uint32_t seed)
      : q(Layout::Bshd, 1, sq, 1, d), k(Layout::Bshd, 1, sk, 1, d), v(Layout::Bshd, 1, sk, 1, d),
        o(Layout::Bshd, 1, sq, 1, d, 0.0f), lse(1, 1, sq) {
    fill_normal(q.view(), seed);
    fill_normal(k.view(), seed + 1);
    fill_normal(v.view(), seed + 2);
  }
  void run(const AttentionOptions& opts) {
    attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  }
};

// NaN through split-KV: the merge of key ranges lets NaN win over finite maxima.
TEST(NanPropagation, ThroughSplitKeyRanges) {
  const index_t sq = 8, sk = 4096, d = 32;
  for (int where : {0, 1}) {
    SplitKvProblem p(sq, sk, d, 121);
    auto& o = p.o;
    auto& lse = p.lse;
    (where == 0 ? p.k : p.v).view()(0, 3000, 0, 2) = kNan;
    p.run(AttentionOptions{});
    for (index_t i = 0; i < sq; ++i) {
      for (index_t c = 0; c < d; ++c) {
        const bool expect_nan = where == 0 || c == 2;  // K: whole rows; V: its column
        EXPECT_EQ(std::isnan(o.view()(0, i, 0, c)), expect_nan) << "row " << i << " col " << c;
      }
      EXPECT_EQ(std::isnan(lse.view()(0, 0, i)), where == 0);
    }
  }
}

// The running max of the online softmax can drop a NaN score (a packet max returns its second operand
// when either is NaN) while the running sum keeps it: a row of NaN scores whose last visited tile ends in
// masked keys leaves max −inf, sum NaN. Regression test of a fuzzer finding: split-KV's merge took such a
// range for one that kept no key, and the row came out 0 with LSE −inf instead of NaN.
TEST(NanPropagation, ThroughSplitKeyRangesWhenTheRunningMaxDropsIt) {
  const index_t sq = 16, sk = 4096, d = 32;  // one query block, many keys: split-KV
  SplitKvProblem p(sq, sk, d, 171);
  auto& o = p.o;
  auto& lse = p.lse;
  p.q.view()(0, 0, 0, 3) = kNan;
  AttentionOptions opts;
  opts.causal = true;
  opts.window_left = 30;  // row 0 keeps keys 4050 .. 4080 only, all in the last key range
  p.run(opts);
  for (index_t c = 0; c < d; ++c) EXPECT_TRUE(std::isnan(o.view()(0, 0, 0, c))) << "col " << c;
  EXPECT_TRUE(std::isnan(lse.view()(0, 0, 0)));
  for (index_t i = 1; i < sq; ++i) EXPECT_TRUE(std::isfinite(lse.view()(0, 0, i))) << "row " << i;
}

// A score modifier sees the NaN score and passes it on (tanh(NaN) = NaN).
TEST(NanPropagation, ThroughScoreModifier) {
  NanProblem p;
  const auto softcap = score_mod(NoMask{p.n}, [](index_t, index_t, auto s) { return 30 * std::tanh(s / 30); });
  p.k.view()(0, 50, 0, 1) = kNan;
  attention_forward_masked(p.q.cview(), p.k.cview(), p.v.cview(), p.o.view(), softcap, AttentionOptions{},
                           p.lse.view());
  for (index_t i = 0; i < p.n; ++i) EXPECT_TRUE(p.row_nan(i)) << "row " << i;
}

// ---- infinities ---------------------------------------------------------------------------------------

// A score of −inf (from an infinite input) weighs exactly 0, like a masked key: the row stays finite and
// matches the reference.
TEST(InfiniteInputs, MinusInfinityScoreWeighsZero) {
  const index_t n = 70, d = 16;
  HostTensor<float> q(Layout::Bshd, 1, n, 1, d), k(Layout::Bshd, 1, n, 1, d), v(Layout::Bshd, 1, n, 1, d);
  HostTensor<float> o(Layout::Bshd, 1, n, 1, d, kNan);
  HostLse lse(1, 1, n);
  fill_uniform(q.view(), 131, 0.5, 1.5);  // positive: q·k = −inf where k holds −inf
  fill_normal(k.view(), 132);
  fill_normal(v.view(), 133);
  k.view()(0, 10, 0, 4) = -kInf;
  k.view()(0, 65, 0, 0) = -kInf;
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), AttentionOptions{}, lse.view());
  EXPECT_TRUE(all_finite(o.view()));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 0.25, NoMask{n}));
}

// A score of +inf makes its row NaN (inf − inf in the softmax), as in the reference and in PyTorch.
TEST(InfiniteInputs, PlusInfinityScoreMakesItsRowNan) {
  NanProblem p;
  for (index_t c = 0; c < p.d; ++c) p.q.view()(0, 40, 0, c) = 1.0f;
  p.k.view()(0, 20, 0, 0) = kInf;
  attention_forward(p.q.cview(), p.k.cview(), p.v.cview(), p.o.view(), AttentionOptions{}, p.lse.view());
  EXPECT_TRUE(p.row_nan(40));
}

// ---- tiny and huge magnitudes -------------------------------------------------------------------------

// Inputs near the bottom of the range: scores round to 0 and the softmax is uniform. On x86 the kernels
// run with subnormals flushed (cpu/denormals.hpp: read as 0, results below the smallest normal as 0), so
// subnormal values in V give outputs accurate to the smallest normal of the accumulator (2^-126 for float,
// bf16 and fp16 alike, whose subnormals are normal floats, 2^-1022 for double); elsewhere to the type's
// subnormal spacing, except bf16 on AVX512_BF16, whose dot-product instruction flushes (docs/robustness.md).
TYPED_TEST(NumericsTyped, TinyMagnitudes) {
  using T = TypeParam;
  const index_t n = 90, d = 32;
  const double tiny = double(float(std::numeric_limits<T>::min()));  // smallest normal of T
  HostTensor<T> q(Layout::Bshd, 1, n, 1, d), k(Layout::Bshd, 1, n, 1, d), v(Layout::Bshd, 1, n, 1, d);
  HostTensor<T> o(Layout::Bshd, 1, n, 1, d, T(kNan));
  HostLse lse(1, 1, n);
  fill_normal(q.view(), 141, tiny * 100);
  fill_normal(k.view(), 142, tiny * 100);
  fill_uniform(v.view(), 143, -tiny / 2, tiny / 2);  // subnormal
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), AttentionOptions{}, lse.view());
  EXPECT_TRUE(all_finite(o.view()));
  const double scale = 1.0 / std::sqrt(double(d));
  using Exact = exact_t<T>;
  const ReferenceResult exact = reference_attention<Exact>(q.cview(), k.cview(), v.cview(), scale, NoMask{n});
  ReferenceResult naive = reference_attention<cpu::acc_t<T>, cpu::acc_t<T>>(q.cview(), k.cview(), v.cview(), scale,
                                                                             NoMask{n});
  for (double& x : naive.o) x = double(float(T(x)));
  // The tolerance rule with eps scaled to the values (a few subnormal steps of T), not to 1.
  const double err = max_abs_error(to_double(o.view()), exact.o);
  const double naive_err = max_abs_error(naive.o, exact.o);
  constexpr bool flushes = std::is_same_v<T, Eigen::bfloat16> && cpu::kBestIsa == cpu::Isa::Avx512Bf16;
  using Acc = cpu::acc_t<T>;
  const double step =
      std::max(cpu::kFlushesDenormals ? double(std::numeric_limits<Acc>::min()) : 0.0,
               double(float(flushes ? std::numeric_limits<T>::min() : std::numeric_limits<T>::denorm_min())));
  EXPECT_LE(err, 2 * naive_err + 4 * step) << "err " << err << ", naive " << naive_err;
  EXPECT_NEAR(lse.view()(0, 0, 0), std::log(double(n)), 1e-5);  // all scores ~0: LSE = log(n)
}

// Values up to FLT_MAX / (2·seq_k): the unnormalised fp32 sums stay finite (the documented domain; see
// docs/robustness.md), and so do the results.
TEST(Numerics, LargeValuesWithinAccumulatorRange) {
  const index_t n = 100, d = 16;
  const double big = double(std::numeric_limits<float>::max()) / (2.0 * double(n));
  HostTensor<float> q(Layout::Bshd, 1, n, 1, d), k(Layout::Bshd, 1, n, 1, d), v(Layout::Bshd, 1, n, 1, d);
  HostTensor<float> o(Layout::Bshd, 1, n, 1, d, kNan);
  HostLse lse(1, 1, n);
  fill_normal(q.view(), 151, 0.01);
  fill_normal(k.view(), 152, 0.01);
  fill_uniform(v.view(), 153, -big, big);
  attention_forward(q.cview(), k.cview(), v.cview(), o.view(), AttentionOptions{}, lse.view());
  EXPECT_TRUE(all_finite(o.view()));
  EXPECT_TRUE(close_to_reference(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 0.25, NoMask{n}));
}

}  // namespace
}  // namespace flashattn::testing
