// Mask policies: the tile answers of BandMask (Empty / Partial / Full and the kv_begin / kv_end range)
// checked exhaustively against brute-force keep(), and every policy kind (element masks, score modifiers,
// per-head policies through for_head) run end to end against the fp64 reference.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "configs.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/context.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// ---- Tile classification ---------------------------------------------------------------------------------

// What tile() must answer for rows [q0, q1) and keys [k0, k1): Empty when no pair is kept, Full when
// every pair is, Partial otherwise.
template <class Mask>
TileKind brute_force_tile(const Mask& m, index_t q0, index_t q1, index_t k0, index_t k1) {
  bool any = false, all = true;
  for (index_t i = q0; i < q1; ++i)
    for (index_t j = k0; j < k1; ++j) {
      const bool kept = m.keep(i, j);
      any = any || kept;
      all = all && kept;
    }
  return !any ? TileKind::Empty : all ? TileKind::Full : TileKind::Partial;
}

const char* kind_name(TileKind k) {
  return k == TileKind::Empty ? "Empty" : k == TileKind::Full ? "Full" : "Partial";
}

struct BandShape {
  index_t seq_q, seq_k, left, right;
  std::string describe() const {
    std::ostringstream s;
    s << "seq_q=" << seq_q << " seq_k=" << seq_k << " left=" << left << " right=" << right;
    return s.str();
  }
};

std::vector<BandShape> band_shapes(const std::vector<index_t>& seqs) {
  const index_t sides[] = {-1, 0, 1, 2, 5};
  std::vector<BandShape> shapes;
  for (index_t sq : seqs)
    for (index_t sk : seqs)
      for (index_t left : sides)
        for (index_t right : sides) shapes.push_back({sq, sk, left, right});
  return shapes;
}

// Every sub-rectangle of small score matrices: all (q0, q1) row ranges against all (k0, k1) key ranges.
TEST(BandMaskTiles, EveryRectangleMatchesBruteForce) {
  for (const BandShape& sh : band_shapes({1, 2, 5, 8})) {
    const BandMask m = BandMask::window(sh.seq_q, sh.seq_k, sh.left, sh.right);
    for (index_t q0 = 0; q0 < sh.seq_q; ++q0)
      for (index_t q1 = q0 + 1; q1 <= sh.seq_q; ++q1)
        for (index_t k0 = 0; k0 < sh.seq_k; ++k0)
          for (index_t k1 = k0 + 1; k1 <= sh.seq_k; ++k1) {
            const TileKind want = brute_force_tile(m, q0, q1, k0, k1);
            const TileKind got = m.tile(q0, q1, k0, k1);
            ASSERT_EQ(got, want) << sh.describe() << " rows [" << q0 << ", " << q1 << ") keys [" << k0 << ", "
                                 << k1 << "): got " << kind_name(got) << ", want " << kind_name(want);
          }
  }
}

// kv_begin / kv_end bound exactly the keys some row of the block keeps (an empty range when none), so the
// kernel neither skips a kept key nor visits a tile it could have skipped.
TEST(BandMaskTiles, KeyRangeIsExact) {
  for (const BandShape& sh : band_shapes({1, 3, 7, 16, 37})) {
    const BandMask m = BandMask::window(sh.seq_q, sh.seq_k, sh.left, sh.right);
    for (index_t q0 = 0; q0 < sh.seq_q; ++q0)
      for (index_t q1 = q0 + 1; q1 <= sh.seq_q; ++q1) {
        index_t first = -1, last = -1;
        for (index_t j = 0; j < sh.seq_k; ++j)
          for (index_t i = q0; i < q1; ++i)
            if (m.keep(i, j)) {
              if (first < 0) first = j;
              last = j;
              break;
            }
        const index_t begin = m.kv_begin(q0, q1), end = m.kv_end(q0, q1);
        const std::string where = sh.describe() + " rows [" + std::to_string(q0) + ", " + std::to_string(q1) +
                                  "): kv range [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
        ASSERT_GE(begin, 0) << where;
        ASSERT_LE(end, sh.seq_k) << where;
        if (first < 0) {
          ASSERT_LE(end, begin) << where << " but no key is kept";
        } else {
          ASSERT_EQ(begin, first) << where;
          ASSERT_EQ(end, last + 1) << where;
        }
      }
  }
}

