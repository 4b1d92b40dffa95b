// Long sequences (issue 26, docs/io.md "Long context"):
//  - the AutoTiles rule (tiles.hpp's choose_forward_tiles) is a function of its inputs, the L2 size among
//    them, so its choices and boundaries are checked here at several cache sizes, whatever this CPU's;
//    the shapes it picks run the whole forward suite on every CPU (test_forward.cpp's ShippedPanels,
//    test_forward_amx.cpp);
//  - one long problem, N = 20000 (K and V of the head past L2 on every CPU we run on), through the public
//    forward and backward with AutoTiles, checked on sampled rows against the fp64 reference under the
//    tolerance rule: a row of O, of LSE or of dQ needs only its own row of scores, and under a causal
//    mask dK and dV of the last keys need only the last rows (reference.hpp's RowRange).

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <string>
#include <vector>

#include "flashattn/backward.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "reference_backward.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

using cpu::TileRuleInput;
using cpu::TileShape;

constexpr long kKiB = 1024, kMiB = 1024 * 1024;

TileRuleInput rule_for(long long seq_k, long long d, long long elem_bytes, long l2) {
  TileRuleInput in;
  in.seq_k = seq_k;
  in.head_dim = d;
  in.kv_elem_bytes = elem_bytes;
  in.l2_bytes = l2;
  return in;
}

// The boundary is strict: K + V of exactly L2's size (e.g. d = 64, N = 4096 in fp32 on a 2 MiB L2, where
// 256-row programs ran level or slower) stays below it; one more key row crosses over.
TEST(TileRule, KvHeadExceedsL2IsStrictAtEveryCacheSize) {
  for (long l2 : {512 * kKiB, 1 * kMiB, 2 * kMiB, 3 * kMiB / 2}) {
    for (long long d : {64LL, 128LL}) {
      const long long fp32_rows = l2 / (2 * d * 4);  // K + V of exactly L2 in fp32
      SCOPED_TRACE("l2=" + std::to_string(l2) + " d=" + std::to_string(d));
      EXPECT_FALSE(cpu::kv_head_exceeds_l2(fp32_rows, d, 4, l2));
      EXPECT_TRUE(cpu::kv_head_exceeds_l2(fp32_rows + 1, d, 4, l2));
      EXPECT_FALSE(cpu::kv_head_exceeds_l2(2 * fp32_rows, d, 2, l2)) << "16-bit K and V are half the bytes";
      EXPECT_TRUE(cpu::kv_head_exceeds_l2(2 * fp32_rows + 1, d, 2, l2));
    }
  }
  EXPECT_FALSE(cpu::kv_head_exceeds_l2(4096, 64, 4, 2 * kMiB));
  EXPECT_TRUE(cpu::kv_head_exceeds_l2(4096, 128, 4, 2 * kMiB));
  EXPECT_TRUE(cpu::kv_head_exceeds_l2(8192, 64, 2, 1 * kMiB));
  // The machine's own L2 is the default of both the function and the rule's input.
  EXPECT_EQ(TileRuleInput{}.l2_bytes, cpu::l2_cache_bytes());
  EXPECT_EQ(cpu::kv_head_exceeds_l2(4096, 128, 2), cpu::kv_head_exceeds_l2(4096, 128, 2, cpu::l2_cache_bytes()));
}

