// The main job's comparison (bench/run.sh): the naive attention (S = Q·Kᵀ materialised in memory) and the
// tiled one (FlashAttention) on the same calls, for growing N. fp32, one batch entry, one head of d = 64,
// non-causal, one thread; both through the public API (flashattn::naive_attention_forward and
// flashattn::attention_forward with a one-thread context).
//
//   bench_main --benchmark_filter='main/(naive|tiled)/N:4096/'
//
// Rows main/<path>/N:<n>. Counters (per call):
//   GFLOP/s   4·H·N²·d / time
//   moved_B   bytes between main memory and the kernel's working tiles, counted by the kernels themselves
//             (flashattn::ByteCounter, instrument/accounting.hpp; docs/io.md checks the counts against
//             cachegrind's simulated cache): naive reads Q, K, V, writes O, and writes and reads the N × N
//             S and P; tiled reads Q and writes O once and streams K and V once per block of query rows
//   extra_B   peak heap bytes allocated during the call on top of the inputs and output (every malloc of
//             the process, bench/io_heap.hpp; -1 without glibc): the naive path's N × N matrix, the tiled
//             path's per-thread tiles
// The counted and heap numbers come from one call before the timed ones, which run without accounting.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "flashattn/reference/naive_forward.hpp"
#include "io_heap.hpp"

namespace {

using flashattn::index_t;

constexpr index_t kHeads = 1, kDim = 64;

struct Inputs {
  index_t n;
  std::vector<float> q, k, v, o;
  explicit Inputs(index_t n_) : n(n_), q(std::size_t(n * kHeads * kDim)), k(q.size()), v(q.size()), o(q.size()) {
    std::uint32_t state = 2024u;
    for (auto* x : {&q, &k, &v})
      for (float& e : *x) {
        state = state * 1664525u + 1013904223u;
        e = float(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
      }
  }
  flashattn::TensorView<const float> in(const std::vector<float>& x) const {
    return flashattn::bshd(x.data(), 1, n, kHeads, kDim);
  }
  flashattn::TensorView<float> out() { return flashattn::bshd(o.data(), 1, n, kHeads, kDim); }
};

template <bool Tiled>
void bm_attention(benchmark::State& state, index_t n) {
  Inputs x(n);
  const flashattn::AttentionOptions opts;
  const auto call = [&](auto&& acct) {
    if constexpr (Tiled)
      flashattn::attention_forward(flashattn::cpu::Context<>{1}, x.in(x.q), x.in(x.k), x.in(x.v), x.out(), opts, {},
                                   acct);
    else
      flashattn::naive_attention_forward<float>(x.in(x.q), x.in(x.k), x.in(x.v), x.out(), opts, {}, acct);
    benchmark::DoNotOptimize(x.o.data());
  };
  flashattn::ByteCounter counter;
  const std::int64_t extra = flashattn::bench::heap_peak_during([&] { call(counter); });
  for (auto _ : state) call(flashattn::NoAccounting{});
  const double len = double(n);
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * kHeads * len * len * kDim * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["moved_B"] = double(counter.total_bytes());
  state.counters["extra_B"] = double(extra);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (index_t n : {512, 1024, 2048, 4096, 8192, 16384, 32768, 65536}) {
    const std::string suffix = "/N:" + std::to_string(n);
    for (const auto& [name, fn] : {std::pair{"main/naive", bm_attention<false>}, std::pair{"main/tiled", bm_attention<true>}})
      benchmark::RegisterBenchmark((name + suffix).c_str(), fn, n)
          ->Iterations(n >= 8192 ? 1 : n >= 2048 ? 3 : 10)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
