// A small driver for cache simulation: one fp32 forward call, one head, one thread, so that valgrind's
// cachegrind can count the last-level-cache misses of exactly that call.
//
//   io_driver <naive|naive_blocked|tiled|api|none> N d M_BYTES [BLOCK_Q BLOCK_KV]
//
// naive: naive_attention_forward (whole-matrix Eigen GEMMs, S and P in main memory). naive_blocked: the same
// three passes blocked with the tiles of M (bench/io_naive.hpp), the schedule of the naive IO model. tiled: the forward programs in the
// backend's no-split order (bench/io_tiled.hpp), the schedule of the IO model. api: attention_forward
// itself with the same tiles, which for one head and few query blocks splits the keys (split-KV).
// "none" does everything but the attention call: its misses are subtracted from the others' by
// bench/io_sweep.py. Before the call the driver streams through a buffer twice the simulated LL (M_BYTES),
// so the call starts cold and its compulsory misses (Q, K, V once) are in the count, as in the model.
// The tiled paths run the compiled tiles io::select_tiles picks for M (or BLOCK_Q x BLOCK_KV): for "tiled"
// any of io::IoSweepTileConfigs (d = 64, 128 and M = 64 KiB … 8 MiB), for "api" those of M = 1 MiB.
//
// Built without -march=native (see bench/CMakeLists.txt): valgrind 3.19 does not decode AVX-512. It is
// built with -mavx2 but without FMA: valgrind 3.19 emulates each FMA lane by a call into a helper, which
// made the simulation 6-17x slower, while the misses of the last-level cache (what we measure) were the
// same to 0.1% with and without FMA (docs/io.md). Without FMA the kernels take their portable path.
// Eigen is told the simulated cache sizes, so that its GEMM blocking fits the simulated hierarchy as it
// fits the real one.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "flashattn/reference/naive_forward.hpp"
#include "io_model.hpp"
#include "io_naive.hpp"
#include "io_tiled.hpp"

namespace {

using flashattn::index_t;
namespace io = flashattn::bench::io;

// Cheap, deterministic values in [-1, 1): the fill must not dominate the (subtracted) setup run.
void fill(std::vector<float>& x, std::uint32_t seed) {
  std::uint32_t state = seed * 2654435761u + 1u;
  for (auto& e : x) {
    state = state * 1664525u + 1013904223u;
    e = float(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

// Writes one float per line of a buffer twice the simulated LL, so that (LRU) no line of Q, K, V or O is
// left in the simulated caches when the call starts. Not zero-initialised: only these writes touch it.
float flush_caches(std::int64_t ll_bytes) {
  const std::size_t floats = std::size_t(2 * ll_bytes) / sizeof(float);
  const std::unique_ptr<float[]> buffer(new float[floats]);
  constexpr std::size_t kFloatsPerLine = 64 / sizeof(float);
  for (std::size_t i = 0; i < floats; i += kFloatsPerLine) buffer[i] = float(i);
  float sum = 0;
  for (std::size_t i = 0; i < floats; i += 16 * kFloatsPerLine) sum += buffer[i];
  return sum;
}

// The public API path is compiled for the tiles of M = 1 MiB only (d = 64 and 128), which is where the sweep
// runs it: each configuration costs a full set of kernel instantiations.
using ApiTiles = std::tuple<flashattn::cpu::Tiles<1024, 32>, flashattn::cpu::Tiles<512, 64>>;

volatile float g_sink;  // keeps the flush from being optimised away

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: io_driver <naive|naive_blocked|tiled|api|none> N d M_BYTES [BLOCK_Q BLOCK_KV]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 7) usage();
  const std::string path = argv[1];
  if (path != "naive" && path != "naive_blocked" && path != "tiled" && path != "api" && path != "none") usage();
  const index_t n = std::atoll(argv[2]), d = std::atoll(argv[3]);
  const std::int64_t m = std::atoll(argv[4]);
  if (n <= 0 || d <= 0 || m <= 0) usage();
  const io::TileChoice tiles = argc == 7 ? io::TileChoice{std::atoi(argv[5]), std::atoi(argv[6])}
                                         : io::select_tiles(m, d, sizeof(float));

  std::vector<float> q(std::size_t(n * d)), k(q.size()), v(q.size()), o(q.size());
  fill(q, 1), fill(k, 2), fill(v, 3);
  const auto view = [&](const std::vector<float>& x) { return flashattn::bshd(x.data(), 1, n, 1, d); };
  const auto out = flashattn::bshd(o.data(), 1, n, 1, d);
  flashattn::AttentionOptions opts;
  flashattn::ByteCounter counter;

  // D1 as given to cachegrind by bench/io_sweep.py; L2 = L3 = the simulated LL.
  Eigen::setCpuCacheSizes(48 * 1024, m, m);
  g_sink = flush_caches(m);
  if (path == "naive") {
    flashattn::naive_attention_forward<float>(view(q), view(k), view(v), out, opts, {}, counter);
  } else if (path == "naive_blocked") {
    io::naive_forward_blocked(view(q), view(k), view(v), out, opts, tiles.block_q, tiles.block_kv, counter);
  } else if (path == "tiled") {
    io::with_tiles<io::IoSweepTileConfigs>(tiles, [&](auto config) {
      io::tiled_forward_unsplit<decltype(config), float>(view(q), view(k), view(v), out, opts, {}, counter);
    });
  } else if (path == "api") {
    io::with_tiles<ApiTiles>(tiles, [&](auto config) {
      flashattn::attention_forward(flashattn::cpu::Context<decltype(config)>{1}, view(q), view(k), view(v), out, opts,
                                   {}, counter);
    });
  }

  const io::Shape shape{n, n, d, sizeof(float), sizeof(float), false};
  const bool tiled = path == "tiled" || path == "api" || path == "naive_blocked";
  std::printf("path=%s n=%lld d=%lld m=%lld block_q=%d block_kv=%d counted_bytes=%lld exact_bytes=%lld "
              "model_bytes=%.0f checksum=%g\n",
              path.c_str(), (long long)n, (long long)d, (long long)m, tiled ? tiles.block_q : 0,
              tiled ? tiles.block_kv : 0, (long long)counter.total_bytes(),
              (long long)(path == "naive_blocked" ? io::naive_blocked_bytes(shape, tiles.block_q)
                          : tiled             ? io::tiled_bytes(shape, tiles.block_q)
                          : path == "naive"   ? io::naive_bytes(shape)
                                              : 0),
              path == "naive_blocked" || path == "naive" ? io::naive_model_bytes(shape)
              : tiled                                    ? io::tiled_model_bytes(shape, m)
                                                         : 0.0,
              double(o[0] + o[o.size() - 1]));
  return 0;
}
