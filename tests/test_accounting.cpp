// Accounting policies and the IO model: the bytes the kernels report equal the analytic formulas of
// bench/io_model.hpp for the tile configuration used (exactly, not approximately), NoAccounting costs
// nothing, and the tracked scratch of the tiled path does not grow with the sequence length.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../bench/io_model.hpp"
#include "../bench/io_naive.hpp"
#include "../bench/io_tiled.hpp"
#include "flashattn/core/kv_source.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/forward_kernel.hpp"
#include "flashattn/cpu/staged_tile_cache.hpp"
#include "flashattn/flashattn.hpp"
#include "flashattn/reference/naive_forward.hpp"

namespace {

using flashattn::ByteCounter;
using flashattn::index_t;
using flashattn::Traffic;
namespace io = flashattn::bench::io;

// Q, K, V, O for (batch, seq, heads, dim) in BSHD, with an optional LSE.
template <class T>
struct Problem {
  index_t batch, seq_q, seq_k, heads_q, heads_kv, dim;
  std::vector<T> q, k, v, o;
  std::vector<float> lse;
  Problem(index_t b, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d)
      : batch(b), seq_q(sq), seq_k(sk), heads_q(hq), heads_kv(hkv), dim(d),
        q(std::size_t(b * sq * hq * d)), k(std::size_t(b * sk * hkv * d)), v(k.size()), o(q.size()),
        lse(std::size_t(b * hq * sq)) {
    std::mt19937 gen(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto* x : {&q, &k, &v})
      for (auto& e : *x) e = T(dist(gen));
  }
  flashattn::TensorView<const T> qv() const { return flashattn::bshd(q.data(), batch, seq_q, heads_q, dim); }
  flashattn::TensorView<const T> kv(const std::vector<T>& x) const {
    return flashattn::bshd(x.data(), batch, seq_k, heads_kv, dim);
  }
  flashattn::TensorView<T> ov() { return flashattn::bshd(o.data(), batch, seq_q, heads_q, dim); }
  flashattn::LseView lv() { return flashattn::lse_bhs(lse.data(), batch, heads_q, seq_q); }

