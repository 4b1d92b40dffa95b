// The backward pass (issue 6) against the forward and against a naive backward, each pair timed in the
// same benchmark, alternating call by call, so that their ratio holds on a noisy machine.
//
//   bench_backward [--benchmark_filter=...] [--benchmark_repetitions=5 --benchmark_report_aggregates_only=true]
//
// Benchmarks:
//   fwd_bwd/<dtype>/N/d/causal/threads    one tiled forward (with LSE) then one tiled backward per iteration
//     fwd_GFLOP/s    4·H·N²·d per forward (× 0.5 when causal)
//     bwd_GFLOP/s    10·H·N²·d per backward (2.5 × the forward's FLOPs, × 0.5 when causal)
//     bwd_over_fwd   bwd_GFLOP/s ÷ fwd_GFLOP/s: the backward's efficiency relative to the forward's
//                    (the target: >= 0.6; FlashAttention 2 reaches about 0.63 on A100)
//     x_fma_peak     bwd_GFLOP/s ÷ the FMA peak measured at startup
//   naive_bwd/<dtype>/N/d/causal/threads  one naive backward (Eigen GEMMs, materialised P) then one tiled
//     naive_GFLOP/s, tiled_GFLOP/s, tiled_over_naive   (same FLOP count for both)
//
// Heads per call shrink with N (8 at N = 1024, 2 at 2048, 1 at 4096... ) so that a call does about the
// same work at every N.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "flashattn/reference/naive_backward.hpp"
#include "references.hpp"
#include "threads.hpp"

namespace {

using flashattn::index_t;

double g_fma_peak[3] = {0, 0, 0};  // by thread count: [1] one thread, [2] all threads

using flashattn::bench::all_threads;

index_t heads_for(index_t n) { return std::max<index_t>(1, 8 * 1024 * 1024 / (n * n)); }

template <class T>
struct Problem {
  index_t n, d, h;
  std::vector<T> q, k, v, o, d_o, dq, dk, dv;
  std::vector<float> lse;
  Problem(index_t n_, index_t d_, index_t h_) : n(n_), d(d_), h(h_) {
    const std::size_t size = std::size_t(n * h * d);
    for (auto* x : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}) x->resize(size);
    lse.resize(std::size_t(n * h));
    std::mt19937 gen(42);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto* x : {&q, &k, &v, &d_o})
      for (auto& e : *x) e = T(dist(gen));
  }
  flashattn::TensorView<const T> in(const std::vector<T>& x) const { return flashattn::bshd(x.data(), 1, n, h, d); }
  flashattn::TensorView<T> out(std::vector<T>& x) { return flashattn::bshd(x.data(), 1, n, h, d); }
  flashattn::LseView lse_view() { return flashattn::lse_bhs(lse.data(), 1, h, n); }

  void forward(const flashattn::cpu::Context<>& ctx, const flashattn::AttentionOptions& opts) {
    flashattn::attention_forward(ctx, in(q), in(k), in(v), out(o), opts, lse_view());
  }
  void backward(const flashattn::cpu::Context<>& ctx, const flashattn::AttentionOptions& opts) {
    flashattn::attention_backward(ctx, in(q), in(k), in(v), in(o), in(d_o), lse_view(), out(dq), out(dk), out(dv),
                                  opts);
  }
  void naive_backward(const flashattn::AttentionOptions& opts) {
    flashattn::naive_attention_backward<T>(in(q), in(k), in(v), in(o), in(d_o), lse_view(), out(dq), out(dk),
                                           out(dv), opts);
  }
  double forward_flops(bool causal) const {
    return 4.0 * double(h) * double(n) * double(n) * double(d) * (causal ? 0.5 : 1.0);
  }
};

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return "bf16";
  if constexpr (std::is_same_v<T, Eigen::half>) return "fp16";
  return "fp64";
}

