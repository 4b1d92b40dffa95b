// The decode path (cpu/decode_kernel.hpp, forward_scheduler.hpp's run_decode): calls with at most 16 query
// rows per sequence, the query heads of a GQA group packed into one program's rows, keys split into
// ranges by bytes. Checked against the fp64 reference under the tolerance rule for every storage type,
// head dims on and off whole packets, group sizes whose rows fit one program and ones that take several,
// masks (none, causal, window, an element mask), both layouts, key counts around the 64-key tile and long
// enough to split; every thread count must give the same bits; a sink and an output transform reach the
// merged rows; and the same calls through the prefill kernel (Context::decode_kernel = false) agree.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flashattn/core/masks.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

struct DecodeCase {
  index_t batch, seq_q, seq_k, heads, heads_kv, dim;
  bool causal = false;
  index_t window_left = -1;
  Layout layout = Layout::Bshd;
  index_t dim_v = 0;  // V's and O's head dim, when it differs from dim (MLA)

  index_t value_dim() const { return dim_v > 0 ? dim_v : dim; }
  std::string name() const {
    return "B" + std::to_string(batch) + " Sq" + std::to_string(seq_q) + " Sk" + std::to_string(seq_k) + " H" +
           std::to_string(heads) + ":" + std::to_string(heads_kv) + " d" + std::to_string(dim) +
           (dim_v > 0 ? "/" + std::to_string(dim_v) : "") +
           (causal ? " causal" : "") + (window_left >= 0 ? " wl" + std::to_string(window_left) : "") +
           (layout == Layout::Bhsd ? " bhsd" : " bshd");
  }
  AttentionOptions options() const {
    AttentionOptions o;
    o.causal = causal;
    o.window_left = window_left;
    return o;
  }
};

template <class T>
struct Problem {
  HostTensor<T> q, k, v, o;
  HostLse lse;
  explicit Problem(const DecodeCase& c, std::uint32_t seed = 7)
      : q(c.layout, c.batch, c.seq_q, c.heads, c.dim),
        k(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim),
        v(c.layout, c.batch, c.seq_k, c.heads_kv, c.value_dim()),
        o(c.layout, c.batch, c.seq_q, c.heads, c.value_dim()),
        lse(c.batch, c.heads, c.seq_q) {
    fill_normal(q.view(), seed);
    fill_normal(k.view(), seed + 1);
    fill_normal(v.view(), seed + 2);
  }
};

std::vector<DecodeCase> cases() {
  std::vector<DecodeCase> out;
  for (index_t seq_q : {1, 3, 4, 16})
    for (index_t seq_k : {1, 63, 65, 700})
      for (auto heads : {std::pair<index_t, index_t>{8, 2}, {3, 3}, {6, 1}}) {
        const index_t dim = seq_k == 63 ? 40 : seq_k == 65 ? 33 : seq_k == 1 ? 64 : 128;
        out.push_back({2, seq_q, seq_k, heads.first, heads.second, dim, seq_q > 1 && seq_k >= seq_q, -1,
                       seq_k == 700 ? Layout::Bhsd : Layout::Bshd});
      }
  out.push_back({1, 1, 5000, 8, 2, 128});                        // split into ranges
  out.push_back({1, 2, 3000, 4, 1, 64, true, -1, Layout::Bhsd});  // split, causal
  out.push_back({1, 5, 2000, 4, 2, 128, false, 300});            // split, sliding window
  out.push_back({3, 1, 0, 4, 2, 64});                            // no keys at all
  // V's head dim apart from Q/K's: MLA's 192/128, a wider V off whole packets, absorbed MLA split.
  out.push_back({2, 4, 300, 8, 2, 192, true, -1, Layout::Bshd, 128});
  out.push_back({1, 16, 130, 4, 1, 40, false, -1, Layout::Bhsd, 72});
  out.push_back({1, 1, 3000, 16, 1, 576, false, -1, Layout::Bshd, 512});
  return out;
}

