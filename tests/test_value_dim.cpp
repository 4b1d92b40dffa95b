// V's head dim apart from Q/K's (MLA: 192 for q/k with 128 for v; absorbed MLA: 576 with v the first 512
// columns of k). Every path that moves a V or O row takes the value dim: the prefill kernel, split-KV and
// its merge, the decode kernel (both of its layouts: test_decode_amx runs every program in the lane
// layout), contiguous and paged caches, packed batches, and the backward. Checked against the fp64
// reference under the tolerance rule (forward and gradients, every storage type), against central
// differences, for equal bits on 1, 2 and 3 threads and between the cache and dense calls, and for the
// errors of shapes that do not fit together.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "expect_invalid.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/eigen.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/kv_cache.hpp"
#include "flashattn/varlen.hpp"
#include "grad_problem.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// Head dims (q/k, v): MLA's pair, a wider V, dims off whole packets, a V narrower than one packet.
constexpr std::pair<index_t, index_t> kDims[] = {{192, 128}, {40, 72}, {72, 8}, {16, 48}};

struct Shape {
  index_t batch, seq_q, seq_k, heads, heads_kv, dk, dv;
  std::string name() const {
    return "B" + std::to_string(batch) + " Sq" + std::to_string(seq_q) + " Sk" + std::to_string(seq_k) + " H" +
           std::to_string(heads) + ":" + std::to_string(heads_kv) + " dk" + std::to_string(dk) + " dv" +
           std::to_string(dv);
  }
};

