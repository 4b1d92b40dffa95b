// An additive bias tensor (bias(view, mask), core/score_variants.hpp): broadcast over batch and heads or
// not, −inf entries (padding), under a mask and under soft-capping; forward, dq/dk/dv and the bias's own
// gradient (BackwardExtras::d_bias) against the fp64 reference for every dtype, d_bias against central
// differences and in the same bits for any thread count; bad views and bad d_bias requests.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "expect_invalid.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/core/block_mask.hpp"
#include "flashattn/core/score_variants.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/varlen.hpp"
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
        attention_forward_masked(cpu::Context<>{threads}, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), policy,
                                 {}, pr.lse.view());
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

// The expected d_bias: dS of every (entry, head), summed over the bias's broadcast extents.
std::vector<double> bias_grad_of(const std::vector<double>& d_scores, index_t batch, index_t heads, index_t sq,
                                 index_t sk, index_t bias_batch, index_t bias_heads) {
  std::vector<double> out(std::size_t(bias_batch * bias_heads * sq * sk), 0.0);
  const std::size_t plane = std::size_t(sq * sk);
  for (index_t b = 0; b < batch; ++b)
    for (index_t h = 0; h < heads; ++h) {
      const std::size_t from = std::size_t(b * heads + h) * plane;
      const std::size_t to = std::size_t((bias_batch == 1 ? 0 : b) * bias_heads + (bias_heads == 1 ? 0 : h)) * plane;
      for (std::size_t e = 0; e < plane; ++e) out[to + e] += d_scores[from + e];
    }
  return out;
}

// d_bias against the fp64 reference's dS (the 2x-naive rule), for broadcast and full biases, over a mask and
// under soft-capping; 1, 2 and 3 threads give the same bits.
template <class T>
void check_bias_grad() {
  const index_t batch = 2, hq = 4, hkv = 2, d = 32;
  const auto run = [&](index_t sq, index_t sk, index_t bias_batch, index_t bias_heads, bool capped) {
    SCOPED_TRACE("bias (" + std::to_string(bias_batch) + ", " + std::to_string(bias_heads) + "), seq " +
                 std::to_string(sq) + " x " + std::to_string(sk) + (capped ? ", soft-capped" : ""));
    const std::vector<float> values = random_bias(bias_batch * bias_heads * sq * sk, 17, true);
    const BiasView view = bias_bhqk(values.data(), bias_batch, bias_heads, sq, sk);
    const double scale = 1.0 / std::sqrt(double(d));
    const auto check = [&](const auto& policy) {
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        GradProblem<T> pr(Layout::Bshd, batch, sq, sk, hq, hkv, d, 29);
        pr.forward_masked(policy);
        std::vector<float> d_bias(values.size(), std::nanf(""));
        BackwardExtras extras;
        extras.d_bias = d_bias.data();
        pr.backward_masked(policy, {}, extras, threads);
        if (threads == 1) {
          std::vector<double> exact_ds, naive_ds;
          reference_backward<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.d_o.cview(), scale, policy, {},
                                     nullptr, &exact_ds);
          reference_backward<cpu::acc_t<T>, T>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.d_o.cview(), scale, policy,
                                               {}, nullptr, &naive_ds);
          const auto exact = bias_grad_of(exact_ds, batch, hq, sq, sk, bias_batch, bias_heads);
          const auto naive = bias_grad_of(naive_ds, batch, hq, sq, sk, bias_batch, bias_heads);
          const ToleranceCheck c{
              max_abs_error(std::vector<double>(d_bias.begin(), d_bias.end()), exact), max_abs_error(naive, exact),
              std::max(tiny_eps<float>(max_abs_finite(exact), 4.0), tiny_eps<T>(max_abs_finite(exact), 4.0))};
          EXPECT_TRUE(c.ok()) << c.describe("d_bias");
          EXPECT_TRUE(grads_match(pr, scale, policy));
          first = d_bias;
        } else {
          EXPECT_EQ(0, std::memcmp(first.data(), d_bias.data(), first.size() * sizeof(float)))
              << "d_bias differs between 1 and " << threads << " threads";
        }
      }
    };
    if (capped) {
      check(soft_cap(3.0, bias(view, causal_mask())));
    } else {
      check(bias(view, causal_mask()));
    }
  };
  run(90, 110, 2, 4, false);
  run(90, 110, 1, 1, false);
  run(70, 70, 1, 4, false);
  run(70, 70, 2, 1, false);
  run(64, 80, 1, 4, true);
}
TEST(BiasGrad, MatchesReferenceFp32) { check_bias_grad<float>(); }
TEST(BiasGrad, MatchesReferenceBf16) { check_bias_grad<Eigen::bfloat16>(); }
TEST(BiasGrad, MatchesReferenceFp64) { check_bias_grad<double>(); }

