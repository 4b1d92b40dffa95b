// The backward's extras (core/backward_params.hpp's BackwardExtras): a gradient of the LSE output (dLSE)
// as an input, and the gradient of learnable sink logits (sinks(...), core/score_variants.hpp) as an
// output. Against the fp64 reference (reference_backward.hpp, which counts the sink and dLSE) under the
// tolerance rule for every dtype, against central differences in double, with rows that keep no key,
// across thread counts, and with bad arguments.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "expect_invalid.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/core/score_variants.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/varlen.hpp"
#include "grad_problem.hpp"
#include "reference.hpp"
#include "reference_backward.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// A dLSE of (batch, heads_q, seq_q), in the dtype the API takes (float) and as the reference reads it.
struct LseGrad {
  std::vector<float> values;
  std::vector<double> as_double;
  LseGrad(index_t batch, index_t heads, index_t seq, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    for (index_t n = 0; n < batch * heads * seq; ++n) values.push_back(dist(rng));
    as_double.assign(values.begin(), values.end());
  }
  LseView view(index_t batch, index_t heads, index_t seq) { return lse_bhs(values.data(), batch, heads, seq); }
};

// d_sinks against the reference under the tolerance rule. It is returned as float whatever T is (the
// logits are float), so its tiny epsilon is float's.
template <class T, class Mask>
::testing::AssertionResult sink_grads_match(const GradProblem<T>& pr, const Mask& policy, const double* d_lse,
                                            const std::vector<float>& got) {
  const double scale = 1.0 / std::sqrt(double(pr.q.cview().dim));
  const ReferenceGrads exact =
      reference_backward<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.d_o.cview(), scale, policy, {}, d_lse);
  const ReferenceGrads naive = reference_backward<cpu::acc_t<T>, T>(pr.q.cview(), pr.k.cview(), pr.v.cview(),
                                                                    pr.d_o.cview(), scale, policy, {}, d_lse);
  // The epsilon of grads_match's rule (4 ulps of T at the result's magnitude): d_sinks sums terms made of
  // the forward's T-rounded O, so T's precision bounds it (the AMX bf16 path overshot a float epsilon by
  // 1.5 % on the Xeon); at least a float's, which the output is stored in.
  const double magnitude = max_abs_finite(exact.d_sinks);
  const ToleranceCheck c{max_abs_error(std::vector<double>(got.begin(), got.end()), exact.d_sinks),
                         max_abs_error(naive.d_sinks, exact.d_sinks),
                         std::max(tiny_eps<float>(magnitude, 4.0), tiny_eps<T>(magnitude, 4.0))};
  if (!c.ok()) return ::testing::AssertionFailure() << c.describe("d_sinks");
  return ::testing::AssertionSuccess() << c.describe("d_sinks");
}

// ---- dLSE ------------------------------------------------------------------------------------------------------

template <class T>
void check_lse_gradient() {
  const index_t b = 2, sq = 77, sk = 90, hq = 4, hkv = 2, d = 40;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "no mask");
    AttentionOptions opts;
    opts.causal = causal;
    GradProblem<T> pr(Layout::Bshd, b, sq, sk, hq, hkv, d, 17);
    LseGrad d_lse(b, hq, sq, 18);
    pr.forward(opts);
    BackwardExtras extras;
    extras.d_lse = d_lse.view(b, hq, sq);
    attention_backward(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.d_o.cview(), pr.lse.view(),
                       pr.dq.view(), pr.dk.view(), pr.dv.view(), opts, extras);
    EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(double(d)), band_of(opts, sq, sk), d_lse.as_double.data()));
  }
}
TEST(LseGradient, MatchesReferenceFp32) { check_lse_gradient<float>(); }
TEST(LseGradient, MatchesReferenceBf16) { check_lse_gradient<Eigen::bfloat16>(); }
TEST(LseGradient, MatchesReferenceFp64) { check_lse_gradient<double>(); }

// A zero dLSE is no dLSE: the same bits as a call without it.
TEST(LseGradient, ZeroIsAbsent) {
  GradProblem<float> with(Layout::Bshd, 1, 50, 70, 2, 1, 32, 5), without(Layout::Bshd, 1, 50, 70, 2, 1, 32, 5);
  std::vector<float> zeros(100, 0.0f);
  with.forward({});
  without.forward({});
  BackwardExtras extras;
  extras.d_lse = lse_bhs(zeros.data(), 1, 2, 50);
  attention_backward(with.q.cview(), with.k.cview(), with.v.cview(), with.o.cview(), with.d_o.cview(),
                     with.lse.view(), with.dq.view(), with.dk.view(), with.dv.view(), {}, extras);
  without.backward({});
  EXPECT_EQ(to_double(with.dq.cview()), to_double(without.dq.cview()));
  EXPECT_EQ(to_double(with.dk.cview()), to_double(without.dk.cview()));
}

