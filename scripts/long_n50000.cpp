// Driver of scripts/long_n50000.sh: one forward call with N × N > 2^31 scores (N = 50000 by default;
// float, head dim 64, one head, 2 threads), non-causal and causal, checked on sampled rows (the first,
// the last and random ones) against an fp64 reference computed for those rows only, under the tolerance
// rule (error <= 2 × that of a naive fp32 computation of the same row + a few float ulps).
//
//   long_n50000 [N] [threads] [sampled rows]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"

namespace {

using flashattn::index_t;

struct RowResult {
  std::vector<double> o;
  double lse;
};

// Row i of softmax(scale·Q·Kᵀ [causal])·V, every step in Calc (double: the reference; float: the naive
// same-precision computation the tolerance rule compares with).
template <class Calc>
RowResult row_attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                        index_t n, index_t d, index_t i, bool causal, double scale) {
  const index_t keys = causal ? i + 1 : n;
  std::vector<Calc> s(static_cast<std::size_t>(keys));
  Calc m = -std::numeric_limits<Calc>::infinity();
  for (index_t j = 0; j < keys; ++j) {
    Calc dot = 0;
    for (index_t c = 0; c < d; ++c) dot += Calc(q[std::size_t(i * d + c)]) * Calc(k[std::size_t(j * d + c)]);
    s[std::size_t(j)] = dot * Calc(scale);
    m = std::max(m, s[std::size_t(j)]);
  }
  Calc l = 0;
  for (Calc& x : s) l += (x = std::exp(x - m));
  std::vector<Calc> acc(static_cast<std::size_t>(d), Calc(0));
  for (index_t j = 0; j < keys; ++j)
    for (index_t c = 0; c < d; ++c) acc[std::size_t(c)] += s[std::size_t(j)] / l * Calc(v[std::size_t(j * d + c)]);
  RowResult r;
  for (Calc x : acc) r.o.push_back(double(x));
  r.lse = double(m) + std::log(double(l));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const index_t n = argc > 1 ? std::atoll(argv[1]) : 50000;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int samples = argc > 3 ? std::atoi(argv[3]) : 64;
  const index_t d = 64;
  const double scale = 1.0 / std::sqrt(double(d));
  std::printf("N = %lld (N*N = %.3g, 2^31 = %.3g), d = %lld, float, 1 head, %d threads, %d sampled rows\n",
              (long long)n, double(n) * double(n), 2147483648.0, (long long)d, threads, samples);

  std::vector<float> q(std::size_t(n * d)), k(q.size()), v(q.size()), o(q.size());
  std::vector<float> lse(static_cast<std::size_t>(n));
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);

  std::vector<index_t> rows = {0, 1, n / 2, n - 2, n - 1};
  std::uniform_int_distribution<index_t> pick(0, n - 1);
  while (int(rows.size()) < samples) rows.push_back(pick(rng));
  std::sort(rows.begin(), rows.end());

  bool ok = true;
  for (bool causal : {false, true}) {
    std::fill(o.begin(), o.end(), std::numeric_limits<float>::quiet_NaN());
    flashattn::AttentionOptions opts;
    opts.causal = causal;
    std::printf("[%s] forward ...\n", causal ? "causal" : "non-causal");
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    flashattn::attention_forward(flashattn::cpu::Context<>{threads},
                                 flashattn::bshd<const float>(q.data(), 1, n, 1, d),
                                 flashattn::bshd<const float>(k.data(), 1, n, 1, d),
                                 flashattn::bshd<const float>(v.data(), 1, n, 1, d),
                                 flashattn::bshd(o.data(), 1, n, 1, d), opts,
                                 flashattn::lse_bhs(lse.data(), 1, 1, n));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[%s] forward done in %.1f s; checking %zu rows against fp64\n", causal ? "causal" : "non-causal",
                secs, rows.size());
    std::fflush(stdout);

    double worst_ratio = 0;
    int failures = 0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const index_t i = rows[r];
      const RowResult exact = row_attention<double>(q, k, v, n, d, i, causal, scale);
      const RowResult naive = row_attention<float>(q, k, v, n, d, i, causal, scale);
      double err = 0, naive_err = 0, mag = 0;
      for (index_t c = 0; c < d; ++c) {
        const double x = o[std::size_t(i * d + c)];
        err = std::isfinite(x) ? std::max(err, std::abs(x - exact.o[std::size_t(c)])) : HUGE_VAL;
        naive_err = std::max(naive_err, std::abs(naive.o[std::size_t(c)] - exact.o[std::size_t(c)]));
        mag = std::max(mag, std::abs(exact.o[std::size_t(c)]));
      }
      const double eps = 4 * double(std::numeric_limits<float>::epsilon()) * std::max(1.0, mag);
      const double lse_err = std::abs(double(lse[std::size_t(i)]) - exact.lse);
      const double lse_naive = std::abs(naive.lse - exact.lse);
      const double lse_eps = 4 * double(std::numeric_limits<float>::epsilon()) * std::max(1.0, std::abs(exact.lse));
      const bool row_ok = err <= 2 * naive_err + eps && lse_err <= 2 * lse_naive + lse_eps;
      worst_ratio = std::max(worst_ratio, err / (2 * naive_err + eps));
      if (!row_ok) {
        ++failures;
        std::printf("  row %lld FAILED: |o - ref| = %.3g (bound %.3g), |lse - ref| = %.3g (bound %.3g)\n",
                    (long long)i, err, 2 * naive_err + eps, lse_err, 2 * lse_naive + lse_eps);
      }
      if ((r + 1) % 16 == 0 || r + 1 == rows.size())
        std::printf("  %zu/%zu rows checked (last: row %lld, |o - ref| = %.3g, naive fp32 %.3g)\n", r + 1,
                    rows.size(), (long long)i, err, naive_err);
      std::fflush(stdout);
    }
    std::printf("[%s] %s: %d of %zu sampled rows outside the tolerance rule; worst error / bound = %.3f\n",
                causal ? "causal" : "non-causal", failures == 0 ? "PASS" : "FAIL", failures, rows.size(),
                worst_ratio);
    ok = ok && failures == 0;
  }
  return ok ? 0 : 1;
}
