// Score variants and block-sparse masks against the plain kernel, alternated call by call in the same run
// (bench/alternate.hpp), as issue 23's targets are stated: B=1, H=8, N=2048, d=128, fp32.
//
//   bench_variants [--benchmark_filter=...]     FLASHATTN_BENCH_THREADS=1,2 for the thread counts
//
// Names: <pass>/<variant>/<form>/threads:<t>. Counters:
//   ms_variant, ms_base   median milliseconds of each (CPU time on one thread, wall time on several)
//   x_base                ms_variant / ms_base: the target ratio (soft-cap <= 1.10, ALiBi <= 1.05, ...)
//   kept                  (block-sparse rows) the share of 64 x 64 cells of the score grid that keep any pair
//   x_kept                x_base / kept: within 1.2 of it is the block-sparse target
//   (bias rows: the base is the plain call with the bias's mask)
//   (block-sparse and structured-mask rows: chunked, streaming, prefix-LM; their base is plain non-causal)
//   gflops_d, gflops_128, x_rate   (head_dim rows) the plain forward's (or backward's) rate at d (or dk/dv) and
//                                  at d = 128, and their ratio
// Soft-capping runs at cap 30 (the scores, about N(0, 1), stay in tanh's fast range) and at cap 0.5 (most
// packets leave it: the slower path everywhere).
// The base is the plain call with the variant's mask: non-causal for soft-capping and the document masks
// (whose target is against plain non-causal), causal for causal ALiBi.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "alternate.hpp"
#include "flashattn/flashattn.hpp"
#include "references.hpp"
#include "threads.hpp"

namespace {

using flashattn::index_t;
using flashattn::bench::alternated_medians;

constexpr index_t kN = 2048, kH = 8, kD = 128;

// d: the head dim of q and k; dv: of v, o and their gradients (d unless given: MLA-style heads).
struct Problem {
  index_t d, dv_dim;
  std::vector<float> q, k, v, o, d_o, dq, dk, dv, lse;
  explicit Problem(index_t dim = kD, index_t v_dim = 0) : d(dim), dv_dim(v_dim > 0 ? v_dim : dim) {
    for (auto* x : {&q, &k, &dq, &dk}) x->resize(std::size_t(kN * kH * d));
    for (auto* x : {&v, &o, &d_o, &dv}) x->resize(std::size_t(kN * kH * dv_dim));
    lse.resize(std::size_t(kH * kN));
    std::mt19937 gen(42);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto* x : {&q, &k, &v, &d_o})
      for (auto& e : *x) e = dist(gen);
  }
  // A tensor's view, with its own head dim (q, k, dq, dk: d; the others dv).
  flashattn::TensorView<const float> in(const std::vector<float>& x) const {
    return flashattn::bshd(x.data(), 1, kN, kH, dim_of(x));
  }
  flashattn::TensorView<float> out(std::vector<float>& x) { return flashattn::bshd(x.data(), 1, kN, kH, dim_of(x)); }
  index_t dim_of(const std::vector<float>& x) const {
    return &x == &q || &x == &k || &x == &dq || &x == &dk ? d : dv_dim;
  }
  flashattn::LseView lse_view() { return flashattn::lse_bhs(lse.data(), 1, kH, kN); }
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// Document-causal over 4 documents of 512: a key of the query's own document, at or before it. (A lambda,
// as a user would write it, so that the kernel's keep() calls inline.)
const auto doc_causal = [](index_t i, index_t j) { return j <= i && i / 512 == j / 512; };

void report(benchmark::State& state, double t_variant, double t_base, double kept) {
  state.counters["ms_variant"] = t_variant * 1e3;
  state.counters["ms_base"] = t_base * 1e3;
  state.counters["x_base"] = t_variant / t_base;
  if (kept > 0) {
    state.counters["kept"] = kept;
    state.counters["x_kept"] = t_variant / t_base / kept;
  }
}

// The forward with `policy` against attention_forward with options {causal = base_causal}.
template <class Policy>
void bm_forward(benchmark::State& state, const Policy& policy, bool base_causal, double kept) {
  const int threads = int(state.range(0));
  Problem p;
  const flashattn::cpu::Context<> ctx{threads};
  flashattn::AttentionOptions base;
  base.causal = base_causal;
  const auto [t_variant, t_base] = alternated_medians(
      state, flashattn::bench::RateClock(threads),
      [&] { flashattn::attention_forward_masked(ctx, p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o), policy); },
      [&] { flashattn::attention_forward(ctx, p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o), base); });
  report(state, t_variant, t_base, kept);
}

