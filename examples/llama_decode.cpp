// A small Llama-style decoder serving a batch of requests, the way an inference engine drives flashattn:
// RMSNorm, rotary position embeddings (RoPE), grouped-query attention over a paged KV cache, a SwiGLU
// feed-forward block, random weights.
//
//   1. prefill: each request's prompt (different lengths) goes through the model in chunks of `chunk`
//      tokens; each chunk's K/V rows are appended to the request's pages (kv_cache_append), then its
//      queries attend causally to everything the request has so far (attention_forward on the cache);
//   2. decode: all requests step together, one token each, greedy: append one K/V row per request, attend
//      with seq_q = 1 (the decode kernel), pick the next token.
//
// The cache is one pool of pages per layer (16 rows each, heads × rows × dim inside a page), handed out
// to requests as they grow, so requests' pages interleave in memory. The program prints prefill and decode
// tokens/s and the KV bytes, and checks the attention output of every layer in the first decode steps
// against the naive path (materialised scores, flashattn/reference/naive_forward.hpp) on the same keys
// gathered into a dense tensor. It exits non-zero when they disagree (it runs as a ctest smoke test).
//
// Usage: llama_decode [requests max_prompt gen_tokens layers [threads]]   defaults: 4 150 8 2, all threads

#include <flashattn/flashattn.hpp>
#include <flashattn/reference/naive_forward.hpp>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using flashattn::index_t;

constexpr int kVocab = 512, kModel = 512, kHeads = 8, kKvHeads = 2, kHeadDim = kModel / kHeads, kHidden = 1024;
constexpr int kPage = 16, kChunk = 64, kChecked = 2;  // decode steps checked against the naive path
constexpr float kRopeBase = 10000.0f, kEps = 1e-5f;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Matrix random_matrix(int rows, int cols, std::mt19937& gen) {
  std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(float(rows)));
  Matrix m(rows, cols);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = dist(gen);
  return m;
}

// Rows scaled to unit RMS (the learned gain is 1 here).
Matrix rms_norm(const Matrix& x) {
  Matrix y = x;
  for (index_t r = 0; r < x.rows(); ++r) y.row(r) *= 1.0f / std::sqrt(x.row(r).squaredNorm() / float(x.cols()) + kEps);
  return y;
}

// Rotates each head's pairs (i, i + dim/2) of row r by position pos[r] (the rotate-half convention).
void rope(Matrix& x, int heads, const std::vector<int>& pos) {
  const int half = kHeadDim / 2;
  for (index_t r = 0; r < x.rows(); ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const float angle = float(pos[std::size_t(r)]) * std::pow(kRopeBase, -2.0f * float(i) / float(kHeadDim));
        const float c = std::cos(angle), s = std::sin(angle);
        float& a = x(r, h * kHeadDim + i);
        float& b = x(r, h * kHeadDim + i + half);
        const float a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = a0 * s + b0 * c;
      }
}

struct Layer {
  Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
  explicit Layer(std::mt19937& gen)
      : wq(random_matrix(kModel, kHeads * kHeadDim, gen)),
        wk(random_matrix(kModel, kKvHeads * kHeadDim, gen)),
        wv(random_matrix(kModel, kKvHeads * kHeadDim, gen)),
        wo(random_matrix(kHeads * kHeadDim, kModel, gen)),
        w_gate(random_matrix(kModel, kHidden, gen)),
        w_up(random_matrix(kModel, kHidden, gen)),
        w_down(random_matrix(kHidden, kModel, gen)) {}
};

// One layer's paged K/V: a pool of pages shared by all requests, and the rows each request has in it
// (kv_cache_append advances them, so each layer keeps its own; they stay equal across layers).
struct LayerCache {
  std::vector<float> k, v;  // (pages, kv_heads, page rows, head dim): HND pages
  std::vector<std::int32_t> lengths;
};

// The block table all layers share: request b's i-th page is the same page index in every layer's pool.
struct PagedState {
  int requests = 0, max_pages = 0, pages = 0, next_free = 0;
  std::vector<std::int32_t> table;
  // Gives request b, which has `len` rows, the pages its next `n` rows need, from the shared pool.
  void reserve(int b, int len, int n) {
    for (int i = (len + kPage - 1) / kPage; i < (len + n + kPage - 1) / kPage; ++i)
      table[std::size_t(b * max_pages + i)] = next_free++;
  }
};

struct Model {
  Matrix embedding;  // (vocab, d_model)
  Matrix unembed;    // (d_model, vocab): the logits
  std::vector<Layer> layers;
  Model(int n_layers, std::mt19937& gen)
      : embedding(random_matrix(kVocab, kModel, gen) * 16.0f), unembed(random_matrix(kModel, kVocab, gen)) {
    for (int l = 0; l < n_layers; ++l) layers.emplace_back(gen);
  }
};

struct Checker {
  double max_err = 0;
  int checks = 0;
};

