// Decoding against a long KV cache (issue 22, docs/inference.md): one query token (or a few) per sequence,
// the step a generating model repeats most. It is bound by reading K and V, so each row is judged against
// a streaming read of a buffer of the same size at the same thread count, alternated with the kernel in
// the same loop (../shared/MEASURING.md): x_read = (K+V bytes / kernel time) / read rate.
//
//   bench_decode --benchmark_counters_tabular=true [--benchmark_filter=...]
//   FLASHATTN_BENCH_THREADS=1,2 (default: 1 and every hardware thread)
//
// Rows: decode/<kv dtype>/kv:<keys>/q:<query rows>/threads:<n>: B = 1, 32 query heads over 8 KV heads, d = 128,
// K and V in BHSD (each head's rows contiguous: docs/inference.md says why that layout decodes fastest).
// prefill_kernel/... is the same call through the prefill kernel (Context::decode_kernel = false): the path
// every decode call took before the decode kernel.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flashattn/cpu/simd.hpp"
#include "flashattn/forward.hpp"
#include "threads.hpp"

namespace {

using flashattn::index_t;
namespace cpu = flashattn::cpu;

using flashattn::bench::all_threads;

using flashattn::bench::thread_counts;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The streaming-read reference: `threads` threads each sum their share of a buffer with independent vector
// accumulators (no reduction chain limits it), as a plain read loop would. Returns the sum, so that the
// loop is not optimised away.
float read_all(const std::vector<float>& buf, int threads) {
  using V = cpu::Simd<float, cpu::kBestIsa>;
  constexpr int kAcc = 8;
  std::vector<float> sums(std::size_t(threads), 0.0f);
  const auto part = [&](int t) {
    const std::size_t n = buf.size() / std::size_t(threads);
    const float* p = buf.data() + std::size_t(t) * n;
    typename V::Reg acc[kAcc];
    for (auto& a : acc) a = V::zero();
    std::size_t i = 0;
    for (; i + kAcc * V::width <= n; i += kAcc * V::width)
      for (int a = 0; a < kAcc; ++a) acc[a] = V::add(acc[a], V::load(p + i + a * V::width));
    alignas(64) float lanes[64];
    float s = 0.0f;
    for (auto& a : acc) {
      V::store(lanes, a);
      for (int l = 0; l < V::width; ++l) s += lanes[l];
    }
    for (; i < n; ++i) s += p[i];
    sums[std::size_t(t)] = s;
  };
  if (threads == 1) {
    part(0);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(part, t);
    for (auto& th : pool) th.join();
  }
  float s = 0.0f;
  for (float x : sums) s += x;
  return s;
}

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return "bf16";
  if constexpr (std::is_same_v<T, Eigen::half>) return "fp16";
  return "?";
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// Args: keys, query rows, threads, decode kernel (1) or prefill kernel (0).
template <class T>
void bm_decode(benchmark::State& state) {
  const index_t B = 1, H = 32, Hk = 8, D = 128;
  const index_t kv = state.range(0), seq_q = state.range(1);
  const int threads = int(state.range(2));
  cpu::Context<> ctx{threads};
  ctx.decode_kernel = state.range(3) != 0;

  std::vector<T> q(std::size_t(B * seq_q * H * D)), o(q.size()), k(std::size_t(B * Hk * kv * D)), v(k.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& x : q) x = T(dist(rng));
  for (std::size_t i = 0; i < k.size(); ++i) {  // cheap fill: a large cache need not be random
    k[i] = T(float(int(i % 251) - 125) / 64.0f);
    v[i] = T(float(int(i % 241) - 120) / 64.0f);
  }
  const auto qv = flashattn::bshd<const T>(q.data(), B, seq_q, H, D);
  const auto ov = flashattn::bshd<T>(o.data(), B, seq_q, H, D);
  const auto kvw = flashattn::bhsd<const T>(k.data(), B, Hk, kv, D);
  const auto vvw = flashattn::bhsd<const T>(v.data(), B, Hk, kv, D);
  const double bytes = double(k.size() + v.size()) * sizeof(T);
  std::vector<float> other(std::size_t(bytes / sizeof(float)), 1.0f);  // as large as K+V: both come from memory

  flashattn::attention_forward(ctx, qv, kvw, vvw, ov);  // warm: pool threads, first touch
  float sink = read_all(other, threads);
  std::vector<double> t_kernel, t_read;
  for (auto _ : state) {
    const double t0 = now();
    flashattn::attention_forward(ctx, qv, kvw, vvw, ov);
    const double t1 = now();
    sink += read_all(other, threads);
    const double t2 = now();
    t_kernel.push_back(t1 - t0);
    t_read.push_back(t2 - t1);
    state.SetIterationTime(t1 - t0);
  }
  benchmark::DoNotOptimize(sink);
  const double kernel_gbps = bytes / median(t_kernel) * 1e-9, read_gbps = bytes / median(t_read) * 1e-9;
  state.counters["kv_MB"] = bytes * 1e-6;
  state.counters["kv_GBps"] = kernel_gbps;
  state.counters["read_GBps"] = read_gbps;
  state.counters["x_read"] = kernel_gbps / read_gbps;
  state.counters["tokens_per_s"] = double(seq_q) / median(t_kernel);
}

template <class T>
void register_rows() {
  for (index_t kv : {32768, 131072})
    for (index_t seq_q : {1, 4})
      for (int threads : thread_counts()) {
        const std::string tail = std::string("/") + dtype_name<T>() + "/kv:" + std::to_string(kv) + "/q:" +
                                 std::to_string(seq_q) + "/threads:" + std::to_string(threads);
        const int iterations = kv > 32768 ? 5 : 9;
        benchmark::RegisterBenchmark(("decode" + tail).c_str(), bm_decode<T>)
            ->Args({kv, seq_q, threads, 1})
            ->Unit(benchmark::kMillisecond)
            ->Iterations(iterations)
            ->UseManualTime();
        if (kv == 32768 && seq_q == 1)
          benchmark::RegisterBenchmark(("prefill_kernel" + tail).c_str(), bm_decode<T>)
              ->Args({kv, seq_q, threads, 0})
              ->Unit(benchmark::kMillisecond)
              ->Iterations(3)
              ->UseManualTime();
      }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_rows<float>();
  register_rows<Eigen::half>();
  register_rows<Eigen::bfloat16>();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
