#pragma once
// A forward + backward problem for the backward's tests (test_backward.cpp, test_backward_extras.cpp), and
// the tolerance rule on its gradients against the fp64 reference (reference_backward.hpp).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include "configs.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "reference_backward.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {

// A forward + backward problem: inputs, the forward's O and LSE, dO, and the three gradients (filled with
// NaN first, so that an element the backward forgets to write fails every comparison).
template <class T>
struct GradProblem {
  HostTensor<T> q, k, v, o, d_o, dq, dk, dv;
  HostLse lse;

  // d: the head dim of q and k; dv: of v, o and d_o (d unless given: MLA-style heads differ).
  GradProblem(Layout layout, index_t batch, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d,
              std::uint32_t seed, index_t dv_dim = 0)
      : q(layout, batch, sq, hq, d),
        k(layout, batch, sk, hkv, d),
        v(layout, batch, sk, hkv, dv_dim > 0 ? dv_dim : d),
        o(layout, batch, sq, hq, dv_dim > 0 ? dv_dim : d),
        d_o(layout, batch, sq, hq, dv_dim > 0 ? dv_dim : d),
        dq(layout, batch, sq, hq, d, nan()),
        dk(layout, batch, sk, hkv, d, nan()),
        dv(layout, batch, sk, hkv, dv_dim > 0 ? dv_dim : d, nan()),
        lse(batch, hq, sq) {
    fill_normal(q.view(), seed);
    fill_normal(k.view(), seed + 1);
    fill_normal(v.view(), seed + 2);
    fill_normal(d_o.view(), seed + 3);
  }

  static T nan() { return T(std::numeric_limits<float>::quiet_NaN()); }

  // threads: the context's thread count (0: the default).
  template <class Tiles = cpu::AutoTiles>
  void forward(const AttentionOptions& opts, int threads = 0) {
    attention_forward(cpu::Context<Tiles>{threads}, q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  }
  template <class Tiles = cpu::AutoTiles>
  void backward(const AttentionOptions& opts, int threads = 0) {
    attention_backward(cpu::Context<Tiles>{threads}, q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(),
                       lse.view(), dq.view(), dk.view(), dv.view(), opts);
  }
  template <class Tiles = cpu::AutoTiles, class Mask>
  void forward_masked(const Mask& mask, const AttentionOptions& opts = {}) {
    attention_forward_masked(cpu::Context<Tiles>{}, q.cview(), k.cview(), v.cview(), o.view(), mask, opts,
                             lse.view());
  }
  template <class Tiles = cpu::AutoTiles, class Mask>
  void backward_masked(const Mask& mask, const AttentionOptions& opts = {}, const BackwardExtras& extras = {},
                       int threads = 0) {
    attention_backward_masked(cpu::Context<Tiles>{threads}, q.cview(), k.cview(), v.cview(), o.cview(),
                              d_o.cview(), lse.view(), dq.view(), dk.view(), dv.view(), mask, opts, extras);
  }
};

// The mask policy an AttentionOptions describes, for the reference.
inline BandMask band_of(const AttentionOptions& opts, index_t sq, index_t sk) {
  return BandMask::window(sq, sk, opts.window_left, opts.causal ? 0 : opts.window_right);
}

// The tolerance rule on each of dq, dk, dv: max error against fp64 <= 2 × the error of a naive backward
// computing in T's accumulator and rounding to T between steps, plus a tiny epsilon of T.
// d_lse: dLoss/dLSE given to the backward ((batch, heads_q, seq_q) contiguous), or null.
template <class T, class Mask>
::testing::AssertionResult grads_match(const GradProblem<T>& pr, double scale, const Mask& mask,
                                       const double* d_lse = nullptr) {
  const ReferenceGrads exact = reference_backward<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(),
                                                          pr.d_o.cview(), scale, mask, {}, d_lse);
  const ReferenceGrads naive = reference_backward<cpu::acc_t<T>, T>(pr.q.cview(), pr.k.cview(), pr.v.cview(),
                                                                    pr.d_o.cview(), scale, mask, {}, d_lse);
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  const struct {
    const char* name;
    const HostTensor<T>& got;
    const std::vector<double>& naive;
    const std::vector<double>& exact;
  } grads[] = {{"dq", pr.dq, naive.dq, exact.dq}, {"dk", pr.dk, naive.dk, exact.dk}, {"dv", pr.dv, naive.dv, exact.dv}};
  // The tiny epsilon: 4 ulps of T, except for double, where the naive backward is the reference itself
  // (error 0) and the epsilon is the whole allowance for summing up to seq·group products in another
  // order: 16 ulps there.
  const double ulps = std::is_same_v<T, double> ? 16.0 : 4.0;
  bool ok = true;
  for (const auto& g : grads) {
    const ToleranceCheck c{max_abs_error(to_double(g.got.cview()), g.exact), max_abs_error(g.naive, g.exact),
                           tiny_eps<T>(max_abs_finite(g.exact), ulps)};
    ok = ok && c.ok();
    result << c.describe(g.name) << "; ";
  }
  if (!ok) return ::testing::AssertionFailure() << result.message();
  return result;
}

// dq, dk, dv of a double problem against central differences of `loss()` (a function of pr's q, k, v,
// computed independently of the backward, e.g. by the fp64 reference forward): `probes` random elements of
// each input, step 1e-5, agreement to 1e-8 relative.
template <class Loss>
void expect_central_differences(GradProblem<double>& pr, Loss&& loss, int probes, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto [x, dx, name] : {std::tuple{&pr.q, &pr.dq, "q"}, std::tuple{&pr.k, &pr.dk, "k"},
                             std::tuple{&pr.v, &pr.dv, "v"}}) {
    std::vector<double>& data = x->storage();
    const std::vector<double> grad = dx->storage();
    std::uniform_int_distribution<std::size_t> pick(0, data.size() - 1);
    for (int probe = 0; probe < probes; ++probe) {
      const std::size_t at = pick(rng);
      const double saved = data[at], h = 1e-5;
      data[at] = saved + h;
      const double up = loss();
      data[at] = saved - h;
      const double down = loss();
      data[at] = saved;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(grad[at], numeric, 1e-8 * std::max(1.0, std::abs(numeric))) << name << "[" << at << "]";
    }
  }
}

inline bool all_finite(const std::vector<double>& x) {
  for (double e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

}  // namespace flashattn::testing