template <class T>
void check_against_reference() {
  for (const DecodeCase& c : cases()) {
    SCOPED_TRACE(c.name());
    Problem<T> pr(c);
    attention_forward<T>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), c.options(), pr.lse.view());
    EXPECT_TRUE(matches_reference_for_options<T>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(),
                                                 pr.lse.view(), c.options()));
  }
}

TEST(Decode, Fp32MatchesReference) { check_against_reference<float>(); }
TEST(Decode, Fp64MatchesReference) { check_against_reference<double>(); }
TEST(Decode, Bf16MatchesReference) { check_against_reference<Eigen::bfloat16>(); }
TEST(Decode, Fp16MatchesReference) { check_against_reference<Eigen::half>(); }

// Key ranges are chosen from the shape alone, so 1, 2 and 3 threads give the same bits.
template <class T>
void check_thread_counts() {
  for (const DecodeCase& c : {DecodeCase{1, 1, 5000, 8, 2, 128}, DecodeCase{2, 4, 2000, 4, 4, 64, true},
                              DecodeCase{1, 16, 1500, 2, 1, 80}}) {
    SCOPED_TRACE(c.name());
    std::vector<unsigned char> first;
    for (int threads : {1, 2, 3}) {
      Problem<T> pr(c);
      attention_forward(cpu::Context<>{threads}, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), c.options(),
                        pr.lse.view());
      std::vector<unsigned char> got = bytes_of(pr.o.storage());
      if (threads == 1) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << threads << " threads";
      }
    }
  }
}

TEST(Decode, SameBitsOnAnyThreadCountFp32) { check_thread_counts<float>(); }
TEST(Decode, SameBitsOnAnyThreadCountBf16) { check_thread_counts<Eigen::bfloat16>(); }

// The prefill kernel on the same calls (the decode kernel turned off) meets the same bound: the two paths
// compute one function.
TEST(Decode, PrefillKernelOnTheSameCallsAgrees) {
  for (const DecodeCase& c : {DecodeCase{1, 1, 777, 8, 2, 128}, DecodeCase{2, 7, 300, 4, 4, 64, true}}) {
    SCOPED_TRACE(c.name());
    Problem<float> fast(c), slow(c);
    attention_forward(cpu::Context<>{1}, fast.q.cview(), fast.k.cview(), fast.v.cview(), fast.o.view(), c.options(),
                      fast.lse.view());
    cpu::Context<> prefill{1};
    prefill.decode_kernel = false;
    attention_forward(prefill, slow.q.cview(), slow.k.cview(), slow.v.cview(), slow.o.view(), c.options(),
                      slow.lse.view());
    const std::vector<double> a = to_double(fast.o.cview()), b = to_double(slow.o.cview());
    EXPECT_LE(max_abs_error(a, b), 1e-5);
    EXPECT_TRUE(matches_reference_for_options<float>(slow.q.cview(), slow.k.cview(), slow.v.cview(),
                                                     slow.o.cview(), slow.lse.view(), c.options()));
  }
}

// A policy of the caller's: an element mask that drops every third key of a row (tiles Partial for
// every head), through attention_forward_masked.
TEST(Decode, ElementMaskPolicy) {
  const DecodeCase c{2, 3, 500, 8, 2, 64};
  Problem<float> pr(c);
  const auto mask = element_mask(c.seq_k, [](index_t i, index_t j) { return (i + j) % 3 != 0; });
  const double scale = 0.125;
  AttentionOptions opts;
  opts.scale = scale;
  attention_forward_masked<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), mask, opts, pr.lse.view());
  EXPECT_TRUE(matches_reference<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), scale,
                                       mask));
}

