// Variable-length packed batches (issue 22, docs/inference.md): a causal prefill of 16 sequences of
// 100-4000 tokens (16384 in all) packed with cu_seqlens, against a dense batch of 16 equal sequences doing
// the same causal work (length sqrt(mean L²)), alternated in the same loop. Both rates count the causal
// FLOPs, 2·H·d·Σ L² (half of 4·H·d·L² per sequence); x_dense = packed GFLOP/s / dense GFLOP/s.
// padded_x = the packed call's time over a dense batch padded to the longest sequence (what a caller
// without varlen would run), measured once per row.
// varlen_backward/...: the same comparison for the backward (packed training): attention_backward_varlen
// against the dense backward of equal work, each after its own forward (not timed); GFLOP/s count the
// backward's 5 GEMMs, 2.5 × the forward's (padded_x not measured).
//
//   bench_varlen --benchmark_counters_tabular=true     FLASHATTN_BENCH_THREADS=1,2 (default: 1 and all)
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "threads.hpp"

namespace {

using flashattn::index_t;
namespace cpu = flashattn::cpu;
using flashattn::bench::thread_counts;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// 15 lengths evenly spaced from 100, and one of 4000, summing to 16384.
std::vector<std::int32_t> lengths() {
  std::vector<std::int32_t> l;
  for (int i = 0; i < 15; ++i) l.push_back(std::int32_t(std::lround(100.0 + i * (1551.2 - 100.0) / 14.0)));
  l.push_back(4000);
  l[7] += 16384 - std::accumulate(l.begin(), l.end(), 0);
  return l;
}

template <class T>
std::vector<T> filled(std::size_t n, unsigned seed) {
  std::vector<T> x(n);
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& e : x) e = T(dist(gen));
  return x;
}