// d_bias of an fp64 problem against central differences of the fp64 reference forward's loss
// sum(dO ∘ O), each probed bias entry moved by ±2^-14 (exact in float for the entries' magnitudes).
TEST(BiasGrad, CentralDifferences) {
  const index_t sq = 19, sk = 23, hq = 4, hkv = 2, d = 8;
  for (index_t bias_heads : {index_t{1}, hq}) {
    SCOPED_TRACE("bias heads " + std::to_string(bias_heads));
    std::vector<float> values = random_bias(bias_heads * sq * sk, 5, false);
    const double scale = 1.0 / std::sqrt(double(d));
    GradProblem<double> pr(Layout::Bshd, 1, sq, sk, hq, hkv, d, 3);
    const auto policy = [&] {
      return soft_cap(4.0, bias(bias_bhqk(values.data(), 1, bias_heads, sq, sk), causal_mask()));
    };
    pr.forward_masked(policy());
    std::vector<float> d_bias(values.size());
    BackwardExtras extras;
    extras.d_bias = d_bias.data();
    pr.backward_masked(policy(), {}, extras);
    const std::vector<double> d_o = to_double(pr.d_o.cview());
    const auto loss = [&] {
      const ReferenceResult r = reference_attention<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), scale, policy());
      double l = 0;
      for (std::size_t i = 0; i < d_o.size(); ++i) l += d_o[i] * r.o[i];
      return l;
    };
    std::mt19937 rng(11);
    std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
    double largest = 0;
    for (int probe = 0; probe < 40; ++probe) {
      const std::size_t at = pick(rng);
      const float saved = values[at], h = 1.0f / 16384;
      values[at] = saved + h;
      const double up = loss();
      values[at] = saved - h;
      const double down = loss();
      values[at] = saved;
      const double numeric = (up - down) / (2.0 * double(h));
      EXPECT_NEAR(d_bias[at], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << "d_bias[" << at << "]";
      largest = std::max(largest, std::abs(numeric));
    }
    EXPECT_GT(largest, 1e-3) << "the probed entries do not move the loss: the comparison would be vacuous";
  }
}

TEST(BiasGrad, BadRequests) {
  const index_t sq = 20, sk = 24;
  std::vector<float> values(std::size_t(4 * sq * sk), 0.0f), d_bias(values.size());
  GradProblem<float> pr(Layout::Bshd, 2, sq, sk, 4, 2, 16, 1);
  const BiasView view = bias_bhqk(values.data(), 1, 4, sq, sk);
  pr.forward_masked(bias(view, causal_mask()));
  BackwardExtras extras;
  extras.d_bias = d_bias.data();
  expect_invalid([&] { pr.backward_masked(causal_mask(), {}, extras); },
                 "extras.d_bias is set, but the call's policy has no bias");
  expect_invalid([&] { pr.backward_masked(bias(view, soft_cap(2.0, causal_mask())), {}, extras); },
                 "extras.d_bias: the bias's own mask changes scores");
  BackwardExtras over_dq;
  over_dq.d_bias = pr.dq.view().data;
  expect_invalid([&] { pr.backward_masked(bias(view, causal_mask()), {}, over_dq); },
                 "extras.d_bias overlaps the memory of dq");
  BackwardExtras over_bias;
  over_bias.d_bias = values.data() + 5;
  expect_invalid([&] { pr.backward_masked(bias(view, causal_mask()), {}, over_bias); },
                 "extras.d_bias overlaps the memory of the bias");
  // The packed (varlen) backward takes no policy, so no bias.
  const index_t heads = 2, d = 16, tq = 10, tk = 12;
  const std::vector<std::int32_t> cu_q = {0, 4, tq}, cu_k = {0, 5, tk};
  std::vector<float> q(std::size_t(tq * heads * d), 0.5f), o(q.size()), d_o(q.size(), 1.0f), dq(q.size()),
      k(std::size_t(tk * heads * d), 0.25f), v(k.size(), 1.0f), dk(k.size()), dv(k.size()),
      lse(std::size_t(heads * tq));
  const PackedBatch seqs{cu_q.data(), cu_k.data(), 2};
  attention_forward_varlen<float>(packed(q.data(), tq, heads, d), packed(k.data(), tk, heads, d),
                                  packed(v.data(), tk, heads, d), packed(o.data(), tq, heads, d), seqs, {},
                                  lse_packed(lse.data(), heads, tq));
  expect_invalid(
      [&] {
        attention_backward_varlen<float>(packed(q.data(), tq, heads, d), packed(k.data(), tk, heads, d),
                                         packed(v.data(), tk, heads, d), packed(o.data(), tq, heads, d),
                                         packed(d_o.data(), tq, heads, d), lse_packed(lse.data(), heads, tq),
                                         packed(dq.data(), tq, heads, d), packed(dk.data(), tk, heads, d),
                                         packed(dv.data(), tk, heads, d), seqs, {}, extras);
      },
      "extras.d_bias is set, but the call's policy has no bias");
}