// The share of 64 x 64 cells of the N x N grid that a per-sequence policy does not skip (tile() not Empty).
template <class Policy>
double kept_share(const Policy& policy) {
  const auto m = flashattn::policy_for(policy, flashattn::SequenceInfo{0, 0, kN, kN});
  index_t kept = 0, all = 0;
  for (index_t q0 = 0; q0 < kN; q0 += 64)
    for (index_t k0 = 0; k0 < kN; k0 += 64, ++all)
      kept += m.tile(q0, q0 + 64, k0, k0 + 64) != flashattn::TileKind::Empty;
  return double(kept) / double(all);
}

// The backward of each (each after its own forward, outside the timing, for its O and LSE). sink_grads: the
// variant's call also returns the sink logits' gradient (BackwardExtras::d_sinks).
template <class Policy>
void bm_backward(benchmark::State& state, const Policy& policy, bool base_causal, double kept,
                 bool sink_grads = false) {
  const int threads = int(state.range(0));
  Problem pv, pb;
  const flashattn::cpu::Context<> ctx{threads};
  flashattn::AttentionOptions base;
  base.causal = base_causal;
  flashattn::attention_forward_masked(ctx, pv.in(pv.q), pv.in(pv.k), pv.in(pv.v), pv.out(pv.o), policy, {},
                                      pv.lse_view());
  flashattn::attention_forward(ctx, pb.in(pb.q), pb.in(pb.k), pb.in(pb.v), pb.out(pb.o), base, pb.lse_view());
  std::vector<float> d_sinks(static_cast<std::size_t>(kH));
  flashattn::BackwardExtras extras;
  if (sink_grads) extras.d_sinks = d_sinks.data();
  const auto [t_variant, t_base] = alternated_medians(
      state, flashattn::bench::RateClock(threads),
      [&] {
        flashattn::attention_backward_masked(ctx, pv.in(pv.q), pv.in(pv.k), pv.in(pv.v), pv.in(pv.o), pv.in(pv.d_o),
                                             pv.lse_view(), pv.out(pv.dq), pv.out(pv.dk), pv.out(pv.dv), policy, {},
                                             extras);
      },
      [&] {
        flashattn::attention_backward(ctx, pb.in(pb.q), pb.in(pb.k), pb.in(pb.v), pb.in(pb.o), pb.in(pb.d_o),
                                      pb.lse_view(), pb.out(pb.dq), pb.out(pb.dk), pb.out(pb.dv), base);
      });
  report(state, t_variant, t_base, kept);
}

// Head dims that are not the specialised 64 / 128 (and V's head dim dv apart from d, MLA's 192/128): the
// rate (FLOP per second) against the rate at d = 128 in the same run, plain non-causal forward (x_rate: the
// issue's target is >= 0.90). A forward is 2·N²·H·(d + dv) FLOP: Q·Kᵀ of depth d, P·V of width dv.
void bm_head_dim(benchmark::State& state, index_t d, index_t dv = 0) {
  const int threads = int(state.range(0));
  Problem pd(d, dv), p128(128);
  const flashattn::cpu::Context<> ctx{threads};
  const auto [t_d, t_128] = alternated_medians(
      state, flashattn::bench::RateClock(threads),
      [&] { flashattn::attention_forward(ctx, pd.in(pd.q), pd.in(pd.k), pd.in(pd.v), pd.out(pd.o)); },
      [&] { flashattn::attention_forward(ctx, p128.in(p128.q), p128.in(p128.k), p128.in(p128.v), p128.out(p128.o)); });
  const double gemm = 2.0 * double(kN) * double(kN) * double(kH);  // FLOP per unit of depth or width
  const double flops_d = gemm * double(d + pd.dv_dim), flops_128 = gemm * 256.0;
  state.counters["gflops_d"] = flops_d / t_d * 1e-9;
  state.counters["gflops_128"] = flops_128 / t_128 * 1e-9;
  state.counters["x_rate"] = (flops_d / t_d) / (flops_128 / t_128);
}