TEST(TileRule, ShapesOnEachSideOfTheBoundary) {
  for (long l2 : {512 * kKiB, 1 * kMiB, 2 * kMiB, 4 * kMiB}) {
    for (long long bytes : {4LL, 2LL}) {
      const long long d = 128, edge = l2 / (2 * d * bytes);  // the longest key range that fits L2
      SCOPED_TRACE("l2=" + std::to_string(l2) + " bytes=" + std::to_string(bytes));
      const bool tall = l2 >= 2 * kMiB;
      for (bool masked : {true, false}) {
        TileRuleInput in = rule_for(edge, d, bytes, l2);
        in.masked = masked;
        EXPECT_EQ(cpu::choose_forward_tiles(in), !masked && tall ? TileShape::Tall : TileShape::Default);
        in.seq_k = edge + 1;
        EXPECT_EQ(cpu::choose_forward_tiles(in), TileShape::Taller) << "masked or not, past L2";
        in.decode = true;
        EXPECT_EQ(cpu::choose_forward_tiles(in), TileShape::Default) << "the decode kernel has tiles of its own";
        in.seq_k = edge;
        EXPECT_EQ(cpu::choose_forward_tiles(in), TileShape::Default);
      }
      // bf16 on the AMX tile unit: its own two shapes, for every mask; decode calls keep the short one.
      TileRuleInput amx = rule_for(edge, d, bytes, l2);
      amx.amx = true;
      EXPECT_EQ(cpu::choose_forward_tiles(amx), TileShape::Amx);
      amx.masked = false;
      EXPECT_EQ(cpu::choose_forward_tiles(amx), TileShape::Amx);
      amx.seq_k = edge + 1;
      EXPECT_EQ(cpu::choose_forward_tiles(amx), TileShape::AmxTaller);
      amx.decode = true;
      EXPECT_EQ(cpu::choose_forward_tiles(amx), TileShape::Amx);
    }
  }
}

// ---- One long problem ------------------------------------------------------------------------------------

constexpr index_t kLongN = 20000, kLongD = 64;

// Rows [begin, end) of every head of a (1, seq, heads, d) tensor, in (row, head, column) order: the
// layout of the reference's contiguous results.
template <class T>
std::vector<double> sampled_rows(const TensorView<const T>& x, RowRange r) {
  std::vector<double> out;
  for (index_t i = r.begin; i < r.end_in(x.seq); ++i)
    for (index_t h = 0; h < x.heads; ++h)
      for (index_t c = 0; c < x.dim; ++c) out.push_back(double(x(0, i, h, c)));
  return out;
}
inline std::vector<double> sampled_rows(const std::vector<double>& x, index_t seq, index_t heads, index_t dim,
                                        RowRange r) {
  const auto begin = x.begin() + std::ptrdiff_t(r.begin * heads * dim);
  return {begin, begin + std::ptrdiff_t((r.end_in(seq) - r.begin) * heads * dim)};
}
inline std::vector<double> sampled_lse(const LseView& x, RowRange r) {
  std::vector<double> out;
  for (index_t h = 0; h < x.heads; ++h)
    for (index_t i = r.begin; i < r.end_in(x.seq); ++i) out.push_back(double(x(0, h, i)));
  return out;
}
inline std::vector<double> sampled_lse(const std::vector<double>& x, index_t seq, index_t heads, RowRange r) {
  std::vector<double> out;
  for (index_t h = 0; h < heads; ++h)
    for (index_t i = r.begin; i < r.end_in(seq); ++i) out.push_back(x[std::size_t(h * seq + i)]);
  return out;
}

template <class T>
struct LongProblem {
  HostTensor<T> q, k, v, o, d_o, dq, dk, dv;
  HostLse lse;
  AttentionOptions opts;
  double scale;