  // The formulas are per (batch, query head): every query head's programs read their K/V head.
  io::Shape shape(bool with_lse) const {
    return {seq_q, seq_k, dim, index_t(sizeof(T)), index_t(sizeof(flashattn::cpu::acc_t<T>)), with_lse};
  }
  index_t heads_total() const { return batch * heads_q; }
};

// ---- NoAccounting is free ------------------------------------------------------------------------------

TEST(NoAccounting, IsAnEmptyPolicyThatRecordsNothing) {
  static_assert(std::is_empty_v<flashattn::NoAccounting>, "NoAccounting must carry no state");
  static_assert(std::is_trivially_copyable_v<flashattn::NoAccounting>);
  static_assert(std::is_trivially_default_constructible_v<flashattn::NoAccounting>);
  static_assert(!flashattn::NoAccounting::enabled && ByteCounter::enabled);
  // The empty-base optimisation applies: a type that derives from it pays no storage for it.
  struct Holder : flashattn::NoAccounting {
    int x;
  };
  EXPECT_EQ(sizeof(Holder), sizeof(int));
}

TEST(NoAccounting, ResultsAreBitIdenticalWithAndWithoutCounting) {
  Problem<float> a(1, 77, 91, 2, 2, 64), b = a;
  flashattn::AttentionOptions opts;
  const flashattn::cpu::Context<> one_thread{1};
  flashattn::attention_forward(one_thread, a.qv(), a.kv(a.k), a.kv(a.v), a.ov(), opts, a.lv());
  ByteCounter counter;
  flashattn::attention_forward(one_thread, b.qv(), b.kv(b.k), b.kv(b.v), b.ov(), opts, b.lv(), counter);
  EXPECT_GT(counter.total_bytes(), 0);
  EXPECT_EQ(0, std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
}

// ---- tiled: counted bytes == formula ----------------------------------------------------------------------

template <class T, class TileConfig>
struct Case {
  using Scalar = T;
  using Tiles = TileConfig;
};

template <class C>
class TiledCounts : public ::testing::Test {};

// Bytes one worker writes when it keeps every staged K/V tile of every (batch, KV head) of p once
// (cpu/staged_tile_cache.hpp): the K and/or V tiles the storage ops stage or copy for this layout.
template <class T, class Tiles>
index_t one_fill_of_kept_tiles(const Problem<T>& p) {
  using Ops = typename flashattn::cpu::ForwardKernel<T, Tiles, 0>::Ops;
  const int d = int(p.dim);
  const index_t matrices = index_t(Ops::keeps_qk_tiles(flashattn::dense_kv(p.kv(p.k)), d)) +
                           index_t(Ops::keeps_pv_tiles(flashattn::dense_kv(p.kv(p.v)), d));
  return p.batch * p.heads_kv * matrices * p.seq_k * p.dim * index_t(sizeof(typename Ops::StagedElem));
}

// The traffic the IO model describes: everything but the kept copies of K/V tiles, counted apart.
inline std::int64_t model_bytes(const ByteCounter& c) { return c.total_bytes() - c.written_bytes(Traffic::StagedTiles); }

using TiledCases = ::testing::Types<Case<float, flashattn::cpu::Tiles<16, 64>>, Case<float, flashattn::cpu::Tiles<32, 16>>,
                                    Case<float, flashattn::cpu::Tiles<64, 64>>, Case<float, flashattn::cpu::Tiles<256, 32>>,
                                    Case<double, flashattn::cpu::Tiles<16, 32>>,
                                    Case<Eigen::bfloat16, flashattn::cpu::Tiles<32, 64>>>;
struct CaseName {
  template <class C>
  static std::string GetName(int) {
    using T = typename C::Scalar;
    const char* dtype = std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, double> ? "fp64" : "bf16";
    return std::string(dtype) + "_" + std::to_string(C::Tiles::BlockQ) + "x" + std::to_string(C::Tiles::BlockKV);
  }
};
TYPED_TEST_SUITE(TiledCounts, TiledCases, CaseName);

// The model's schedule (one worker, no split): Q and O once, K and V once per query block, per head.
TYPED_TEST(TiledCounts, UnsplitScheduleMatchesFormulaPerArray) {
  using T = typename TypeParam::Scalar;
  using Tiles = typename TypeParam::Tiles;
  constexpr index_t bq = Tiles::BlockQ;
  struct Dims {
    index_t b, sq, sk, hq, hkv, d;
  };
  for (Dims s : {Dims{1, 1, 1, 1, 1, 64}, Dims{1, bq - 1, 3 * bq + 7, 1, 1, 64}, Dims{2, 3 * bq + 7, bq + 1, 2, 1, 40},
                 Dims{1, 2 * bq, 2 * bq, 1, 1, 128}}) {
    for (bool with_lse : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "sq=" << s.sq << " sk=" << s.sk << " d=" << s.d << " lse=" << with_lse);
      Problem<T> p(s.b, s.sq, s.sk, s.hq, s.hkv, s.d);
      ByteCounter c;
      io::tiled_forward_unsplit<Tiles, T>(p.qv(), p.kv(p.k), p.kv(p.v), p.ov(), {}, with_lse ? p.lv() : flashattn::LseView{}, c);
      const io::Shape shape = p.shape(with_lse);
      const index_t e = index_t(sizeof(T)), heads = p.heads_total(), blocks = io::ceil_div(s.sq, bq);
      EXPECT_EQ(c.read_bytes(Traffic::Q), heads * s.sq * s.d * e);
      EXPECT_EQ(c.read_bytes(Traffic::K), heads * blocks * s.sk * s.d * e);
      EXPECT_EQ(c.read_bytes(Traffic::V), heads * blocks * s.sk * s.d * e);
      EXPECT_EQ(c.written_bytes(Traffic::O), heads * s.sq * s.d * e);
      EXPECT_EQ(c.written_bytes(Traffic::Lse), with_lse ? heads * s.sq * 4 : 0);
      EXPECT_EQ(c.written_bytes(Traffic::S) + c.read_bytes(Traffic::S) + c.written_bytes(Traffic::P) +
                    c.read_bytes(Traffic::P),
                0);
      EXPECT_EQ(model_bytes(c), heads * io::tiled_bytes(shape, bq));
      // One worker, heads in order: each kept tile is staged once per (batch, KV head).
      EXPECT_EQ(c.written_bytes(Traffic::StagedTiles), (one_fill_of_kept_tiles<T, Tiles>(p)));
    }
  }
}

TYPED_TEST(TiledCounts, CausalMatchesFormula) {
  using T = typename TypeParam::Scalar;
  using Tiles = typename TypeParam::Tiles;
  constexpr index_t bq = Tiles::BlockQ;
  flashattn::AttentionOptions opts;
  opts.causal = true;
  // seq_q < seq_k (a chunk of queries at the end), seq_q > seq_k (leading rows keep no key), equal.
  for (auto [sq, sk] : {std::pair<index_t, index_t>{2 * bq + 3, 5 * bq + 1}, {3 * bq + 5, bq + 2}, {4 * bq, 4 * bq}}) {
    SCOPED_TRACE(::testing::Message() << "sq=" << sq << " sk=" << sk);
    Problem<T> p(1, sq, sk, 1, 1, 64);
    ByteCounter c;
    io::tiled_forward_unsplit<Tiles, T>(p.qv(), p.kv(p.k), p.kv(p.v), p.ov(), opts, {}, c);
    const io::Shape shape = p.shape(false);
    EXPECT_EQ(c.read_bytes(Traffic::K), io::tiled_kv_rows_causal(shape, bq) * 64 * index_t(sizeof(T)));
    EXPECT_EQ(model_bytes(c), io::tiled_bytes_causal(shape, bq));
    EXPECT_LT(model_bytes(c), io::tiled_bytes(shape, bq));
    // The last query block, run first, sees every key tile whole.
    EXPECT_EQ(c.written_bytes(Traffic::StagedTiles), (one_fill_of_kept_tiles<T, Tiles>(p)));
  }
}

// The public API runs the same schedule whenever it has enough query blocks not to split the keys (>= 64
// work items), on any number of threads.
TYPED_TEST(TiledCounts, PublicApiWithoutSplitMatchesFormulaOnAnyThreadCount) {
  using T = typename TypeParam::Scalar;
  using Tiles = typename TypeParam::Tiles;
  constexpr index_t bq = Tiles::BlockQ;
  const index_t sq = 8 * bq + 3;  // 9 query blocks x 8 heads = 72 work items
  for (bool causal : {false, true})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "causal=" << causal << " threads=" << threads);
      Problem<T> p(2, sq, sq + 5, 4, 2, 64);
      flashattn::AttentionOptions opts;
      opts.causal = causal;
      ByteCounter c;
      flashattn::attention_forward(flashattn::cpu::Context<Tiles>{threads}, p.qv(), p.kv(p.k), p.kv(p.v), p.ov(), opts,
                                   p.lv(), c);
      const io::Shape shape = p.shape(true);
      EXPECT_EQ(model_bytes(c),
                p.heads_total() * (causal ? io::tiled_bytes_causal(shape, bq) : io::tiled_bytes(shape, bq)));
      // Each worker stages a kept tile at most once per head: one fill on one thread, at most one per thread.
      const index_t fill = one_fill_of_kept_tiles<T, Tiles>(p);
      EXPECT_GT(fill, 0);  // BSHD with two KV heads: rows are strided, so tiles are kept
      if (threads == 1) {
        EXPECT_EQ(c.written_bytes(Traffic::StagedTiles), fill);
      }
      EXPECT_GE(c.written_bytes(Traffic::StagedTiles), fill);
      EXPECT_LE(c.written_bytes(Traffic::StagedTiles), threads * fill);
    }
}

