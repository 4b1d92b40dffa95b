// Variable-length packed batches (flashattn/varlen.hpp): sequences of different lengths packed into
// (total, heads, dim) tensors with cu_seqlens offsets. A packed call must give each sequence the bits of
// a separate dense call on that sequence alone through the same kernel (same tiles; key counts below the
// split threshold, so neither call splits its keys), prefill and decode, with masks and GQA; longer
// sequences (split into key ranges) against the fp64 reference for every storage type; the same bits on
// 1, 2 and 3 threads; and bad offsets rejected before anything is written.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/varlen.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

struct VarlenCase {
  std::vector<std::int32_t> q_lens, k_lens;
  index_t heads, heads_kv, dim;
  bool causal = false;
  index_t window_left = -1;

  index_t batch() const { return index_t(q_lens.size()); }
  std::vector<std::int32_t> cu(const std::vector<std::int32_t>& lens) const {
    std::vector<std::int32_t> c{0};
    for (auto l : lens) c.push_back(c.back() + l);
    return c;
  }
  AttentionOptions options() const {
    AttentionOptions o;
    o.causal = causal;
    o.window_left = window_left;
    return o;
  }
  std::string name() const {
    std::string s = "q";
    for (auto l : q_lens) s += " " + std::to_string(l);
    s += " k";
    for (auto l : k_lens) s += " " + std::to_string(l);
    return s + " H" + std::to_string(heads) + ":" + std::to_string(heads_kv) + " d" + std::to_string(dim) +
           (causal ? " causal" : "") + (window_left >= 0 ? " wl" + std::to_string(window_left) : "");
  }
};

template <class T>
struct Packed {
  VarlenCase c;
  std::vector<std::int32_t> cu_q, cu_k;
  HostTensor<T> q, k, v, o;
  HostLse lse;
  explicit Packed(const VarlenCase& cc)
      : c(cc),
        cu_q(c.cu(c.q_lens)),
        cu_k(c.cu(c.k_lens)),
        q(Layout::Bshd, 1, cu_q.back(), c.heads, c.dim),
        k(Layout::Bshd, 1, cu_k.back(), c.heads_kv, c.dim),
        v(Layout::Bshd, 1, cu_k.back(), c.heads_kv, c.dim),
        o(Layout::Bshd, 1, cu_q.back(), c.heads, c.dim, T(-3)),
        lse(1, c.heads, cu_q.back()) {
    fill_normal(q.view(), 21);
    fill_normal(k.view(), 22);
    fill_normal(v.view(), 23);
  }
  PackedBatch seqs() const { return {cu_q.data(), cu_k.data(), c.batch()}; }
  // Sequence b's rows of a packed (1, total, heads, dim) view, as a dense batch of one.
  template <class X>
  static TensorView<X> rows(TensorView<X> x, index_t first, index_t n) {
    x.data += first * x.stride_seq;
    x.seq = n;
    return x;
  }
};

// Sequence b's LSE rows of a packed (1, heads, total) LSE, as (1, heads, n).
LseView lse_rows(LseView x, index_t first, index_t n) {
  x.data += first * x.stride_seq;
  x.seq = n;
  return x;
}

std::vector<VarlenCase> short_cases() {
  return {
      {{5, 300, 1, 0, 64}, {7, 300, 450, 3, 64}, 8, 2, 64, true},  // prefill: causal, an empty sequence
      {{100, 37, 200}, {100, 500, 9}, 4, 4, 40},                    // no mask, dim off whole packets
      {{1, 1, 1, 1}, {1, 77, 256, 500}, 8, 2, 128},                // decode rows
      {{4, 16, 3}, {20, 400, 3}, 6, 3, 64, true},                  // speculative rows, causal
      {{64, 90}, {300, 90}, 4, 2, 64, false, 40},                  // sliding window
  };
}

template <class T>
void check_equals_separate_calls() {
  using Ctx = cpu::Context<cpu::DefaultTiles<T>>;
  for (const VarlenCase& c : short_cases()) {
    SCOPED_TRACE(c.name());
    Packed<T> pk(c);
    attention_forward_varlen(Ctx{2}, pk.q.cview(), pk.k.cview(), pk.v.cview(), pk.o.view(), pk.seqs(), c.options(),
                             pk.lse.view());
    // The packed call takes the decode kernel when its longest sequence does: each separate call must take
    // the same kernel to give the same bits.
    Ctx one{1};
    one.decode_kernel = *std::max_element(c.q_lens.begin(), c.q_lens.end()) <= 16;
    for (index_t b = 0; b < c.batch(); ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      const index_t q0 = pk.cu_q[b], nq = c.q_lens[b], k0 = pk.cu_k[b], nk = c.k_lens[b];
      if (nq == 0) continue;
      HostTensor<T> o(Layout::Bshd, 1, nq, c.heads, c.dim);
      HostLse lse(1, c.heads, nq);
      attention_forward(one, Packed<T>::rows(pk.q.cview(), q0, nq), Packed<T>::rows(pk.k.cview(), k0, nk),
                        Packed<T>::rows(pk.v.cview(), k0, nk), o.view(), c.options(), lse.view());
      const TensorView<T> got = Packed<T>::rows(pk.o.view(), q0, nq);
      EXPECT_EQ(bytes_of(got.data, std::size_t(got.numel())), bytes_of(o.storage().data(), o.storage().size()));
      for (index_t h = 0; h < c.heads; ++h)
        for (index_t i = 0; i < nq; ++i) {
          const float a = lse_rows(pk.lse.view(), q0, nq)(0, h, i), e = lse.view()(0, h, i);
          EXPECT_TRUE(std::memcmp(&a, &e, sizeof(float)) == 0) << "lse h" << h << " row " << i << ": " << a << " vs " << e;
        }
    }
  }
}

