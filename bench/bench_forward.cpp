// Naive (Eigen GEMMs, materialised S) vs tiled forward attention, with same-run references.
//
//   bench_forward [--benchmark_filter=...]      (Google Benchmark flags)
//
// Benchmarks are named <path>/<dtype>/N/d/causal/threads. Counters:
//   GFLOP/s       4·B·H·N²·d per call (× 0.5 when causal), per second of process CPU time for one thread
//                 (robust to load on the other core) and of wall time for several
//   x_sgemm       GFLOP/s ÷ the best same-thread-count sgemm measured at startup (OpenBLAS if linked, else Eigen)
//   x_fma_peak    GFLOP/s ÷ the FMA peak measured at startup
//   scratch_B     peak bytes of tracked kernel scratch (tiled) or of the materialised S (naive)
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "flashattn/reference/naive_forward.hpp"
#include "alternate.hpp"
#include "references.hpp"
#include "threads.hpp"

namespace {

using flashattn::index_t;

struct References {
  double fma_peak = 0, sgemm = 0, eigen_sgemm = 0, openblas_sgemm = 0;
};
std::map<int, References> g_refs;  // by thread count

using flashattn::bench::all_threads;

using flashattn::bench::thread_counts;

// Heads per call: 8 (the B=1, H=8) up to N=4096; fewer beyond, so that one call stays ~1 s.
index_t heads_for(index_t n) { return n <= 4096 ? 8 : std::max<index_t>(1, 8 * 4096 * 4096 / (n * n)); }

template <class T>
struct Problem {
  index_t n, d, h;
  std::vector<T> q, k, v, o;
  Problem(index_t n_, index_t d_, index_t h_) : n(n_), d(d_), h(h_) {
    const std::size_t size = std::size_t(n * h * d);
    q.resize(size), k.resize(size), v.resize(size), o.resize(size);
    std::mt19937 gen(42);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto* x : {&q, &k, &v})
      for (auto& e : *x) e = T(dist(gen));
  }
  flashattn::TensorView<const T> view(const std::vector<T>& x) const { return flashattn::bshd(x.data(), 1, n, h, d); }
  flashattn::TensorView<T> out() { return flashattn::bshd(o.data(), 1, n, h, d); }
};

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return "bf16";
  if constexpr (std::is_same_v<T, Eigen::half>) return "fp16";
  return "fp64";
}

void set_counters(benchmark::State& state, double flops_per_call, double seconds, int threads, double scratch) {
  const double gflops = flops_per_call * double(state.iterations()) / seconds * 1e-9;
  const References& r = g_refs[threads];
  state.counters["GFLOP/s"] = gflops;
  state.counters["x_sgemm"] = gflops / r.sgemm;
  state.counters["x_fma_peak"] = gflops / r.fma_peak;
  state.counters["scratch_B"] = scratch;
}

// Seconds spent in `call` over the benchmark's iterations, on the clock that suits `threads`.
template <class F>
double timed_iterations(benchmark::State& state, int threads, F&& call) {
  const flashattn::bench::RateClock clock(threads);
  const double t0 = clock.now();
  for (auto _ : state) call();
  return clock.now() - t0;
}

template <class T>
double attention_flops(const Problem<T>& p, bool causal) {
  return 4.0 * double(p.h) * double(p.n) * double(p.n) * double(p.d) * (causal ? 0.5 : 1.0);
}

template <class T>
void bm_tiled(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = int(state.range(3));
  Problem<T> p(n, d, heads_for(n));
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  const flashattn::cpu::Context<> ctx{threads};
  auto call = [&] { flashattn::attention_forward(ctx, p.view(p.q), p.view(p.k), p.view(p.v), p.out(), opts); };
  call();  // warm-up
  flashattn::cpu::reset_scratch_peak();
  const double sec = timed_iterations(state, threads, call);
  set_counters(state, attention_flops(p, causal), sec, threads, double(flashattn::cpu::scratch_stats().peak_bytes));
}

template <class T>
void bm_naive(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = int(state.range(3));
  Eigen::setNbThreads(threads);
  Problem<T> p(n, d, heads_for(n));
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  auto call = [&] { flashattn::naive_attention_forward(p.view(p.q), p.view(p.k), p.view(p.v), p.out(), opts); };
  call();
  const double sec = timed_iterations(state, threads, call);
  set_counters(state, attention_flops(p, causal), sec, threads, double(n) * double(n) * sizeof(flashattn::cpu::acc_t<T>));
}