// ---- naive: S and P in main memory ------------------------------------------------------------------------

TEST(NaiveCounts, MatchFormula) {
  for (bool with_lse : {false, true}) {
    Problem<float> p(2, 70, 33, 2, 1, 40);
    ByteCounter c;
    flashattn::naive_attention_forward<float>(p.qv(), p.kv(p.k), p.kv(p.v), p.ov(), {},
                                              with_lse ? p.lv() : flashattn::LseView{}, c);
    const io::Shape shape = p.shape(with_lse);
    EXPECT_EQ(c.written_bytes(Traffic::S), p.heads_total() * 70 * 33 * 4);
    EXPECT_EQ(c.read_bytes(Traffic::P), p.heads_total() * 70 * 33 * 4);
    EXPECT_EQ(c.total_bytes(), p.heads_total() * io::naive_bytes(shape));
  }
}

// The blocked naive schedule of the IO sweep: its counts are the formula, for tails in both dimensions, and
// its output is the naive one (the same sums, blocked differently: a few float ulps apart).
TEST(NaiveCounts, BlockedMatchesFormulaAndNaiveOutput) {
  Problem<float> p(2, 70, 33, 2, 1, 40);
  std::vector<float> o_naive(p.o.size());
  flashattn::naive_attention_forward<float>(p.qv(), p.kv(p.k), p.kv(p.v),
                                            flashattn::bshd(o_naive.data(), 2, 70, 2, 40));
  for (auto [bq, bk] : {std::pair<index_t, index_t>{16, 16}, {32, 64}, {128, 32}}) {
    ByteCounter c;
    io::naive_forward_blocked(p.qv(), p.kv(p.k), p.kv(p.v), p.ov(), {}, bq, bk, c);
    const io::Shape shape = p.shape(false);
    EXPECT_EQ(c.read_bytes(Traffic::K), p.heads_total() * io::ceil_div(70, bq) * 33 * 40 * 4);
    EXPECT_EQ(c.written_bytes(Traffic::S), p.heads_total() * 70 * 33 * 4);
    EXPECT_EQ(c.read_bytes(Traffic::P), p.heads_total() * 70 * 33 * 4);
    EXPECT_EQ(c.total_bytes(), p.heads_total() * io::naive_blocked_bytes(shape, bq));
    float worst = 0;
    for (std::size_t i = 0; i < o_naive.size(); ++i) worst = std::max(worst, std::abs(p.o[i] - o_naive[i]));
    EXPECT_LT(worst, 1e-5f) << bq << " x " << bk;
  }
}

