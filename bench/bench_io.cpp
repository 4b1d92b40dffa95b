// Memory traffic of naive vs tiled forward attention: modelled, counted and the extra memory each needs.
//
//   bench_io [--benchmark_filter=...]      (Google Benchmark flags)
//
// Benchmarks are io/<path>/N/d[/M_KiB]: fp32, one head, one thread. The tiled path runs the compiled tile
// configuration that io::select_tiles picks for a fast memory of M bytes (BlockQ ≈ M / (4·d·4), as in
// Algorithm 1 of the FlashAttention paper) in the schedule of the model (bench/io_tiled.hpp: no split-KV);
// io/api runs attention_forward itself with the same tiles, which for one head with few query blocks
// splits the keys (more traffic, for parallelism). io/naive is naive_attention_forward (whole-matrix Eigen
// GEMMs; counted as the textbook passes, independent of M); io/naive_blocked is the same algorithm blocked
// with the tiles of M (bench/io_naive.hpp), whose count is exact. Counters:
//   model_B     the paper's law: naive (both) 4·N·d·e + 4·N²·e, tiled 2·N·d·e + 8·N²·d²·e²/M (bench/io_model.hpp)
//   counted_B   bytes the kernel reported through flashattn::ByteCounter during one call
//   exact_B     the exact formula for the tile configuration used (= counted_B; tests/test_accounting.cpp)
//   scratch_B   peak tracked kernel scratch (cpu::scratch_stats) during one call: the tiled working set
//   heap_B      peak heap bytes allocated during one call (every malloc of the process, bench/io_heap.hpp):
//               the naive path's N×N score matrix shows here
//   block_q, block_kv   the tile configuration (0 for naive)
//   x_naive     counted bytes of the naive path ÷ counted bytes of this run (same N, d)
// Times are printed by Google Benchmark as usual; compare them only as same-run ratios (MEASURING.md).
#include <benchmark/benchmark.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "flashattn/reference/naive_forward.hpp"
#include "io_heap.hpp"
#include "io_model.hpp"
#include "io_naive.hpp"
#include "io_tiled.hpp"