// L = Σ dO ∘ O + Σ dLSE ∘ LSE, by central differences of the fp64 reference forward, against the backward's
// dq, dk, dv (double), with a sink and the sink's gradient too.
TEST(LseGradient, MatchesCentralDifferences) {
  const index_t sq = 19, sk = 23, hq = 4, hkv = 2, d = 8;
  std::vector<float> logits = {0.75f, -1.5f, 2.0f, 0.0f};
  for (bool with_sinks : {false, true}) {
    SCOPED_TRACE(with_sinks ? "with sinks" : "no sinks");
    GradProblem<double> pr(Layout::Bshd, 1, sq, sk, hq, hkv, d, 3);
    LseGrad d_lse(1, hq, sq, 4);
    const auto policy = sinks(logits, window_mask(-1, 0));
    const auto plain = causal_mask();
    std::vector<float> d_sinks(std::size_t(hq), std::nanf(""));
    BackwardExtras extras;
    extras.d_lse = d_lse.view(1, hq, sq);
    if (with_sinks) {
      extras.d_sinks = d_sinks.data();
      pr.forward_masked(policy);
      pr.backward_masked(policy, {}, extras);
    } else {
      pr.forward_masked(plain);
      pr.backward_masked(plain, {}, extras);
    }
    const double scale = 1.0 / std::sqrt(double(d));
    const std::vector<double> d_o = to_double(pr.d_o.cview());
    const auto loss = [&] {
      const ReferenceResult r =
          with_sinks ? reference_attention<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), scale, policy)
                     : reference_attention<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), scale, plain);
      double l = 0;
      for (std::size_t i = 0; i < d_o.size(); ++i) l += d_o[i] * r.o[i];
      for (std::size_t i = 0; i < r.lse.size(); ++i) l += d_lse.as_double[i] * r.lse[i];
      return l;
    };
    expect_central_differences(pr, loss, 30, 5);
    if (!with_sinks) continue;
    // The logits are float: a step of 2^-10 is exact on them; the result is float (6e-8 relative).
    for (index_t h = 0; h < hq; ++h) {
      const float saved = logits[std::size_t(h)], step = 1.0f / 1024.0f;
      logits[std::size_t(h)] = saved + step;
      const double up = loss();
      logits[std::size_t(h)] = saved - step;
      const double down = loss();
      logits[std::size_t(h)] = saved;
      const double numeric = (up - down) / (2.0 * double(step));
      EXPECT_NEAR(double(d_sinks[std::size_t(h)]), numeric, 1e-5 * std::max(1.0, std::abs(numeric)))
          << "d_sinks[" << h << "]";
    }
  }
}