// ---- scratch: O(tile), not O(N) ---------------------------------------------------------------------------

// Peak tracked scratch of one unsplit tiled call on one worker: exactly one kernel Scratch, whatever N.
TEST(TiledScratch, IsOneWorkerScratchIndependentOfSequenceLength) {
  using Tiles = flashattn::cpu::Tiles<64, 64>;
  using Kernel = flashattn::cpu::ForwardKernel<float, Tiles, 64>;
  const std::int64_t base = flashattn::cpu::scratch_stats().current_bytes;
  std::int64_t one_scratch = 0;
  {
    Kernel::Scratch s(64, 64);
    one_scratch = flashattn::cpu::scratch_stats().current_bytes - base;
  }
  // At least the Q block and its O accumulator (Algorithm 1's held block), in fp32.
  EXPECT_GE(one_scratch, 2 * 64 * Tiles::BlockQ * 4);
  for (index_t n : {64, 1000, 4096}) {
    Problem<float> p(1, n, n, 1, 1, 64);
    flashattn::cpu::reset_scratch_peak();
    io::tiled_forward_unsplit<Tiles, float>(p.qv(), p.kv(p.k), p.kv(p.v), p.ov());
    EXPECT_EQ(flashattn::cpu::scratch_stats().peak_bytes - base, one_scratch) << "n=" << n;
    EXPECT_EQ(flashattn::cpu::scratch_stats().current_bytes, base);
  }
}

// Kept K/V tiles (cpu/staged_tile_cache.hpp): a head whose tiles all fit the budget has each tile staged
// once; a head past the budget keeps none and allocates nothing (its tiles are left to the caller); the
// buffer is released with the cache.
TEST(KeptKvTiles, WholeHeadsWithinTheBudgetStagedOnce) {
  struct Tile {
    const float* data;
    index_t ld;
  };
  using Cache = flashattn::cpu::StagedTileCache<Tile, float>;
  // Three tiles of K and V fit the budget.
  constexpr std::size_t tile_elems = std::size_t(flashattn::cpu::kStagedTileCacheBytes) / (2 * sizeof(float)) / 3;
  const std::int64_t base = flashattn::cpu::scratch_stats().current_bytes;
  {
    Cache cache(tile_elems);
    EXPECT_EQ(flashattn::cpu::scratch_stats().current_bytes, base);  // nothing until a head is kept
    int staged = 0;
    const auto stage = [&](float* slot) {
      ++staged;
      slot[0] = float(staged);
      return Tile{slot, 7};
    };
    cache.keep_head(0, 0, 10);  // a long head: 10 tiles
    for (index_t t = 0; t < 10; ++t)
      for (Cache::Matrix m : {Cache::K, Cache::V})
        EXPECT_EQ(cache.get(m, t, stage).data, nullptr) << "tile " << t << " of a head past the budget";
    EXPECT_EQ(staged, 0);
    EXPECT_EQ(flashattn::cpu::scratch_stats().current_bytes, base) << "a head past the budget allocates nothing";
    for (index_t head : {1, 2}) {
      cache.keep_head(0, head, 3);
      for (int pass = 0; pass < 2; ++pass)
        for (index_t t = 0; t < 3; ++t)
          for (Cache::Matrix m : {Cache::K, Cache::V}) {
            const Tile tile = cache.get(m, t, stage);
            ASSERT_NE(tile.data, nullptr) << "tile " << t;
            EXPECT_EQ(tile.ld, 7);
          }
      // Staged on the first pass only; the next head stages its own.
      EXPECT_EQ(staged, 6 * int(head));
    }
    const std::int64_t held = flashattn::cpu::scratch_stats().current_bytes - base;
    EXPECT_EQ(held, std::int64_t(2 * 3 * tile_elems * sizeof(float)));
    EXPECT_LE(held, flashattn::cpu::kStagedTileCacheBytes);
  }
  EXPECT_EQ(flashattn::cpu::scratch_stats().current_bytes, base);
}

