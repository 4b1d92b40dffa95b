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
// decode/fp32q-<kv dtype>kv/...: fp32 Q and O against 16-bit K and V (mixed precision).
// prefill_kernel/... is the same call through the prefill kernel (Context::decode_kernel = false): the path
// every decode call took before the decode kernel.
// paged/<dtype>/kv:<keys>/page:<rows>/<nhd|hnd>/threads:<n>: the same step on a paged cache (pages
// shuffled), alternated in the same loop with the contiguous BHSD cache: x_contiguous = paged rate /
// contiguous rate. nhd pages are (page_size, heads, dim), hnd pages (heads, page_size, dim).
// FLASHATTN_BENCH_SWEEP=1: the decode rows (q:1) at 1k-128k keys only (bench/plot_decode.py plots them).
// batch8/<dtype>/threads:<n>: 8 requests of one contiguous BHSD cache (capacity 32768) whose lengths
// spread over 1k-32k; x_read counts the K/V rows the requests use.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "flashattn/cpu/amx.hpp"
#include "flashattn/cpu/simd.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/kv_cache.hpp"
#include "read_rate.hpp"
#include "threads.hpp"

namespace {

using flashattn::index_t;
namespace cpu = flashattn::cpu;

using flashattn::bench::all_threads;
using flashattn::bench::read_all;

using flashattn::bench::thread_counts;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

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

// Times calls[0] (and calls[1..], alternated with it in the same loop) and a streaming read of `bytes`
// bytes, alternated in one loop; sets kv_GBps (of calls[0]), read_GBps and x_read. Returns the median
// seconds of each call.
template <class... Calls>
std::vector<double> measure(benchmark::State& state, double bytes, int threads, Calls&&... calls) {
  std::vector<float> other(std::size_t(bytes / sizeof(float)), 1.0f);  // as large as K+V: both come from memory
  (calls(), ...);  // warm: pool threads, first touch
  float sink = read_all(other, threads);
  constexpr std::size_t kCalls = sizeof...(Calls);
  std::vector<std::vector<double>> t_call(kCalls);
  std::vector<double> t_read;
  for (auto _ : state) {
    double first = 0.0;
    std::size_t i = 0;
    const auto timed = [&](auto& call) {
      const double t0 = now();
      call();
      const double t = now() - t0;
      t_call[i++].push_back(t);
      if (i == 1) first = t;
    };
    (timed(calls), ...);
    const double t1 = now();
    sink += read_all(other, threads);
    t_read.push_back(now() - t1);
    state.SetIterationTime(first);
  }
  benchmark::DoNotOptimize(sink);
  std::vector<double> med;
  for (auto& t : t_call) med.push_back(median(t));
  const double kernel_gbps = bytes / med[0] * 1e-9, read_gbps = bytes / median(t_read) * 1e-9;
  state.counters["kv_MB"] = bytes * 1e-6;
  state.counters["kv_GBps"] = kernel_gbps;
  state.counters["read_GBps"] = read_gbps;
  state.counters["x_read"] = kernel_gbps / read_gbps;
  return med;
}

// Args: keys, query rows, threads, decode kernel (1) or prefill kernel (0). T: Q and O; E: K and V (mixed
// precision where they differ). Tiles: AutoTiles, or the configuration of the decode_no_amx rows.
template <class T, class E = T, class Tiles = cpu::AutoTiles>
void bm_decode(benchmark::State& state) {
  const index_t B = 1, H = 32, Hk = 8, D = 128;
  const index_t kv = state.range(0), seq_q = state.range(1);
  const int threads = int(state.range(2));
  cpu::Context<Tiles> ctx{threads};
  ctx.decode_kernel = state.range(3) != 0;

  std::vector<T> q(std::size_t(B * seq_q * H * D)), o(q.size());
  std::vector<E> k(std::size_t(B * Hk * kv * D)), v(k.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& x : q) x = T(dist(rng));
  for (std::size_t i = 0; i < k.size(); ++i) {  // cheap fill: a large cache need not be random
    k[i] = E(float(int(i % 251) - 125) / 64.0f);
    v[i] = E(float(int(i % 241) - 120) / 64.0f);
  }
  const auto qv = flashattn::bshd<const T>(q.data(), B, seq_q, H, D);
  const auto ov = flashattn::bshd<T>(o.data(), B, seq_q, H, D);
  const auto kvw = flashattn::bhsd<const E>(k.data(), B, Hk, kv, D);
  const auto vvw = flashattn::bhsd<const E>(v.data(), B, Hk, kv, D);
  const double bytes = double(k.size() + v.size()) * sizeof(E);
  const auto med = measure(state, bytes, threads, [&] { flashattn::attention_forward(ctx, qv, kvw, vvw, ov); });
  state.counters["tokens_per_s"] = double(seq_q) / med[0];
}

// A cache of `pages` pages of `page` rows, handed out in a shuffled order; nhd or hnd inside a page.
template <class T>
struct PagedCache {
  std::vector<T> k, v;
  std::vector<std::int32_t> table, lengths;
  flashattn::PagedKvCacheView<const T> view;
  PagedCache(index_t batch, index_t kv, index_t page, index_t heads_kv, index_t dim, bool hnd) {
    const index_t per_seq = (kv + page - 1) / page, pages = batch * per_seq;
    k.resize(std::size_t(pages * page * heads_kv * dim));
    v.resize(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = T(float(int(i % 251) - 125) / 64.0f);
      v[i] = T(float(int(i % 241) - 120) / 64.0f);
    }
    table.resize(std::size_t(pages));
    for (index_t i = 0; i < pages; ++i) table[i] = std::int32_t(i);
    std::shuffle(table.begin(), table.end(), std::mt19937(3));
    lengths.assign(std::size_t(batch), std::int32_t(kv));
    const auto make = hnd ? flashattn::paged_kv_cache_hnd<const T> : flashattn::paged_kv_cache_nhd<const T>;
    view = make(k.data(), v.data(), pages, page, heads_kv, dim, table.data(), batch, per_seq, lengths.data());
  }
};

// Args: keys, page rows, hnd (1) or nhd (0), threads.
template <class T>
void bm_paged(benchmark::State& state) {
  const index_t H = 32, Hk = 8, D = 128;
  const index_t kv = state.range(0), page = state.range(1);
  const int threads = int(state.range(3));
  const cpu::Context<> ctx{threads};
  std::vector<T> q(std::size_t(H * D)), o(q.size()), o2(q.size()), k(std::size_t(Hk * kv * D)), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = T(float(int(i % 251) - 125) / 64.0f);
    v[i] = T(float(int(i % 241) - 120) / 64.0f);
  }
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = T(float(int(i % 13) - 6) / 8.0f);
  const PagedCache<T> paged(1, kv, page, Hk, D, state.range(2) != 0);
  const auto qv = flashattn::bshd<const T>(q.data(), 1, 1, H, D);
  const auto kvw = flashattn::bhsd<const T>(k.data(), 1, Hk, kv, D), vvw = flashattn::bhsd<const T>(v.data(), 1, Hk, kv, D);
  const double bytes = double(k.size() + v.size()) * sizeof(T);
  const auto med = measure(
      state, bytes, threads,
      [&] { flashattn::attention_forward(ctx, qv, paged.view, flashattn::bshd<T>(o.data(), 1, 1, H, D)); },
      [&] { flashattn::attention_forward(ctx, qv, kvw, vvw, flashattn::bshd<T>(o2.data(), 1, 1, H, D)); });
  state.counters["x_contiguous"] = med[1] / med[0];
}