// The same attention by the naive path on request b's keys gathered into a dense (1, len, kv_heads, dim)
// tensor; returns max |a − naive|.
double naive_difference(const flashattn::PagedKvCacheView<float>& cache, int b, const Matrix& q_row,
                        const Matrix& attn_row) {
  const index_t len = cache.lengths[b];
  std::vector<float> k(std::size_t(len * kKvHeads * kHeadDim)), v(k.size()), o(std::size_t(kHeads * kHeadDim));
  const auto kd = flashattn::bshd(k.data(), 1, len, kKvHeads, kHeadDim), vd = flashattn::bshd(v.data(), 1, len, kKvHeads, kHeadDim);
  for (index_t s = 0; s < len; ++s)
    for (int h = 0; h < kKvHeads; ++h)
      for (int d = 0; d < kHeadDim; ++d) {
        kd(0, s, h, d) = cache.k_pages(cache.page_of(b, s), s % kPage, h, d);
        vd(0, s, h, d) = cache.v_pages(cache.page_of(b, s), s % kPage, h, d);
      }
  flashattn::naive_attention_forward<float>(flashattn::bshd(q_row.data(), 1, 1, kHeads, kHeadDim), kd, vd,
                                            flashattn::bshd(o.data(), 1, 1, kHeads, kHeadDim));
  double err = 0;
  for (int i = 0; i < kHeads * kHeadDim; ++i) err = std::max(err, double(std::fabs(o[std::size_t(i)] - attn_row(0, i))));
  return err;
}

// Runs `tokens` (rows: requests' tokens, all of request `first` .. first + n_req, `per_req` each, at
// positions pos) through the model, appending their K/V to the cache. Returns the last hidden rows.
// `check`: compare each layer's attention against the naive path (decode steps).
Matrix forward(Model& m, std::vector<LayerCache>& caches, PagedState& st, const flashattn::cpu::Context<>& ctx,
               const std::vector<int>& tokens, const std::vector<int>& pos, int first, int n_req, int per_req,
               Checker* check) {
  Matrix x(index_t(tokens.size()), kModel);
  for (std::size_t r = 0; r < tokens.size(); ++r) x.row(index_t(r)) = m.embedding.row(tokens[r]);
  flashattn::AttentionOptions causal;
  causal.causal = true;
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    const Layer& w = m.layers[l];
    const Matrix h = rms_norm(x);
    Matrix q = h * w.wq, k = h * w.wk, v = h * w.wv;  // rows: (request, token)
    rope(q, kHeads, pos);
    rope(k, kKvHeads, pos);
    // The cache of these requests: the pool's pages, their rows of the table, their lengths.
    auto cache = flashattn::paged_kv_cache_hnd(caches[l].k.data(), caches[l].v.data(), st.pages, kPage, kKvHeads,
                                               kHeadDim, st.table.data() + first * st.max_pages, n_req, st.max_pages,
                                               caches[l].lengths.data() + first);
    flashattn::kv_cache_append(cache, flashattn::bshd<const float>(k.data(), n_req, per_req, kKvHeads, kHeadDim),
                               flashattn::bshd<const float>(v.data(), n_req, per_req, kKvHeads, kHeadDim));
    Matrix attn(x.rows(), kHeads * kHeadDim);
    flashattn::attention_forward(ctx, flashattn::bshd<const float>(q.data(), n_req, per_req, kHeads, kHeadDim),
                                 flashattn::PagedKvCacheView<const float>(cache),
                                 flashattn::bshd(attn.data(), n_req, per_req, kHeads, kHeadDim), causal);
    if (check != nullptr)  // one row per request in a decode step
      for (int b = 0; b < n_req; ++b) {
        check->max_err = std::max(check->max_err, naive_difference(cache, b, q.row(b), attn.row(b)));
        ++check->checks;
      }
    x += attn * w.wo;
    const Matrix g = rms_norm(x);
    const Matrix gate = g * w.w_gate, up = g * w.w_up;
    Matrix act = gate.array() / (1.0f + (-gate.array()).exp()) * up.array();  // SwiGLU: silu(gate) · up
    x += act * w.w_down;
  }
  return rms_norm(x);
}

