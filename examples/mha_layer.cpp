// The multi-head self-attention layer of a small decoder model, written the way a C++ model would hold it:
// activations are Eigen row-major matrices of shape (batch·seq, d_model), the projections are Eigen GEMMs,
// and flashattn runs on views of the projected activations, with no copy and no transpose.
//
//   [Q | K | V] = X · [Wq | Wk | Wv]      one fused GEMM, (batch·seq, 3·d_model)
//   A = attention(Q, K, V), causal         per head; Q, K, V are strided column slices of the fused result
//   Y = A · Wo                             (batch·seq, d_model)
//
// The attention is computed twice, by flashattn's tiled kernel and by the naive one (materialised score
// matrix, flashattn/reference/naive_forward.hpp); the program prints both timings and the max abs error
// between them, and exits non-zero when the error exceeds the tolerance (it runs as a ctest smoke test).
//
// Usage: mha_layer [batch seq d_model heads [threads]]    defaults: 4 512 256 8, all hardware threads

#include <flashattn/flashattn.hpp>
#include <flashattn/reference/naive_forward.hpp>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Config {
  int batch = 4;
  int seq = 512;
  int d_model = 256;
  int heads = 8;
  int threads = 0;  // 0: flashattn's default (every hardware thread)
};

// The layer's parameters, initialised as a model would be (uniform, variance ~ 1/d_model).
struct MhaLayer {
  Config cfg;
  Matrix w_qkv;  // (d_model, 3·d_model): [Wq | Wk | Wv]
  Matrix w_o;    // (d_model, d_model)

  explicit MhaLayer(const Config& c) : cfg(c) {
    const float bound = std::sqrt(3.0f / float(c.d_model));
    const Matrix wq = bound * Matrix::Random(c.d_model, c.d_model);
    const Matrix wk = bound * Matrix::Random(c.d_model, c.d_model);
    const Matrix wv = bound * Matrix::Random(c.d_model, c.d_model);
    w_qkv.resize(c.d_model, 3 * c.d_model);
    w_qkv << wq, wk, wv;
    w_o = bound * Matrix::Random(c.d_model, c.d_model);
  }

  int head_dim() const { return cfg.d_model / cfg.heads; }

  // Q, K or V (which = 0, 1, 2) of every head as a view into the fused projection, no copy: row
  // (b, s) of the fused matrix holds [q heads | k heads | v heads], so the view starts `which·d_model`
  // columns in and steps 3·d_model elements from one position to the next.
  flashattn::TensorView<const float> qkv_view(const Matrix& qkv, int which) const {
    const flashattn::index_t d_model = cfg.d_model, row = 3 * d_model;
    return {qkv.data() + which * d_model,
            cfg.batch, cfg.seq, cfg.heads, head_dim(),
            /*stride_batch=*/cfg.seq * row, /*stride_seq=*/row, /*stride_head=*/head_dim(), /*stride_dim=*/1};
  }

  // The attention output A (batch·seq, d_model) is plain BSHD: heads side by side in each row.
  flashattn::TensorView<float> out_view(Matrix& a) const {
    return flashattn::bshd(a.data(), cfg.batch, cfg.seq, cfg.heads, head_dim());
  }

  // What to compute: causal attention with SDPA's default scale.
  flashattn::AttentionOptions options() const {
    flashattn::AttentionOptions o;
    o.causal = true;
    return o;
  }

  // How to run it: the CPU backend on cfg.threads threads (0: every hardware thread), its default tiles.
  flashattn::cpu::Context<> context() const { return flashattn::cpu::Context<>{cfg.threads}; }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best of `reps` runs: the least disturbed by whatever else the machine is doing.
template <class F>
double best_time(int reps, F&& f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

int parse(const char* s, const char* name) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0 || v > (1L << 24)) {
    std::fprintf(stderr, "mha_layer: bad %s '%s'\n", name, s);
    std::exit(2);
  }
  return int(v);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (argc != 1 && argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s [batch seq d_model heads [threads]]\n", argv[0]);
    return 2;
  }
  if (argc >= 5) {
    cfg.batch = parse(argv[1], "batch");
    cfg.seq = parse(argv[2], "seq");
    cfg.d_model = parse(argv[3], "d_model");
    cfg.heads = parse(argv[4], "heads");
  }
  if (argc == 6) cfg.threads = parse(argv[5], "threads");
  if (cfg.heads < 1 || cfg.d_model % cfg.heads != 0) {
    std::fprintf(stderr, "mha_layer: d_model (%d) must be a multiple of heads (%d)\n", cfg.d_model, cfg.heads);
    return 2;
  }

