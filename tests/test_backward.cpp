// The backward pass (issue 6): gradients against the analytic fp64 reference under the tolerance rule
// (every dtype), against finite differences (double), tails, masks, GQA, layouts, fully masked rows,
// determinism across thread counts, memory, and argument validation.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "configs.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/core/score_variants.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/reference/naive_backward.hpp"
#include "reference.hpp"
#include "grad_problem.hpp"
#include "reference_backward.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// ---- Every dtype and tile configuration against the reference -------------------------------------------

template <class C>
class BackwardTyped : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_runs(C::Tiles::isa)) GTEST_SKIP() << "this CPU does not run " << cpu::isa_name(C::Tiles::isa);
  }
};

using BackwardConfigs = CompiledConfigs<Pair<float, TileSpec<64, 64>>, Pair<double, TileSpec<64, 64>>,
                                        Pair<Eigen::half, TileSpec<64, 64>>, Pair<Eigen::bfloat16, TileSpec<64, 64>>,
                                        Pair<float, TileSpec<16, 32, cpu::Isa::Avx2>>,
                                        Pair<double, TileSpec<8, 8, cpu::Isa::Portable>>>;
TYPED_TEST_SUITE(BackwardTyped, BackwardConfigs, ConfigName);

struct Shape {
  index_t batch, sq, sk, hq, hkv, d;
};

// Tails around both block sizes: 1, B − 1, B, B + 1, 3B + 7; GQA and MQA; a compile-time head dim (64)
// and a runtime one (24).
template <class Tiles>
std::vector<Shape> tail_shapes() {
  constexpr index_t bq = Tiles::BlockQ, bkv = Tiles::BlockKV;
  return {{1, 1, 1, 1, 1, 64},           {1, bq - 1, bkv + 1, 2, 1, 24}, {2, bq, bkv, 4, 2, 64},
          {1, bq + 1, 3 * bkv + 7, 3, 3, 24}, {1, 3 * bq + 7, bkv - 1, 4, 1, 64}, {1, 2 * bq + 3, 2 * bq + 3, 2, 2, 24}};
}

TYPED_TEST(BackwardTyped, MatchesReferenceWithTailsMasksAndGqa) {
  using T = typename TypeParam::T;
  using Tiles = typename TypeParam::Tiles;
  std::uint32_t seed = 100;
  for (const Shape& s : tail_shapes<Tiles>()) {
    for (int mode = 0; mode < 3; ++mode) {
      AttentionOptions opts;
      if (mode == 1) opts.causal = true;
      if (mode == 2) opts.window_left = 9, opts.window_right = 4;
      SCOPED_TRACE("batch=" + std::to_string(s.batch) + " sq=" + std::to_string(s.sq) + " sk=" +
                   std::to_string(s.sk) + " hq=" + std::to_string(s.hq) + " hkv=" + std::to_string(s.hkv) +
                   " d=" + std::to_string(s.d) + " mode=" + std::to_string(mode));
      GradProblem<T> pr(Layout::Bshd, s.batch, s.sq, s.sk, s.hq, s.hkv, s.d, seed += 10);
      pr.template forward<Tiles>(opts);
      pr.template backward<Tiles>(opts);
      EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(double(s.d)), band_of(opts, s.sq, s.sk)));
    }
  }
}

TYPED_TEST(BackwardTyped, BhsdLayoutAndScale) {
  using T = typename TypeParam::T;
  using Tiles = typename TypeParam::Tiles;
  GradProblem<T> pr(Layout::Bhsd, 2, 2 * Tiles::BlockQ + 5, Tiles::BlockKV + 9, 4, 2, 64, 7);
  AttentionOptions opts;
  opts.scale = 0.3;
  opts.causal = true;
  pr.template forward<Tiles>(opts);
  pr.template backward<Tiles>(opts);
  EXPECT_TRUE(grads_match(pr, 0.3, band_of(opts, pr.q.view().seq, pr.k.view().seq)));
}