// The tiles the kernel actually asks about: a grid of (BlockQ, BlockKV) blocks starting at kv_begin,
// on larger problems.
TEST(BandMaskTiles, KernelGridMatchesBruteForce) {
  const index_t blocks[][2] = {{16, 16}, {32, 64}, {64, 32}, {5, 7}};
  const BandShape shapes[] = {{199, 199, -1, 0},  {71, 199, -1, 0}, {199, 71, -1, 0}, {150, 150, 40, 0},
                              {150, 150, 17, 23}, {90, 200, 3, 3},  {200, 90, -1, 9}, {64, 64, 0, -1}};
  for (const auto& bl : blocks)
    for (const BandShape& sh : shapes) {
      const BandMask m = BandMask::window(sh.seq_q, sh.seq_k, sh.left, sh.right);
      for (index_t q0 = 0; q0 < sh.seq_q; q0 += bl[0]) {
        const index_t q1 = std::min(q0 + bl[0], sh.seq_q);
        const index_t end = m.kv_end(q0, q1);
        for (index_t k0 = m.kv_begin(q0, q1); k0 < end; k0 += bl[1]) {
          const index_t k1 = std::min(k0 + bl[1], end);
          ASSERT_EQ(m.tile(q0, q1, k0, k1), brute_force_tile(m, q0, q1, k0, k1))
              << sh.describe() << " block " << bl[0] << "x" << bl[1] << " rows [" << q0 << ", " << q1
              << ") keys [" << k0 << ", " << k1 << ")";
        }
      }
    }
}

TEST(BandMaskTiles, CausalIsTheBandWithRightZero) {
  for (index_t sq : {1, 4, 9})
    for (index_t sk : {1, 4, 9}) {
      const BandMask causal = BandMask::causal(sq, sk), band = BandMask::window(sq, sk, -1, 0);
      for (index_t i = 0; i < sq; ++i)
        for (index_t j = 0; j < sk; ++j) {
          ASSERT_EQ(causal.keep(i, j), j <= i + sk - sq) << "seq_q=" << sq << " seq_k=" << sk << " (" << i << ", " << j << ")";
          ASSERT_EQ(causal.keep(i, j), band.keep(i, j));
        }
    }
}

TEST(MaskPolicies, NoMaskAndElementMaskTileAnswers) {
  const NoMask none{13};
  EXPECT_EQ(none.kv_begin(0, 4), 0);
  EXPECT_EQ(none.kv_end(0, 4), 13);
  EXPECT_EQ(none.tile(0, 4, 0, 8), TileKind::Full);
  EXPECT_TRUE(none.keep(3, 12));

  // An element mask cannot know its structure: every tile is Partial, every key is in range.
  const auto even = element_mask(10, [](index_t i, index_t j) { return (i + j) % 2 == 0; });
  EXPECT_EQ(even.kv_begin(2, 5), 0);
  EXPECT_EQ(even.kv_end(2, 5), 10);
  EXPECT_EQ(even.tile(0, 4, 0, 4), TileKind::Partial);
  EXPECT_TRUE(even.keep(1, 3));
  EXPECT_FALSE(even.keep(1, 2));
  // and it leaves the scores it keeps as they are (no score hook: the kernel never changes them).
  EXPECT_FALSE(modifies_scores_v<std::decay_t<decltype(even)>>);
}

TEST(MaskPolicies, ScoreModKeepsTheTileStructureOfItsBase) {
  const BandMask base = BandMask::window(40, 50, 6, 2);
  const auto mod = score_mod(base, [](index_t i, index_t j, auto s) { return s + decltype(s)(i - j); });
  EXPECT_TRUE(modifies_scores_v<std::decay_t<decltype(mod)>>);
  EXPECT_FALSE(modifies_scores_v<BandMask>);
  for (index_t q0 = 0; q0 < 40; q0 += 8)
    for (index_t k0 = 0; k0 < 50; k0 += 8) {
      const index_t q1 = std::min<index_t>(q0 + 8, 40), k1 = std::min<index_t>(k0 + 8, 50);
      EXPECT_EQ(mod.tile(q0, q1, k0, k1), base.tile(q0, q1, k0, k1));
      EXPECT_EQ(mod.kv_begin(q0, q1), base.kv_begin(q0, q1));
      EXPECT_EQ(mod.kv_end(q0, q1), base.kv_end(q0, q1));
    }
  EXPECT_EQ(mod.keep(10, 3), base.keep(10, 3));
  EXPECT_DOUBLE_EQ(mod.score(7, 3, 1.0), 5.0);
}

// A per-head policy: for_head(b, h) gives the policy for that head (here a band whose width grows with h);
// policy_for (core/variants.hpp) picks it.
struct WidthPerHead {
  index_t seq_q, seq_k;
  BandMask for_head(index_t b, index_t h) const { return BandMask::window(seq_q, seq_k, h + b, 0); }
};

