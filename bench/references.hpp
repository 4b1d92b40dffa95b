#pragma once
// Same-run reference rates for the benchmarks: the machine's FMA peak (a register-resident loop) and GEMM
// rates (Eigen's, and OpenBLAS's sgemm when available), each the median of several repetitions. Every
// performance claim is a ratio against these, measured in the same process (../shared/MEASURING.md).

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

#include "flashattn/cpu/parallel.hpp"
#include "flashattn/cpu/simd.hpp"

#if defined(FLASHATTN_HAVE_OPENBLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace flashattn::bench {

// A clock for rates. One thread: the calling thread's CPU time, where all one-thread work runs (our kernels
// on a one-thread cpu::Context, Eigen and OpenBLAS set to one thread), so that neither work on the other core (these
// machines are shared) nor idle pool threads of this process count against us or the reference (OpenBLAS's
// workers spin for a while after start-up: on process CPU time the one-thread FMA peak read ~165 GFLOP/s
// instead of ~250 on Zen 5). Several threads: wall time, the only honest measure of a parallel speed-up.
class RateClock {
 public:
  explicit RateClock(int threads) : cpu_(threads <= 1) {}
  double now() const {
    if (!cpu_) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  }

 private:
  bool cpu_;
};

template <class F>
double median_seconds(int reps, F&& f, int threads = 1) {
  const RateClock clock(threads);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = clock.now();
    f();
    t.push_back(clock.now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// FMA peak: independent accumulators per thread (enough to cover latency × 2 FMA pipes), nothing but
// FMAs in the loop. GFLOP/s counts 2 flops per lane per FMA. 16 of AVX-512's 32 registers; 12 of AVX2's
// 16, since the two operands need registers too (16 accumulators there spill, and the loop measured half
// the peak on Zen 3).
inline double fma_peak_gflops(int threads = 1) {
  using V = cpu::Simd<float, cpu::kBestIsa>;
  constexpr int kAcc = cpu::is_avx512(cpu::kBestIsa) ? 16 : 12;
  constexpr long kIters = 20'000'000;
  auto kernel = [] {
    typename V::Reg acc[kAcc];
    for (auto& a : acc) a = V::set1(1.0f);
    const typename V::Reg x = V::set1(0.999999f), y = V::set1(1e-7f);
    for (long i = 0; i < kIters; ++i) {
#pragma GCC unroll 16
      for (auto& a : acc) a = V::fma(a, x, y);  // a serial chain per accumulator: not foldable
    }
    float sink[V::width];
    typename V::Reg s = acc[0];
    for (int k = 1; k < kAcc; ++k) s = V::add(s, acc[k]);
    V::store(sink, s);
    asm volatile("" ::"m"(sink));
  };
  const double sec = median_seconds(
      5,
      [&] {
        std::vector<std::thread> pool;
        for (int t = 1; t < threads; ++t) pool.emplace_back(kernel);
        kernel();
        for (auto& th : pool) th.join();
      },
      threads);
  return double(threads) * kIters * double(kAcc) * V::width * 2.0 / sec * 1e-9;
}

// C (m, n) = A (m, k) · B (k, n), fp32, Eigen.
inline double eigen_sgemm_gflops(int m, int n, int k, int threads = 1) {
  Eigen::setNbThreads(threads);
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(m, k), b = Eigen::MatrixXf::Random(k, n), c(m, n);
  c.noalias() = a * b;  // warm-up
  const double sec = median_seconds(5, [&] { c.noalias() = a * b; }, threads);
  return 2.0 * m * n * k / sec * 1e-9;
}

#if defined(FLASHATTN_HAVE_OPENBLAS)
// One OpenBLAS sgemm C (m, n) = A (m, k) · B (k, n) per call, on its own operands: the GEMM reference as a
// callable, so that a benchmark can alternate it with the kernel under test (bench_forward's vs_sgemm).
class OpenblasSgemm {
 public:
  OpenblasSgemm(int m, int n, int k, int threads = 1)
      : m_(m), n_(n), k_(k), a_(std::size_t(m) * k, 0.5f), b_(std::size_t(k) * n, 0.25f), c_(std::size_t(m) * n) {
    openblas_set_num_threads(threads);
  }
  void operator()() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m_, n_, k_, 1.0f, a_.data(), k_, b_.data(), n_, 0.0f,
                c_.data(), n_);
  }
  double flops() const { return 2.0 * m_ * n_ * k_; }

 private:
  int m_, n_, k_;
  std::vector<float> a_, b_, c_;
};

inline double openblas_sgemm_gflops(int m, int n, int k, int threads = 1) {
  OpenblasSgemm run(m, n, k, threads);
  run();
  const double sec = median_seconds(5, run, threads);
  return run.flops() / sec * 1e-9;
}
#endif

}  // namespace flashattn::bench
