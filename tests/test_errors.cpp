// Every bad input of the public API raises flashattn::InvalidArgument (a std::invalid_argument) before
// any work starts, with a message that names the argument and the offending values.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn/forward.hpp"
#include "flashattn/core/errors.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/reference/naive_forward.hpp"

namespace flashattn {
namespace {

// Runs `call`; succeeds when it throws std::invalid_argument (of the flashattn type) whose message holds
// every one of `needles`.
::testing::AssertionResult rejects(const std::function<void()>& call, std::initializer_list<std::string> needles) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (dynamic_cast<const InvalidArgument*>(&e) == nullptr)
      return ::testing::AssertionFailure() << "a std::invalid_argument, but not flashattn::InvalidArgument: " << what;
    for (const std::string& needle : needles)
      if (what.find(needle) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << needle << "\"";
    return ::testing::AssertionSuccess() << what;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another exception type: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

std::string hex(const void* p) {
  std::ostringstream s;
  s << "0x" << std::hex << reinterpret_cast<std::uintptr_t>(p);
  return s.str();
}

// A valid problem laid out in one arena (q, k, v, o, lse one after another, with gaps), so that views
// can be pointed at each other's memory. Each test breaks one thing.
class ForwardErrors : public ::testing::Test {
 protected:
  static constexpr index_t B = 2, Sq = 5, Sk = 7, Hq = 4, Hkv = 2, D = 8;
  static constexpr index_t kQ = 0, kK = kQ + B * Sq * Hq * D + 64, kV = kK + B * Sk * Hkv * D + 64,
                           kO = kV + B * Sk * Hkv * D + 64, kLse = kO + B * Sq * Hq * D + 64,
                           kArena = kLse + B * Hq * Sq + 64;
  static constexpr float kSentinel = 12345.0f;

  std::vector<float> arena = std::vector<float>(std::size_t(kArena), 0.5f);
  TensorView<float> q = bshd(arena.data() + kQ, B, Sq, Hq, D);
  TensorView<float> k = bshd(arena.data() + kK, B, Sk, Hkv, D);
  TensorView<float> v = bshd(arena.data() + kV, B, Sk, Hkv, D);
  TensorView<float> o = bshd(arena.data() + kO, B, Sq, Hq, D);
  LseView lse = lse_bhs(arena.data() + kLse, B, Hq, Sq);
  AttentionOptions opts;
  cpu::Context<> ctx{1};

  void SetUp() override {
    std::fill(arena.begin() + kO, arena.begin() + kArena, kSentinel);
  }

  std::function<void()> call() {
    return [this] { attention_forward(ctx, q, k, v, o, opts, lse); };
  }
  // Nothing was written: validation happens before any work.
  void expect_untouched() const {
    for (index_t i = kO; i < kArena; ++i) ASSERT_EQ(arena[std::size_t(i)], kSentinel) << "written at " << i;
  }
  void TearDown() override { expect_untouched(); }
};

TEST_F(ForwardErrors, ValidBaselineRuns) {
  // The unmodified problem is accepted (and writes o and lse, so refill the sentinels for TearDown).
  attention_forward(ctx, q, k, v, o, opts, lse);
  EXPECT_NE(arena[std::size_t(kO)], kSentinel);
  EXPECT_NE(arena[std::size_t(kLse)], kSentinel);
  std::fill(arena.begin() + kO, arena.begin() + kArena, kSentinel);
}

TEST_F(ForwardErrors, BatchSizesDisagree) {
  k.batch = 1;
  EXPECT_TRUE(rejects(call(), {"batch sizes disagree", "q (batch=2,", "k (batch=1,"}));
  k.batch = B;
  v.batch = 1;
  EXPECT_TRUE(rejects(call(), {"batch sizes disagree", "v (batch=1,"}));
  v.batch = B;
  o.batch = 1;
  EXPECT_TRUE(rejects(call(), {"batch sizes disagree", "o (batch=1,"}));
  o.batch = B;
  q.batch = 1;
  EXPECT_TRUE(rejects(call(), {"batch sizes disagree", "q (batch=1,", "k (batch=2,"}));
}

TEST_F(ForwardErrors, SeqLengthsDisagree) {
  v.seq = Sk - 1;
  EXPECT_TRUE(rejects(call(), {"k and v must have the same seq length", "k (batch=2, seq=7,", "v (batch=2, seq=6,"}));
  v.seq = Sk;
  o.seq = Sq + 1;
  EXPECT_TRUE(rejects(call(), {"o must have q's seq length", "q (batch=2, seq=5,", "o (batch=2, seq=6,"}));
}

TEST_F(ForwardErrors, HeadsDisagree) {
  v.heads = 1;
  EXPECT_TRUE(rejects(call(), {"k and v must have the same heads", "heads=2", "v (batch=2, seq=7, heads=1,"}));
  v.heads = Hkv;
  o.heads = 2;
  EXPECT_TRUE(rejects(call(), {"o must have q's heads", "q (batch=2, seq=5, heads=4,", "o (batch=2, seq=5, heads=2,"}));
}

TEST_F(ForwardErrors, HeadDimsDisagree) {
  k.dim = 4;
  EXPECT_TRUE(rejects(call(), {"head dims must agree", "q (batch=2, seq=5, heads=4, dim=8)", "k (batch=2, seq=7, heads=2, dim=4)"}));
  k.dim = D;
  v.dim = 6;
  EXPECT_TRUE(rejects(call(), {"head dims must agree", "v (batch=2, seq=7, heads=2, dim=6)"}));
  v.dim = D;
  o.dim = 16;
  EXPECT_TRUE(rejects(call(), {"head dims must agree", "o (batch=2, seq=5, heads=4, dim=16)"}));
  o.dim = D;
  q.dim = 4;
  EXPECT_TRUE(rejects(call(), {"head dims must agree", "q (batch=2, seq=5, heads=4, dim=4)"}));
}

TEST_F(ForwardErrors, LseShapeDisagrees) {
  const LseView good = lse;
  lse.batch = 1;
  EXPECT_TRUE(rejects(call(), {"lse must have shape (batch, heads_q, seq_q) = (2, 4, 5)", "got lse (batch=1, heads=4, seq=5)"}));
  lse = good;
  lse.heads = 2;
  EXPECT_TRUE(rejects(call(), {"(2, 4, 5)", "got lse (batch=2, heads=2, seq=5)"}));
  lse = good;
  lse.seq = 7;
  EXPECT_TRUE(rejects(call(), {"(2, 4, 5)", "got lse (batch=2, heads=4, seq=7)"}));
}

TEST_F(ForwardErrors, HeadsNotAMultiple) {
  q.heads = o.heads = 3;
  EXPECT_TRUE(rejects(call(), {"heads of q must be a multiple of heads of k/v", "3 vs 2"}));
  q.heads = o.heads = 5;
  EXPECT_TRUE(rejects(call(), {"multiple", "5 vs 2"}));
}

TEST_F(ForwardErrors, NegativeSizes) {
  const char* dims[] = {"batch", "seq", "heads", "dim"};
  TensorView<float>* views[] = {&q, &k, &v, &o};
  const char* names[] = {"q", "k", "v", "o"};
  for (int t = 0; t < 4; ++t)
    for (int d = 0; d < 4; ++d) {
      TensorView<float> saved = *views[t];
      index_t* extent[] = {&views[t]->batch, &views[t]->seq, &views[t]->heads, &views[t]->dim};
      *extent[d] = -3;
      EXPECT_TRUE(rejects(call(), {std::string(names[t]) + " (", std::string(dims[d]) + "=-3",
                                   std::string(dims[d]) + " must be >= 0, got -3"}))
          << names[t] << "." << dims[d];
      *views[t] = saved;
    }
  const LseView good = lse;
  lse.seq = -1;
  EXPECT_TRUE(rejects(call(), {"lse (batch=2, heads=4, seq=-1)", "seq must be >= 0, got -1"}));
  lse = good;
  lse.heads = -2;
  EXPECT_TRUE(rejects(call(), {"lse (", "heads must be >= 0, got -2"}));
}

// Zero batch and zero seq are defined no-ops (test_edge_cases); zero heads or a zero head dim are not.
TEST_F(ForwardErrors, ZeroHeadsOrHeadDim) {
  q.heads = o.heads = 0;
  EXPECT_TRUE(rejects(call(), {"heads must be >= 1", "q (batch=2, seq=5, heads=0, dim=8)"}));
  q.heads = o.heads = Hq;
  k.heads = v.heads = 0;
  EXPECT_TRUE(rejects(call(), {"heads must be >= 1", "k (batch=2, seq=7, heads=0, dim=8)"}));
  k.heads = v.heads = Hkv;
  q.dim = k.dim = v.dim = o.dim = 0;
  EXPECT_TRUE(rejects(call(), {"head dim must be >= 1", "q (batch=2, seq=5, heads=4, dim=0)"}));
}

TEST_F(ForwardErrors, NullDataWithElements) {
  TensorView<float>* views[] = {&q, &k, &v, &o};
  const char* described[] = {"q (batch=2, seq=5, heads=4, dim=8)", "k (batch=2, seq=7, heads=2, dim=8)",
                             "v (batch=2, seq=7, heads=2, dim=8)", "o (batch=2, seq=5, heads=4, dim=8)"};
  for (int t = 0; t < 4; ++t) {
    float* saved = views[t]->data;
    views[t]->data = nullptr;
    EXPECT_TRUE(rejects(call(), {described[t], "data is null but the view is not empty"}));
    views[t]->data = saved;
  }
  lse.data = nullptr;  // a null LSE with a shape is an error, not "no LSE"
  EXPECT_TRUE(rejects(call(), {"lse (batch=2, heads=4, seq=5)", "data is null"}));
}

TEST_F(ForwardErrors, OutputOverlapsAnInput) {
  float* const base = arena.data();
  o.data = base + kQ;  // o exactly on q
  EXPECT_TRUE(rejects(call(), {"o overlaps the memory of input q", "o spans bytes [" + hex(base + kQ),
                               "q spans [" + hex(base + kQ)}));
  o.data = base + kK - 8;  // o's head reaches into k's first row
  EXPECT_TRUE(rejects(call(), {"o overlaps the memory of input", hex(base + kK - 8)}));
  o.data = base + kV + 3;
  EXPECT_TRUE(rejects(call(), {"o overlaps the memory of input v", "v spans [" + hex(base + kV)}));
  o.data = base + kO;

  lse.data = base + kK + 5;
  EXPECT_TRUE(rejects(call(), {"lse overlaps the memory of input k", "lse spans bytes [" + hex(base + kK + 5)}));
  lse.data = base + kO + 17;
  EXPECT_TRUE(rejects(call(), {"lse overlaps the memory of output o", "o spans [" + hex(base + kO)}));
}

TEST_F(ForwardErrors, NegativeStrides) {
  const char* dims[] = {"batch", "seq", "head", "dim"};
  const char* dim_names[] = {"batch", "seq", "heads", "dim"};
  TensorView<float>* views[] = {&q, &k, &v, &o};
  const char* names[] = {"q (", "k (", "v (", "o ("};
  for (int t = 0; t < 4; ++t)
    for (int d = 0; d < 4; ++d) {
      TensorView<float> saved = *views[t];
      index_t* stride[] = {&views[t]->stride_batch, &views[t]->stride_seq, &views[t]->stride_head,
                           &views[t]->stride_dim};
      *stride[d] = -*stride[d];
      EXPECT_TRUE(rejects(call(), {names[t], "negative strides are not supported",
                                   "got stride " + std::to_string(*stride[d]) + " for " + dim_names[d]}))
          << names[t] << dims[d];
      *views[t] = saved;
    }
  lse.stride_seq = -1;
  EXPECT_TRUE(rejects(call(), {"lse (", "negative strides are not supported, got stride -1 for seq"}));
}

TEST_F(ForwardErrors, SelfOverlappingOutputStrides) {
  o.stride_head = 0;  // every head written to the same place
  EXPECT_TRUE(rejects(call(), {"o: strides make distinct elements share memory", "stride 0 < 1"}));
  o = bshd(arena.data() + kO, B, Sq, Hq, D);
  o.stride_seq = 4;  // rows of 8 elements, 4 apart
  EXPECT_TRUE(rejects(call(), {"o: strides make distinct elements share memory", "stride 4 < 8"}));
  o = bshd(arena.data() + kO, B, Sq, Hq, D);
  lse.stride_head = 2;  // heads of 5 positions, 2 apart
  EXPECT_TRUE(rejects(call(), {"lse: strides make distinct elements share memory", "stride 2 < 5"}));
}

// Inputs may alias themselves: a K/V shared by every batch entry is a stride-0 broadcast, read only.
TEST_F(ForwardErrors, BroadcastInputsAreAccepted) {
  k.stride_batch = 0;
  v.stride_batch = 0;
  attention_forward(ctx, q, k, v, o, opts, lse);
  for (index_t s = 0; s < Sq; ++s)
    for (index_t h = 0; h < Hq; ++h)
      for (index_t c = 0; c < D; ++c) EXPECT_NEAR(o(1, s, h, c), 0.5f, 1e-6f);  // every input element is 0.5
  std::fill(arena.begin() + kO, arena.begin() + kArena, kSentinel);
}

TEST_F(ForwardErrors, BadScale) {
  const std::pair<double, const char*> bad[] = {{std::nan(""), "nan"},
                                                {std::numeric_limits<double>::infinity(), "inf"},
                                                {-std::numeric_limits<double>::infinity(), "-inf"},
                                                {0.0, "got 0"},
                                                {-0.5, "got -0.5"}};
  for (const auto& [scale, text] : bad) {
    opts.scale = scale;
    EXPECT_TRUE(rejects(call(), {"options.scale must be finite and > 0", text})) << scale;
  }
}

TEST_F(ForwardErrors, HeadDimBeyondMaximum) {
  const index_t d = cpu::kMaxHeadDim + 1;
  std::vector<float> big(std::size_t(B * (Sq + 2 * Sk) * Hq * d), 0.0f), out(std::size_t(B * Sq * Hq * d), kSentinel);
  const auto qb = bshd(big.data(), B, Sq, Hq, d), kb = bshd(big.data(), B, Sk, Hkv, d), vb = kb;
  const auto ob = bshd(out.data(), B, Sq, Hq, d);
  EXPECT_TRUE(rejects([&] { attention_forward(ctx, qb, kb, vb, ob, opts); },
                      {"head dim " + std::to_string(d) + " is larger than the supported maximum " +
                       std::to_string(cpu::kMaxHeadDim)}));
  for (float x : out) ASSERT_EQ(x, kSentinel);
}

TEST_F(ForwardErrors, OffsetsOverflow) {
  q.stride_batch = std::numeric_limits<index_t>::max();  // the last element lies past 2^63
  EXPECT_TRUE(rejects(call(), {"q (batch=2,", "overflows 64-bit offsets"}));
}

TEST_F(ForwardErrors, NegativeNumThreads) {
  ctx.num_threads = -2;
  EXPECT_TRUE(rejects(call(), {"context.num_threads must be >= 0, got -2"}));
}

// One mask type for every masked call here, so that the kernels are compiled once for it.
struct LowerTriangle {
  bool operator()(index_t i, index_t j) const { return i >= j; }
};

TEST_F(ForwardErrors, CausalOrWindowWithAMaskPolicy) {
  const auto mask = element_mask(Sk, LowerTriangle{});
  opts.causal = true;
  EXPECT_TRUE(rejects([&] { attention_forward_masked(ctx, q, k, v, o, mask, opts, lse); },
                      {"options.causal / options.window_* cannot be combined with a mask policy"}));
  opts.causal = false;
  opts.window_left = 3;
  EXPECT_TRUE(rejects([&] { attention_forward_masked(ctx, q, k, v, o, mask, opts, lse); },
                      {"options.causal / options.window_*", "mask policy"}));
}

// The other entry points validate the same way.
TEST_F(ForwardErrors, MaskedAndNaiveEntryPointsValidate) {
  const auto mask = element_mask(Sk, LowerTriangle{});
  k.dim = 4;
  EXPECT_TRUE(rejects([&] { attention_forward_masked(ctx, q, k, v, o, mask, opts, lse); },
                      {"head dims must agree", "k (batch=2, seq=7, heads=2, dim=4)"}));
  EXPECT_TRUE(rejects([&] { naive_attention_forward<float>(q, k, v, o, opts, lse); },
                      {"head dims must agree", "k (batch=2, seq=7, heads=2, dim=4)"}));
  k.dim = D;
  opts.scale = -1.0;
  EXPECT_TRUE(rejects([&] { naive_attention_forward<float>(q, k, v, o, opts, lse); }, {"options.scale", "-1"}));
}

// Validation does not depend on the storage type (checked through make_forward_params, the validation
// every entry point runs, so that this file does not compile the kernels a second time).
TEST(ForwardErrorsHalf, OverlapAndShapes) {
  using H = Eigen::half;
  std::vector<H> buf(4 * 3 * 2 * 8, H(0.25f));
  const auto q = bshd<const H>(buf.data(), 1, 3, 2, 8), k = bshd<const H>(buf.data() + 48, 1, 3, 2, 8),
             v = bshd<const H>(buf.data() + 96, 1, 3, 2, 8);
  const auto o = bshd<H>(buf.data() + 144, 1, 3, 2, 8);
  EXPECT_NO_THROW(make_forward_params<H>(q, k, v, o, {}, {}));
  EXPECT_TRUE(rejects([&] { make_forward_params<H>(q, k, v, bshd<H>(buf.data() + 100, 1, 3, 2, 8), {}, {}); },
                      {"o overlaps the memory of input v", "o spans bytes [" + hex(buf.data() + 100)}));
  EXPECT_TRUE(rejects([&] { make_forward_params<H>(q, k, bshd<const H>(buf.data() + 96, 1, 2, 2, 8), o, {}, {}); },
                      {"k and v must have the same seq length", "v (batch=1, seq=2, heads=2, dim=8)"}));
}

}  // namespace
}  // namespace flashattn