// 8 requests of one contiguous cache, lengths over 1k-32k. Args: threads.
template <class T>
void bm_batch8(benchmark::State& state) {
  const index_t B = 8, H = 32, Hk = 8, D = 128, cap = 32768;
  const int threads = int(state.range(0));
  const cpu::Context<> ctx{threads};
  std::vector<std::int32_t> lengths{1024, 1700, 2900, 4800, 8100, 13500, 22000, 32768};
  std::vector<T> q(std::size_t(B * H * D)), o(q.size()), k(std::size_t(B * Hk * cap * D)), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = T(float(int(i % 251) - 125) / 64.0f);
    v[i] = T(float(int(i % 241) - 120) / 64.0f);
  }
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = T(float(int(i % 13) - 6) / 8.0f);
  const auto cache = flashattn::kv_cache_bhsd<const T>(k.data(), v.data(), B, Hk, cap, D, lengths.data());
  double keys = 0;
  for (auto l : lengths) keys += l;
  const double bytes = 2.0 * keys * double(Hk * D) * sizeof(T);
  measure(state, bytes, threads, [&] {
    flashattn::attention_forward(ctx, flashattn::bshd<const T>(q.data(), B, 1, H, D), cache,
                                 flashattn::bshd<T>(o.data(), B, 1, H, D));
  });
}