// Seconds of one call on the references' clock: process CPU time for one thread (work of others on the
// shared machine does not count), wall time for several.
template <class F>
double time_call(int threads, F&& f) {
  const flashattn::bench::RateClock clock(threads);
  const double t0 = clock.now();
  f();
  return clock.now() - t0;
}

template <class T>
void bm_fwd_bwd(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = int(state.range(3));
  Problem<T> p(n, d, heads_for(n));
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  const flashattn::cpu::Context<> ctx{threads};
  p.forward(ctx, opts);  // warm-up
  p.backward(ctx, opts);
  double fwd_sec = 0, bwd_sec = 0;
  for (auto _ : state) {
    const double f = time_call(threads, [&] { p.forward(ctx, opts); });
    const double b = time_call(threads, [&] { p.backward(ctx, opts); });
    benchmark::DoNotOptimize(p.dq.data());
    fwd_sec += f;
    bwd_sec += b;
    state.SetIterationTime(f + b);
  }
  const double iters = double(state.iterations());
  const double fwd = p.forward_flops(causal) * iters / fwd_sec * 1e-9;
  const double bwd = 2.5 * p.forward_flops(causal) * iters / bwd_sec * 1e-9;
  state.counters["fwd_GFLOP/s"] = fwd;
  state.counters["bwd_GFLOP/s"] = bwd;
  state.counters["bwd_over_fwd"] = bwd / fwd;
  state.counters["x_fma_peak"] = bwd / g_fma_peak[std::min(threads, 2)];
}

template <class T>
void bm_naive_bwd(benchmark::State& state) {
  const index_t n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = int(state.range(3));
  Eigen::setNbThreads(threads);
  Problem<T> p(n, d, heads_for(n));
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  const flashattn::cpu::Context<> ctx{threads};
  p.forward(ctx, opts);
  p.naive_backward(opts);  // warm-up
  p.backward(ctx, opts);
  double naive_sec = 0, tiled_sec = 0;
  for (auto _ : state) {
    const double a = time_call(threads, [&] { p.naive_backward(opts); });
    const double b = time_call(threads, [&] { p.backward(ctx, opts); });
    benchmark::DoNotOptimize(p.dq.data());
    naive_sec += a;
    tiled_sec += b;
    state.SetIterationTime(a + b);
  }
  const double flops = 2.5 * p.forward_flops(causal) * double(state.iterations()) * 1e-9;
  state.counters["naive_GFLOP/s"] = flops / naive_sec;
  state.counters["tiled_GFLOP/s"] = flops / tiled_sec;
  state.counters["tiled_over_naive"] = naive_sec / tiled_sec;
}

template <class T>
void register_all(const char* path, void (*fn)(benchmark::State&)) {
  for (index_t n : {1024, 2048, 4096})
    for (index_t d : {64, 128})
      for (int causal : {0, 1})
        for (int threads : {1, all_threads()}) {
          const std::string name = std::string(path) + "/" + dtype_name<T>() + "/N:" + std::to_string(n) +
                                   "/d:" + std::to_string(d) + "/causal:" + std::to_string(causal) +
                                   "/threads:" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), fn)
              ->Args({n, d, causal, threads})
              ->Unit(benchmark::kMillisecond)
              ->MinTime(0.5)
              ->UseManualTime();
        }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (int threads : {1, all_threads()}) {
    g_fma_peak[std::min(threads, 2)] = flashattn::bench::fma_peak_gflops(threads);
    std::printf("reference threads=%d: fma_peak %.1f GFLOP/s\n", threads, g_fma_peak[std::min(threads, 2)]);
    benchmark::AddCustomContext("fma_peak_threads" + std::to_string(threads),
                                std::to_string(g_fma_peak[std::min(threads, 2)]));
  }
  register_all<float>("fwd_bwd", bm_fwd_bwd<float>);
  register_all<Eigen::bfloat16>("fwd_bwd", bm_fwd_bwd<Eigen::bfloat16>);
  register_all<float>("naive_bwd", bm_naive_bwd<float>);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
