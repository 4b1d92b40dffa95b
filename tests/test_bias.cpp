// An additive bias tensor (bias(view, mask), core/score_variants.hpp): broadcast over batch and heads or
// not, −inf entries (padding), under a mask and under soft-capping; forward and dq/dk/dv against the fp64
// reference for every dtype; bad views. (The bias's own gradient is not computed yet.)

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <random>
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

std::vector<float> random_bias(index_t n, std::uint32_t seed, bool with_holes) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> b(static_cast<std::size_t>(n));
  for (float& x : b) x = dist(rng);
  if (with_holes)
    for (std::size_t i = 0; i < b.size(); i += 7) b[i] = -std::numeric_limits<float>::infinity();
  return b;
}

template <class T>
void check_bias() {
  const index_t batch = 2, hq = 4, hkv = 2, d = 32;
  const auto run = [&](index_t sq, index_t sk, index_t bias_batch, index_t bias_heads, bool holes, bool capped) {
    SCOPED_TRACE("bias (" + std::to_string(bias_batch) + ", " + std::to_string(bias_heads) + "), seq " +
                 std::to_string(sq) + " x " + std::to_string(sk) + (holes ? ", -inf entries" : "") +
                 (capped ? ", soft-capped" : ""));
    const std::vector<float> values = random_bias(bias_batch * bias_heads * sq * sk, 91, holes);
    const BiasView view = bias_bhqk(values.data(), bias_batch, bias_heads, sq, sk);
    const double scale = 1.0 / std::sqrt(double(d));
    const auto check = [&](const auto& policy) {
      for (int threads : {1, 2}) {
        GradProblem<T> pr(Layout::Bshd, batch, sq, sk, hq, hkv, d, 93);
        attention_forward_masked(cpu::Context<>{threads}, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(),
                                 policy, {}, pr.lse.view());
        EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                      policy, capped ? 12.0 : 4.0));
        pr.backward_masked(policy, {}, {}, threads);
        EXPECT_TRUE(grads_match(pr, scale, policy));
      }
    };
    if (capped) {
      check(soft_cap(3.0, bias(view, causal_mask())));
    } else {
      check(bias(view, causal_mask()));
    }
  };
  run(90, 110, 2, 4, false, false);
  run(90, 110, 1, 1, true, false);
  run(70, 70, 1, 4, false, false);
  run(70, 70, 2, 1, true, false);
  if constexpr (std::is_same_v<T, float>) run(64, 80, 1, 4, false, true);
}
TEST(Bias, MatchesReferenceFp32) { check_bias<float>(); }
TEST(Bias, MatchesReferenceBf16) { check_bias<Eigen::bfloat16>(); }
TEST(Bias, MatchesReferenceFp64) { check_bias<double>(); }

TEST(Bias, BadViews) {
  const std::vector<float> values(2 * 3 * 20 * 24, 0.0f);
  GradProblem<float> pr(Layout::Bshd, 2, 20, 24, 4, 2, 16, 1);
  const auto forward = [&](const BiasView& v) { pr.forward_masked(bias(v, no_mask())); };
  expect_invalid([&] { forward(bias_bhqk(values.data(), 2, 3, 20, 24)); },
                 "bias: batch=2 heads=3 must each be 1 (broadcast) or the call's (batch=2, heads=4)");
  expect_invalid([&] { forward(bias_bhqk(values.data(), 3, 1, 20, 24)); }, "bias: batch=3 heads=1 must each be 1");
  expect_invalid([&] { forward(bias_bhqk(values.data(), 1, 1, 20, 23)); },
                 "mask policy: built for seq_q=20 seq_k=23, but the call has seq_q=20 seq_k=24");
  expect_invalid([&] { bias(bias_bhqk(nullptr, 1, 1, 20, 24), no_mask()); }, "bias: data is null");
  expect_invalid([&] { bias(BiasView{values.data(), 1, 1, 20, 24, 0, 0, 10}, no_mask()); },
                 "stride_q >= seq_k, got stride_batch=0 stride_head=0 stride_q=10 seq_k=24");
  expect_invalid([&] { bias(bias_bhqk(values.data(), 0, 1, 20, 24), no_mask()); }, "bias: batch and heads must be >= 1");
}

}  // namespace
}  // namespace flashattn::testing