// Gradients written with a dim stride of 2 go element by element; contiguous ones are scaled in place and
// moved by 16 × 16 transposes that convert on the way out (cpu/transpose.hpp, on AVX-512). Both must give
// the same bits, in whole 16 × 16 blocks and at the edges (rows and a head dim of 40 that blocks do not fill).
TYPED_TEST(BackwardTyped, StridedGradientsHaveTheBitsOfContiguousOnes) {
  using T = typename TypeParam::T;
  using Tiles = typename TypeParam::Tiles;
  const index_t sq = 2 * Tiles::BlockQ + 21, sk = Tiles::BlockKV + 37, hq = 4, hkv = 2, d = 40;
  GradProblem<T> pr(Layout::Bshd, 1, sq, sk, hq, hkv, d, 31);
  AttentionOptions opts;
  opts.causal = true;
  opts.scale = 0.2;
  pr.template forward<Tiles>(opts);
  pr.template backward<Tiles>(opts);
  std::vector<T> dq_buf(std::size_t(sq * hq * d * 2)), dk_buf(std::size_t(sk * hkv * d * 2)), dv_buf(dk_buf.size());
  const auto spread = [&](std::vector<T>& buf, index_t seq, index_t heads) {
    return TensorView<T>{buf.data(), 1, seq, heads, d, seq * heads * d * 2, heads * d * 2, d * 2, 2};
  };
  const TensorView<T> dq = spread(dq_buf, sq, hq), dk = spread(dk_buf, sk, hkv), dv = spread(dv_buf, sk, hkv);
  attention_backward(cpu::Context<Tiles>{}, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.d_o.cview(),
                     pr.lse.view(), dq, dk, dv, opts);
  int differing = 0;
  for (const auto& [strided, contiguous] : {std::pair{dq, pr.dq.view()}, std::pair{dk, pr.dk.view()},
                                            std::pair{dv, pr.dv.view()}})
    for (index_t s = 0; s < strided.seq; ++s)
      for (index_t h = 0; h < strided.heads; ++h)
        for (index_t c = 0; c < d; ++c)
          differing += std::memcmp(&strided(0, s, h, c), &contiguous(0, s, h, c), sizeof(T)) != 0;
  EXPECT_EQ(differing, 0);
}

// ---- Finite differences (double) ---------------------------------------------------------------------------

// L(q, k, v) = Σ dO ∘ O, so dL/dx is the backward's dx. Central differences of L computed by the fp64
// reference forward check the analytic gradients independently of the reference backward.
TEST(BackwardFiniteDifference, MatchesCentralDifferences) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "no mask");
    GradProblem<double> pr(Layout::Bshd, 1, 19, 23, 4, 2, 8, 3);
    AttentionOptions opts;
    opts.causal = causal;
    pr.forward(opts);
    pr.backward(opts);
    const double scale = 1.0 / std::sqrt(8.0);
    const BandMask mask = band_of(opts, 19, 23);
    const std::vector<double> d_o = to_double(pr.d_o.cview());
    const auto loss = [&] {
      const ReferenceResult r = reference_attention<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), scale, mask);
      double l = 0;
      for (std::size_t i = 0; i < d_o.size(); ++i) l += d_o[i] * r.o[i];
      return l;
    };
    expect_central_differences(pr, loss, 40, 5);
  }
}

// ---- The naive backward (naive_backward.hpp), the comparison baseline of the benchmark and the example ----

TEST(NaiveBackward, MatchesReference) {
  for (bool causal : {false, true}) {
    GradProblem<float> pr(Layout::Bhsd, 2, 70, 90, 4, 2, 32, 31);
    AttentionOptions opts;
    opts.causal = causal;
    pr.forward(opts);
    naive_attention_backward<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.d_o.cview(),
                                    pr.lse.view(), pr.dq.view(), pr.dk.view(), pr.dv.view(), opts);
    EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(32.0), band_of(opts, 70, 90))) << (causal ? "causal" : "no mask");
  }
}

// ---- Masks ---------------------------------------------------------------------------------------------------

