// Variable-length packed batches (flashattn/varlen.hpp): sequences of different lengths packed into
// (total, heads, dim) tensors with cu_seqlens offsets. A packed call must give each sequence the bits of
// a separate dense call on that sequence alone through the same kernel (same tiles; key counts below the
// split threshold, so neither call splits its keys), prefill and decode, with masks and GQA; longer
// sequences (split into key ranges) against the fp64 reference for every storage type; the same bits on
// 1, 2 and 3 threads; and bad offsets rejected before anything is written. The packed backward likewise:
// each sequence's dq, dk, dv have the bits of a separate dense backward, match the fp64 gradients under
// the tolerance rule, do not depend on the thread count, and bad offsets are rejected.

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
#include "reference_backward.hpp"
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

// ---- The packed backward ----------------------------------------------------------------------------------

// A packed forward's tensors plus dO and the three gradients (NaN first: an element the backward forgets
// to write fails every comparison).
template <class T>
struct PackedGrads : Packed<T> {
  HostTensor<T> d_o, dq, dk, dv;
  explicit PackedGrads(const VarlenCase& c)
      : Packed<T>(c),
        d_o(Layout::Bshd, 1, this->cu_q.back(), c.heads, c.dim),
        dq(Layout::Bshd, 1, this->cu_q.back(), c.heads, c.dim, nan()),
        dk(Layout::Bshd, 1, this->cu_k.back(), c.heads_kv, c.dim, nan()),
        dv(Layout::Bshd, 1, this->cu_k.back(), c.heads_kv, c.dim, nan()) {
    fill_normal(d_o.view(), 24);
  }
  static T nan() { return T(std::numeric_limits<float>::quiet_NaN()); }

  template <class Ctx>
  void run(const Ctx& ctx) {
    attention_forward_varlen(ctx, this->q.cview(), this->k.cview(), this->v.cview(), this->o.view(), this->seqs(),
                             this->c.options(), this->lse.view());
    attention_backward_varlen(ctx, this->q.cview(), this->k.cview(), this->v.cview(), this->o.cview(), d_o.cview(),
                              this->lse.view(), dq.view(), dk.view(), dv.view(), this->seqs(), this->c.options());
  }
  std::vector<unsigned char> grad_bytes() const {
    std::vector<unsigned char> all;
    for (const HostTensor<T>* g : {&dq, &dk, &dv}) {
      const auto b = bytes_of(g->storage().data(), g->storage().size());
      all.insert(all.end(), b.begin(), b.end());
    }
    return all;
  }
};

// Backward cases: prefill-shaped (the backward has no decode kernel), with an empty sequence, keys without
// queries and queries without keys.
std::vector<VarlenCase> backward_cases() {
  return {
      {{5, 300, 0, 64, 3}, {7, 300, 450, 64, 0}, 8, 2, 64, true},
      {{100, 37, 200}, {100, 500, 9}, 4, 4, 40},
      {{4, 130, 3}, {20, 400, 3}, 6, 3, 64, true},
      {{64, 90}, {300, 90}, 4, 2, 64, false, 40},
  };
}

template <class T>
void check_backward_equals_separate_calls() {
  using Ctx = cpu::Context<cpu::DefaultTiles<T>>;
  for (const VarlenCase& c : backward_cases()) {
    SCOPED_TRACE(c.name());
    PackedGrads<T> pk(c);
    pk.run(Ctx{2});
    for (index_t b = 0; b < c.batch(); ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      const index_t q0 = pk.cu_q[b], nq = c.q_lens[b], k0 = pk.cu_k[b], nk = c.k_lens[b];
      using P = Packed<T>;
      HostTensor<T> dq(Layout::Bshd, 1, nq, c.heads, c.dim), dk(Layout::Bshd, 1, nk, c.heads_kv, c.dim),
          dv(Layout::Bshd, 1, nk, c.heads_kv, c.dim);
      // The packed forward's O and LSE are a separate forward's bits (check_equals_separate_calls).
      attention_backward(Ctx{1}, P::rows(pk.q.cview(), q0, nq), P::rows(pk.k.cview(), k0, nk),
                         P::rows(pk.v.cview(), k0, nk), P::rows(pk.o.cview(), q0, nq),
                         P::rows(pk.d_o.cview(), q0, nq), lse_rows(pk.lse.view(), q0, nq), dq.view(), dk.view(),
                         dv.view(), c.options());
      const TensorView<T> got[] = {P::rows(pk.dq.view(), q0, nq), P::rows(pk.dk.view(), k0, nk),
                                   P::rows(pk.dv.view(), k0, nk)};
      const HostTensor<T>* want[] = {&dq, &dk, &dv};
      const char* names[] = {"dq", "dk", "dv"};
      for (int g = 0; g < 3; ++g)
        EXPECT_EQ(bytes_of(got[g].data, std::size_t(got[g].numel())),
                  bytes_of(want[g]->storage().data(), want[g]->storage().size()))
            << names[g];
    }
  }
}

TEST(VarlenBackward, Fp32EqualsSeparateCalls) { check_backward_equals_separate_calls<float>(); }
TEST(VarlenBackward, Bf16EqualsSeparateCalls) { check_backward_equals_separate_calls<Eigen::bfloat16>(); }
TEST(VarlenBackward, Fp16EqualsSeparateCalls) { check_backward_equals_separate_calls<Eigen::half>(); }

