// Score variants evaluated on lanes (core/lanes.hpp, core/score_math.hpp, core/score_variants.hpp):
//  - flashattn::tanh(float), the branch-free form the lanes use, against std::tanh over its whole range;
//  - Lanes operators mean per lane what the scalar operators mean;
//  - built-in soft_cap and alibi, forward, against the fp64 reference (tolerance.hpp's rule) for fp32,
//    bf16 and fp64, with and without a causal band, GQA, seq_q != seq_k, sizes off the tiles;
//  - a user functor marked vectorized() gives the bits of the same functor evaluated one score at a time,
//    forward and backward. This file is compiled with -ffp-contract=off (tests/CMakeLists.txt): whether a
//    compiler fuses a·b + c into one FMA may differ between the scalar and the vector code of the same
//    expression, which changes the last bit; what is tested here is that nothing else differs;
//  - bad arguments: a cap that is not positive and finite, slopes of the wrong count.
// The backward of the built-ins is checked in test_backward.cpp (gradients against the fp64 reference).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "expect_invalid.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/core/lanes.hpp"
#include "flashattn/core/score_math.hpp"
#include "flashattn/core/score_variants.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// ---- tanh --------------------------------------------------------------------------------------------------

TEST(ScoreMath, TanhFloatWithinTwoUlpsOfTheLibrary) {
  double worst = 0;
  float worst_x = 0;
  for (int k = -2000000; k <= 2000000; ++k) {
    const float x = float(k) * 1e-5f * (k % 7 == 0 ? 4.0f : 1.0f);  // [-80, 80] sparsely, [-20, 20] densely
    const double want = std::tanh(double(x));
    const float got = flashattn::tanh(x);
    const double ulp = std::max(std::abs(want), 1e-30) * std::numeric_limits<float>::epsilon();
    const double err = std::abs(double(got) - want) / ulp;
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "at x=" << worst_x;
  // Tiny arguments keep their value (tanh x = x to float precision), and the sign of zero.
  EXPECT_EQ(flashattn::tanh(1e-30f), 1e-30f);
  EXPECT_TRUE(std::signbit(flashattn::tanh(-0.0f)));
  EXPECT_EQ(flashattn::tanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(flashattn::tanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_TRUE(std::isnan(flashattn::tanh(std::numeric_limits<float>::quiet_NaN())));
}

TEST(ScoreMath, LanesAreTheScalarOperationsPerLane) {
  using L = Lanes<float, 8>;
  using I = Lanes<index_t, 8>;
  const I i = I::iota(-3);
  const index_t j = 2;
  const L s = L::load(std::vector<float>{-9.5f, -1.0f, -0.25f, 0.0f, 0.3f, 2.0f, 7.0f, 40.0f}.data());
  const auto f = [](auto i, auto j, auto s) {
    using S = decltype(s);
    const auto d = flashattn::abs(i - j);
    return flashattn::select(i % 2 == 0, S(3) * flashattn::tanh(s / S(3)), s - S(0.5) * S(d)) + S(i / 2) * 0.25f;
  };
  const L got = f(i, j, s);
  for (int l = 0; l < 8; ++l) EXPECT_EQ(got.v[l], f(i.v[l], j, s.v[l])) << "lane " << l;
  // Positions (what the kernels pass): the same, on either side, with affine and other operations.
  for (index_t base : {index_t(-3), index_t(1) << 23, (index_t(1) << 24) - 5, index_t(1) << 40}) {
    const Positions<8> p{base, 1};
    const L by_positions_i = f(p, j, s), by_positions_j = f(j, p, s);
    const L converted(p);
    for (int l = 0; l < 8; ++l) {
      EXPECT_EQ(by_positions_i.v[l], f(base + l, j, s.v[l])) << "base " << base << " lane " << l;
      EXPECT_EQ(by_positions_j.v[l], f(j, base + l, s.v[l])) << "base " << base << " lane " << l;
      EXPECT_EQ(converted.v[l], float(base + l)) << "base " << base << " lane " << l;
    }
    const Positions<8> q = 5 - 2 * p;  // still a progression: 5 − 2·base, step −2
    EXPECT_EQ(q.base, 5 - 2 * base);
    EXPECT_EQ(q.step, -2);
  }
}

// ---- Forward against the reference ------------------------------------------------------------------------

template <class T>
struct Problem {
  HostTensor<T> q, k, v, o;
  HostLse lse;
  Problem(index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, std::uint32_t seed, double stddev = 1.0)
      : q(Layout::Bshd, 2, sq, hq, d),
        k(Layout::Bshd, 2, sk, hkv, d),
        v(Layout::Bshd, 2, sk, hkv, d),
        o(Layout::Bshd, 2, sq, hq, d),
        lse(2, hq, sq) {
    fill_normal(q.view(), seed, stddev);
    fill_normal(k.view(), seed + 1, stddev);
    fill_normal(v.view(), seed + 2);
  }
  template <class Mask>
  std::vector<double> run(const Mask& mask, int threads = 0) {
    attention_forward_masked(cpu::Context<>{threads}, q.cview(), k.cview(), v.cview(), o.view(), mask, {},
                             lse.view());
    return to_double(o.cview());
  }
};

template <class T>
void check_builtins(index_t sq, index_t sk) {
  const index_t hq = 4, hkv = 2, d = 64;
  // Scores of a few units: stddev 2 makes q·k/8 of order ±4, so a cap of 3 bites.
  Problem<T> pr(sq, sk, hq, hkv, d, 7, 2.0);
  const std::vector<float> slopes = alibi_slopes(hq);
  const double scale = 1.0 / 8.0;
  // The kernel's base-2 softmax rounds each score once more (test_masks.cpp's SoftCapping): epsilon by cap.
  const double cap_ulps = 4.0 * 3;
  for (bool causal : {false, true}) {
    const std::string where = std::string("causal=") + (causal ? "1" : "0") + " sq=" + std::to_string(sq) +
                              " sk=" + std::to_string(sk);
    if (causal) {
      pr.run(soft_cap(3.0f, causal_mask()));
      EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                    soft_cap(3.0f, causal_mask()), cap_ulps))
          << where;
      pr.run(alibi(slopes, causal_mask()));
      EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                    alibi(slopes, causal_mask()), 4.0))
          << where;
    } else {
      pr.run(soft_cap(3.0f, no_mask()));
      EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                    soft_cap(3.0f, no_mask()), cap_ulps))
          << where;
      pr.run(alibi(slopes, no_mask()));
      EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                    alibi(slopes, no_mask()), 4.0))
          << where;
    }
  }
}