// The plane each (entry, head) reads, checked independently of Bias::for_sequence: a hand-written per-head
// score_mod adding plane (b, h) of a full (batch, heads, sq, sk) tensor is the reference of the library's
// bias over that tensor; and a broadcast bias, expanded by hand, gives the bits of the broadcast call. A
// strided view (padded rows, padded head and batch strides) gives the bits of its contiguous copy.
struct PlaneBias {
  const float* data;
  index_t heads, sq, sk;
  auto for_head(index_t b, index_t h) const {
    const float* plane = data + (b * heads + h) * sq * sk;
    const index_t cols = sk;
    return score_mod(BandMask::causal(sq, sk),
                     [plane, cols](index_t i, index_t j, auto s) { return s + decltype(s)(plane[i * cols + j]); });
  }
};

TEST(Bias, PlanesBroadcastAndStrides) {
  const index_t batch = 2, hq = 4, hkv = 2, d = 32, sq = 37, sk = 53;
  const double scale = 1.0 / std::sqrt(double(d));
  const std::vector<float> full = random_bias(batch * hq * sq * sk, 3, true);
  GradProblem<float> pr(Layout::Bshd, batch, sq, sk, hq, hkv, d, 8);
  pr.forward_masked(bias(bias_bhqk(full.data(), batch, hq, sq, sk), causal_mask()));
  EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                PlaneBias{full.data(), hq, sq, sk}, 4.0));
  const std::vector<float> full_o = pr.o.storage();

  // (1, hq) broadcast over the batch, against the same planes written out for each entry.
  const std::vector<float> per_head = random_bias(hq * sq * sk, 4, false);
  std::vector<float> expanded;
  for (index_t b = 0; b < batch; ++b) expanded.insert(expanded.end(), per_head.begin(), per_head.end());
  pr.forward_masked(bias(bias_bhqk(per_head.data(), 1, hq, sq, sk), causal_mask()));
  const std::vector<float> broadcast_o = pr.o.storage();
  pr.forward_masked(bias(bias_bhqk(expanded.data(), batch, hq, sq, sk), causal_mask()));
  EXPECT_EQ(0, std::memcmp(broadcast_o.data(), pr.o.storage().data(), broadcast_o.size() * sizeof(float)));

  // The full tensor behind padded strides: rows of sk + 5, heads of (sq + 2) rows, entries of hq + 1 heads.
  const index_t row = sk + 5, head = (sq + 2) * row, entry = (hq + 1) * head;
  std::vector<float> strided(std::size_t(batch * entry), std::nanf(""));
  for (index_t b = 0; b < batch; ++b)
    for (index_t h = 0; h < hq; ++h)
      for (index_t i = 0; i < sq; ++i)
        for (index_t j = 0; j < sk; ++j)
          strided[std::size_t(b * entry + h * head + i * row + j)] =
              full[std::size_t(((b * hq + h) * sq + i) * sk + j)];
  pr.forward_masked(bias(BiasView{strided.data(), batch, hq, sq, sk, entry, head, row}, causal_mask()));
  EXPECT_EQ(0, std::memcmp(full_o.data(), pr.o.storage().data(), full_o.size() * sizeof(float)));
}

