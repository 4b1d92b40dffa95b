// Long context (issue 26, docs/performance.md): the rate of the forward and the backward against the
// sequence length, judged against the same run's rate at N = 4096 (8 heads, same dtype, mask, direction
// and thread count), measured once per configuration in this process before its first long row.
//
//   bench_long --benchmark_counters_tabular=true [--benchmark_filter=...]
//   FLASHATTN_BENCH_THREADS=1,2 (default: 1 and every hardware thread)
//   FLASHATTN_BENCH_LONG_MAX_N=1048576 (default 65536): the longest N of the sweep (powers of 4 from 1024,
//   then the maximum); 1M tokens of one causal head take minutes per call even on the AMX path.
//
// Rows: long/<fwd|bwd>/<fp32|bf16|fp16>/<causal|full>/H:<heads>/N:<n>/threads:<t>, d = 128, batch 1, one
// head from N = 16384 on (8 below; FLASHATTN_BENCH_LONG_HEADS=1,8 runs both at every N). Counters:
//   GFLOPs        4·H·N²·d per forward call (× 0.5 causal; the backward counts its 5 GEMMs: × 2.5)
//   x_4096        GFLOPs ÷ the same configuration's rate at N = 4096 with 8 heads, same run
//   scratch_MB    peak bytes of the kernels' tracked scratch during the row (cpu/aligned_buffer.hpp): the
//                 memory beyond inputs and outputs (issue 26: under 100 MiB at N = 1M)
//   rss_MB        the process's peak resident set so far (inputs and outputs included), a cross-check
// and, for the forward rows, the IO law's side of it (docs/io.md): every query block streams its head's
// K and V again, from L2, L3 or memory, so the K/V bytes the kernel reads (its own accounting,
// instrument/accounting.hpp, kept on in every forward call of this binary, the N = 4096 reference's too)
// must stay well below what a core can read in the same time:
//   kv_B_per_kFLOP  K/V bytes read per 1000 FLOPs (falls as the query blocks grow: 256-row programs read
//                   a quarter of what 64-row ones do)
//   kv_GBps         those bytes per second of the call
//   read_GBps       the same run's streaming read of a buffer as large as K and V, at the same thread count
//                   (read repeatedly where it fits a cache, so that it comes from the level K and V do)
//   kv_x_read       kv_GBps / read_GBps: the share of the read rate that re-streaming takes (near 1: the
//                   kernel would wait on memory; small: the tiles hide it)
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <Eigen/Core>
#include <chrono>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "read_rate.hpp"
#include "threads.hpp"

namespace {

using flashattn::index_t;
namespace cpu = flashattn::cpu;
using flashattn::bench::thread_counts;

constexpr index_t kDim = 128;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return "bf16";
  return "fp16";
}

// One problem's tensors, (1, N, H, d) BSHD; filled cheaply (a long input need not be random, but its
// scores must not be degenerate: a pseudo-random pattern of small values).
template <class T>
struct Problem {
  index_t n, heads;
  std::vector<T> q, k, v, o, d_o, dq, dk, dv;
  std::vector<float> lse;
  Problem(index_t n_, index_t heads_, bool backward) : n(n_), heads(heads_) {
    const std::size_t elems = std::size_t(n * heads * kDim);
    const auto fill = [&](std::vector<T>& x, unsigned seed) {
      x.resize(elems);
      std::uint32_t s = seed * 2654435761u + 1;
      for (auto& e : x) {
        s = s * 1664525u + 1013904223u;
        e = T(float(int(s >> 24) - 128) / 128.0f);
      }
    };
    fill(q, 1);
    fill(k, 2);
    fill(v, 3);
    o.resize(elems);
    lse.resize(std::size_t(n * heads));
    if (backward) {
      fill(d_o, 4);
      dq.resize(elems);
      dk.resize(elems);
      dv.resize(elems);
    }
  }
  template <class X>
  flashattn::TensorView<X> view(std::vector<T>& x) {
    return flashattn::bshd<X>(x.data(), 1, n, heads, kDim);
  }
  // Counts the K/V bytes it reads into `kv` (one atomic add per tile: no cost at this granularity).
  void forward(const cpu::Context<>& ctx, const flashattn::AttentionOptions& opts) {
    flashattn::attention_forward(ctx, view<const T>(q), view<const T>(k), view<const T>(v), view<T>(o), opts,
                                 flashattn::lse_bhs(lse.data(), 1, heads, n), kv);
  }
  flashattn::ByteCounter kv;
  void backward(const cpu::Context<>& ctx, const flashattn::AttentionOptions& opts) {
    flashattn::attention_backward(ctx, view<const T>(q), view<const T>(k), view<const T>(v), view<const T>(o),
                                  view<const T>(d_o), flashattn::lse_bhs(lse.data(), 1, heads, n), view<T>(dq),
                                  view<T>(dk), view<T>(dv), opts);
  }
};

double flops(index_t n, index_t heads, bool causal, bool backward) {
  return 4.0 * double(heads) * double(n) * double(n) * double(kDim) * (causal ? 0.5 : 1.0) * (backward ? 2.5 : 1.0);
}