namespace {

using flashattn::index_t;
namespace io = flashattn::bench::io;

struct Inputs {
  index_t n, d;
  std::vector<float> q, k, v, o;
  Inputs(index_t n_, index_t d_) : n(n_), d(d_), q(std::size_t(n * d)), k(q.size()), v(q.size()), o(q.size()) {
    std::uint32_t state = 12345u;
    for (auto* x : {&q, &k, &v})
      for (auto& e : *x) {
        state = state * 1664525u + 1013904223u;
        e = float(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
      }
  }
  flashattn::TensorView<const float> view(const std::vector<float>& x) const {
    return flashattn::bshd(x.data(), 1, n, 1, d);
  }
  flashattn::TensorView<float> out() { return flashattn::bshd(o.data(), 1, n, 1, d); }
};

// The configurations select_tiles picks for M = 256 KiB, 1 MiB, 4 MiB and d = 64, 128 (checked at run time:
// with_tiles throws for any other), so that only these are compiled.
using BenchTiles = std::tuple<flashattn::cpu::Tiles<128, 32>, flashattn::cpu::Tiles<256, 32>, flashattn::cpu::Tiles<512, 64>,
                              flashattn::cpu::Tiles<1024, 32>, flashattn::cpu::Tiles<2048, 64>>;

// io/api runs at M = 1 MiB only.
using ApiTiles = std::tuple<flashattn::cpu::Tiles<1024, 32>, flashattn::cpu::Tiles<512, 64>>;

io::Shape shape_of(index_t n, index_t d) { return {n, n, d, sizeof(float), sizeof(float), false}; }

// Runs `call(acct)` once counted (bytes, scratch and heap peaks), then times it with accounting off.
template <class Call>
void measure(benchmark::State& state, const io::Shape& shape, double model, std::int64_t exact, io::TileChoice tiles,
             Call&& call) {
  flashattn::ByteCounter counter;
  flashattn::cpu::reset_scratch_peak();
  const std::int64_t scratch_before = flashattn::cpu::scratch_stats().current_bytes;
  const std::int64_t heap = flashattn::bench::heap_peak_during([&] { call(counter); });
  const std::int64_t scratch = flashattn::cpu::scratch_stats().peak_bytes - scratch_before;
  for (auto _ : state) call(flashattn::NoAccounting{});

  state.counters["model_B"] = model;
  state.counters["counted_B"] = double(counter.total_bytes());
  state.counters["exact_B"] = double(exact);
  state.counters["scratch_B"] = double(scratch);
  state.counters["heap_B"] = double(heap);
  state.counters["block_q"] = tiles.block_q;
  state.counters["block_kv"] = tiles.block_kv;
  state.counters["x_naive"] = double(io::naive_bytes(shape)) / double(counter.total_bytes());
}

// What every benchmark here starts from: one head of N × d inputs, one thread, and (for the tiled and
// blocked paths, whose third argument is M in KiB) the tiles select_tiles picks for M.
struct OneHead {
  Inputs in;
  flashattn::AttentionOptions opts;
  io::Shape shape;
  std::int64_t m;
  io::TileChoice choice;
  OneHead(index_t n, index_t d, std::int64_t m_bytes)
      : in(n, d), shape(shape_of(n, d)), m(m_bytes), choice(io::select_tiles(m_bytes, d, sizeof(float))) {}
  static OneHead with_m(const benchmark::State& state) {
    return OneHead(state.range(0), state.range(1), state.range(2) * 1024);
  }
};

void bm_naive(benchmark::State& state) {
  OneHead h(state.range(0), state.range(1), 0);
  measure(state, h.shape, io::naive_model_bytes(h.shape), io::naive_bytes(h.shape), {0, 0}, [&](auto&& acct) {
    flashattn::naive_attention_forward<float>(h.in.view(h.in.q), h.in.view(h.in.k), h.in.view(h.in.v), h.in.out(),
                                              h.opts, {}, acct);
    benchmark::DoNotOptimize(h.in.o.data());
  });
}

void bm_naive_blocked(benchmark::State& state) {
  OneHead h = OneHead::with_m(state);
  measure(state, h.shape, io::naive_model_bytes(h.shape), io::naive_blocked_bytes(h.shape, h.choice.block_q), h.choice,
          [&](auto&& acct) {
            io::naive_forward_blocked(h.in.view(h.in.q), h.in.view(h.in.k), h.in.view(h.in.v), h.in.out(), h.opts,
                                      h.choice.block_q, h.choice.block_kv, acct);
            benchmark::DoNotOptimize(h.in.o.data());
          });
}

template <bool Api>
void bm_tiled(benchmark::State& state) {
  OneHead h = OneHead::with_m(state);
  io::with_tiles<std::conditional_t<Api, ApiTiles, BenchTiles>>(h.choice, [&](auto tiles) {
    using Tiles = decltype(tiles);
    measure(state, h.shape, io::tiled_model_bytes(h.shape, h.m), io::tiled_bytes(h.shape, h.choice.block_q), h.choice,
            [&](auto&& acct) {
              const auto q = h.in.view(h.in.q), k = h.in.view(h.in.k), v = h.in.view(h.in.v);
              if constexpr (Api)
                flashattn::attention_forward(flashattn::cpu::Context<Tiles>{1}, q, k, v, h.in.out(), h.opts, {}, acct);
              else
                io::tiled_forward_unsplit<Tiles, float>(q, k, v, h.in.out(), h.opts, {}, acct);
              benchmark::DoNotOptimize(h.in.o.data());
            });
  });
}

void register_all() {
  for (index_t n : {512, 1024, 2048, 4096})
    for (index_t d : {64, 128}) {
      const std::string suffix = "/N:" + std::to_string(n) + "/d:" + std::to_string(d);
      benchmark::RegisterBenchmark(("io/naive" + suffix).c_str(), bm_naive)
          ->Args({n, d})
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("io/naive_blocked" + suffix + "/M_KiB:1024").c_str(), bm_naive_blocked)
          ->Args({n, d, 1024})
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      for (index_t m_kib : {256, 1024, 4096})
        benchmark::RegisterBenchmark(("io/tiled" + suffix + "/M_KiB:" + std::to_string(m_kib)).c_str(), bm_tiled<false>)
            ->Args({n, d, m_kib})
            ->Iterations(1)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      benchmark::RegisterBenchmark(("io/api" + suffix + "/M_KiB:1024").c_str(), bm_tiled<true>)
          ->Args({n, d, 1024})
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (!flashattn::bench::heap_tracking_available())
    benchmark::AddCustomContext("heap_B", "unavailable (needs glibc): reads -1");
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