// The checks reach a bias under other variants, and the policies under a bias.
TEST(Bias, ChecksSeeThroughVariants) {
  const index_t sq = 20, sk = 24;
  const std::vector<float> values(std::size_t(3 * sq * sk), 0.0f);
  GradProblem<float> pr(Layout::Bshd, 2, sq, sk, 4, 2, 16, 1);
  const std::vector<float> logits(4, 0.5f), slopes3(3, 0.25f);
  expect_invalid([&] { pr.forward_masked(soft_cap(3.0, bias(bias_bhqk(values.data(), 1, 1, sq, sk + 1), no_mask()))); },
                 "mask policy: built for seq_q=20 seq_k=25, but the call has seq_q=20 seq_k=24");
  expect_invalid([&] { pr.forward_masked(sinks(logits, bias(bias_bhqk(values.data(), 3, 1, sq, sk), no_mask()))); },
                 "bias: batch=3 heads=1 must each be 1 (broadcast) or the call's (batch=2, heads=4)");
  expect_invalid([&] { pr.forward_masked(bias(bias_bhqk(values.data(), 1, 1, sq, sk), alibi(slopes3, no_mask()))); },
                 "mask policy: has per-head parameters for 3 heads, but q has heads=4");
  expect_invalid(
      [&] {
        pr.forward_masked(bias(bias_bhqk(values.data(), 1, 1, sq, sk),
                               block_mask(sq + 1, sk, [](index_t, index_t) { return true; })));
      },
      "mask policy: built for seq_q=21 seq_k=24");
}

// No output may overlap the bias, which the kernels read while they write.
TEST(Bias, OutputsMustNotOverlapIt) {
  const index_t sq = 20, sk = 24, d = 16;
  GradProblem<float> pr(Layout::Bshd, 1, sq, sk, 2, 1, d, 1);
  const BiasView in_o = bias_bhqk(pr.o.view().data, 1, 1, 4, 5);  // 20 floats inside o
  GradProblem<float> small(Layout::Bshd, 1, 4, 5, 2, 1, d, 2);
  expect_invalid(
      [&] {
        attention_forward_masked(small.q.cview(), small.k.cview(), small.v.cview(), bshd(pr.o.view().data, 1, 4, 2, d),
                                 bias(in_o, no_mask()));
      },
      "o overlaps the memory of the bias");
  const auto dq_bias = bias(bias_bhqk(pr.dq.view().data, 1, 1, 4, 5), no_mask());  // inside the dq passed below
  expect_invalid(
      [&] {
        attention_backward_masked(small.q.cview(), small.k.cview(), small.v.cview(), small.o.cview(), small.d_o.cview(),
                                  small.lse.view(), bshd(pr.dq.view().data, 1, 4, 2, d), small.dk.view(),
                                  small.dv.view(), dq_bias);
      },
      "dq overlaps the memory of the bias");
}

// An empty batch: the bias's gradient is a sum over no entries.
TEST(BiasGrad, EmptyBatchGivesZeros) {
  const index_t sq = 6, sk = 7;
  GradProblem<float> pr(Layout::Bshd, 0, sq, sk, 2, 1, 8, 1);
  std::vector<float> values(std::size_t(2 * sq * sk), 1.0f), d_bias(values.size(), std::nanf(""));
  BackwardExtras extras;
  extras.d_bias = d_bias.data();
  pr.backward_masked(bias(bias_bhqk(values.data(), 1, 2, sq, sk), no_mask()), {}, extras);
  for (float g : d_bias) EXPECT_EQ(g, 0.0f);
}

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
  expect_invalid(
      [&] {
        bias(BiasView{values.data(), 1, 1, 20, 24, 0, 0, 10}, no_mask());
      },
      "stride_q >= seq_k, got stride_batch=0 stride_head=0 stride_q=10 seq_k=24");
  expect_invalid([&] { bias(bias_bhqk(values.data(), 0, 1, 20, 24), no_mask()); },
                 "bias: batch and heads must be >= 1");
}

}  // namespace
}  // namespace flashattn::testing
