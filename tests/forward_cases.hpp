#pragma once
// The forward-pass test cases, written once as a type-parameterised suite over (scalar, tile
// configuration) and instantiated by test_forward.cpp (the default instruction set, three tile shapes,
// every scalar) and test_forward_isa.cpp (every other instruction set this build can run). Two
// translation units so that the two halves compile in parallel.
//
// Every case compares the tiled kernel with the fp64 reference under the tolerance rule of
// tolerance.hpp, for the output and (where asked) the LSE.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "configs.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {

// One forward problem.
struct ForwardCase {
  index_t batch = 1, seq_q = 1, seq_k = 1, heads_q = 2, heads_kv = 2, dim = 16;
  Layout layout = Layout::Bshd;
  bool causal = false;
  index_t window_left = -1, window_right = -1;
  std::optional<double> scale;
  bool with_lse = true;
  int num_threads = 2;
  std::uint32_t seed = 1;

  AttentionOptions options() const {
    AttentionOptions o;
    o.scale = scale;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    return o;
  }
  // The backend context of the case: its tiles and its thread count.
  template <class Tiles>
  cpu::Context<Tiles> context() const {
    return {num_threads};
  }
  std::string describe() const {
    std::ostringstream s;
    s << "batch=" << batch << " seq_q=" << seq_q << " seq_k=" << seq_k << " heads_q=" << heads_q
      << " heads_kv=" << heads_kv << " dim=" << dim << " layout=" << (layout == Layout::Bshd ? "bshd" : "bhsd")
      << " causal=" << causal << " window=(" << window_left << ", " << window_right << ")";
    if (scale) s << " scale=" << *scale;
    return s.str();
  }
};

template <class Config>
class ForwardTest : public ::testing::Test {
 protected:
  using T = typename Config::T;
  using Tiles = typename Config::Tiles;
  static constexpr index_t BQ = Tiles::BlockQ;
  static constexpr index_t BKV = Tiles::BlockKV;

  void SetUp() override {
    if (!cpu_runs(Tiles::isa)) GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(Tiles::isa);
  }

  // 1, B - 1, B, B + 1, 3B + 7: a single row, a block one short, exact, one over, and several blocks
  // with a ragged tail. (B - 1 is dropped when it is 0.)
  static std::vector<index_t> lengths(index_t b) {
    std::vector<index_t> l{1};
    if (b - 1 > 1) l.push_back(b - 1);
    if (b > 1) l.push_back(b);
    l.push_back(b + 1);
    l.push_back(3 * b + 7);
    return l;
  }

  static T nan() { return T(std::numeric_limits<float>::quiet_NaN()); }

  // Runs one case with fresh random inputs; the output starts as NaN so that an unwritten element fails.
  void run(const ForwardCase& c) {
    HostTensor<T> q(c.layout, c.batch, c.seq_q, c.heads_q, c.dim);
    HostTensor<T> k(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim);
    HostTensor<T> v(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim);
    HostTensor<T> o(c.layout, c.batch, c.seq_q, c.heads_q, c.dim, nan());
    fill_normal(q.view(), c.seed);
    fill_normal(k.view(), c.seed + 1);
    fill_normal(v.view(), c.seed + 2);
    HostLse lse(c.batch, c.heads_q, c.seq_q);
    const LseView lse_view = c.with_lse ? lse.view() : LseView{};
    attention_forward(c.context<Tiles>(), q.cview(), k.cview(), v.cview(), o.view(), c.options(), lse_view);
    EXPECT_TRUE(matches_reference_for_options<T>(q.cview(), k.cview(), v.cview(), o.cview(), lse_view, c.options()))
        << c.describe();
  }
};

TYPED_TEST_SUITE_P(ForwardTest);

// Every pair of lengths around the query block size (seq_q) and the key block size (seq_k): ragged
// tails on both sides, and seq_q != seq_k in both directions.
TYPED_TEST_P(ForwardTest, SequenceLengths) {
  for (index_t sq : this->lengths(this->BQ))
    for (index_t sk : this->lengths(this->BKV)) {
      ForwardCase c;
      c.seq_q = sq;
      c.seq_k = sk;
      this->run(c);
    }
}

// The same grid with the causal mask aligned bottom-right: with seq_q > seq_k the first rows see no key
// (output 0, LSE −inf), with seq_q < seq_k the last row sees every key.
TYPED_TEST_P(ForwardTest, CausalSequenceLengths) {
  for (index_t sq : this->lengths(this->BQ))
    for (index_t sk : this->lengths(this->BKV)) {
      ForwardCase c;
      c.seq_q = sq;
      c.seq_k = sk;
      c.causal = true;
      this->run(c);
    }
}