TEST(MaskPolicies, PolicyForUsesForHeadWhenPresent) {
  const WidthPerHead per_head{8, 8};
  EXPECT_EQ(policy_for(per_head, SequenceInfo{0, 3, 8, 8}).left, 3);
  EXPECT_EQ(policy_for(per_head, SequenceInfo{1, 3, 8, 8}).left, 4);
  const BandMask plain = BandMask::causal(8, 8);
  EXPECT_EQ(policy_for(plain, SequenceInfo{5, 7, 8, 8}).left, plain.left);  // a policy without for_head is used as is
}

// ---- End to end ------------------------------------------------------------------------------------------

template <class Config>
class MaskedForwardTest : public ::testing::Test {
 protected:
  using T = typename Config::T;
  using Tiles = typename Config::Tiles;
  static constexpr index_t BQ = Tiles::BlockQ, BKV = Tiles::BlockKV;

  void SetUp() override {
    if (!cpu_runs(Tiles::isa)) GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(Tiles::isa);
  }

  struct Problem {
    HostTensor<T> q, k, v, o;
    HostLse lse;
    Problem(index_t batch, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, std::uint32_t seed)
        : q(Layout::Bshd, batch, sq, hq, d),
          k(Layout::Bshd, batch, sk, hkv, d),
          v(Layout::Bshd, batch, sk, hkv, d),
          o(Layout::Bshd, batch, sq, hq, d, T(std::numeric_limits<float>::quiet_NaN())),
          lse(batch, hq, sq) {
      fill_normal(q.view(), seed);
      fill_normal(k.view(), seed + 1);
      fill_normal(v.view(), seed + 2);
    }
  };

  // Runs `mask` through attention_forward_masked and compares with the reference under the same mask.
  template <class Mask>
  void check(Problem& pr, const Mask& mask, const AttentionOptions& opts = {}, double ulps = 4.0) {
    attention_forward_masked(cpu::Context<Tiles>{}, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), mask,
                             opts, pr.lse.view());
    const double scale = opts.scale.value_or(1.0 / std::sqrt(double(pr.q.view().dim)));
    EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                  mask, ulps));
  }
};

// Masks act on accumulator-type scores, the same code for every storage type: one config per
// accumulator (float, double) and the bf16 path, whose Q·Kᵀ differs, keep the compile time down. The
// float one has three 16-row panels per program (tiles.hpp's PanelQ): a key tile can be full for one
// panel, partial for the next and empty for the third.
using MaskConfigs = CompiledConfigs<Pair<float, TileSpec<48, 32, cpu::kBestIsa, 16>>, Pair<double, TileSpec<32, 16>>,
                                    Pair<Eigen::bfloat16, TileSpec<16, 16>>>;
TYPED_TEST_SUITE(MaskedForwardTest, MaskConfigs, ConfigName);

// A pseudo-random keep pattern (about a third of the pairs), with some rows that keep nothing and some
// that keep only keys in the last tile: their running max stays −inf through the earlier tiles.
TYPED_TEST(MaskedForwardTest, ElementMaskPattern) {
  const index_t sq = 2 * this->BQ + 5, sk = 3 * this->BKV + 2;
  typename TestFixture::Problem pr(2, sq, sk, 4, 2, 16, 21);
  const auto keep = [sk](index_t i, index_t j) {
    if (i % 7 == 3) return false;               // fully masked rows
    if (i % 7 == 5) return j >= sk - 2;         // only the last keys
    const std::uint64_t hash = std::uint64_t(i * 2654435761u) ^ std::uint64_t(j * 40503u + 977u);
    return hash % 3 == 0 || j == i % sk;        // and at least one key otherwise
  };
  this->check(pr, element_mask(sk, keep));
  // Fully masked rows: output 0 and LSE −inf.
  for (index_t i = 3; i < sq; i += 7)
    for (index_t h = 0; h < 4; ++h) {
      EXPECT_EQ(pr.lse.view()(1, h, i), -std::numeric_limits<float>::infinity());
      for (index_t c = 0; c < 16; ++c) EXPECT_EQ(float(pr.o.view()(1, i, h, c)), 0.0f);
    }
}