// The same for the backward (each problem's forward first, outside the timing, for its O and LSE): 5 GEMMs,
// S = Q·Kᵀ, dQ = dS·K and dK = dSᵀ·Q of depth or width d, dP = dO·Vᵀ and dV = Pᵀ·dO of dv.
void bm_backward_head_dim(benchmark::State& state, index_t d, index_t dv = 0) {
  const int threads = int(state.range(0));
  Problem pd(d, dv), p128(128);
  const flashattn::cpu::Context<> ctx{threads};
  for (Problem* p : {&pd, &p128})
    flashattn::attention_forward(ctx, p->in(p->q), p->in(p->k), p->in(p->v), p->out(p->o), {}, p->lse_view());
  const auto backward = [&](Problem& p) {
    flashattn::attention_backward(ctx, p.in(p.q), p.in(p.k), p.in(p.v), p.in(p.o), p.in(p.d_o), p.lse_view(),
                                  p.out(p.dq), p.out(p.dk), p.out(p.dv));
  };
  const auto [t_d, t_128] = alternated_medians(
      state, flashattn::bench::RateClock(threads), [&] { backward(pd); }, [&] { backward(p128); });
  const double gemm = 2.0 * double(kN) * double(kN) * double(kH);
  const double flops_d = gemm * double(3 * d + 2 * pd.dv_dim), flops_128 = gemm * 5.0 * 128.0;
  state.counters["gflops_d"] = flops_d / t_d * 1e-9;
  state.counters["gflops_128"] = flops_128 / t_128 * 1e-9;
  state.counters["x_rate"] = (flops_d / t_d) / (flops_128 / t_128);
}