// Causal with seq_q < seq_k spelled out: the last query sees every key, the first sees seq_k - seq_q + 1.
TYPED_TEST_P(ForwardTest, CausalIsBottomRightAligned) {
  using T = typename TestFixture::T;
  const index_t sq = 3, sk = 2 * this->BKV + 1, d = 8;
  HostTensor<T> q(Layout::Bshd, 1, sq, 1, d), k(Layout::Bshd, 1, sk, 1, d), v(Layout::Bshd, 1, sk, 1, d);
  HostTensor<T> o(Layout::Bshd, 1, sq, 1, d, this->nan());
  // Zero queries: every kept key has the same score, so each output is the mean of the keys it keeps.
  fill_normal(v.view(), 5);
  HostLse lse(1, 1, sq);
  AttentionOptions opts;
  opts.causal = true;
  attention_forward(cpu::Context<typename TestFixture::Tiles>{}, q.cview(), k.cview(), v.cview(), o.view(), opts,
                    lse.view());
  for (index_t i = 0; i < sq; ++i) {
    const index_t kept = sk - sq + 1 + i;
    EXPECT_NEAR(lse.view()(0, 0, i), std::log(double(kept)), 1e-5) << "row " << i;
    for (index_t c = 0; c < d; ++c) {
      double mean = 0;
      for (index_t j = 0; j < kept; ++j) mean += double(v.view()(0, j, 0, c));
      mean /= double(kept);
      EXPECT_NEAR(double(o.view()(0, i, 0, c)), mean, tiny_eps<T>(1.0, 2.0) + 1e-6) << "row " << i << " col " << c;
    }
  }
}

// Sliding windows on the bottom-right diagonal: symmetric, one-sided, zero-width, wider than a block.
TYPED_TEST_P(ForwardTest, SlidingWindow) {
  const index_t bq = this->BQ, bkv = this->BKV;
  const std::pair<index_t, index_t> sizes[] = {{3 * bq + 7, 3 * bkv + 7}, {bq + 1, 3 * bkv + 7}, {3 * bq + 7, bkv + 1}};
  const std::pair<index_t, index_t> windows[] = {{0, 0}, {1, 1}, {bkv / 2, 0}, {3, bq + 2}, {-1, 2}, {5, -1}};
  for (auto [sq, sk] : sizes)
    for (auto [left, right] : windows) {
      ForwardCase c;
      c.seq_q = sq;
      c.seq_k = sk;
      c.window_left = left;
      c.window_right = right;
      this->run(c);
    }
  // causal together with a left window: the window's right side is 0.
  ForwardCase c;
  c.seq_q = c.seq_k = 2 * bq + 3;
  c.causal = true;
  c.window_left = bkv / 2 + 1;
  this->run(c);
}

// Grouped-query attention: heads_q = ratio · heads_kv, query head h reads KV head h / ratio.
TYPED_TEST_P(ForwardTest, GroupedQueryRatios) {
  for (index_t ratio : {1, 2, 4, 8})
    for (bool causal : {false, true}) {
      ForwardCase c;
      c.heads_kv = 2;
      c.heads_q = 2 * ratio;
      c.seq_q = this->BQ + 1;
      c.seq_k = 2 * this->BKV + 3;
      c.causal = causal;
      this->run(c);
    }
  ForwardCase mqa;  // multi-query: one KV head for every query head
  mqa.heads_kv = 1;
  mqa.heads_q = 3;
  mqa.seq_q = mqa.seq_k = this->BQ + 5;
  this->run(mqa);
}

// Head dims 64 and 128 take the compile-time path, the others the runtime one.
TYPED_TEST_P(ForwardTest, HeadDims) {
  for (index_t d : {1, 5, 16, 64, 80, 128})
    for (bool causal : {false, true}) {
      ForwardCase c;
      c.dim = d;
      c.heads_q = c.heads_kv = 1;
      c.seq_q = this->BQ + 1;
      c.seq_k = this->BKV + 1;
      c.causal = causal;
      this->run(c);
    }
}

TYPED_TEST_P(ForwardTest, BatchesAndBhsdLayout) {
  for (Layout layout : {Layout::Bshd, Layout::Bhsd})
    for (bool causal : {false, true}) {
      ForwardCase c;
      c.batch = 3;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.seq_q = this->BQ + 3;
      c.seq_k = 2 * this->BKV + 1;
      c.layout = layout;
      c.causal = causal;
      c.dim = 64;
      this->run(c);
    }
}

