// The table of bad inputs (docs/robustness.md), one test per row that no other test file covers: every
// invalid call throws flashattn::InvalidArgument (a std::invalid_argument) whose message names the
// argument, before anything is written; and the unusual-but-valid inputs have their defined result.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashattn/forward.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/eigen.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// A valid problem (batch 2, seq_q 5, seq_k 7, 4 query heads over 2 KV heads, head dim 8) whose views,
// options and context a test corrupts one at a time.
struct Call {
  HostTensor<float> q_t{Layout::Bshd, 2, 5, 4, 8}, k_t{Layout::Bshd, 2, 7, 2, 8}, v_t{Layout::Bshd, 2, 7, 2, 8};
  HostTensor<float> o_t{Layout::Bshd, 2, 5, 4, 8, kNan};
  std::vector<float> lse_data = std::vector<float>(2 * 4 * 5, kNan);
  TensorView<const float> q, k, v;
  TensorView<float> o;
  LseView lse;
  AttentionOptions opts;
  cpu::Context<> ctx;

  Call() {
    fill_normal(q_t.view(), 1);
    fill_normal(k_t.view(), 2);
    fill_normal(v_t.view(), 3);
    q = q_t.cview();
    k = k_t.cview();
    v = v_t.cview();
    o = o_t.view();
    lse = lse_bhs(lse_data.data(), 2, 4, 5);
  }
  void run() const { attention_forward(ctx, q, k, v, o, opts, lse); }
  // Nothing was written: o and lse still hold their NaN fill.
  bool untouched() {
    for (float x : o_t.storage())
      if (!std::isnan(x)) return false;
    for (float x : lse_data)
      if (!std::isnan(x)) return false;
    return true;
  }
};

