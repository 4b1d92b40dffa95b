// attention_combine (include/flashattn/combine.hpp): results over disjoint key sets merged into the result
// over all keys. Each part is a real attention call over a slice of the keys; the combination must meet
// the fp64 reference of the whole call under the tolerance rule (for fp32 and fp64), a part that kept no
// key must weigh nothing, the output may alias a part, and bad arguments throw before anything is written.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flashattn/combine.hpp"
#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// Keys [k0, k1) of a (batch, seq_k, heads, dim) view.
template <class T>
TensorView<const T> keys(const TensorView<const T>& x, index_t k0, index_t k1) {
  TensorView<const T> out = x;
  out.data = x.data + k0 * x.stride_seq;
  out.seq = k1 - k0;
  return out;
}

// float_lse_bound > 0: compare with the fp64 reference by that absolute bound instead of the tolerance rule
// (for fp64, whose parts' LSE are float: the weights carry float's relative error).
template <class T>
void check_split(std::vector<index_t> cuts, index_t seq_q, double float_lse_bound = 0.0) {
  const index_t B = 2, Sk = cuts.back(), H = 4, Hk = 2, D = 64;
  HostTensor<T> q(Layout::Bshd, B, seq_q, H, D), k(Layout::Bshd, B, Sk, Hk, D), v(Layout::Bshd, B, Sk, Hk, D),
      o(Layout::Bshd, B, seq_q, H, D);
  fill_normal(q.view(), 11);
  fill_normal(k.view(), 12);
  fill_normal(v.view(), 13);
  std::vector<HostTensor<T>> outs;
  std::vector<HostLse> lses;
  std::vector<AttentionPart<T>> parts;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    outs.emplace_back(Layout::Bshd, B, seq_q, H, D);
    lses.emplace_back(B, H, seq_q);
  }
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    AttentionOptions opts;
    opts.scale = 0.125;
    attention_forward<T>(q.cview(), keys(k.cview(), cuts[i], cuts[i + 1]), keys(v.cview(), cuts[i], cuts[i + 1]),
                         outs[i].view(), opts, lses[i].view());
    parts.push_back({outs[i].cview(), lses[i].view()});
  }
  HostLse lse(B, H, seq_q);
  attention_combine<T>(parts, o.view(), lse.view());
  if (float_lse_bound > 0.0) {
    const ReferenceResult exact = reference_attention<exact_t<T>>(q.cview(), k.cview(), v.cview(), 0.125, NoMask{Sk});
    EXPECT_LE(max_abs_error(to_double(o.cview()), exact.o), float_lse_bound);
    EXPECT_LE(max_abs_error(to_double(lse.view()), exact.lse), float_lse_bound * 8);
    return;
  }
  EXPECT_TRUE(matches_reference<T>(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), 0.125, NoMask{Sk}));
}

TEST(Combine, TwoPartsMatchTheWholeCallFp32) { check_split<float>({0, 300, 700}, 3); }
TEST(Combine, ManyUnevenPartsFp32) { check_split<float>({0, 1, 64, 65, 500, 2000}, 1); }
TEST(Combine, EmptyPartWeighsNothingFp32) { check_split<float>({0, 0, 400, 400}, 2); }
TEST(Combine, TwoPartsFp64WithinFloatLse) { check_split<double>({0, 129, 700}, 5, 1e-6); }

TEST(Combine, RowsNoPartKeptAreZeroWithMinusInfLse) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> o1{1, 2}, o2{3, 4}, out{7, 7};
  std::vector<float> l1{-inf}, l2{-inf}, lse{7};
  attention_combine<float>({{bshd<const float>(o1.data(), 1, 1, 1, 2), lse_bhs(l1.data(), 1, 1, 1)},
                            {bshd<const float>(o2.data(), 1, 1, 1, 2), lse_bhs(l2.data(), 1, 1, 1)}},
                           bshd(out.data(), 1, 1, 1, 2), lse_bhs(lse.data(), 1, 1, 1));
  EXPECT_EQ(out, (std::vector<float>{0, 0}));
  EXPECT_EQ(lse[0], -inf);
}

TEST(Combine, WeightsByLseAndMayWriteOverAPart) {
  // LSE 0 and log 3: weights 1/4 and 3/4; the output is part 0's own buffer.
  std::vector<float> o1{4, 8}, o2{0, 4};
  std::vector<float> l1{0.0f}, l2{std::log(3.0f)}, lse{0};
  attention_combine<float>({{bshd<const float>(o1.data(), 1, 1, 1, 2), lse_bhs(l1.data(), 1, 1, 1)},
                            {bshd<const float>(o2.data(), 1, 1, 1, 2), lse_bhs(l2.data(), 1, 1, 1)}},
                           bshd(o1.data(), 1, 1, 1, 2), lse_bhs(lse.data(), 1, 1, 1));
  EXPECT_NEAR(o1[0], 1.0f, 1e-6f);
  EXPECT_NEAR(o1[1], 5.0f, 1e-6f);
  EXPECT_NEAR(lse[0], std::log(4.0f), 1e-6f);
}

TEST(Combine, NanLsePropagates) {
  std::vector<float> o1{1, 2}, o2{3, 4}, out{7, 7};
  std::vector<float> l1{std::numeric_limits<float>::quiet_NaN()}, l2{0.0f}, lse{7};
  attention_combine<float>({{bshd<const float>(o1.data(), 1, 1, 1, 2), lse_bhs(l1.data(), 1, 1, 1)},
                            {bshd<const float>(o2.data(), 1, 1, 1, 2), lse_bhs(l2.data(), 1, 1, 1)}},
                           bshd(out.data(), 1, 1, 1, 2), lse_bhs(lse.data(), 1, 1, 1));
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]) && std::isnan(lse[0]));
}

// Each bad argument throws InvalidArgument naming it, and leaves the output as it was.
TEST(Combine, BadArgumentsThrowAndWriteNothing) {
  std::vector<float> o1(2 * 3 * 4, 1.0f), out(o1.size(), 7.0f), l1(2 * 3, 0.0f), lse(l1.size(), 7.0f);
  const auto part = [&](index_t seq) { return AttentionPart<float>{bshd<const float>(o1.data(), 1, seq, 2, 4),
                                                                   lse_bhs(l1.data(), 1, 2, seq)}; };
  const TensorView<float> ov = bshd(out.data(), 1, 3, 2, 4);
  const auto expect_throw = [&](auto&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no exception; expected one naming " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(out, std::vector<float>(out.size(), 7.0f));
    EXPECT_EQ(lse, std::vector<float>(lse.size(), 7.0f));
  };
  expect_throw([&] { attention_combine<float>(std::vector<AttentionPart<float>>{}, ov, lse_bhs(lse.data(), 1, 2, 3)); },
               "parts is empty");
  expect_throw([&] { attention_combine<float>({part(3), part(2)}, ov, lse_bhs(lse.data(), 1, 2, 3)); }, "parts[1].o");
  AttentionPart<float> no_lse = part(3);
  no_lse.lse = {};
  expect_throw([&] { attention_combine<float>({part(3), no_lse}, ov, lse_bhs(lse.data(), 1, 2, 3)); }, "parts[1].lse");
  expect_throw([&] { attention_combine<float>({part(3)}, ov, lse_bhs(lse.data(), 1, 2, 2)); }, "lse has shape");
}

}  // namespace
}  // namespace flashattn::testing