  std::srand(42);  // Eigen's Random() draws from std::rand: a fixed seed makes the run repeatable
  const MhaLayer layer(cfg);
  const Matrix x = Matrix::Random(Eigen::Index(cfg.batch) * cfg.seq, cfg.d_model);  // the layer's input

  const Matrix qkv = x * layer.w_qkv;  // (batch·seq, 3·d_model)
  const auto q = layer.qkv_view(qkv, 0), k = layer.qkv_view(qkv, 1), v = layer.qkv_view(qkv, 2);
  Matrix a_tiled(x.rows(), cfg.d_model), a_naive(x.rows(), cfg.d_model);
  const flashattn::AttentionOptions options = layer.options();
  const flashattn::cpu::Context<> context = layer.context();

  const int reps = 3;
  const double t_tiled = best_time(reps, [&] {
    flashattn::attention_forward(context, q, k, v, layer.out_view(a_tiled), options);
  });
  // The naive path runs on one thread (Eigen's GEMMs without OpenMP), so the tiled kernel is also timed
  // on one thread: that ratio is the algorithm's, the other adds the threads.
  const flashattn::cpu::Context<> one_thread{1};
  Matrix a_tiled_1(x.rows(), cfg.d_model);
  const double t_tiled_1 = best_time(reps, [&] {
    flashattn::attention_forward(one_thread, q, k, v, layer.out_view(a_tiled_1), options);
  });
  const double t_naive = best_time(reps, [&] {
    flashattn::naive_attention_forward<float>(q, k, v, layer.out_view(a_naive), options);
  });
  const Matrix y_tiled = a_tiled * layer.w_o, y_naive = a_naive * layer.w_o;

  const double err_attn = std::max((a_tiled - a_naive).cwiseAbs().maxCoeff(), (a_tiled_1 - a_naive).cwiseAbs().maxCoeff());
  const double err_out = (y_tiled - y_naive).cwiseAbs().maxCoeff();
  // Both paths accumulate in fp32 over seq keys of |v| <~ 1; they differ only in summation order, so
  // their gap is a few ulps of the output's size. 1e-4 leaves an order of magnitude of headroom.
  const double tolerance = 1e-4;

  // Causal attention FLOPs: 4·B·H·N²·d, halved by the mask.
  const double flops = 2.0 * double(cfg.batch) * cfg.heads * double(cfg.seq) * cfg.seq * layer.head_dim();
  std::printf("multi-head attention layer: batch %d, seq %d, d_model %d, heads %d (head dim %d), causal, fp32\n",
              cfg.batch, cfg.seq, cfg.d_model, cfg.heads, layer.head_dim());
  const int threads = cfg.threads > 0 ? cfg.threads : flashattn::cpu::default_num_threads();
  std::printf("  attention, naive (S in RAM), 1 thread : %9.3f ms  (%6.1f GFLOP/s)\n", 1e3 * t_naive,
              flops / t_naive * 1e-9);
  std::printf("  attention, flashattn tiled, 1 thread  : %9.3f ms  (%6.1f GFLOP/s)  %6.2f x naive\n",
              1e3 * t_tiled_1, flops / t_tiled_1 * 1e-9, t_naive / t_tiled_1);
  std::printf("  attention, flashattn tiled, %2d threads: %9.3f ms  (%6.1f GFLOP/s)  %6.2f x naive\n", threads,
              1e3 * t_tiled, flops / t_tiled * 1e-9, t_naive / t_tiled);
  std::printf("  (best of %d runs each, all in this one process)\n", reps);
  std::printf("  max |tiled - naive|: attention output %.3g, layer output %.3g (tolerance %.0e)\n", err_attn,
              err_out, tolerance);

  if (!(err_attn <= tolerance) || !(err_out <= tolerance)) {
    std::fprintf(stderr, "mha_layer: FAILED: the tiled and naive results differ by more than %.0e\n", tolerance);
    return 1;
  }
  std::printf("  OK\n");
  return 0;
}