using flashattn::bench::alternated_medians;

// Parallel speed-up: the same problem on 1 thread and on `threads`, both in wall time.
void bm_thread_scaling(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = int(state.range(3));
  Problem<float> p(n, d, heads_for(n));
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  auto call = [&](int t) {
    flashattn::attention_forward(flashattn::cpu::Context<>{t}, p.view(p.q), p.view(p.k), p.view(p.v), p.out(), opts);
  };
  const auto [one, many] = alternated_medians(state, flashattn::bench::RateClock(threads), [&] { call(1); },
                                              [&] { call(threads); });
  state.counters["GFLOP/s_1"] = attention_flops(p, causal) / one * 1e-9;
  state.counters["GFLOP/s_n"] = attention_flops(p, causal) / many * 1e-9;
  state.counters["speedup"] = one / many;
}

// 16-bit storage against fp32 on the same shape (one thread, CPU time): the ratio the bf16/fp16 targets
// are stated in.
template <class T>
void bm_dtype_vs_fp32(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  Problem<float> pf(n, d, heads_for(n));
  Problem<T> pt(n, d, heads_for(n));
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  const flashattn::cpu::Context<> one{1};
  const auto [tf, tt] = alternated_medians(
      state, flashattn::bench::RateClock(1),
      [&] { flashattn::attention_forward(one, pf.view(pf.q), pf.view(pf.k), pf.view(pf.v), pf.out(), opts); },
      [&] { flashattn::attention_forward(one, pt.view(pt.q), pt.view(pt.k), pt.view(pt.v), pt.out(), opts); });
  state.counters["GFLOP/s_fp32"] = attention_flops(pf, causal) / tf * 1e-9;
  state.counters["GFLOP/s_16bit"] = attention_flops(pf, causal) / tt * 1e-9;
  state.counters["x_fp32"] = tf / tt;
}

// Causal against full attention on the same shape (one thread, CPU time), each credited with the flops
// it must do (half for causal): the effective-rate ratio, which shows whether empty tiles are skipped.
void bm_causal_vs_full(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  Problem<float> p(n, d, heads_for(n));
  flashattn::AttentionOptions full, causal;
  causal.causal = true;
  const flashattn::cpu::Context<> one{1};
  const auto [t_full, t_causal] = alternated_medians(
      state, flashattn::bench::RateClock(1),
      [&] { flashattn::attention_forward(one, p.view(p.q), p.view(p.k), p.view(p.v), p.out(), full); },
      [&] { flashattn::attention_forward(one, p.view(p.q), p.view(p.k), p.view(p.v), p.out(), causal); });
  state.counters["GFLOP/s_full"] = attention_flops(p, false) / t_full * 1e-9;
  state.counters["GFLOP/s_causal"] = attention_flops(p, true) / t_causal * 1e-9;
  state.counters["x_full"] = (attention_flops(p, true) / t_causal) / (attention_flops(p, false) / t_full);
}

#if defined(FLASHATTN_HAVE_OPENBLAS)
// The tiled forward against OpenBLAS's sgemm 2048³ (one thread, CPU time), alternated call by call: the
// ratio issue 3's GEMM-rate targets are stated in, with both sides under the same machine state (the
// references measured once at start-up drift with a shared machine's load).
void bm_tiled_vs_sgemm(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  Problem<float> p(n, d, heads_for(n));
  flashattn::AttentionOptions opts;
  const flashattn::cpu::Context<> one{1};
  flashattn::bench::OpenblasSgemm sgemm(2048, 2048, 2048, 1);
  const auto [t_tiled, t_sgemm] = alternated_medians(
      state, flashattn::bench::RateClock(1),
      [&] { flashattn::attention_forward(one, p.view(p.q), p.view(p.k), p.view(p.v), p.out(), opts); },
      [&] { sgemm(); });
  state.counters["GFLOP/s_tiled"] = attention_flops(p, false) / t_tiled * 1e-9;
  state.counters["GFLOP/s_sgemm"] = sgemm.flops() / t_sgemm * 1e-9;
  state.counters["x_sgemm"] = (attention_flops(p, false) / t_tiled) / (sgemm.flops() / t_sgemm);
}
#endif