// Causal with seq_q > seq_k: the first seq_q − seq_k query rows keep no key. Their dq is exactly 0 and no
// gradient anywhere is NaN.
TEST(Backward, FullyMaskedRowsHaveZeroGradients) {
  GradProblem<float> pr(Layout::Bshd, 1, 150, 40, 2, 1, 64, 11);
  AttentionOptions opts;
  opts.causal = true;
  pr.forward(opts);
  pr.backward(opts);
  const std::vector<double> dq = to_double(pr.dq.cview()), dk = to_double(pr.dk.cview()),
                            dv = to_double(pr.dv.cview());
  EXPECT_TRUE(all_finite(dq) && all_finite(dk) && all_finite(dv));
  for (index_t i = 0; i < 110; ++i)
    for (index_t h = 0; h < 2; ++h)
      for (index_t c = 0; c < 64; ++c) ASSERT_EQ(pr.dq.view()(0, i, h, c), 0.0f) << "row " << i;
  EXPECT_TRUE(grads_match(pr, 1.0 / 8.0, band_of(opts, 150, 40)));
}

TEST(Backward, EmptyKeysAndEmptyQueries) {
  {  // seq_k = 0: every row masked, dq = 0, dk and dv empty.
    GradProblem<float> pr(Layout::Bshd, 1, 20, 0, 2, 1, 16, 1);
    pr.forward({});
    pr.backward({});
    for (double x : to_double(pr.dq.cview())) ASSERT_EQ(x, 0.0);
  }
  {  // seq_q = 0: no query, so dk = dv = 0.
    GradProblem<float> pr(Layout::Bshd, 1, 0, 20, 2, 1, 16, 1);
    pr.backward({});
    for (double x : to_double(pr.dk.cview())) ASSERT_EQ(x, 0.0);
    for (double x : to_double(pr.dv.cview())) ASSERT_EQ(x, 0.0);
  }
}

TEST(Backward, ElementMaskWithEmptyRows) {
  const index_t sq = 77, sk = 90;
  // Keeps a pseudo-random half of the keys, and nothing for every 7th query row.
  auto keep = [](index_t i, index_t j) { return i % 7 != 0 && ((i * 31 + j * 17) % 5) < 3; };
  const auto mask = element_mask(sk, keep);
  GradProblem<float> pr(Layout::Bshd, 1, sq, sk, 2, 2, 40, 21);
  pr.forward_masked(mask);
  pr.backward_masked(mask);
  EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(40.0), mask));
  EXPECT_TRUE(all_finite(to_double(pr.dk.cview())));
}

// Soft-capping c·tanh(s/c) on a causal band, differentiated through score_grad.
TEST(Backward, ScoreModifierWithGradient) {
  const index_t sq = 70, sk = 70;
  const double cap = 2.0;
  const auto mask = score_mod(
      BandMask::causal(sq, sk), [cap](index_t, index_t, auto s) { return decltype(s)(cap * std::tanh(s / cap)); },
      [cap](index_t, index_t, auto s) {
        const auto t = std::tanh(s / cap);
        return decltype(s)(1 - t * t);
      });
  for (bool in_double : {false, true}) {
    if (in_double) {
      GradProblem<double> pr(Layout::Bshd, 1, sq, sk, 2, 1, 32, 8);
      pr.forward_masked(mask);
      pr.backward_masked(mask);
      EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(32.0), mask));
    } else {
      GradProblem<float> pr(Layout::Bshd, 1, sq, sk, 2, 1, 32, 8);
      pr.forward_masked(mask);
      pr.backward_masked(mask);
      EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(32.0), mask));
    }
  }
}

// The built-in variants (core/score_variants.hpp), evaluated on lanes, through the backward: soft-capping
// with scores large enough to bite, ALiBi over a causal band and without a mask; fp32, bf16 and fp64.
template <class T>
void check_builtin_variant_grads() {
  const index_t sq = 90, sk = 110, hq = 4, hkv = 2, d = 32;
  const std::vector<float> slopes = alibi_slopes(hq);
  const auto run = [&](const auto& policy, double stddev) {
    GradProblem<T> pr(Layout::Bshd, 1, sq, sk, hq, hkv, d, 31);
    fill_normal(pr.q.view(), 31, stddev);
    fill_normal(pr.k.view(), 32, stddev);
    pr.forward_masked(policy);
    pr.backward_masked(policy);
    EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(double(d)), policy));
  };
  run(soft_cap(2.0f, no_mask()), 2.0);
  run(soft_cap(2.0f, causal_mask()), 2.0);
  run(alibi(slopes, causal_mask()), 1.0);
  run(alibi(slopes, no_mask()), 1.0);
}
TEST(Backward, BuiltinVariantsFp32) { check_builtin_variant_grads<float>(); }
TEST(Backward, BuiltinVariantsBf16) { check_builtin_variant_grads<Eigen::bfloat16>(); }
TEST(Backward, BuiltinVariantsFp64) { check_builtin_variant_grads<double>(); }