template <class F>
void add(const std::string& name, int iterations, F&& fn) {
  for (int threads : flashattn::bench::thread_counts())
    benchmark::RegisterBenchmark((name + "/threads:" + std::to_string(threads)).c_str(), fn)
        ->Arg(threads)
        ->Iterations(iterations)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
#if defined(__SSE__)
  // FLASHATTN_BENCH_FTZ=1: subnormal results flushed and inputs read as zero (MXCSR FTZ and DAZ) on the
  // calling thread, to see what subnormal probabilities cost where a CPU takes microcode assists on them.
  if (const char* ftz = std::getenv("FLASHATTN_BENCH_FTZ"); ftz != nullptr && ftz[0] == '1') {
    _mm_setcsr(_mm_getcsr() | 0x8040u);
    benchmark::AddCustomContext("mxcsr", "FTZ+DAZ on the calling thread");
  }
#endif
  benchmark::AddCustomContext("cpu_model", cpu_model());

  const auto slopes = std::make_shared<const std::vector<float>>(flashattn::alibi_slopes(kH));
  const auto cap = flashattn::soft_cap(30.0f, flashattn::no_mask());
  const auto user_cap = flashattn::score_mod(flashattn::NoMask{kN}, flashattn::vectorized([](auto, auto, auto s) {
                                               using S = decltype(s);
                                               return S(30) * flashattn::tanh(s * S(1.0f / 30));
                                             }),
                                             flashattn::vectorized([](auto, auto, auto s) {
                                               using S = decltype(s);
                                               const S t = flashattn::tanh(s * S(1.0f / 30));
                                               return S(1) - t * t;
                                             }));
  const auto scalar_cap =
      flashattn::score_mod(flashattn::NoMask{kN}, [](index_t, index_t, auto s) { return 30 * std::tanh(s / 30); });
  const auto alibi_causal = flashattn::alibi(*slopes, flashattn::causal_mask());
  const auto alibi_full = flashattn::alibi(*slopes, flashattn::no_mask());
  const auto doc_element = flashattn::element_mask(kN, doc_causal);
  const auto doc_block = flashattn::block_mask(kN, kN, doc_causal);
  const double kept = doc_block.map->density();

  add("forward/softcap/builtin", 5, [=](benchmark::State& s) { bm_forward(s, cap, false, 0); });
  // Scores beyond 1.5·cap in most packets: the slower path of flashattn::tanh (score_math.hpp) everywhere.
  const auto cap_saturated = flashattn::soft_cap(0.5f, flashattn::no_mask());
  add("forward/softcap/builtin_cap0.5", 5, [=](benchmark::State& s) { bm_forward(s, cap_saturated, false, 0); });
  add("forward/softcap/user_vectorized", 5, [=](benchmark::State& s) { bm_forward(s, user_cap, false, 0); });
  add("forward/softcap/user_scalar", 3, [=](benchmark::State& s) { bm_forward(s, scalar_cap, false, 0); });
  add("forward/alibi/builtin_causal", 5, [=](benchmark::State& s) { bm_forward(s, alibi_causal, true, 0); });
  add("forward/alibi/builtin_full", 5, [=](benchmark::State& s) { bm_forward(s, alibi_full, false, 0); });
  add("forward/doc_causal/element_mask", 3, [=](benchmark::State& s) { bm_forward(s, doc_element, false, kept); });
  add("forward/doc_causal/block_mask", 5, [=](benchmark::State& s) { bm_forward(s, doc_block, false, kept); });
  // gpt-oss-style learned sinks (one logit per head) over causal; the base is plain causal.
  const auto sink_logits =
      std::make_shared<const std::vector<float>>(std::vector<float>{0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -0.5f, 1.0f, 3.0f});
  const auto sinks_causal = flashattn::sinks(*sink_logits, flashattn::causal_mask());
  add("forward/sinks/causal", 5, [=](benchmark::State& s) { bm_forward(s, sinks_causal, true, 0); });
  // Structured masks, against plain non-causal, with the share of tiles they keep.
  const auto chunked = flashattn::chunked_mask(512);
  const auto streaming = flashattn::streaming_mask(4, 511);
  const auto prefix = flashattn::prefix_lm_mask(512);
  add("forward/chunked/causal_512", 5,
      [=](benchmark::State& s) { bm_forward(s, chunked, false, kept_share(chunked)); });
  add("forward/streaming/sinks4_window511", 5,
      [=](benchmark::State& s) { bm_forward(s, streaming, false, kept_share(streaming)); });
  add("forward/prefix_lm/prefix_512", 5,
      [=](benchmark::State& s) { bm_forward(s, prefix, false, kept_share(prefix)); });
  // An additive bias tensor (B, H, N, N) in fp32, read once per call: N^2 more floats per head than the
  // plain call reads (16 MiB per head here; target <= 1.30x), and one (1, 1, N, N) matrix shared by the heads.
  const auto bias_values = std::make_shared<const std::vector<float>>([] {
    std::vector<float> b(std::size_t(kH * kN * kN));
    std::mt19937 gen(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& e : b) e = dist(gen);
    return b;
  }());
  const auto per_head = flashattn::bias_bhqk(bias_values->data(), 1, kH, kN, kN);
  const auto bias_per_head = flashattn::bias(per_head, flashattn::no_mask());
  const auto bias_shared =
      flashattn::bias(flashattn::bias_bhqk(bias_values->data(), 1, 1, kN, kN), flashattn::no_mask());
  const auto bias_causal = flashattn::bias(per_head, flashattn::causal_mask());
  add("forward/bias/per_head", 5, [=](benchmark::State& s) {
    (void)bias_values;
    bm_forward(s, bias_per_head, false, 0);
  });
  add("forward/bias/shared_by_heads", 5, [=](benchmark::State& s) {
    (void)bias_values;
    bm_forward(s, bias_shared, false, 0);
  });
  add("forward/bias/per_head_causal", 5, [=](benchmark::State& s) {
    (void)bias_values;
    bm_forward(s, bias_causal, true, 0);
  });
  add("backward/softcap/builtin", 3, [=](benchmark::State& s) { bm_backward(s, cap, false, 0); });
  add("backward/alibi/builtin_causal", 3, [=](benchmark::State& s) { bm_backward(s, alibi_causal, true, 0); });
  add("backward/sinks/causal_with_d_sinks", 3,
      [=](benchmark::State& s) { bm_backward(s, sinks_causal, true, 0, true); });
  add("backward/bias/per_head", 3, [=](benchmark::State& s) {
    (void)bias_values;
    bm_backward(s, bias_per_head, false, 0);
  });
  add("backward/chunked/causal_512", 3,
      [=](benchmark::State& s) { bm_backward(s, chunked, false, kept_share(chunked)); });
  add("backward/doc_causal/block_mask", 3, [=](benchmark::State& s) { bm_backward(s, doc_block, false, kept); });
  for (index_t d : {72, 80, 96, 112, 192, 256})
    add("forward/head_dim/d:" + std::to_string(d), 3, [=](benchmark::State& s) { bm_head_dim(s, d); });
  for (index_t d : {72, 80, 96, 112, 192, 256})
    add("backward/head_dim/d:" + std::to_string(d), 3, [=](benchmark::State& s) { bm_backward_head_dim(s, d); });
  // V's head dim apart from Q/K's: MLA (192/128) and absorbed MLA (576/512).
  for (auto [d, dv] : {std::pair<index_t, index_t>{192, 128}, {576, 512}}) {
    const std::string dims = "dk:" + std::to_string(d) + "_dv:" + std::to_string(dv);
    add("forward/head_dim/" + dims, 3, [=](benchmark::State& s) { bm_head_dim(s, d, dv); });
    add("backward/head_dim/" + dims, 3, [=](benchmark::State& s) { bm_backward_head_dim(s, d, dv); });
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