// A packed batch with dLSE gives what separate calls per sequence give (varlen.hpp: "as a separate call").
TEST(LseGradient, VarlenIsSeparateCalls) {
  const index_t heads = 2, d = 16;
  const std::vector<std::int32_t> cu_q = {0, 37, 87}, cu_k = {0, 45, 75};
  const index_t tq = cu_q.back(), tk = cu_k.back();
  std::vector<float> q(std::size_t(tq * heads * d)), o(q.size()), d_o(q.size()), k(std::size_t(tk * heads * d)),
      v(k.size()), lse(std::size_t(heads * tq)), d_lse(lse.size());
  std::mt19937 rng(77);
  std::normal_distribution<float> dist;
  for (auto* x : {&q, &d_o, &k, &v, &d_lse})
    for (float& e : *x) e = dist(rng);
  AttentionOptions opts;
  opts.causal = true;
  const PackedBatch seqs{cu_q.data(), cu_k.data(), 2};
  attention_forward_varlen<float>(packed(q.data(), tq, heads, d), packed(k.data(), tk, heads, d),
                                  packed(v.data(), tk, heads, d), packed(o.data(), tq, heads, d), seqs, opts,
                                  lse_packed(lse.data(), heads, tq));
  std::vector<float> dq(q.size()), dk(k.size()), dv(k.size());
  BackwardExtras extras;
  extras.d_lse = lse_packed(d_lse.data(), heads, tq);
  attention_backward_varlen<float>(packed(q.data(), tq, heads, d), packed(k.data(), tk, heads, d),
                                   packed(v.data(), tk, heads, d), packed(o.data(), tq, heads, d),
                                   packed(d_o.data(), tq, heads, d), lse_packed(lse.data(), heads, tq),
                                   packed(dq.data(), tq, heads, d), packed(dk.data(), tk, heads, d),
                                   packed(dv.data(), tk, heads, d), seqs, opts, extras);
  std::vector<float> sq_dq(q.size()), sq_dk(k.size()), sq_dv(k.size());
  for (int b = 0; b < 2; ++b) {
    const index_t q0 = cu_q[b], nq = cu_q[b + 1] - q0, k0 = cu_k[b], nk = cu_k[b + 1] - k0;
    const auto rows = [&](std::vector<float>& x, index_t first, index_t n) {
      return bshd(x.data() + first * heads * d, 1, n, heads, d);
    };
    const auto crows = [&](std::vector<float>& x, index_t first, index_t n) {
      return bshd<const float>(x.data() + first * heads * d, 1, n, heads, d);
    };
    const auto lse_rows = [&](std::vector<float>& x) { return LseView{x.data() + q0, 1, heads, nq, heads * tq, tq, 1}; };
    BackwardExtras one;
    one.d_lse = lse_rows(d_lse);
    attention_backward<float>(crows(q, q0, nq), crows(k, k0, nk), crows(v, k0, nk), crows(o, q0, nq),
                              crows(d_o, q0, nq), lse_rows(lse), rows(sq_dq, q0, nq), rows(sq_dk, k0, nk),
                              rows(sq_dv, k0, nk), opts, one);
  }
  EXPECT_EQ(dq, sq_dq);
  EXPECT_EQ(dk, sq_dk);
  EXPECT_EQ(dv, sq_dv);
}

// ---- Sink gradients --------------------------------------------------------------------------------------------

// sinks over a causal mask (with seq_q > seq_k, so the first rows keep no key and attend only the sink),
// over ALiBi, and over soft-capping; with and without dLSE; 1 and 2 threads give the same bits.
template <class T>
void check_sink_gradients() {
  const index_t b = 2, hq = 4, hkv = 2, d = 32;
  const std::vector<float> logits = {0.5f, -2.0f, 3.0f, 1.25f};
  [[maybe_unused]] const std::vector<float> slopes = alibi_slopes(hq);
  const auto run = [&](const auto& policy, index_t sq, index_t sk, bool with_d_lse, const char* what) {
    SCOPED_TRACE(std::string(what) + (with_d_lse ? ", with dLSE" : ""));
    LseGrad d_lse(b, hq, sq, 23);
    std::vector<float> first;
    for (int threads : {1, 2}) {
      GradProblem<T> pr(Layout::Bshd, b, sq, sk, hq, hkv, d, 29);
      std::vector<float> d_sinks(std::size_t(hq), std::nanf(""));
      BackwardExtras extras;
      if (with_d_lse) extras.d_lse = d_lse.view(b, hq, sq);
      extras.d_sinks = d_sinks.data();
      pr.forward_masked(policy);
      pr.backward_masked(policy, {}, extras, threads);
      const double* dl = with_d_lse ? d_lse.as_double.data() : nullptr;
      EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(double(d)), policy, dl));
      EXPECT_TRUE(sink_grads_match(pr, policy, dl, d_sinks));
      if (threads == 1) {
        first = d_sinks;
      } else {
        EXPECT_EQ(0, std::memcmp(first.data(), d_sinks.data(), first.size() * sizeof(float))) << "thread counts";
      }
    }
  };
  run(sinks(logits, causal_mask()), 90, 70, false, "causal, rows without keys");
  run(sinks(logits, causal_mask()), 90, 70, true, "causal, rows without keys");
  run(sinks(logits, window_mask(-1, -1)), 64, 100, true, "no mask");
  // Compositions, fp32 and bf16 (the bf16 kernels are another instantiation; fp64 runs fp32's code with
  // another element type, left out to keep the build short).
  if constexpr (!std::is_same_v<T, double>) {
    run(sinks(logits, alibi(slopes, causal_mask())), 70, 110, true, "ALiBi");
    run(sinks(logits, soft_cap(2.0, window_mask(20, 5))), 80, 80, false, "soft-cap over a window");
  }
}
TEST(SinkGradient, MatchesReferenceFp32) { check_sink_gradients<float>(); }
TEST(SinkGradient, MatchesReferenceBf16) { check_sink_gradients<Eigen::bfloat16>(); }
TEST(SinkGradient, MatchesReferenceFp64) { check_sink_gradients<double>(); }