TEST(Varlen, Fp32EqualsSeparateCalls) { check_equals_separate_calls<float>(); }
TEST(Varlen, Bf16EqualsSeparateCalls) { check_equals_separate_calls<Eigen::bfloat16>(); }
TEST(Varlen, Fp16EqualsSeparateCalls) { check_equals_separate_calls<Eigen::half>(); }

// Long sequences beside short ones (the long ones' keys are split into ranges) against fp64.
template <class T>
void check_against_reference() {
  for (const VarlenCase& c : {VarlenCase{{1, 2, 1}, {3000, 40, 0}, 8, 2, 128},
                              VarlenCase{{700, 20, 1}, {2500, 20, 1}, 4, 2, 64, true}}) {
    SCOPED_TRACE(c.name());
    Packed<T> pk(c);
    attention_forward_varlen<T>(pk.q.cview(), pk.k.cview(), pk.v.cview(), pk.o.view(), pk.seqs(), c.options(),
                                pk.lse.view());
    for (index_t b = 0; b < c.batch(); ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      const index_t q0 = pk.cu_q[b], nq = c.q_lens[b], k0 = pk.cu_k[b], nk = c.k_lens[b];
      EXPECT_TRUE(matches_reference_for_options<T>(
          Packed<T>::rows(pk.q.cview(), q0, nq), Packed<T>::rows(pk.k.cview(), k0, nk),
          Packed<T>::rows(pk.v.cview(), k0, nk), Packed<T>::rows(pk.o.cview(), q0, nq),
          lse_rows(pk.lse.view(), q0, nq), c.options()));
    }
  }
}

TEST(Varlen, Fp32MatchesReference) { check_against_reference<float>(); }
TEST(Varlen, Fp64MatchesReference) { check_against_reference<double>(); }
TEST(Varlen, Bf16MatchesReference) { check_against_reference<Eigen::bfloat16>(); }
TEST(Varlen, Fp16MatchesReference) { check_against_reference<Eigen::half>(); }

TEST(Varlen, ThreadCountsGiveTheSameBits) {
  for (const VarlenCase& c : {short_cases()[0], short_cases()[2], VarlenCase{{3, 1}, {4000, 700}, 8, 2, 64}}) {
    SCOPED_TRACE(c.name());
    std::vector<unsigned char> first;
    for (int threads : {1, 2, 3}) {
      Packed<float> pk(c);
      attention_forward_varlen(cpu::Context<>{threads}, pk.q.cview(), pk.k.cview(), pk.v.cview(), pk.o.view(),
                               pk.seqs(), c.options(), pk.lse.view());
      const auto got = bytes_of(pk.o.storage().data(), pk.o.storage().size());
      if (threads == 1) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << threads << " threads";
      }
    }
  }
}

// Offsets that do not describe the packed tensors: InvalidArgument naming them, o untouched.
TEST(Varlen, BadOffsetsThrowAndWriteNothing) {
  const VarlenCase c{{2, 3}, {4, 1}, 2, 1, 8};
  const auto rejects = [&](auto&& corrupt, const std::string& needle) {
    Packed<float> pk(c);
    PackedBatch seqs = pk.seqs();
    TensorView<const float> q = pk.q.cview();
    corrupt(pk, seqs, q);
    try {
      attention_forward_varlen<float>(q, pk.k.cview(), pk.v.cview(), pk.o.view(), seqs);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      for (float x : pk.o.storage()) EXPECT_EQ(x, -3.0f);
      return;
    }
    ADD_FAILURE() << "no exception for " << needle;
  };
  using P = Packed<float>;
  rejects([](P& pk, PackedBatch&, TensorView<const float>&) { pk.cu_q[0] = 1; }, "cu_seqlens_q[0] must be 0, got 1");
  rejects([](P& pk, PackedBatch&, TensorView<const float>&) { pk.cu_k[1] = 6; },
          "cu_seqlens_k must not decrease: cu_seqlens_k[1] = 6 > cu_seqlens_k[2] = 5");
  rejects([](P& pk, PackedBatch&, TensorView<const float>&) { pk.cu_q[2] = 4; },
          "cu_seqlens_q[batch = 2] = 4 must be q's total rows (5)");
  rejects([](P&, PackedBatch& s, TensorView<const float>&) { s.cu_seqlens_k = nullptr; }, "cu_seqlens_k is null");
  rejects([](P&, PackedBatch& s, TensorView<const float>&) { s.batch = -1; }, "seqs.batch must be >= 0, got -1");
  rejects([](P&, PackedBatch&, TensorView<const float>& q) { q.batch = 2; }, "batch sizes disagree");
}

}  // namespace
}  // namespace flashattn::testing