// The causal band written as an element mask gives the result of the band policy (and of options.causal).
TYPED_TEST(MaskedForwardTest, ElementMaskCausalEqualsBandMask) {
  using T = typename TestFixture::T;
  const index_t sq = this->BQ + 3, sk = 2 * this->BKV + 1, d = 16;
  typename TestFixture::Problem pr(1, sq, sk, 2, 2, d, 31);
  const index_t offset = sk - sq;
  this->check(pr, element_mask(sk, [offset](index_t i, index_t j) { return j <= i + offset; }));
  const std::vector<double> by_element = to_double(pr.o.cview());

  HostTensor<T> o_band(Layout::Bshd, 1, sq, 2, d), o_opts(Layout::Bshd, 1, sq, 2, d);
  attention_forward_masked(cpu::Context<typename TestFixture::Tiles>{}, pr.q.cview(), pr.k.cview(), pr.v.cview(),
                           o_band.view(), BandMask::causal(sq, sk));
  AttentionOptions causal;
  causal.causal = true;
  attention_forward(cpu::Context<typename TestFixture::Tiles>{}, pr.q.cview(), pr.k.cview(), pr.v.cview(),
                    o_opts.view(), causal);
  // The band policy and options.causal run the same kernel with the same mask: identical bits.
  EXPECT_EQ(to_double(o_band.cview()), to_double(o_opts.cview()));
  // The element mask differs only in which tiles it skips, which changes no kept score.
  EXPECT_EQ(by_element, to_double(o_band.cview()));
}

// ALiBi as a per-head policy: query head h subtracts slope_h · (distance to the diagonal), with the
// geometric slopes of the ALiBi paper, on top of a causal band.
struct Alibi {
  index_t seq_q, seq_k, heads;
  auto for_head(index_t /*b*/, index_t h) const {
    const double slope = std::exp2(-8.0 * double(h + 1) / double(heads));
    const index_t offset = seq_k - seq_q;
    return score_mod(BandMask::causal(seq_q, seq_k), [slope, offset](index_t i, index_t j, auto s) {
      using S = decltype(s);
      return s - S(slope) * S(i + offset - j);
    });
  }
};

TYPED_TEST(MaskedForwardTest, AlibiPerHead) {
  const index_t sq = 2 * this->BQ + 1, sk = 3 * this->BKV + 4, hq = 4;
  typename TestFixture::Problem pr(2, sq, sk, hq, 2, 16, 41);
  this->check(pr, Alibi{sq, sk, hq});
}

// Soft-capping (Gemma 2): c · tanh(s / c), without a mask and on a sliding window.
TYPED_TEST(MaskedForwardTest, SoftCapping) {
  const index_t sq = this->BQ + 7, sk = 2 * this->BKV + 3;
  const auto cap = [](index_t, index_t, auto s) {
    using S = decltype(s);
    return S(5) * std::tanh(s / S(5));
  };
  typename TestFixture::Problem pr(1, sq, sk, 2, 1, 64, 51);
  AttentionOptions big_scores;
  big_scores.scale = 2.0;  // scores of ±10 and more, so that the cap bites
  // The kernel's softmax works in base 2: each score is multiplied by log2(e), one rounding at the score's
  // magnitude, which the naive order does not make. With every score near ±cap, that rounding moves the
  // probabilities by up to ~2·cap units in the last place, so the epsilon is sized by the cap.
  const double ulps = 4.0 * 5;
  this->check(pr, score_mod(NoMask{sk}, cap), big_scores, ulps);
  this->check(pr, score_mod(BandMask::window(sq, sk, 9, 4), cap), big_scores, ulps);
}

// An additive bias read from a (heads, seq_q, seq_k) buffer, per head through for_head; −inf entries
// mask, and one row is all −inf.
struct BiasPerHead {
  const std::vector<double>* bias;
  index_t seq_q, seq_k;
  auto for_head(index_t /*b*/, index_t h) const {
    const double* head = bias->data() + h * seq_q * seq_k;
    const index_t sk = seq_k;
    return score_mod(NoMask{seq_k}, [head, sk](index_t i, index_t j, auto s) {
      return s + decltype(s)(head[i * sk + j]);
    });
  }
};

TYPED_TEST(MaskedForwardTest, AdditiveBiasWithInfinities) {
  const index_t sq = this->BQ + 2, sk = this->BKV + 9, hq = 3;
  std::vector<double> bias(std::size_t(hq * sq * sk));
  std::mt19937 rng(61);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  for (std::size_t n = 0; n < bias.size(); ++n) bias[n] = n % 5 == 0 ? -INFINITY : dist(rng);
  for (index_t j = 0; j < sk; ++j) bias[std::size_t(1 * sk + j)] = -INFINITY;  // head 0, row 1
  typename TestFixture::Problem pr(1, sq, sk, hq, 1, 16, 62);
  this->check(pr, BiasPerHead{&bias, sq, sk});
  EXPECT_EQ(pr.lse.view()(0, 0, 1), -std::numeric_limits<float>::infinity());
  for (index_t c = 0; c < 16; ++c) EXPECT_EQ(float(pr.o.view()(0, 1, 0, c)), 0.0f);
}

}  // namespace
}  // namespace flashattn::testing