// Args: threads, backward (1) or forward (0).
template <class T>
void bm_varlen(benchmark::State& state) {
  const index_t H = 4, D = 128;
  const int threads = int(state.range(0));
  const bool backward = state.range(1) != 0;
  const cpu::Context<> ctx{threads};
  flashattn::AttentionOptions causal;
  causal.causal = true;

  const std::vector<std::int32_t> lens = lengths();
  std::vector<std::int32_t> cu{0};
  double sum_sq = 0;
  for (auto l : lens) {
    cu.push_back(cu.back() + l);
    sum_sq += double(l) * double(l);
  }
  const index_t total = cu.back(), B = index_t(lens.size());
  const index_t eq = index_t(std::lround(std::sqrt(sum_sq / double(B))));
  const auto q = filled<T>(std::size_t(total * H * D), 1), k = filled<T>(q.size(), 2), v = filled<T>(q.size(), 3);
  std::vector<T> o(q.size());
  const auto qd = filled<T>(std::size_t(B * eq * H * D), 4), kd = filled<T>(qd.size(), 5), vd = filled<T>(qd.size(), 6);
  std::vector<T> od(qd.size());
  const flashattn::PackedBatch seqs{cu.data(), cu.data(), B};

  const auto packed_call = [&] {
    flashattn::attention_forward_varlen(ctx, flashattn::packed(q.data(), total, H, D),
                                        flashattn::packed(k.data(), total, H, D),
                                        flashattn::packed(v.data(), total, H, D),
                                        flashattn::packed(o.data(), total, H, D), seqs, causal);
  };
  const auto dense_call = [&] {
    flashattn::attention_forward(ctx, flashattn::bshd(qd.data(), B, eq, H, D), flashattn::bshd(kd.data(), B, eq, H, D),
                                 flashattn::bshd(vd.data(), B, eq, H, D), flashattn::bshd(od.data(), B, eq, H, D),
                                 causal);
  };
  // The backward's extra tensors: dO, the gradients and each forward's LSE.
  std::vector<float> lse(std::size_t(H * total)), lse_d(std::size_t(B * H * eq));
  const auto d_o = filled<T>(q.size(), 7), d_od = filled<T>(qd.size(), 8);
  std::vector<T> dq(q.size()), dk(q.size()), dv(q.size()), dqd(qd.size()), dkd(qd.size()), dvd(qd.size());
  const auto packed_backward = [&] {
    flashattn::attention_backward_varlen(
        ctx, flashattn::packed(q.data(), total, H, D), flashattn::packed(k.data(), total, H, D),
        flashattn::packed(v.data(), total, H, D), flashattn::packed(o.data(), total, H, D),
        flashattn::packed(d_o.data(), total, H, D), flashattn::lse_packed(lse.data(), H, total),
        flashattn::packed(dq.data(), total, H, D), flashattn::packed(dk.data(), total, H, D),
        flashattn::packed(dv.data(), total, H, D), seqs, causal);
  };
  const auto dense_backward = [&] {
    flashattn::attention_backward(ctx, flashattn::bshd(qd.data(), B, eq, H, D), flashattn::bshd(kd.data(), B, eq, H, D),
                                  flashattn::bshd(vd.data(), B, eq, H, D), flashattn::bshd(od.data(), B, eq, H, D),
                                  flashattn::bshd(d_od.data(), B, eq, H, D), flashattn::lse_bhs(lse_d.data(), B, H, eq),
                                  flashattn::bshd(dqd.data(), B, eq, H, D), flashattn::bshd(dkd.data(), B, eq, H, D),
                                  flashattn::bshd(dvd.data(), B, eq, H, D), causal);
  };
  if (backward) {
    flashattn::attention_forward_varlen(ctx, flashattn::packed(q.data(), total, H, D),
                                        flashattn::packed(k.data(), total, H, D),
                                        flashattn::packed(v.data(), total, H, D),
                                        flashattn::packed(o.data(), total, H, D), seqs, causal,
                                        flashattn::lse_packed(lse.data(), H, total));
    flashattn::attention_forward(ctx, flashattn::bshd(qd.data(), B, eq, H, D), flashattn::bshd(kd.data(), B, eq, H, D),
                                 flashattn::bshd(vd.data(), B, eq, H, D), flashattn::bshd(od.data(), B, eq, H, D),
                                 causal, flashattn::lse_bhs(lse_d.data(), B, H, eq));
  }
  const auto run_packed = [&] { backward ? packed_backward() : packed_call(); };
  const auto run_dense = [&] { backward ? dense_backward() : dense_call(); };
  run_packed();
  run_dense();
  std::vector<double> tp, td;
  for (auto _ : state) {
    double t0 = now();
    run_packed();
    const double t1 = now();
    run_dense();
    const double t2 = now();
    tp.push_back(t1 - t0);
    td.push_back(t2 - t1);
    state.SetIterationTime(t1 - t0);
  }
  const double gemms = backward ? 2.5 : 1.0;  // the backward's 5 GEMMs to the forward's 2
  const double flops_packed = gemms * 2.0 * double(H) * double(D) * sum_sq;
  const double flops_dense = gemms * 2.0 * double(H) * double(D) * double(B) * double(eq) * double(eq);
  const double gp = flops_packed / median(tp) * 1e-9, gd = flops_dense / median(td) * 1e-9;
  state.counters["GFLOPs"] = gp;
  state.counters["dense_GFLOPs"] = gd;
  state.counters["x_dense"] = gp / gd;
  state.counters["tokens"] = double(total);
  if (backward) return;

  // The padded alternative, once: every sequence padded to the longest.
  const index_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<T> pq(std::size_t(B * longest * H * D), T(0)), po(pq.size());
  const double t0 = now();
  flashattn::attention_forward(ctx, flashattn::bshd<const T>(pq.data(), B, longest, H, D),
                               flashattn::bshd<const T>(pq.data(), B, longest, H, D),
                               flashattn::bshd<const T>(pq.data(), B, longest, H, D),
                               flashattn::bshd(po.data(), B, longest, H, D), causal);
  const double t_padded = now() - t0;
  state.counters["padded_x"] = t_padded / median(tp);
}

template <class T>
void register_rows(const char* name) {
  for (int backward : {0, 1})
    for (int threads : thread_counts())
      benchmark::RegisterBenchmark((std::string(backward ? "varlen_backward/" : "varlen/") + name +
                                    "/causal/threads:" + std::to_string(threads))
                                       .c_str(),
                                   bm_varlen<T>)
          ->Args({threads, backward})
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3)
          ->UseManualTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_rows<float>("fp32");
  register_rows<Eigen::bfloat16>("bf16");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