// Seconds of the median of `reps` timed calls (a forward first when timing the backward: it needs O, LSE).
template <class T>
double time_calls(Problem<T>& pr, const cpu::Context<>& ctx, const flashattn::AttentionOptions& opts, bool backward,
                  int reps) {
  if (backward) pr.forward(ctx, opts);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    backward ? pr.backward(ctx, opts) : pr.forward(ctx, opts);
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The N = 4096, 8-head rate of a configuration, measured on first use in this process.
template <class T>
double reference_gflops(bool backward, bool causal, int threads) {
  static std::map<std::tuple<bool, bool, int>, double> measured;
  const auto key = std::make_tuple(backward, causal, threads);
  const auto it = measured.find(key);
  if (it != measured.end()) return it->second;
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  Problem<T> pr(4096, 8, backward);
  const cpu::Context<> ctx{threads};
  time_calls(pr, ctx, opts, backward, 1);  // warm
  const double g = flops(4096, 8, causal, backward) / time_calls(pr, ctx, opts, backward, 3) * 1e-9;
  measured[key] = g;
  return g;
}

// Args: N, heads, causal, backward, threads.
template <class T>
void bm_long(benchmark::State& state) {
  const index_t n = state.range(0), heads = state.range(1);
  const bool causal = state.range(2) != 0, backward = state.range(3) != 0;
  const int threads = int(state.range(4));
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  const double ref = reference_gflops<T>(backward, causal, threads);
  Problem<T> pr(n, heads, backward);
  const cpu::Context<> ctx{threads};
  if (backward) pr.forward(ctx, opts);
  cpu::reset_scratch_peak();
  std::vector<double> t;
  double kv_bytes = 0;
  for (auto _ : state) {
    pr.kv.reset();
    const double t0 = now();
    backward ? pr.backward(ctx, opts) : pr.forward(ctx, opts);
    t.push_back(now() - t0);
    state.SetIterationTime(t.back());
    kv_bytes = double(pr.kv.read_bytes(flashattn::Traffic::K) + pr.kv.read_bytes(flashattn::Traffic::V));
  }
  std::sort(t.begin(), t.end());
  const double seconds = t[t.size() / 2];
  const double g = flops(n, heads, causal, backward) / seconds * 1e-9;
  if (!backward) {
    std::vector<float> other(std::size_t(2 * n * heads * kDim) * sizeof(T) / sizeof(float), 1.0f);
    // A buffer that fits a cache level is read several times per timed call (256 MiB in all at least),
    // from that level, as the kernel re-reads K and V from it.
    const int passes = int(std::max<std::size_t>(1, (std::size_t(256) << 20) / (other.size() * sizeof(float))));
    float sink = flashattn::bench::read_all(other, threads);  // warm: first touch
    std::vector<double> t_read;
    for (int r = 0; r < 5; ++r) {
      const double t0 = now();
      sink += flashattn::bench::read_all(other, threads, passes);
      t_read.push_back(now() - t0);
    }
    benchmark::DoNotOptimize(sink);
    std::sort(t_read.begin(), t_read.end());
    const double read_gbps = double(passes) * double(other.size() * sizeof(float)) / t_read[2] * 1e-9;
    const double kv_gbps = kv_bytes / seconds * 1e-9;
    state.counters["kv_B_per_kFLOP"] = kv_bytes / flops(n, heads, causal, false) * 1e3;
    state.counters["kv_GBps"] = kv_gbps;
    state.counters["read_GBps"] = read_gbps;
    state.counters["kv_x_read"] = kv_gbps / read_gbps;
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["GFLOPs"] = g;
  state.counters["ref_GFLOPs"] = ref;
  state.counters["x_4096"] = g / ref;
  state.counters["scratch_MB"] = double(cpu::scratch_stats().peak_bytes) / (1 << 20);
  state.counters["rss_MB"] = double(usage.ru_maxrss) / 1024.0;
}

std::vector<index_t> lengths() {
  index_t max_n = 65536;
  if (const char* e = std::getenv("FLASHATTN_BENCH_LONG_MAX_N")) max_n = std::max<index_t>(1024, std::atoll(e));
  std::vector<index_t> out;
  for (index_t n = 1024; n < max_n; n *= 4) out.push_back(n);
  out.push_back(max_n);
  return out;
}

// Heads per row: 8 up to N = 4096 and one from 16384 on, unless FLASHATTN_BENCH_LONG_HEADS=1,8 (a list)
// asks for those head counts at every N (8 heads at 1M: 8 GiB of fp32 inputs).
std::vector<index_t> head_counts(index_t n) {
  std::vector<index_t> out;
  for (long h : flashattn::bench::env_positive_list("FLASHATTN_BENCH_LONG_HEADS")) out.push_back(h);
  if (out.empty()) out.push_back(n >= 16384 ? 1 : 8);
  return out;
}

template <class T>
void register_rows() {
  for (int backward : {0, 1})
    for (int causal : {1, 0})
      for (index_t n : lengths())
        for (index_t heads : head_counts(n))
          for (int threads : thread_counts()) {
            const std::string name = std::string("long/") + (backward ? "bwd/" : "fwd/") + dtype_name<T>() +
                                     (causal ? "/causal" : "/full") + "/H:" + std::to_string(heads) +
                                     "/N:" + std::to_string(n) + "/threads:" + std::to_string(threads);
            const double seconds = flops(n, heads, causal != 0, backward != 0) / 1e11;  // at ~100 GFLOP/s
            benchmark::RegisterBenchmark(name.c_str(), bm_long<T>)
                ->Args({n, heads, causal, backward, threads})
                ->Unit(benchmark::kMillisecond)
                ->Iterations(seconds > 5 ? 1 : 3)
                ->UseManualTime();
          }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_rows<float>();
  register_rows<Eigen::bfloat16>();
  register_rows<Eigen::half>();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