  explicit LongProblem(std::uint32_t seed)
      : q(Layout::Bshd, 1, kLongN, 1, kLongD),
        k(Layout::Bshd, 1, kLongN, 1, kLongD),
        v(Layout::Bshd, 1, kLongN, 1, kLongD),
        o(Layout::Bshd, 1, kLongN, 1, kLongD),
        d_o(Layout::Bshd, 1, kLongN, 1, kLongD),
        dq(Layout::Bshd, 1, kLongN, 1, kLongD),
        dk(Layout::Bshd, 1, kLongN, 1, kLongD),
        dv(Layout::Bshd, 1, kLongN, 1, kLongD),
        lse(1, 1, kLongN),
        scale(1.0 / std::sqrt(double(kLongD))) {
    fill_normal(q.view(), seed);
    fill_normal(k.view(), seed + 1);
    fill_normal(v.view(), seed + 2);
    fill_normal(d_o.view(), seed + 3);
    opts.causal = true;
  }
  void forward() {
    attention_forward(cpu::Context<cpu::AutoTiles>{2}, q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  }
  void backward() {
    attention_backward(cpu::Context<cpu::AutoTiles>{2}, q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(),
                       lse.view(), dq.view(), dk.view(), dv.view(), opts);
  }
};

// The first rows, rows across a 256-row program boundary in the middle, and the last rows.
const RowRange kForwardRows[] = {{0, 48}, {9200, 9240}, {kLongN - 48, kLongN}};

template <class T>
void check_long_forward() {
  // The rule must see this problem as long on this CPU, or the test would not test the long path.
  ASSERT_TRUE(cpu::kv_head_exceeds_l2(kLongN, kLongD, sizeof(T)));
  LongProblem<T> pr(101);
  pr.forward();
  const BandMask mask = BandMask::window(kLongN, kLongN, -1, 0);  // causal
  for (const RowRange r : kForwardRows) {
    SCOPED_TRACE("rows " + std::to_string(r.begin) + ".." + std::to_string(r.end));
    const ReferenceResult exact = reference_attention<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.scale, mask, r);
    const ReferenceResult naive =
        reference_attention<cpu::acc_t<T>, T>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.scale, mask, r);
    const ToleranceCheck o = check_output<T>(sampled_rows(pr.o.cview(), r), sampled_rows(naive.o, kLongN, 1, kLongD, r),
                                             sampled_rows(exact.o, kLongN, 1, kLongD, r));
    EXPECT_TRUE(o.ok()) << o.describe("o");
    const ToleranceCheck l = check_lse(sampled_lse(pr.lse.view(), r), sampled_lse(naive.lse, kLongN, 1, r),
                                       sampled_lse(exact.lse, kLongN, 1, r));
    EXPECT_TRUE(l.ok()) << l.describe("lse");
  }
}

TEST(LongContext, ForwardFp32SampledRowsMatchReference) { check_long_forward<float>(); }
TEST(LongContext, ForwardBf16SampledRowsMatchReference) { check_long_forward<Eigen::bfloat16>(); }
TEST(LongContext, ForwardFp16SampledRowsMatchReference) { check_long_forward<Eigen::half>(); }

// dQ of rows in the middle and at the end; dK and dV of the last keys, which under the causal mask only
// the last rows keep, so the reference over those rows gives them whole.
template <class T>
void check_long_backward() {
  LongProblem<T> pr(202);
  pr.forward();
  pr.backward();
  const BandMask mask = BandMask::window(kLongN, kLongN, -1, 0);
  const RowRange tail{kLongN - 64, kLongN};
  for (const RowRange r : {RowRange{9200, 9240}, tail}) {
    SCOPED_TRACE("rows " + std::to_string(r.begin) + ".." + std::to_string(r.end));
    const ReferenceGrads exact =
        reference_backward<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.d_o.cview(), pr.scale, mask, r);
    const ReferenceGrads naive = reference_backward<cpu::acc_t<T>, T>(pr.q.cview(), pr.k.cview(), pr.v.cview(),
                                                                      pr.d_o.cview(), pr.scale, mask, r);
    struct Grad {
      const char* name;
      const HostTensor<T>& got;
      const std::vector<double>& naive;
      const std::vector<double>& exact;
    };
    std::vector<Grad> grads{{"dq", pr.dq, naive.dq, exact.dq}};
    if (r.end_in(kLongN) == kLongN) {  // keys [tail.begin, N) are kept by these rows only
      grads.push_back({"dk", pr.dk, naive.dk, exact.dk});
      grads.push_back({"dv", pr.dv, naive.dv, exact.dv});
    }
    for (const Grad& g : grads) {
      const std::vector<double> ex = sampled_rows(g.exact, kLongN, 1, kLongD, r);
      const ToleranceCheck c{max_abs_error(sampled_rows(g.got.cview(), r), ex),
                             max_abs_error(sampled_rows(g.naive, kLongN, 1, kLongD, r), ex),
                             tiny_eps<T>(max_abs_finite(ex))};
      EXPECT_TRUE(c.ok()) << c.describe(g.name);
    }
  }
}

TEST(LongContext, BackwardFp32SampledRowsMatchReference) { check_long_backward<float>(); }
TEST(LongContext, BackwardBf16SampledRowsMatchReference) { check_long_backward<Eigen::bfloat16>(); }

}  // namespace
}  // namespace flashattn::testing