// Strided views: Q and O with a dim stride of 2 (every other element), K and V in place with unit stride but
// rows further apart than dim (a cache with spare room per row).
TEST(Decode, StridedViews) {
  const index_t B = 1, Sq = 2, Sk = 300, H = 4, Hk = 2, D = 64, room = 80;
  std::vector<float> q(std::size_t(B * Sq * H * D * 2)), o(q.size()), k(std::size_t(B * Sk * Hk * room)), v(k.size());
  TensorView<float> qv{q.data(), B, Sq, H, D, Sq * H * D * 2, H * D * 2, D * 2, 2};
  TensorView<float> ov{o.data(), B, Sq, H, D, Sq * H * D * 2, H * D * 2, D * 2, 2};
  TensorView<float> kv{k.data(), B, Sk, Hk, D, Sk * Hk * room, Hk * room, room, 1};
  TensorView<float> vv{v.data(), B, Sk, Hk, D, Sk * Hk * room, Hk * room, room, 1};
  fill_normal(qv, 1);
  fill_normal(kv, 2);
  fill_normal(vv, 3);
  HostLse lse(B, H, Sq);
  attention_forward<float>(qv, kv, vv, ov, {}, lse.view());
  EXPECT_TRUE(matches_reference_for_options<float>(qv, kv, vv, ov, lse.view(), {}));
}

// The scale multiplies the dot product, not Q (fuzzer finding): with scale 1e-30 a Q element of 1e-20
// would round to 0 in fp32 if scaled first, and 0 times the -inf of a K element is NaN, where
// q·k·scale = -inf makes that key weigh exactly 0.
TEST(Decode, ScaleAppliesToTheDotProductNotToQ) {
  const DecodeCase c{1, 1, 40, 2, 1, 16};
  Problem<float> pr(c);
  for (index_t h = 0; h < c.heads; ++h)
    for (index_t d = 0; d < c.dim; ++d) pr.q.view()(0, 0, h, d) = 1e-20f;
  pr.k.view()(0, 7, 0, 3) = -std::numeric_limits<float>::infinity();
  AttentionOptions opts;
  opts.scale = 1e-30;
  attention_forward<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), opts, pr.lse.view());
  for (float x : pr.o.storage()) ASSERT_TRUE(std::isfinite(x));
  EXPECT_TRUE(matches_reference<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(), 1e-30,
                                       NoMask{c.seq_k}));
}

// test_decode_amx compiles this file with FLASHATTN_DECODE_LANE_ROWS=1 and FLASHATTN_AMX_EMULATE: there
// every program runs in the decode kernel's lane layout (the prefill kernel's tile operations at 16
// lanes), and every bf16 call on the AMX tile unit (tile_ops_amx.hpp on the scalar model of the unit), as
// AutoTiles picks AmxTiles wherever AMX is usable. That routing is checked here: AutoTiles gives the bits
// of naming AmxTiles.
#if defined(FLASHATTN_AMX_EMULATE) && defined(__AVX512BF16__)
static_assert(cpu::DecodeKernel<Eigen::bfloat16, 0, cpu::Isa::Amx>::kAmxTiles,
              "the emulated tile unit runs the decode kernel's AMX programs");
TEST(Decode, Bf16CallsTakeTheAmxPrograms) {
  for (const DecodeCase& c : {DecodeCase{1, 4, 700, 8, 2, 128, true}, DecodeCase{2, 1, 65, 6, 1, 33}}) {
    SCOPED_TRACE(c.name());
    Problem<Eigen::bfloat16> automatic(c), named(c);
    attention_forward(cpu::Context<>{1}, automatic.q.cview(), automatic.k.cview(), automatic.v.cview(),
                      automatic.o.view(), c.options(), automatic.lse.view());
    attention_forward(cpu::Context<cpu::AmxTiles<Eigen::bfloat16>>{1}, named.q.cview(), named.k.cview(),
                      named.v.cview(), named.o.view(), c.options(), named.lse.view());
    EXPECT_EQ(bytes_of(automatic.o.storage()), bytes_of(named.o.storage()));
    EXPECT_TRUE(matches_reference_for_options<Eigen::bfloat16>(named.q.cview(), named.k.cview(), named.v.cview(),
                                                               named.o.cview(), named.lse.view(), c.options()));
  }
}
#endif

}  // namespace
}  // namespace flashattn::testing