TEST(BuiltinVariants, Fp32MatchesReference) {
  check_builtins<float>(130, 130);
  check_builtins<float>(37, 201);
  check_builtins<float>(1, 300);  // one query row: the decode kernel
}
TEST(BuiltinVariants, Bf16MatchesReference) { check_builtins<Eigen::bfloat16>(100, 150); }
TEST(BuiltinVariants, Fp64MatchesReference) { check_builtins<double>(70, 90); }

// The same user functor, marked vectorized() or not: the lanes path must give the scalar path's bits, on
// one and two threads, for a band mask (ranges) and an element mask (per-element keep).
template <class T>
void check_lanes_same_bits(index_t sq, index_t sk) {
  Problem<T> pr(sq, sk, 4, 1, 32, 11, 2.0);
  const auto fn = [](auto i, auto j, auto s) {
    using S = decltype(s);
    return S(4) * flashattn::tanh(s * S(0.25)) - S(0.125) * S(flashattn::abs(i - j) % 5);
  };
  const auto keep = [](index_t i, index_t j) { return (i + 2 * j) % 3 != 0; };
  for (int threads : {1, 2}) {
    const auto band = BandMask::window(sq, sk, 20, 5);
    EXPECT_EQ(pr.run(score_mod(band, vectorized(fn)), threads), pr.run(score_mod(band, fn), threads));
    EXPECT_EQ(pr.run(score_mod(element_mask(sk, keep), vectorized(fn)), threads),
              pr.run(score_mod(element_mask(sk, keep), fn), threads));
  }
}