template <class T>
void register_all(const char* path, void (*fn)(benchmark::State&), index_t max_n) {
  for (index_t n : {512, 1024, 2048, 4096, 8192, 16384}) {
    if (n > max_n) continue;
    for (index_t d : {64, 128, 256})
      for (int causal : {0, 1})
        for (int threads : thread_counts()) {
          const std::string name = std::string(path) + "/" + dtype_name<T>() + "/N:" + std::to_string(n) +
                                   "/d:" + std::to_string(d) + "/causal:" + std::to_string(causal) +
                                   "/threads:" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), fn)
              ->Args({n, d, causal, threads})
              ->Unit(benchmark::kMillisecond)
              ->MinTime(0.3)
              ->UseRealTime();
        }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // References first, for 1 thread and for all threads.
  for (int threads : thread_counts()) {
    References& r = g_refs[threads];
    r.fma_peak = flashattn::bench::fma_peak_gflops(threads);
    r.eigen_sgemm = flashattn::bench::eigen_sgemm_gflops(2048, 2048, 2048, threads);
    r.sgemm = r.eigen_sgemm;
#if defined(FLASHATTN_HAVE_OPENBLAS)
    r.openblas_sgemm = flashattn::bench::openblas_sgemm_gflops(2048, 2048, 2048, threads);
    r.sgemm = std::max(r.sgemm, r.openblas_sgemm);
#endif
    std::fprintf(stderr, "reference threads=%d: fma_peak %.1f GFLOP/s, eigen sgemm 2048^3 %.1f, openblas sgemm 2048^3 %.1f\n",
                threads, r.fma_peak, r.eigen_sgemm, r.openblas_sgemm);
    benchmark::AddCustomContext("ref_threads" + std::to_string(threads),
                                "fma_peak=" + std::to_string(r.fma_peak) + " eigen_sgemm=" + std::to_string(r.eigen_sgemm) +
                                    " openblas_sgemm=" + std::to_string(r.openblas_sgemm));
  }
  register_all<float>("naive", bm_naive<float>, 16384);
  register_all<float>("tiled", bm_tiled<float>, 16384);
  register_all<Eigen::bfloat16>("tiled", bm_tiled<Eigen::bfloat16>, 16384);
  register_all<Eigen::half>("tiled", bm_tiled<Eigen::half>, 16384);
  // N = 4096 (the targets' shape) for d 64/128 and causal on/off; shorter sequences at d = 128, where the
  // per-row work a 16-bit call adds (converting Q, K, V in and O out) is a larger share of the call. The
  // iterations grow as N² shrinks, so that every row times about the same total.
  const auto register_vs_fp32 = [](index_t n, index_t d, int causal) {
    const std::string suffix = "/N:" + std::to_string(n) + "/d:" + std::to_string(d) + "/causal:" +
                               std::to_string(causal) + "/threads:1";
    const int iterations = int(5 * (4096 / n) * (4096 / n));
    benchmark::RegisterBenchmark(("vs_fp32/bf16" + suffix).c_str(), bm_dtype_vs_fp32<Eigen::bfloat16>)
        ->Args({n, d, causal})->Unit(benchmark::kMillisecond)->Iterations(iterations);
    benchmark::RegisterBenchmark(("vs_fp32/fp16" + suffix).c_str(), bm_dtype_vs_fp32<Eigen::half>)
        ->Args({n, d, causal})->Unit(benchmark::kMillisecond)->Iterations(iterations);
  };
  for (index_t n : {512, 1024}) register_vs_fp32(n, 128, 0);
  for (index_t d : {64, 128})
    for (int causal : {0, 1}) register_vs_fp32(4096, d, causal);
#if defined(FLASHATTN_HAVE_OPENBLAS)
  for (index_t d : {64, 128, 256})
    benchmark::RegisterBenchmark(("vs_sgemm/fp32/N:4096/d:" + std::to_string(d) + "/threads:1").c_str(),
                                 bm_tiled_vs_sgemm)
        ->Args({4096, d})->Unit(benchmark::kMillisecond)->Iterations(7);
#endif
  for (index_t d : {64, 128, 256})
    benchmark::RegisterBenchmark(("causal_vs_full/fp32/N:4096/d:" + std::to_string(d) + "/threads:1").c_str(),
                                 bm_causal_vs_full)
        ->Args({4096, d})->Unit(benchmark::kMillisecond)->Iterations(5);
  for (int threads : thread_counts()) {
    if (threads == 1) continue;
    for (int causal : {0, 1}) {
      const std::string name = "scaling/fp32/N:4096/d:128/causal:" + std::to_string(causal) +
                               "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), bm_thread_scaling)
          ->Args({4096, 128, causal, threads})
          ->Unit(benchmark::kMillisecond)
          ->Iterations(5)
          ->UseRealTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