TYPED_TEST_P(ForwardTest, CustomScale) {
  for (double scale : {0.05, 1.0, 2.5})
    for (bool causal : {false, true}) {
      ForwardCase c;
      c.seq_q = c.seq_k = this->BQ + this->BKV + 1;
      c.scale = scale;
      c.causal = causal;
      this->run(c);
    }
}

// Views over foreign layouts, no copies: q, k, v as strided slices of one fused QKV activation
// (batch, seq, heads_q + 2·heads_kv, dim); inputs with a non-unit dim stride; an output and an LSE with
// gaps between their rows, which must stay untouched.
TYPED_TEST_P(ForwardTest, FusedQkvAndStridedViews) {
  using T = typename TestFixture::T;
  const index_t batch = 2, seq = this->BQ + this->BKV / 2 + 1, hq = 4, hkv = 2, d = 16;
  const index_t row = (hq + 2 * hkv) * d;  // one token of the fused buffer
  std::vector<T> qkv(std::size_t(batch * seq * row));
  const TensorView<T> fused = bshd(qkv.data(), batch, seq, hq + 2 * hkv, d);
  fill_normal(fused, 11);
  const TensorView<const T> q{qkv.data(), batch, seq, hq, d, seq * row, row, d, 1};
  const TensorView<const T> k{qkv.data() + hq * d, batch, seq, hkv, d, seq * row, row, d, 1};
  const TensorView<const T> v{qkv.data() + (hq + hkv) * d, batch, seq, hkv, d, seq * row, row, d, 1};

  // o: BHSD with 3 padding elements after every row; lse: every other float.
  const T sentinel = T(7.0f);
  const index_t o_row = d + 3;
  std::vector<T> o_buf(std::size_t(batch * hq * seq * o_row), sentinel);
  const TensorView<T> o{o_buf.data(), batch, seq, hq, d, hq * seq * o_row, o_row, seq * o_row, 1};
  std::vector<float> lse_buf(std::size_t(2 * batch * hq * seq), -7.0f);
  const LseView lse{lse_buf.data(), batch, hq, seq, 2 * hq * seq, 2 * seq, 2};

  for (bool causal : {false, true}) {
    AttentionOptions opts;
    opts.causal = causal;
    attention_forward(cpu::Context<typename TestFixture::Tiles>{}, q, k, v, o, opts, lse);
    EXPECT_TRUE(matches_reference_for_options<T>(q, k, v, o, lse, opts)) << "causal=" << causal;
    for (std::size_t i = 0; i < o_buf.size(); ++i) {
      if (index_t(i) % o_row >= d) {
        ASSERT_EQ(float(o_buf[i]), float(sentinel)) << "o padding written at " << i;
      }
    }
    for (std::size_t i = 1; i < lse_buf.size(); i += 2) ASSERT_EQ(lse_buf[i], -7.0f) << "lse gap written at " << i;
  }

  // Non-unit dim strides: each input interleaved with another tensor (stride_dim 2), the output dim-major.
  const index_t sq = this->BQ + 2, sk = this->BKV + 3;
  std::vector<T> q_buf(std::size_t(2 * sq * hq * d)), kv_buf(std::size_t(2 * 2 * sk * hkv * d));
  const TensorView<T> qs{q_buf.data() + 1, 1, sq, hq, d, 2 * sq * hq * d, 2 * hq * d, 2 * d, 2};
  const TensorView<T> ks{kv_buf.data(), 1, sk, hkv, d, 4 * sk * hkv * d, 4 * hkv * d, 4 * d, 4};
  const TensorView<T> vs{kv_buf.data() + 2, 1, sk, hkv, d, 4 * sk * hkv * d, 4 * hkv * d, 4 * d, 4};
  fill_normal(qs, 12);
  fill_normal(ks, 13);
  fill_normal(vs, 14);
  std::vector<T> od_buf(std::size_t(sq * hq * d), this->nan());
  const TensorView<T> od{od_buf.data(), 1, sq, hq, d, sq * hq * d, 1, sq, sq * hq};  // (dim, heads, seq) order
  for (bool causal : {false, true}) {
    AttentionOptions opts;
    opts.causal = causal;
    attention_forward(cpu::Context<typename TestFixture::Tiles>{}, qs, ks, vs, od, opts);
    EXPECT_TRUE(matches_reference_for_options<T>(qs, ks, vs, od, LseView{}, opts)) << "causal=" << causal;
  }
}