TEST(LaneScores, SameBitsAsOneScoreAtATime) {
  check_lanes_same_bits<float>(150, 170);
  check_lanes_same_bits<Eigen::bfloat16>(70, 90);
  check_lanes_same_bits<double>(40, 50);
}

// The backward: a vectorized() functor pair gives the bits of the same functors one score at a time.
TEST(LaneScores, BackwardSameBitsAsOneScoreAtATime) {
  const index_t sq = 70, sk = 85, d = 32;
  const auto fn = [](auto, auto, auto s) {
    using S = decltype(s);
    return S(3) * flashattn::tanh(s * S(1.0 / 3));
  };
  const auto grad = [](auto, auto, auto s) {
    using S = decltype(s);
    const S t = flashattn::tanh(s * S(1.0 / 3));
    return S(1) - t * t;
  };
  const auto band = BandMask::window(sq, sk, 30, 3);
  const auto run = [&](const auto& policy) {
    Problem<float> pr(sq, sk, 2, 1, d, 41, 2.0);
    HostTensor<float> d_o(Layout::Bshd, 2, sq, 2, d), dq(Layout::Bshd, 2, sq, 2, d), dk(Layout::Bshd, 2, sk, 1, d),
        dv(Layout::Bshd, 2, sk, 1, d);
    fill_normal(d_o.view(), 44);
    pr.run(policy);
    attention_backward_masked(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), d_o.cview(), pr.lse.view(),
                              dq.view(), dk.view(), dv.view(), policy);
    std::vector<double> all = to_double(dq.cview()), more = to_double(dk.cview()), last = to_double(dv.cview());
    all.insert(all.end(), more.begin(), more.end());
    all.insert(all.end(), last.begin(), last.end());
    return all;
  };
  EXPECT_EQ(run(score_mod(band, vectorized(fn), vectorized(grad))), run(score_mod(band, fn, grad)));
}

// ---- Bad arguments -----------------------------------------------------------------------------------------

TEST(BuiltinVariantErrors, CapsAndSlopes) {
  expect_invalid([] { soft_cap(0.0f, no_mask()); }, "soft_cap: cap must be positive and finite, got cap=0");
  expect_invalid([] { soft_cap(-1.0f, no_mask()); }, "got cap=-1");
  expect_invalid([] { soft_cap(std::numeric_limits<float>::quiet_NaN(), no_mask()); }, "soft_cap: cap must be");
  expect_invalid([] { alibi(nullptr, 4, causal_mask()); }, "alibi: slopes is null for heads=4");
  Problem<float> pr(16, 16, 4, 2, 16, 1);
  const std::vector<float> three = alibi_slopes(3);
  expect_invalid([&] { pr.run(alibi(three, causal_mask())); },
                 "has per-head parameters for 3 heads, but q has heads=4");
}

TEST(BuiltinVariants, AlibiSlopesOfThePaper) {
  const std::vector<float> s8 = alibi_slopes(8);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(s8[std::size_t(h)], std::exp2(-float(h + 1)));
  const std::vector<float> s6 = alibi_slopes(6);  // 4 of the power of two below, then 2 of the next
  ASSERT_EQ(s6.size(), 6u);
  EXPECT_FLOAT_EQ(s6[0], std::exp2(-2.0f));
  EXPECT_FLOAT_EQ(s6[4], std::exp2(-1.0f));
  EXPECT_FLOAT_EQ(s6[5], std::exp2(-3.0f));
}

}  // namespace
}  // namespace flashattn::testing