// A policy that changes scores without a derivative cannot be differentiated: rejected at compile time.
static_assert(!differentiable_mask_v<ScoreMod<float (*)(index_t, index_t, float), NoMask>>);
static_assert(differentiable_mask_v<BandMask> && differentiable_mask_v<NoMask>);

// ---- Layouts -------------------------------------------------------------------------------------------------

// q, k, v as slices of one fused (batch, seq, 3, heads, dim) buffer; gradients written into a fused
// buffer of the same shape; o and dO with a non-unit dim stride.
TEST(Backward, FusedQkvAndStridedViews) {
  const index_t batch = 2, seq = 45, heads = 3, dim = 24;
  const index_t row = 3 * heads * dim;
  std::vector<float> qkv(std::size_t(batch * seq * row)), grad(qkv.size(), std::nanf(""));
  std::vector<float> o(std::size_t(batch * seq * heads * dim * 2)), d_o(o.size());
  std::vector<float> lse(std::size_t(batch * heads * seq));
  std::mt19937 rng(9);
  std::normal_distribution<float> dist;
  for (float& x : qkv) x = dist(rng);
  for (float& x : d_o) x = dist(rng);
  const auto slice = [&](float* base, int which) {
    return TensorView<float>{base + which * heads * dim, batch, seq, heads, dim, seq * row, row, dim, 1};
  };
  const auto spread = [&](float* base) {  // dim stride 2
    return TensorView<float>{base, batch, seq, heads, dim, seq * heads * dim * 2, heads * dim * 2, dim * 2, 2};
  };
  AttentionOptions opts;
  opts.causal = true;
  const LseView lse_view = lse_bhs(lse.data(), batch, heads, seq);
  attention_forward<float>(slice(qkv.data(), 0), slice(qkv.data(), 1), slice(qkv.data(), 2), spread(o.data()), opts,
                           lse_view);
  attention_backward<float>(slice(qkv.data(), 0), slice(qkv.data(), 1), slice(qkv.data(), 2), spread(o.data()),
                            spread(d_o.data()), lse_view, slice(grad.data(), 0), slice(grad.data(), 1),
                            slice(grad.data(), 2), opts);
  // The same problem in contiguous BSHD memory.
  GradProblem<float> pr(Layout::Bshd, batch, seq, seq, heads, heads, dim, 0);
  for (index_t b = 0; b < batch; ++b)
    for (index_t s = 0; s < seq; ++s)
      for (index_t h = 0; h < heads; ++h)
        for (index_t c = 0; c < dim; ++c) {
          pr.q.view()(b, s, h, c) = slice(qkv.data(), 0)(b, s, h, c);
          pr.k.view()(b, s, h, c) = slice(qkv.data(), 1)(b, s, h, c);
          pr.v.view()(b, s, h, c) = slice(qkv.data(), 2)(b, s, h, c);
          pr.d_o.view()(b, s, h, c) = spread(d_o.data())(b, s, h, c);
        }
  pr.forward(opts);
  pr.backward(opts);
  for (int which = 0; which < 3; ++which) {
    const HostTensor<float>& want = which == 0 ? pr.dq : which == 1 ? pr.dk : pr.dv;
    EXPECT_EQ(to_double(TensorView<const float>(slice(grad.data(), which))), to_double(want.cview()))
        << "gradient " << which;
  }
}

// ---- Determinism ----------------------------------------------------------------------------------------------

