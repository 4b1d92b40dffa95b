// Tile-size sweep: the forward kernel at several (BlockQ, BlockKV) on one shape, one thread, process CPU
// time, best of --reps calls each. For choosing DefaultTiles on a new CPU, and for docs/performance.md.
//   tile_sweep [N=4096] [d=128] [dtype=fp32|bf16|fp16] [causal=0] [reps=3] [heads=2] [layout=bshd|bhsd]
// Built three times: tile_sweep (as shipped), tile_sweep_prefetch (FLASHATTN_PREFETCH=1) and
// tile_sweep_nocache (FLASHATTN_STAGED_TILE_CACHE_BYTES=0: every query block stages its K/V tiles again).
#include <Eigen/Core>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace {
using flashattn::index_t;

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

template <class T>
flashattn::TensorView<T> view(T* data, index_t n, index_t h, index_t d, bool bhsd) {
  return bhsd ? flashattn::bhsd(data, 1, h, n, d) : flashattn::bshd(data, 1, n, h, d);
}

template <class T, int BQ, int BKV, int PQ = BQ>
void sweep_one(index_t n, index_t d, bool causal, int reps, index_t h, bool bhsd) {
  std::vector<T> q(std::size_t(n * h * d)), k(q.size()), v(q.size()), o(q.size());
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = T(dist(gen));
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  const flashattn::cpu::Context<flashattn::cpu::Tiles<BQ, BKV, flashattn::cpu::kBestIsa, PQ>> one_thread{1};
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_seconds();
    flashattn::attention_forward(
        one_thread, view<const T>(q.data(), n, h, d, bhsd), view<const T>(k.data(), n, h, d, bhsd),
        view<const T>(v.data(), n, h, d, bhsd), view(o.data(), n, h, d, bhsd), opts);
    best = std::min(best, cpu_seconds() - t0);
  }
  const double flops = 4.0 * double(h) * double(n) * double(n) * double(d) * (causal ? 0.5 : 1.0);
  std::printf("BlockQ=%3d BlockKV=%3d PanelQ=%3d: %7.1f GFLOP/s\n", BQ, BKV, PQ, flops / best * 1e-9);
  std::fflush(stdout);
}

template <class T>
void sweep(index_t n, index_t d, bool causal, int reps, index_t h, bool bhsd) {
  sweep_one<T, 32, 64>(n, d, causal, reps, h, bhsd);
  sweep_one<T, 64, 64>(n, d, causal, reps, h, bhsd);
  sweep_one<T, 64, 128>(n, d, causal, reps, h, bhsd);
  sweep_one<T, 128, 64>(n, d, causal, reps, h, bhsd);
  sweep_one<T, 128, 128>(n, d, causal, reps, h, bhsd);
  sweep_one<T, 256, 64>(n, d, causal, reps, h, bhsd);
  // Tall blocks of 64-row panels (tiles.hpp: PanelQ).
  sweep_one<T, 128, 64, 64>(n, d, causal, reps, h, bhsd);
  sweep_one<T, 256, 64, 64>(n, d, causal, reps, h, bhsd);
  sweep_one<T, 128, 64, 32>(n, d, causal, reps, h, bhsd);
}
}  // namespace

int main(int argc, char** argv) {
  const index_t n = argc > 1 ? std::atol(argv[1]) : 4096;
  const index_t d = argc > 2 ? std::atol(argv[2]) : 128;
  const std::string dtype = argc > 3 ? argv[3] : "fp32";
  const bool causal = argc > 4 && std::atoi(argv[4]) != 0;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 3;
  const index_t h = argc > 6 ? std::atol(argv[6]) : 2;
  const bool bhsd = argc > 7 && std::string(argv[7]) == "bhsd";
  std::printf("tile sweep: %s N=%ld d=%ld causal=%d, %ld heads, %s, 1 thread, prefetch=%d, kv_cache=%ld B, isa=%s\n",
              dtype.c_str(), long(n), long(d), int(causal), long(h), bhsd ? "bhsd" : "bshd", FLASHATTN_PREFETCH,
              long(flashattn::cpu::kStagedTileCacheBytes),
              flashattn::cpu::isa_name(flashattn::cpu::kBestIsa));
  if (dtype == "bf16") sweep<Eigen::bfloat16>(n, d, causal, reps, h, bhsd);
  else if (dtype == "fp16") sweep<Eigen::half>(n, d, causal, reps, h, bhsd);
  else sweep<float>(n, d, causal, reps, h, bhsd);
}