// FLASHATTN_BENCH_SWEEP=1: decode rows at more KV lengths (1k to 128k keys, q:1 only), for
// bench/plot_decode.py's plot of K+V GB/s against the KV length.
std::vector<index_t> kv_lengths() {
  const char* sweep = std::getenv("FLASHATTN_BENCH_SWEEP");
  if (sweep != nullptr && sweep[0] == '1') return {1024, 4096, 16384, 32768, 65536, 131072};
  return {32768, 131072};
}

// T: Q and O, E: K and V. Mixed rows are named by both: decode/fp32q-fp16kv/...
template <class T, class E = T>
void register_rows() {
  const bool sweep = kv_lengths().size() > 2;
  const std::string types = std::is_same_v<T, E> ? std::string(dtype_name<T>())
                                                 : std::string(dtype_name<T>()) + "q-" + dtype_name<E>() + "kv";
  for (index_t kv : kv_lengths())
    for (index_t seq_q : {1, 4})
      for (int threads : thread_counts()) {
        if (sweep && seq_q != 1) continue;
        const std::string tail = "/" + types + "/kv:" + std::to_string(kv) + "/q:" +
                                 std::to_string(seq_q) + "/threads:" + std::to_string(threads);
        const int iterations = kv > 32768 ? 5 : 9;
        benchmark::RegisterBenchmark(("decode" + tail).c_str(), bm_decode<T, E>)
            ->Args({kv, seq_q, threads, 1})
            ->Unit(benchmark::kMillisecond)
            ->Iterations(iterations)
            ->UseManualTime();
        // bf16 where AMX is usable: the same call on AVX512-BF16 (DefaultTiles) for comparison.
        if constexpr (cpu::is_bf16<T>) {
          if (cpu::is_compiled(cpu::Isa::Amx) && cpu::amx::usable())
            benchmark::RegisterBenchmark(("decode_no_amx" + tail).c_str(), bm_decode<T, E, cpu::DefaultTiles<T>>)
                ->Args({kv, seq_q, threads, 1})
                ->Unit(benchmark::kMillisecond)
                ->Iterations(iterations)
                ->UseManualTime();
        }
        if (kv == 32768 && seq_q == 1 && !sweep && std::is_same_v<T, E>)
          benchmark::RegisterBenchmark(("prefill_kernel" + tail).c_str(), bm_decode<T, E>)
              ->Args({kv, seq_q, threads, 0})
              ->Unit(benchmark::kMillisecond)
              ->Iterations(3)
              ->UseManualTime();
      }
}

}  // namespace

template <class T>
void register_cache_rows() {
  for (int threads : thread_counts()) {
    const std::string tail = std::string("/") + dtype_name<T>();
    for (index_t page : {16, 64, 256})
      for (int hnd : {1, 0})
        benchmark::RegisterBenchmark(("paged" + tail + "/kv:32768/page:" + std::to_string(page) +
                                      (hnd ? "/hnd" : "/nhd") + "/threads:" + std::to_string(threads))
                                         .c_str(),
                                     bm_paged<T>)
            ->Args({32768, page, hnd, threads})
            ->Unit(benchmark::kMillisecond)
            ->Iterations(9)
            ->UseManualTime();
    benchmark::RegisterBenchmark(("batch8" + tail + "/threads:" + std::to_string(threads)).c_str(), bm_batch8<T>)
        ->Args({threads})
        ->Unit(benchmark::kMillisecond)
        ->Iterations(9)
        ->UseManualTime();
  }
}

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_rows<float>();
  register_rows<Eigen::half>();
  register_rows<Eigen::bfloat16>();
  register_rows<float, Eigen::half>();
  register_rows<float, Eigen::bfloat16>();
  if (kv_lengths().size() == 2) {
    register_cache_rows<float>();
    register_cache_rows<Eigen::half>();
    register_cache_rows<Eigen::bfloat16>();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