template <class T>
std::vector<T> concat_grads(const GradProblem<T>& pr) {
  std::vector<T> all;
  for (const HostTensor<T>* g : {&pr.dq, &pr.dk, &pr.dv}) {
    const std::vector<T>& s = const_cast<HostTensor<T>*>(g)->storage();
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}

TEST(Backward, SameBitsForAnyThreadCount) {
  for (bool causal : {false, true}) {
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      GradProblem<float> pr(Layout::Bshd, 2, 300, 260, 4, 2, 64, 17);
      AttentionOptions opts;
      opts.causal = causal;
      pr.forward(opts, 1);
      pr.backward(opts, threads);
      const std::vector<float> grads = concat_grads(pr);
      if (first.empty()) {
        first = grads;
      } else {
        ASSERT_EQ(0, std::memcmp(first.data(), grads.data(), first.size() * sizeof(float)))
            << threads << " threads, causal=" << causal;
      }
    }
  }
}

// ---- Memory ----------------------------------------------------------------------------------------------------

// Extra memory is two accumulators per query row plus per-worker tiles: far below one (seq_q × seq_k)
// matrix, and independent of seq_k.
TEST(Backward, ScratchIsLinearInSequenceLength) {
  const index_t n = 1024, d = 64, heads = 2;
  GradProblem<float> pr(Layout::Bshd, 1, n, n, heads, heads, d, 4);
  AttentionOptions opts;
  pr.forward(opts, 1);
  const std::int64_t before = cpu::scratch_stats().current_bytes;
  cpu::reset_scratch_peak();
  pr.backward(opts, 1);
  const std::int64_t peak = cpu::scratch_stats().peak_bytes - before;
  const std::int64_t stats_bytes = 2 * heads * n * std::int64_t(sizeof(float));
  const std::int64_t tile_bytes = 64 * 64 * 16 * std::int64_t(sizeof(float));  // generous: a few tiles of d ≤ 64
  EXPECT_LE(peak, stats_bytes + tile_bytes);
  EXPECT_LT(peak, n * n * std::int64_t(sizeof(float)) / 16);
}

// ---- Validation -------------------------------------------------------------------------------------------------

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(BackwardValidation, NamesArgumentsAndValues) {
  GradProblem<float> pr(Layout::Bshd, 1, 10, 12, 4, 2, 16, 1);
  HostTensor<float> small_dk(Layout::Bshd, 1, 11, 2, 16);
  HostLse wrong_lse(1, 4, 9);
  const auto call = [&](TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, LseView lse) {
    return error_of([&] {
      attention_backward<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.d_o.cview(), lse, dq, dk,
                                dv);
    });
  };
  EXPECT_NE(call(pr.dq.view(), small_dk.view(), pr.dv.view(), pr.lse.view())
                .find("dk must have k's shape: k (batch=1, seq=12, heads=2, dim=16), dk (batch=1, seq=11"),
            std::string::npos);
  EXPECT_NE(call(pr.dq.view(), pr.dk.view(), pr.dv.view(), LseView{}).find("lse (the forward's log-sum-exp"),
            std::string::npos);
  EXPECT_NE(call(pr.dq.view(), pr.dk.view(), pr.dv.view(), wrong_lse.view()).find("got lse (batch=1, heads=4, seq=9)"),
            std::string::npos);
  EXPECT_NE(call(pr.dq.view(), pr.dk.view(), pr.dk.view(), pr.lse.view()).find("dk overlaps the memory of output dv"),
            std::string::npos);
  // Writing a gradient over an input.
  TensorView<float> q_as_output{pr.q.storage().data(), 1, 10, 4, 16, 10 * 4 * 16, 4 * 16, 16, 1};
  EXPECT_NE(call(q_as_output, pr.dk.view(), pr.dv.view(), pr.lse.view()).find("dq overlaps the memory of input q"),
            std::string::npos);
  AttentionOptions bad;
  bad.scale = -1.0;
  EXPECT_NE(error_of([&] {
              attention_backward<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.d_o.cview(),
                                        pr.lse.view(), pr.dq.view(), pr.dk.view(), pr.dv.view(), bad);
            }).find("options.scale must be finite and > 0"),
            std::string::npos);
  AttentionOptions causal;
  causal.causal = true;
  EXPECT_NE(error_of([&] {
              attention_backward_masked<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(),
                                               pr.d_o.cview(), pr.lse.view(), pr.dq.view(), pr.dk.view(),
                                               pr.dv.view(), NoMask{12}, causal);
            }).find("cannot be combined with a mask policy"),
            std::string::npos);
}

}  // namespace
}  // namespace flashattn::testing