// ---- the model ------------------------------------------------------------------------------------------

TEST(IoModel, TilesFollowFastMemory) {
  EXPECT_EQ(io::ideal_block_q(1 << 20, 64, 4), 1024);  // M / (4 d e)
  const auto check = [](std::int64_t m, index_t d, int bq, int bkv) {
    const io::TileChoice t = io::select_tiles(m, d, 4);
    EXPECT_EQ(t.block_q, bq) << "M=" << m << " d=" << d;
    EXPECT_EQ(t.block_kv, bkv) << "M=" << m << " d=" << d;
    // Q and O within M/2, K, V and the score tile within M/4, whenever the smallest tiles fit at all.
    if (t.block_q > 16) {
      EXPECT_LE(2 * t.block_q * d * 4, m / 2);
      EXPECT_LE((2 * d + t.block_q) * t.block_kv * 4, m / 4);
    }
  };
  check(1 << 20, 64, 1024, 32);
  check(1 << 20, 128, 512, 64);
  check(256 << 10, 128, 128, 32);
  check(128 << 10, 128, 64, 16);
  check(300 << 10, 128, 128, 32);          // the largest compiled sizes that fit
  check(1024, 128, 16, 16);                // none fits: the smallest
  check(std::int64_t(1) << 40, 64, 2048, 64);
  for (int bq : io::kIoBlockQs)
    for (int bkv : io::kIoBlockKVs) {
      int seen_q = 0, seen_kv = 0;
      io::with_tiles({bq, bkv}, [&](auto tiles) {
        seen_q = decltype(tiles)::BlockQ;
        seen_kv = decltype(tiles)::BlockKV;
      });
      EXPECT_EQ(seen_q, bq);
      EXPECT_EQ(seen_kv, bkv);
    }
  EXPECT_THROW(io::with_tiles({48, 16}, [](auto) {}), std::invalid_argument);
  // The short list that the cachegrind driver compiles covers every choice of its range.
  for (index_t d : {64, 128})
    for (std::int64_t m = 64 << 10; m <= 8 << 20; m *= 2) {
      bool found = false;
      io::with_tiles<io::IoSweepTileConfigs>(io::select_tiles(m, d, 4), [&](auto) { found = true; });
      EXPECT_TRUE(found) << "M=" << m << " d=" << d;
    }
}

TEST(IoModel, TiledLawIsInverseInMAndQuadraticInN) {
  const io::Shape s{4096, 4096, 64, 4, 4, false};
  const double qo = 2.0 * 4096 * 64 * 4;
  // With BlockQ = M/(4 d e) dividing N, the law and the exact count agree.
  EXPECT_DOUBLE_EQ(io::tiled_model_bytes(s, 1 << 20), double(io::tiled_bytes(s, 1024)));
  // The K/V term halves when M doubles, and quadruples when N doubles.
  EXPECT_DOUBLE_EQ(io::tiled_model_bytes(s, 1 << 19) - qo, 2 * (io::tiled_model_bytes(s, 1 << 20) - qo));
  const io::Shape s2{8192, 8192, 64, 4, 4, false};
  EXPECT_DOUBLE_EQ(io::tiled_model_bytes(s2, 1 << 18) - 2 * qo, 4 * (io::tiled_model_bytes(s, 1 << 18) - qo));
  // Naive: 4 N² accumulator elements (S and P, each written and read) on top of Q, K, V, O once.
  EXPECT_EQ(io::naive_bytes(s), 4 * 4096 * 64 * 4 + 4 * 4096LL * 4096 * 4);
}

}  // namespace