// Few query blocks against many keys (decoding, a long prompt on one head): the backend splits the keys
// into ranges and merges the partial softmaxes. Includes rows that see no key of some ranges (a sliding
// window) and rows that see no key at all (causal with seq_q > seq_k).
TYPED_TEST_P(ForwardTest, SplitKeyRanges) {
  const index_t bq = this->BQ, bkv = this->BKV;
  struct Shape {
    index_t seq_q, seq_k;
    bool causal;
    index_t left, right;
  };
  const Shape shapes[] = {{1, 8 * bkv + 5, false, -1, -1},   {1, 16 * bkv, true, -1, -1},
                          {bq + 1, 12 * bkv + 3, false, -1, -1}, {bq + 1, 12 * bkv + 3, true, -1, -1},
                          {bq + 3, 9 * bkv, false, 2 * bkv, 1},  {8 * bkv + 9, 8 * bkv + 2, true, -1, -1}};
  for (const Shape& sh : shapes) {
    ForwardCase c;
    c.heads_q = c.heads_kv = 1;
    c.seq_q = sh.seq_q;
    c.seq_k = sh.seq_k;
    c.causal = sh.causal;
    c.window_left = sh.left;
    c.window_right = sh.right;
    this->run(c);
  }
}

// The same values in BSHD (rows of a head heads·dim apart: the worker keeps staged copies of the K/V tiles,
// cpu/staged_tile_cache.hpp) and in BHSD (contiguous rows: fp32 reads them in place) give the same bits, on
// one and two threads: whole tiles, tiles cut by a mask's edge (staged per block), split key ranges, GQA.
TYPED_TEST_P(ForwardTest, KeptKvTilesChangeNoBit) {
  using T = typename TestFixture::T;
  const index_t bq = this->BQ, bkv = this->BKV;
  struct Shape {
    index_t seq_q, seq_k;
    bool causal;
    index_t left, right;
  };
  const Shape shapes[] = {{3 * bq + 7, 3 * bkv + 5, false, -1, -1}, {3 * bq + 7, 3 * bkv + 5, true, -1, -1},
                          {2 * bq + 1, 2 * bq + 1, false, bkv / 2 + 3, 2}, {1, 12 * bkv + 3, false, -1, -1},
                          {bq + 1, 12 * bkv + 3, true, -1, -1}};
  for (const Shape& sh : shapes)
    for (int threads : {1, 2}) {
      ForwardCase c;
      c.batch = 2;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.dim = 40;
      c.seq_q = sh.seq_q;
      c.seq_k = sh.seq_k;
      c.causal = sh.causal;
      c.window_left = sh.left;
      c.window_right = sh.right;
      c.num_threads = threads;
      std::vector<double> out[2], lse_out[2];
      for (Layout layout : {Layout::Bshd, Layout::Bhsd}) {
        HostTensor<T> q(layout, c.batch, c.seq_q, c.heads_q, c.dim);
        HostTensor<T> k(layout, c.batch, c.seq_k, c.heads_kv, c.dim);
        HostTensor<T> v(layout, c.batch, c.seq_k, c.heads_kv, c.dim);
        HostTensor<T> o(layout, c.batch, c.seq_q, c.heads_q, c.dim, this->nan());
        fill_normal(q.view(), 21);
        fill_normal(k.view(), 22);
        fill_normal(v.view(), 23);
        HostLse lse(c.batch, c.heads_q, c.seq_q);
        attention_forward(c.template context<typename TestFixture::Tiles>(), q.cview(), k.cview(), v.cview(),
                          o.view(), c.options(), lse.view());
        out[int(layout)] = to_double(o.cview());
        lse_out[int(layout)] = to_double(lse.view());
      }
      ASSERT_EQ(out[0].size(), out[1].size());
      for (std::size_t i = 0; i < out[0].size(); ++i)
        ASSERT_EQ(std::memcmp(&out[0][i], &out[1][i], sizeof(double)), 0)
            << c.describe() << " threads=" << threads << " element " << i << ": " << out[0][i] << " vs " << out[1][i];
      for (std::size_t i = 0; i < lse_out[0].size(); ++i)
        ASSERT_EQ(std::memcmp(&lse_out[0][i], &lse_out[1][i], sizeof(double)), 0)
            << c.describe() << " threads=" << threads << " lse " << i;
    }
}

REGISTER_TYPED_TEST_SUITE_P(ForwardTest, SequenceLengths, CausalSequenceLengths, CausalIsBottomRightAligned,
                            SlidingWindow, GroupedQueryRatios, HeadDims, BatchesAndBhsdLayout, CustomScale,
                            FusedQkvAndStridedViews, SplitKeyRanges, KeptKvTilesChangeNoBit);

}  // namespace flashattn::testing