// Runs the call after `corrupt`, expecting InvalidArgument with `needle` in its message, and no write.
::testing::AssertionResult rejects(const std::function<void(Call&)>& corrupt, const std::string& needle,
                                   const std::function<void(const Call&)>& run = [](const Call& c) { c.run(); }) {
  Call c;
  corrupt(c);
  try {
    run(c);
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    if (what.rfind("flashattn: ", 0) != 0) return ::testing::AssertionFailure() << "no prefix: " << what;
    if (what.find(needle) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << needle << "\"";
    if (!c.untouched()) return ::testing::AssertionFailure() << "o or lse was written before the throw";
    return ::testing::AssertionSuccess() << what;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception type: " << e.what();
  }
  return ::testing::AssertionFailure() << "no exception";
}

// InvalidArgument is a std::invalid_argument: callers may catch the standard type.
TEST(BadInputs, ExceptionIsStdInvalidArgument) {
  Call c;
  c.opts.scale = 0.0;
  EXPECT_THROW(c.run(), std::invalid_argument);
}

TEST(BadInputs, NegativeExtent) {
  EXPECT_TRUE(rejects([](Call& c) { c.k.seq = -1; }, "k (batch=2, seq=-1, heads=2, dim=8): seq must be >= 0, got -1"));
}

TEST(BadInputs, NegativeStride) {
  EXPECT_TRUE(rejects([](Call& c) { c.v.stride_seq = -16; }, "negative strides are not supported"));
}

TEST(BadInputs, NullDataInNonEmptyView) {
  EXPECT_TRUE(rejects([](Call& c) { c.q.data = nullptr; }, "q (batch=2, seq=5, heads=4, dim=8): data is null"));
  EXPECT_TRUE(rejects([](Call& c) { c.lse.data = nullptr; }, "lse (batch=2, heads=4, seq=5): data is null"));
}

TEST(BadInputs, OffsetsOverflow64Bit) {
  EXPECT_TRUE(rejects([](Call& c) { c.k.stride_seq = index_t(1) << 62; }, "overflows 64-bit offsets"));
}

TEST(BadInputs, BatchMismatch) {
  EXPECT_TRUE(rejects([](Call& c) { c.v.batch = 1; }, "batch sizes disagree"));
}

TEST(BadInputs, KeyValueSeqMismatch) {
  EXPECT_TRUE(rejects([](Call& c) { c.v.seq = 6; }, "k and v must have the same seq length"));
}

TEST(BadInputs, OutputSeqMismatch) {
  EXPECT_TRUE(rejects([](Call& c) { c.o.seq = 4; }, "o must have q's seq length"));
}

TEST(BadInputs, ZeroHeads) {
  // Also guards the heads_q % heads_kv below from a division by zero.
  EXPECT_TRUE(rejects([](Call& c) { c.k.heads = c.v.heads = 0; }, "heads must be >= 1"));
}

TEST(BadInputs, HeadsMismatch) {
  EXPECT_TRUE(rejects([](Call& c) { c.v.heads = 1; }, "k and v must have the same heads"));
  EXPECT_TRUE(rejects([](Call& c) { c.o.heads = 2; }, "o must have q's heads"));
}

TEST(BadInputs, QueryHeadsNotMultipleOfKvHeads) {
  EXPECT_TRUE(rejects([](Call& c) { c.k.heads = c.v.heads = 3; },
                      "heads of q must be a multiple of heads of k/v (grouped-query attention): 4 vs 3"));
}

TEST(BadInputs, ZeroHeadDim) {
  EXPECT_TRUE(rejects([](Call& c) { c.q.dim = c.k.dim = c.v.dim = c.o.dim = 0; }, "head dim must be >= 1"));
}

TEST(BadInputs, HeadDimMismatch) {
  EXPECT_TRUE(rejects([](Call& c) { c.v.dim = 7; }, "head dims must agree"));
}

TEST(BadInputs, HeadDimAboveMaximum) {
  // Views of a head one wider than the limit, otherwise valid (the CPU backend checks its own limit after the core's checks
  // of extents, strides and overlaps): rejected before any element is read or written.
  const index_t d = cpu::kMaxHeadDim + 1;
  std::vector<float> q_buf(std::size_t(2 * 5 * 4 * d), 0.5f), kv_buf(std::size_t(2 * 7 * 2 * d), 0.5f),
      o_buf(std::size_t(2 * 5 * 4 * d), kNan);
  EXPECT_TRUE(rejects(
      [&](Call& c) {
        c.q = bshd<const float>(q_buf.data(), 2, 5, 4, d);
        c.k = c.v = bshd<const float>(kv_buf.data(), 2, 7, 2, d);
        c.o = bshd(o_buf.data(), 2, 5, 4, d);
      },
      "head dim " + std::to_string(d) + " is larger than the supported maximum " + std::to_string(d - 1)));
  for (float x : o_buf) ASSERT_TRUE(std::isnan(x)) << "o was written before the throw";
}

TEST(BadInputs, OutputAliasesItself) {
  EXPECT_TRUE(rejects([](Call& c) { c.o.stride_seq = 0; }, "an output must not alias itself"));
  EXPECT_TRUE(rejects([](Call& c) { c.o.stride_head = 4; }, "an output must not alias itself"));
}

TEST(BadInputs, OutputOverlapsAnInput) {
  EXPECT_TRUE(rejects([](Call& c) { c.o = c.q_t.view(); }, "o overlaps the memory of input q"));
  // o starting a few elements into v's buffer (it may run on into a neighbouring allocation too, so the
  // message may name another input as well).
  EXPECT_TRUE(rejects([](Call& c) { c.o.data = c.v_t.view().data + 8; }, "o overlaps the memory of input"));
}

TEST(BadInputs, LseShape) {
  EXPECT_TRUE(rejects([](Call& c) { c.lse.seq = 4; }, "lse must have shape (batch, heads_q, seq_q) = (2, 4, 5)"));
}

TEST(BadInputs, LseAliasesItselfOrOverlaps) {
  EXPECT_TRUE(rejects([](Call& c) { c.lse.stride_seq = 0; }, "lse: strides make distinct elements share memory"));
  EXPECT_TRUE(rejects([](Call& c) { c.lse.data = const_cast<float*>(c.k.data); }, "lse overlaps the memory of input k"));
  EXPECT_TRUE(rejects([](Call& c) { c.lse.data = c.o.data + 1; }, "lse overlaps the memory of output o"));
}

TEST(BadInputs, BadScale) {
  for (double s : {0.0, -0.0, -1.0, double(kNan), HUGE_VAL, -HUGE_VAL})
    EXPECT_TRUE(rejects([s](Call& c) { c.opts.scale = s; }, "options.scale must be finite and > 0")) << s;
}

TEST(BadInputs, NegativeThreadCount) {
  EXPECT_TRUE(rejects([](Call& c) { c.ctx.num_threads = -2; }, "context.num_threads must be >= 0, got -2"));
}

TEST(BadInputs, MaskPolicyWithCausalOrWindowOptions) {
  const auto masked = [](const Call& c) {
    attention_forward_masked(c.ctx, c.q, c.k, c.v, c.o, NoMask{c.k.seq}, c.opts, c.lse);
  };
  EXPECT_TRUE(rejects([](Call& c) { c.opts.causal = true; }, "cannot be combined with a mask policy", masked));
  EXPECT_TRUE(rejects([](Call& c) { c.opts.window_left = 3; }, "cannot be combined with a mask policy", masked));
}

TEST(BadInputs, EigenOutputWithInnerStride) {
  using Mat = RowMajorMatrix<float>;
  const Mat q = Mat::Random(5, 8), k = Mat::Random(7, 8), v = Mat::Random(7, 8);
  Mat big = Mat::Zero(5, 16);
  Eigen::Map<Mat, 0, Eigen::Stride<Eigen::Dynamic, 2>> strided(big.data(), 5, 8, Eigen::Stride<Eigen::Dynamic, 2>(16, 2));
  EXPECT_THROW(attention(q, k, v, strided), InvalidArgument);
}

// ---- unusual but valid inputs: their defined results --------------------------------------------------

// batch = 0 or seq_q = 0: a no-op that touches nothing (null data is fine in empty views).
TEST(BadInputs, EmptyBatchOrQueriesIsANoOp) {
  Call c;
  c.q.batch = c.k.batch = c.v.batch = c.o.batch = c.lse.batch = 0;
  EXPECT_NO_THROW(c.run());
  EXPECT_TRUE(c.untouched());
  Call d;
  d.q.seq = d.o.seq = d.lse.seq = 0;
  d.q.data = nullptr;
  d.o.data = nullptr;
  EXPECT_NO_THROW(d.run());
  EXPECT_TRUE(d.untouched());
}

// Inputs may share memory with each other (self-attention with k = v = q) and may broadcast with
// stride 0 (one K/V batch read by every batch, as an expanded PyTorch tensor): inputs are only read.
TEST(BadInputs, InputsMayAliasAndBroadcast) {
  HostTensor<float> x(Layout::Bshd, 2, 9, 2, 8), o(Layout::Bshd, 2, 9, 2, 8, kNan);
  fill_normal(x.view(), 7);
  TensorView<const float> bcast = x.cview();
  bcast.stride_batch = 0;  // batch 1 reads batch 0's rows
  attention_forward(x.cview(), bcast, bcast, o.view());
  EXPECT_TRUE(matches_reference(x.cview(), bcast, bcast, o.cview(), LseView{}, 1.0 / std::sqrt(8.0), NoMask{9}));
}

// Pointers with no particular alignment (one element past an allocation's start) are fine: every
// load and store is unaligned.
TEST(BadInputs, UnalignedPointers) {
  std::vector<float> qb(1 + 33 * 2 * 16), kb(1 + 40 * 2 * 16), vb(1 + 40 * 2 * 16), ob(1 + 33 * 2 * 16, kNan);
  const auto q = bshd<float>(qb.data() + 1, 1, 33, 2, 16), k = bshd<float>(kb.data() + 1, 1, 40, 2, 16),
             v = bshd<float>(vb.data() + 1, 1, 40, 2, 16), o = bshd<float>(ob.data() + 1, 1, 33, 2, 16);
  fill_normal(q, 8);
  fill_normal(k, 9);
  fill_normal(v, 10);
  attention_forward<float>(q, k, v, o);
  EXPECT_TRUE(std::isnan(ob[0]));  // the element before the view is untouched
  EXPECT_TRUE(matches_reference<float>(q, k, v, o, LseView{}, 0.25, NoMask{40}));
}

// A mask policy whose key range runs outside [0, seq_k) (a careless user policy): the kernel clips it,
// so nothing outside K/V is read and the result is that of the keys that exist.
struct SloppyRange {
  static constexpr bool modifies_scores = false;
  index_t seq_k;
  index_t kv_begin(index_t, index_t) const { return -100; }
  index_t kv_end(index_t, index_t) const { return seq_k + 1000; }
  TileKind tile(index_t, index_t, index_t, index_t) const { return TileKind::Full; }
  bool keep(index_t, index_t) const { return true; }
  template <class S>
  S score(index_t, index_t, S s) const { return s; }
};

TEST(BadInputs, MaskPolicyRangeOutsideKeysIsClipped) {
  Call c;
  attention_forward_masked(c.q, c.k, c.v, c.o, SloppyRange{c.k.seq}, AttentionOptions{}, c.lse);
  EXPECT_TRUE(matches_reference<float>(c.q, c.k, c.v, c.o, c.lse, 1.0 / std::sqrt(8.0), NoMask{c.k.seq}));
}

// num_threads far above the work (and 0 = the default): the same bits as one thread.
TEST(BadInputs, MoreThreadsThanWork) {
  Call one, many, dflt;
  one.ctx.num_threads = 1;
  many.ctx.num_threads = 64;
  dflt.ctx.num_threads = 0;
  one.run();
  many.run();
  dflt.run();
  EXPECT_EQ(0, std::memcmp(one.o_t.storage().data(), many.o_t.storage().data(), one.o_t.storage().size() * 4));
  EXPECT_EQ(0, std::memcmp(one.o_t.storage().data(), dflt.o_t.storage().data(), one.o_t.storage().size() * 4));
}

// The backward pass validates the same way (one representative check per class of argument).
TEST(BadInputs, BackwardRejectsBadArguments) {
  Call c;
  c.run();
  HostTensor<float> d_o(Layout::Bshd, 2, 5, 4, 8), dq(Layout::Bshd, 2, 5, 4, 8), dk(Layout::Bshd, 2, 7, 2, 8),
      dv(Layout::Bshd, 2, 7, 2, 8);
  fill_normal(d_o.view(), 4);
  AttentionOptions bad;
  bad.scale = -1.0;
  EXPECT_THROW(attention_backward(c.q, c.k, c.v, TensorView<const float>(c.o), d_o.cview(), c.lse, dq.view(),
                                  dk.view(), dv.view(), bad),
               InvalidArgument);
  EXPECT_THROW(attention_backward(c.q, c.k, c.v, TensorView<const float>(c.o), d_o.cview(), LseView{}, dq.view(),
                                  dk.view(), dv.view()),
               InvalidArgument);
  EXPECT_THROW(attention_backward(c.q, c.k, c.v, TensorView<const float>(c.o), d_o.cview(), c.lse, dq.view(),
                                  TensorView<float>(dq.view()), dv.view()),
               InvalidArgument);
}

}  // namespace
}  // namespace flashattn::testing