template <class T>
struct Problem {
  HostTensor<T> q, k, v, o;
  HostLse lse;
  Problem(const Shape& s, Layout layout, std::uint32_t seed = 3)
      : q(layout, s.batch, s.seq_q, s.heads, s.dk),
        k(layout, s.batch, s.seq_k, s.heads_kv, s.dk),
        v(layout, s.batch, s.seq_k, s.heads_kv, s.dv),
        o(layout, s.batch, s.seq_q, s.heads, s.dv, T(std::numeric_limits<float>::quiet_NaN())),
        lse(s.batch, s.heads, s.seq_q) {
    fill_normal(q.view(), seed);
    fill_normal(k.view(), seed + 1);
    fill_normal(v.view(), seed + 2);
  }
  void forward(const cpu::Context<>& ctx, const AttentionOptions& opts) {
    attention_forward(ctx, q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  }
  ::testing::AssertionResult matches(const AttentionOptions& opts) const {
    return matches_reference_for_options<T>(q.cview(), k.cview(), v.cview(), o.cview(), lse.view(), opts);
  }
};

// Query rows 1 and 4 take the decode kernel, 65 and 130 the prefill kernel; each also through the
// prefill kernel alone (decode_kernel = false).
template <class T>
void forward_matches_reference() {
  const std::pair<index_t, index_t> lengths[] = {{1, 70}, {4, 300}, {65, 130}, {130, 67}};
  for (auto [dk, dv] : kDims)
    for (auto [sq, sk] : lengths)
      for (bool causal : {false, true})
        for (bool decode : {true, false}) {
          const Shape s{2, sq, sk, 4, 2, dk, dv};
          Problem<T> pr(s, causal ? Layout::Bhsd : Layout::Bshd);
          AttentionOptions opts;
          opts.causal = causal;
          cpu::Context<> ctx{2};
          ctx.decode_kernel = decode;
          pr.forward(ctx, opts);
          EXPECT_TRUE(pr.matches(opts)) << s.name() << " causal=" << causal << " decode=" << decode;
        }
}

TEST(ValueDim, ForwardFp32) { forward_matches_reference<float>(); }
TEST(ValueDim, ForwardFp64) { forward_matches_reference<double>(); }
TEST(ValueDim, ForwardBf16) { forward_matches_reference<Eigen::bfloat16>(); }
TEST(ValueDim, ForwardFp16) { forward_matches_reference<Eigen::half>(); }

// Few programs against many keys: the keys are split into ranges and merged (split-KV in the prefill
// kernel, the decode kernel's ranges), whose partial rows are V's width. Ranges depend on the shape only,
// so every thread count gives the same bits.
TEST(ValueDim, SplitKeysSameBitsOnAnyThreadCount) {
  for (index_t sq : {2, 40})
    for (auto [dk, dv] : {std::pair<index_t, index_t>{192, 128}, {40, 72}}) {
      const Shape s{1, sq, 5000, 2, 1, dk, dv};
      Problem<float> first(s, Layout::Bhsd);
      first.forward(cpu::Context<>{1}, {});
      EXPECT_TRUE(first.matches({})) << s.name();
      for (int threads : {2, 3}) {
        Problem<float> again(s, Layout::Bhsd);
        again.forward(cpu::Context<>{threads}, {});
        EXPECT_EQ(bytes_of(first.o.storage()), bytes_of(again.o.storage())) << s.name() << " threads=" << threads;
      }
    }
}

// Absorbed MLA (DeepSeek's decode): one latent KV head of 576 (512 latent + 64 rotary) shared by every
// query head, and V the first 512 columns of the same memory as K.
template <class T>
void absorbed_mla() {
  for (index_t sq : {1, 2, 33}) {
    const index_t batch = 2, sk = 150, heads = 8, dk = 576, dv = 512;
    HostTensor<T> q(Layout::Bshd, batch, sq, heads, dk), k(Layout::Bshd, batch, sk, 1, dk);
    HostTensor<T> o(Layout::Bshd, batch, sq, heads, dv);
    fill_normal(q.view(), 11, 0.05);  // dot products of 576 terms: keep the scores moderate
    fill_normal(k.view(), 12);
    TensorView<const T> v = k.cview();
    v.dim = dv;  // the same rows, their first 512 columns
    HostLse lse(batch, heads, sq);
    attention_forward(cpu::Context<>{2}, q.cview(), k.cview(), v, o.view(), {}, lse.view());
    EXPECT_TRUE(matches_reference_for_options<T>(q.cview(), k.cview(), v, o.cview(), lse.view(), {})) << "sq=" << sq;
  }
}

TEST(ValueDim, AbsorbedMlaVIsAViewOfKFp32) { absorbed_mla<float>(); }
TEST(ValueDim, AbsorbedMlaVIsAViewOfKBf16) { absorbed_mla<Eigen::bfloat16>(); }

// A cache with capacity and a paged cache (pages of 16 rows, in a shuffled order) give the bits of the
// dense call on the same keys; appending writes rows of each matrix's own width.
TEST(ValueDim, CachesGiveTheBitsOfTheDenseCall) {
  const index_t batch = 2, heads = 4, heads_kv = 2, dk = 192, dv = 128, capacity = 96, page = 16;
  const std::int32_t lens[] = {70, 41};
  for (index_t sq : {1, 3, 20}) {
    HostTensor<float> q(Layout::Bshd, batch, sq, heads, dk);
    fill_normal(q.view(), 5);
    HostTensor<float> k_cache(Layout::Bshd, batch, capacity, heads_kv, dk);
    HostTensor<float> v_cache(Layout::Bshd, batch, capacity, heads_kv, dv);
    std::vector<std::int32_t> lengths(batch, 0);
    const KvCacheView<float> cache{k_cache.view(), v_cache.view(), lengths.data()};
    // Paged: pages of (page, heads_kv, dim) with K and V apart, the table naming them in reverse order.
    const index_t pages_per_seq = capacity / page, num_pages = batch * pages_per_seq;
    HostTensor<float> k_pages(Layout::Bshd, num_pages, page, heads_kv, dk);
    HostTensor<float> v_pages(Layout::Bshd, num_pages, page, heads_kv, dv);
    std::vector<std::int32_t> table(static_cast<std::size_t>(num_pages)), paged_lengths(batch, 0);
    for (index_t i = 0; i < num_pages; ++i) table[std::size_t(i)] = std::int32_t(num_pages - 1 - i);
    PagedKvCacheView<float> paged{k_pages.view(), v_pages.view(), table.data(), batch, pages_per_seq,
                                  pages_per_seq, paged_lengths.data()};
    // Fill both caches by appends of the same rows, in two chunks per request.
    for (int chunk = 0; chunk < 2; ++chunk) {
      for (index_t b = 0; b < batch; ++b) {
        const index_t n = chunk == 0 ? lens[b] / 2 : lens[b] - lens[b] / 2;
        HostTensor<float> k_new(Layout::Bshd, 1, n, heads_kv, dk), v_new(Layout::Bshd, 1, n, heads_kv, dv);
        fill_normal(k_new.view(), std::uint32_t(100 + 10 * b + chunk));
        fill_normal(v_new.view(), std::uint32_t(200 + 10 * b + chunk));
        // One request at a time: views of batch 1 on request b's rows.
        KvCacheView<float> one = cache;
        one.k.data += b * one.k.stride_batch;
        one.v.data += b * one.v.stride_batch;
        one.k.batch = one.v.batch = 1;
        one.lengths = lengths.data() + b;
        kv_cache_append(one, k_new.cview(), v_new.cview());
        PagedKvCacheView<float> one_paged = paged;
        one_paged.block_table = table.data() + b * pages_per_seq;
        one_paged.batch = 1;
        one_paged.lengths = paged_lengths.data() + b;
        kv_cache_append(one_paged, k_new.cview(), v_new.cview());
      }
    }
    ASSERT_EQ(lengths, std::vector<std::int32_t>(lens, lens + batch));
    ASSERT_EQ(paged_lengths, lengths);

    HostTensor<float> o_cache(Layout::Bshd, batch, sq, heads, dv), o_paged(Layout::Bshd, batch, sq, heads, dv);
    AttentionOptions opts;
    opts.causal = true;
    attention_forward<float>(q.cview(), KvCacheView<const float>(cache), o_cache.view(), opts);
    attention_forward<float>(q.cview(), PagedKvCacheView<const float>(paged), o_paged.view(), opts);
    EXPECT_EQ(bytes_of(o_cache.storage()), bytes_of(o_paged.storage())) << "sq=" << sq;
    // The dense call per request, on the cache's used rows.
    for (index_t b = 0; b < batch; ++b) {
      const auto rows = [&](const TensorView<float>& x) {
        TensorView<const float> r = x;
        r.data += b * x.stride_batch;
        r.batch = 1;
        r.seq = lens[b];
        return r;
      };
      TensorView<const float> qb = q.cview();
      qb.data += b * qb.stride_batch;
      qb.batch = 1;
      HostTensor<float> o_dense(Layout::Bshd, 1, sq, heads, dv);
      attention_forward<float>(qb, rows(k_cache.view()), rows(v_cache.view()), o_dense.view(), opts);
      const float* from_cache = o_cache.storage().data() + b * sq * heads * dv;
      EXPECT_EQ(bytes_of(o_dense.storage()), bytes_of(from_cache, std::size_t(sq * heads * dv)))
          << "sq=" << sq << " request " << b;
      EXPECT_TRUE(matches_reference_for_options<float>(qb, rows(k_cache.view()), rows(v_cache.view()),
                                                       o_dense.cview(), {}, opts));
    }
  }
}

// Gradients against the fp64 reference: dq and dk of Q/K's width, dv of V's.
template <class T>
void backward_matches_reference() {
  for (auto [dk, dv] : kDims)
    for (bool causal : {false, true}) {
      GradProblem<T> pr(Layout::Bshd, 2, 70, 90, 4, 2, dk, 21, dv);
      AttentionOptions opts;
      opts.causal = causal;
      pr.forward(opts, 2);
      pr.backward(opts, 2);
      EXPECT_TRUE(grads_match(pr, 1.0 / std::sqrt(double(dk)), band_of(opts, 70, 90)))
          << "dk=" << dk << " dv=" << dv << " causal=" << causal;
    }
}

TEST(ValueDim, BackwardFp32) { backward_matches_reference<float>(); }
TEST(ValueDim, BackwardFp64) { backward_matches_reference<double>(); }
TEST(ValueDim, BackwardBf16) { backward_matches_reference<Eigen::bfloat16>(); }

// Central differences of the fp64 reference's loss Σ O ⊙ dO, and the same bits on 1, 2 and 3 threads.
TEST(ValueDim, BackwardCentralDifferencesAndThreads) {
  const index_t sq = 9, sk = 13, dk = 12, dv = 5;
  GradProblem<double> pr(Layout::Bshd, 1, sq, sk, 2, 1, dk, 31, dv);
  AttentionOptions opts;
  opts.causal = true;
  pr.forward(opts, 1);
  pr.backward(opts, 1);
  const double scale = 1.0 / std::sqrt(double(dk));
  const auto loss = [&] {
    const ReferenceResult r = reference_attention<double>(pr.q.cview(), pr.k.cview(), pr.v.cview(), scale,
                                                          band_of(opts, sq, sk));
    const std::vector<double> d_o = to_double(pr.d_o.cview());
    return std::inner_product(r.o.begin(), r.o.end(), d_o.begin(), 0.0);
  };
  expect_central_differences(pr, loss, 12, 7);

  GradProblem<float> one(Layout::Bhsd, 2, 150, 200, 4, 2, 192, 41, 128);
  one.forward(opts, 1);
  one.backward(opts, 1);
  for (int threads : {2, 3}) {
    GradProblem<float> again(Layout::Bhsd, 2, 150, 200, 4, 2, 192, 41, 128);
    again.forward(opts, threads);
    again.backward(opts, threads);
    EXPECT_EQ(bytes_of(one.dq.storage()), bytes_of(again.dq.storage())) << threads;
    EXPECT_EQ(bytes_of(one.dk.storage()), bytes_of(again.dk.storage())) << threads;
    EXPECT_EQ(bytes_of(one.dv.storage()), bytes_of(again.dv.storage())) << threads;
  }
}

// A packed batch: each sequence's rows as the dense call gives them, and the packed backward against the
// reference of each sequence.
TEST(ValueDim, PackedBatchForwardAndBackward) {
  const index_t heads = 2, dk = 40, dv = 24;
  const std::vector<std::int32_t> cu = {0, 17, 17, 90};  // an empty sequence in the middle
  const index_t total = cu.back(), batch = index_t(cu.size()) - 1;
  HostTensor<float> q(Layout::Bshd, 1, total, heads, dk), k(Layout::Bshd, 1, total, heads, dk);
  HostTensor<float> v(Layout::Bshd, 1, total, heads, dv), o(Layout::Bshd, 1, total, heads, dv);
  HostTensor<float> d_o(Layout::Bshd, 1, total, heads, dv), dq(Layout::Bshd, 1, total, heads, dk);
  HostTensor<float> dk_(Layout::Bshd, 1, total, heads, dk), dv_(Layout::Bshd, 1, total, heads, dv);
  fill_normal(q.view(), 51);
  fill_normal(k.view(), 52);
  fill_normal(v.view(), 53);
  fill_normal(d_o.view(), 54);
  std::vector<float> lse(std::size_t(heads * total));
  AttentionOptions opts;
  opts.causal = true;
  const PackedBatch seqs{cu.data(), cu.data(), batch};
  attention_forward_varlen<float>(q.cview(), k.cview(), v.cview(), o.view(), seqs, opts,
                                  lse_packed(lse.data(), heads, total));
  attention_backward_varlen<float>(q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(),
                                   lse_packed(lse.data(), heads, total), dq.view(), dk_.view(), dv_.view(), seqs,
                                   opts);
  for (index_t b = 0; b < batch; ++b) {
    const index_t n = cu[b + 1] - cu[b];
    if (n == 0) continue;
    const auto rows = [&](const TensorView<float>& x) {
      TensorView<const float> r = x;
      r.data += cu[b] * x.stride_seq;
      r.seq = n;
      return r;
    };
    GradProblem<float> dense(Layout::Bshd, 1, n, n, heads, heads, dk, 0, dv);
    const auto copy = [](const TensorView<const float>& from, const TensorView<float>& to) {
      for (index_t s = 0; s < from.seq; ++s)
        for (index_t h = 0; h < from.heads; ++h)
          for (index_t c = 0; c < from.dim; ++c) to(0, s, h, c) = from(0, s, h, c);
    };
    copy(rows(q.view()), dense.q.view());
    copy(rows(k.view()), dense.k.view());
    copy(rows(v.view()), dense.v.view());
    copy(rows(d_o.view()), dense.d_o.view());
    dense.forward(opts, 1);
    dense.backward(opts, 1);
    const auto same = [&](const TensorView<float>& packed, const HostTensor<float>& want) {
      HostTensor<float> got(Layout::Bshd, 1, n, heads, want.view().dim);
      copy(rows(packed), got.view());
      return bytes_of(got.storage()) == bytes_of(want.storage());
    };
    EXPECT_TRUE(same(o.view(), dense.o)) << "o of sequence " << b;
    EXPECT_TRUE(same(dq.view(), dense.dq)) << "dq of sequence " << b;
    EXPECT_TRUE(same(dk_.view(), dense.dk)) << "dk of sequence " << b;
    EXPECT_TRUE(same(dv_.view(), dense.dv)) << "dv of sequence " << b;
    EXPECT_TRUE(grads_match(dense, 1.0 / std::sqrt(double(dk)), band_of(opts, n, n))) << "sequence " << b;
  }
}

// The Eigen interface returns (seq_q, dv).
TEST(ValueDim, EigenReturnsRowsOfVsWidth) {
  using Mat = RowMajorMatrix<float>;
  const Mat q = Mat::Random(7, 24), k = Mat::Random(11, 24), v = Mat::Random(11, 10);
  const Mat o = attention(cpu::Context<>{1}, q, k, v);
  EXPECT_EQ(o.rows(), 7);
  EXPECT_EQ(o.cols(), 10);
  HostTensor<float> qh(Layout::Bshd, 1, 7, 1, 24), kh(Layout::Bshd, 1, 11, 1, 24), vh(Layout::Bshd, 1, 11, 1, 10);
  std::copy(q.data(), q.data() + q.size(), qh.storage().begin());
  std::copy(k.data(), k.data() + k.size(), kh.storage().begin());
  std::copy(v.data(), v.data() + v.size(), vh.storage().begin());
  HostTensor<float> oh(Layout::Bshd, 1, 7, 1, 10);
  std::copy(o.data(), o.data() + o.size(), oh.storage().begin());
  EXPECT_TRUE(matches_reference_for_options<float>(qh.cview(), kh.cview(), vh.cview(), oh.cview(), {}, {}));
}

// f() throws InvalidArgument whose message contains every needle.
template <class F>
void rejects(F&& f, const std::vector<std::string>& needles) {
  for (const std::string& needle : needles) expect_invalid(f, needle);
}

// Shapes that do not fit together: InvalidArgument naming the argument, outputs untouched.
TEST(ValueDim, BadShapesAreRejected) {
  const index_t dk = 32, dv = 16;
  Problem<float> pr(Shape{1, 5, 9, 2, 1, dk, dv}, Layout::Bshd);
  const std::vector<float> untouched = pr.o.storage();
  TensorView<float> o = pr.o.view();
  o.dim = dk;  // o with q's head dim instead of v's
  rejects([&] { attention_forward<float>(pr.q.cview(), pr.k.cview(), pr.v.cview(), o); }, {"head dims must agree: o and v", "o (batch=1, seq=5, heads=2, dim=32)"});
  TensorView<const float> k = pr.k.cview();
  k.dim = dv;  // k with v's head dim
  rejects([&] { attention_forward<float>(pr.q.cview(), k, pr.v.cview(), pr.o.view()); }, {"head dims must agree: q and k", "k (batch=1, seq=9, heads=1, dim=16)"});
  EXPECT_EQ(bytes_of(untouched), bytes_of(pr.o.storage()));

  // A V wider than the CPU's limit, Q/K within it.
  HostTensor<float> wide_v(Layout::Bshd, 1, 9, 1, cpu::kMaxHeadDim + 1), wide_o(Layout::Bshd, 1, 5, 2, cpu::kMaxHeadDim + 1);
  rejects([&] { attention_forward<float>(pr.q.cview(), pr.k.cview(), wide_v.cview(), wide_o.view()); }, {"head dim of v " + std::to_string(cpu::kMaxHeadDim + 1), "larger than the supported maximum"});

  // The backward: d_o and dv take v's head dim.
  GradProblem<float> g(Layout::Bshd, 1, 5, 9, 2, 1, dk, 3, dv);
  g.forward({}, 1);
  TensorView<const float> d_o = g.d_o.cview();
  d_o.dim = dk;
  rejects([&] { attention_backward<float>(g.q.cview(), g.k.cview(), g.v.cview(), g.o.cview(), d_o, g.lse.view(),
                                            g.dq.view(), g.dk.view(), g.dv.view()); }, {"d_o must have q's seq and heads and v's head dim", "d_o (batch=1, seq=5, heads=2, dim=32)"});
  TensorView<float> dv_wrong = g.dv.view();
  dv_wrong.dim = dk;
  rejects([&] { attention_backward<float>(g.q.cview(), g.k.cview(), g.v.cview(), g.o.cview(), g.d_o.cview(),
                                            g.lse.view(), g.dq.view(), g.dk.view(), dv_wrong); }, {"dv must have v's shape", "dv (batch=1, seq=9, heads=1, dim=32)"});
}

}  // namespace
}  // namespace flashattn::testing