// Each sequence's gradients against the fp64 ones, under the tolerance rule (2 × a naive backward in T's
// accumulator rounding to T between steps, plus a tiny epsilon).
template <class T>
void check_backward_against_reference() {
  const VarlenCase c{{30, 200, 1}, {300, 200, 17}, 4, 2, 64, true};
  SCOPED_TRACE(c.name());
  PackedGrads<T> pk(c);
  pk.run(cpu::Context<>{});
  for (index_t b = 0; b < c.batch(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    using P = Packed<T>;
    const index_t q0 = pk.cu_q[b], nq = c.q_lens[b], k0 = pk.cu_k[b], nk = c.k_lens[b];
    const auto q = P::rows(pk.q.cview(), q0, nq), k = P::rows(pk.k.cview(), k0, nk),
               v = P::rows(pk.v.cview(), k0, nk), d_o = P::rows(pk.d_o.cview(), q0, nq);
    const double scale = 1.0 / std::sqrt(double(c.dim));
    const BandMask mask = BandMask::window(nq, nk, c.window_left, c.causal ? 0 : -1);
    const ReferenceGrads exact = reference_backward<double>(q, k, v, d_o, scale, mask);
    const ReferenceGrads naive = reference_backward<cpu::acc_t<T>, T>(q, k, v, d_o, scale, mask);
    const std::vector<double> got[] = {to_double(P::rows(pk.dq.cview(), q0, nq)),
                                       to_double(P::rows(pk.dk.cview(), k0, nk)),
                                       to_double(P::rows(pk.dv.cview(), k0, nk))};
    const std::vector<double>* exacts[] = {&exact.dq, &exact.dk, &exact.dv};
    const std::vector<double>* naives[] = {&naive.dq, &naive.dk, &naive.dv};
    const char* names[] = {"dq", "dk", "dv"};
    for (int g = 0; g < 3; ++g) {
      const ToleranceCheck t{max_abs_error(got[g], *exacts[g]), max_abs_error(*naives[g], *exacts[g]),
                             tiny_eps<T>(max_abs_finite(*exacts[g]), std::is_same_v<T, double> ? 16.0 : 4.0)};
      EXPECT_TRUE(t.ok()) << t.describe(names[g]);
    }
  }
}

TEST(VarlenBackward, Fp32MatchesReference) { check_backward_against_reference<float>(); }
TEST(VarlenBackward, Fp64MatchesReference) { check_backward_against_reference<double>(); }
TEST(VarlenBackward, Bf16MatchesReference) { check_backward_against_reference<Eigen::bfloat16>(); }
TEST(VarlenBackward, Fp16MatchesReference) { check_backward_against_reference<Eigen::half>(); }

TEST(VarlenBackward, ThreadCountsGiveTheSameBits) {
  const VarlenCase c = backward_cases()[0];
  std::vector<unsigned char> first;
  for (int threads : {1, 2, 3}) {
    PackedGrads<float> pk(c);
    pk.run(cpu::Context<>{threads});
    if (threads == 1) {
      first = pk.grad_bytes();
    } else {
      EXPECT_EQ(pk.grad_bytes(), first) << threads << " threads";
    }
  }
}

// Bad offsets, and gradients on top of them: InvalidArgument naming them, the gradients untouched.
TEST(VarlenBackward, BadOffsetsThrowAndWriteNothing) {
  const VarlenCase c{{2, 3}, {4, 1}, 2, 1, 8};
  const auto rejects = [&](auto&& corrupt, const std::string& needle) {
    PackedGrads<float> pk(c);
    std::fill(pk.dq.storage().begin(), pk.dq.storage().end(), -3.0f);
    std::fill(pk.dk.storage().begin(), pk.dk.storage().end(), -3.0f);
    PackedBatch seqs = pk.seqs();
    TensorView<float> dk = pk.dk.view();
    corrupt(pk, seqs, dk);
    try {
      attention_backward_varlen<float>(pk.q.cview(), pk.k.cview(), pk.v.cview(), pk.o.cview(), pk.d_o.cview(),
                                       pk.lse.view(), pk.dq.view(), dk, pk.dv.view(), seqs);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      for (float x : pk.dq.storage()) EXPECT_EQ(x, -3.0f);
      for (float x : pk.dk.storage()) EXPECT_EQ(x, -3.0f);
      return;
    }
    ADD_FAILURE() << "no exception for " << needle;
  };
  using G = PackedGrads<float>;
  rejects([](G& pk, PackedBatch&, TensorView<float>&) { pk.cu_q[0] = 1; }, "cu_seqlens_q[0] must be 0, got 1");
  rejects([](G& pk, PackedBatch&, TensorView<float>&) { pk.cu_k[1] = 6; },
          "cu_seqlens_k must not decrease: cu_seqlens_k[1] = 6 > cu_seqlens_k[2] = 5");
  rejects([](G& pk, PackedBatch&, TensorView<float>&) { pk.cu_q[2] = 4; },
          "cu_seqlens_q[batch = 2] = 4 must be q's total rows (5)");
  rejects([](G&, PackedBatch& s, TensorView<float>&) { s.cu_seqlens_q = nullptr; }, "cu_seqlens_q is null");
  rejects([](G&, PackedBatch& s, TensorView<float>&) { s.batch = -1; }, "seqs.batch must be >= 0, got -1");
  // dk laid over the key offsets: the offsets copied to the start of a buffer of their own that is large
  // enough for dk's (1, 5, 1, 8) floats, so that dk overlaps nothing else (never written: the call throws).
  std::vector<std::int32_t> own(64);
  rejects(
      [&own](G& pk, PackedBatch& s, TensorView<float>& dk) {
        std::copy(pk.cu_k.begin(), pk.cu_k.end(), own.begin());
        s.cu_seqlens_k = own.data();
        dk.data = reinterpret_cast<float*>(own.data());
      },
      "cu_seqlens_k");
}

}  // namespace
}  // namespace flashattn::testing