int argmax_token(const Model& m, const Matrix& hidden_row) {
  const Eigen::RowVectorXf logits = hidden_row * m.unembed;
  Eigen::Index best = 0;
  logits.maxCoeff(&best);
  return int(best);
}

}  // namespace

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 4;
  const int max_prompt = argc > 2 ? std::atoi(argv[2]) : 150;
  const int gen_tokens = argc > 3 ? std::atoi(argv[3]) : 8;
  const int n_layers = argc > 4 ? std::atoi(argv[4]) : 2;
  const flashattn::cpu::Context<> ctx{argc > 5 ? std::atoi(argv[5]) : 0};
  if (requests < 1 || max_prompt < 1 || gen_tokens < 1 || n_layers < 1) {
    std::fprintf(stderr, "usage: llama_decode [requests max_prompt gen_tokens layers [threads]]\n");
    return 2;
  }

  std::mt19937 gen(2026);
  Model model(n_layers, gen);
  // Prompts of different lengths: from max_prompt / 8 up to max_prompt.
  std::vector<std::vector<int>> prompts(static_cast<std::size_t>(requests));
  std::uniform_int_distribution<int> token(0, kVocab - 1);
  for (int b = 0; b < requests; ++b) {
    const int len = std::max(1, max_prompt / 8 + (max_prompt - max_prompt / 8) * b / std::max(1, requests - 1));
    for (int i = 0; i < len; ++i) prompts[std::size_t(b)].push_back(token(gen));
  }

  PagedState st;
  st.requests = requests;
  st.max_pages = (max_prompt + gen_tokens + kPage - 1) / kPage;
  st.pages = requests * st.max_pages;
  st.table.assign(std::size_t(requests * st.max_pages), -1);
  std::vector<LayerCache> caches(static_cast<std::size_t>(n_layers));
  for (auto& c : caches) {
    c.k.assign(std::size_t(st.pages) * kPage * kKvHeads * kHeadDim, 0.0f);
    c.v.assign(c.k.size(), 0.0f);
    c.lengths.assign(std::size_t(requests), 0);
  }
  const std::vector<std::int32_t>& lengths = caches[0].lengths;  // rows per request, every layer alike

  // 1. Prefill, chunk by chunk, request after request (their pages interleave in the pool).
  std::vector<int> next(static_cast<std::size_t>(requests));
  std::size_t prompt_tokens = 0;
  const double t0 = now();
  for (int start = 0; start < max_prompt; start += kChunk)
    for (int b = 0; b < requests; ++b) {
      const std::vector<int>& p = prompts[std::size_t(b)];
      if (start >= int(p.size())) continue;
      const int n = std::min<int>(kChunk, int(p.size()) - start);
      std::vector<int> toks(p.begin() + start, p.begin() + start + n), pos(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) pos[std::size_t(i)] = start + i;
      st.reserve(b, lengths[std::size_t(b)], n);
      const Matrix hidden = forward(model, caches, st, ctx, toks, pos, b, 1, n, nullptr);
      prompt_tokens += std::size_t(n);
      if (start + n == int(p.size())) next[std::size_t(b)] = argmax_token(model, hidden.row(n - 1));
    }
  const double t_prefill = now() - t0;

  // 2. Decode: every request one token per step.
  Checker check;
  std::vector<std::vector<int>> generated(static_cast<std::size_t>(requests));
  const double t1 = now();
  for (int step = 0; step < gen_tokens; ++step) {
    std::vector<int> pos(static_cast<std::size_t>(requests));
    for (int b = 0; b < requests; ++b) {
      generated[std::size_t(b)].push_back(next[std::size_t(b)]);
      pos[std::size_t(b)] = lengths[std::size_t(b)];
      st.reserve(b, lengths[std::size_t(b)], 1);
    }
    const Matrix hidden = forward(model, caches, st, ctx, next, pos, 0, requests, 1, step < kChecked ? &check : nullptr);
    for (int b = 0; b < requests; ++b) next[std::size_t(b)] = argmax_token(model, hidden.row(b));
  }
  const double t_decode = now() - t1;

  std::size_t kv_rows = 0;
  for (auto l : lengths) kv_rows += std::size_t(l);
  const double kv_bytes = double(kv_rows) * 2.0 * kKvHeads * kHeadDim * sizeof(float) * n_layers;
  std::printf("requests %d (prompts %zu..%zu tokens), %d layers, d_model %d, %d:%d heads of %d, pages of %d rows\n",
              requests, prompts.front().size(), prompts.back().size(), n_layers, kModel, kHeads, kKvHeads,
              kHeadDim, kPage);
  std::printf("prefill: %zu tokens in %.3f s = %.0f tokens/s (chunks of %d)\n", prompt_tokens, t_prefill,
              double(prompt_tokens) / t_prefill, kChunk);
  std::printf("decode:  %d steps x %d requests in %.3f s = %.0f tokens/s\n", gen_tokens, requests, t_decode,
              double(gen_tokens * requests) / t_decode);
  std::printf("KV cache: %zu rows in use, %.2f MB (fp32, all layers), %d of %d pages\n", kv_rows, kv_bytes * 1e-6,
              st.next_free, st.pages);
  std::printf("request 0 generated:");
  for (int t : generated[0]) std::printf(" %d", t);
  std::printf("\nattention vs naive (first %d decode steps, every layer, %d rows): max |diff| = %.3g\n", kChecked,
              check.checks, check.max_err);
  const bool ok = check.checks == kChecked * requests * n_layers && check.max_err < 1e-4;
  std::printf("%s\n", ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}