// Variants compose: the inner score change applies first (soft_cap over ALiBi caps the biased score), in
// the forward and in the gradients.
TEST(VariantComposition, SoftCapOverAlibi) {
  const index_t sq = 60, sk = 75, hq = 2, d = 32;
  const std::vector<float> slopes = alibi_slopes(hq);
  const auto policy = soft_cap(3.0, alibi(slopes, causal_mask()));
  GradProblem<float> pr(Layout::Bshd, 1, sq, sk, hq, hq, d, 41);
  fill_normal(pr.q.view(), 41, 2.0);
  pr.forward_masked(policy);
  pr.backward_masked(policy);
  EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(double(d)), policy));
  // The reference of the composition differs from soft-capping alone: the ALiBi term is not dropped.
  const ReferenceResult both = reference_attention<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(),
                                                           1.0 / std::sqrt(double(d)), policy);
  const ReferenceResult cap_only = reference_attention<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(),
                                                               1.0 / std::sqrt(double(d)), soft_cap(3.0, causal_mask()));
  EXPECT_GT(max_abs_error(both.o, cap_only.o), 1e-3);
  EXPECT_LT(max_abs_error(to_double(pr.o.cview()), both.o), 1e-4);
}

// ---- Bad arguments ---------------------------------------------------------------------------------------------

TEST(BackwardExtrasErrors, NamedInMessages) {
  const index_t sq = 20, sk = 24, hq = 2, d = 16;
  GradProblem<float> pr(Layout::Bshd, 1, sq, sk, hq, hq, d, 1);
  const std::vector<float> logits = {0.5f, 1.0f};
  const auto policy = sinks(logits, causal_mask());
  pr.forward_masked(policy);
  std::vector<float> d_lse(std::size_t(hq * sq), 0.0f);
  std::vector<float> d_sinks(std::size_t(hq), 0.0f);
  const auto backward = [&](const BackwardExtras& extras) { pr.backward_masked(policy, {}, extras); };

  BackwardExtras wrong_shape;
  wrong_shape.d_lse = lse_bhs(d_lse.data(), 1, hq, sq - 1);
  expect_invalid([&] { backward(wrong_shape); },
                 "extras.d_lse must have lse's shape (batch, heads_q, seq_q) = (1, 2, 20), got");

  BackwardExtras into_dq;
  into_dq.d_lse = lse_bhs(reinterpret_cast<float*>(pr.dq.view().data), 1, hq, sq);
  expect_invalid([&] { backward(into_dq); }, "dq overlaps the memory of input extras.d_lse");

  BackwardExtras sinks_in_dk;
  sinks_in_dk.d_sinks = reinterpret_cast<float*>(pr.dk.view().data);
  expect_invalid([&] { backward(sinks_in_dk); }, "extras.d_sinks overlaps the memory of dk");

  // d_sinks for a policy without a sink, and for the options entry point.
  BackwardExtras want_sinks;
  want_sinks.d_sinks = d_sinks.data();
  expect_invalid([&] { pr.backward_masked(causal_mask(), {}, want_sinks); },
                 "extras.d_sinks is set, but the call's policy has no sink");
  expect_invalid(
      [&] {
        attention_backward(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.d_o.cview(), pr.lse.view(),
                           pr.dq.view(), pr.dk.view(), pr.dv.view(), {}, want_sinks);
      },
      "extras.d_sinks is set, but the call's policy has no sink");

  // The sinks policy itself.
  const std::vector<float> three = {0.0f, 1.0f, 2.0f};
  expect_invalid([&] { pr.forward_masked(sinks(three, causal_mask())); },
                 "mask policy: has per-head parameters for 3 heads, but q has heads=2");
  expect_invalid([&] { sinks(nullptr, 2, no_mask()); }, "sinks: logits is null for heads=2");
  const std::vector<float> with_nan = {0.0f, std::nanf("")};
  expect_invalid([&] { sinks(with_nan, no_mask()); }, "sinks: logits[1] is NaN");
  expect_invalid([&] { sinks(logits, alibi(alibi_slopes(4), no_mask())); },
                 "sinks: 2 logits, but the inner policy has parameters for 4 heads");
}

}  // namespace
}  // namespace flashattn::testing
