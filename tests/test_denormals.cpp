// Kernels run with subnormals flushed (cpu/denormals.hpp): on every thread of a call, mask and score
// callbacks included, and the caller's MXCSR comes back afterwards, also when a callback throws.

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "flashattn/backward.hpp"
#include "flashattn/cpu/denormals.hpp"
#include "flashattn/forward.hpp"

namespace flashattn::testing {
namespace {

#if FLASHATTN_HAS_MXCSR
constexpr unsigned kFtzDaz = cpu::ScopedFlushDenormals::kFtzDaz;
// The MXCSR's control bits (rounding, masks, FTZ, DAZ): its low six bits are sticky exception flags, which
// any computation may raise.
unsigned control() { return _mm_getcsr() & ~0x3Fu; }

struct Tensors {
  index_t seq = 130, heads = 2, dim = 32;
  std::vector<float> q, k, v, o, d_o, dq, dk, dv, lse;
  Tensors() {
    const std::size_t n = std::size_t(seq * heads * dim);
    for (auto* x : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}) x->assign(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) q[i] = float(i % 7) * 0.1f, k[i] = float(i % 5) * 0.2f, v[i] = 1.0f, d_o[i] = 0.5f;
    lse.assign(std::size_t(heads * seq), 0.0f);
  }
  TensorView<const float> in(const std::vector<float>& x) const { return bshd(x.data(), 1, seq, heads, dim); }
  TensorView<float> out(std::vector<float>& x) { return bshd(x.data(), 1, seq, heads, dim); }
  LseView lse_view() { return lse_bhs(lse.data(), 1, heads, seq); }
};

// Records the MXCSR every keep() call sees: all of them must have FTZ and DAZ set.
struct RecordingMask {
  std::atomic<int>* calls;
  std::atomic<int>* without_flush;
  bool operator()(index_t i, index_t j) const {
    calls->fetch_add(1);
    if ((_mm_getcsr() & kFtzDaz) != kFtzDaz) without_flush->fetch_add(1);
    return j <= i;
  }
};

TEST(Denormals, CallbacksRunFlushedAndTheCallerKeepsItsSetting) {
  const unsigned before = control();
  ASSERT_EQ(before & kFtzDaz, 0u) << "the test runner itself flushes subnormals";
  for (int threads : {1, 2}) {
    Tensors t;
    std::atomic<int> calls{0}, without_flush{0};
    const auto mask = element_mask(t.seq, RecordingMask{&calls, &without_flush});
    const cpu::Context<> ctx{threads};
    attention_forward_masked(ctx, t.in(t.q), t.in(t.k), t.in(t.v), t.out(t.o), mask, {}, t.lse_view());
    attention_backward_masked(ctx, t.in(t.q), t.in(t.k), t.in(t.v), t.in(t.o), t.in(t.d_o), t.lse_view(),
                              t.out(t.dq), t.out(t.dk), t.out(t.dv), mask);
    EXPECT_GT(calls.load(), 0) << threads << " threads";
    EXPECT_EQ(without_flush.load(), 0) << threads << " threads";
    EXPECT_EQ(control(), before) << threads << " threads";
  }
}

TEST(Denormals, RestoredWhenACallbackThrows) {
  const unsigned before = control();
  for (int threads : {1, 2}) {
    Tensors t;
    const auto mask = element_mask(t.seq, [](index_t i, index_t j) -> bool {
      if (i == 70 && j == 3) throw std::runtime_error("from keep()");
      return true;
    });
    EXPECT_THROW(attention_forward_masked(cpu::Context<>{threads}, t.in(t.q), t.in(t.k), t.in(t.v), t.out(t.o), mask),
                 std::runtime_error);
    EXPECT_EQ(control(), before) << threads << " threads";
  }
}

// A caller that flushes already keeps flushing (the guard only adds bits, and puts back what it found).
TEST(Denormals, ACallerThatFlushesKeepsItsSetting) {
  const unsigned before = control();
  _mm_setcsr(_mm_getcsr() | kFtzDaz);
  Tensors t;
  attention_forward(t.in(t.q), t.in(t.k), t.in(t.v), t.out(t.o));
  EXPECT_EQ(control(), before | kFtzDaz);
  _mm_setcsr(_mm_getcsr() & ~kFtzDaz);
}
#else
TEST(Denormals, NotX86) { GTEST_SKIP() << "no MXCSR on this architecture: the guard is a no-op"; }
#endif

}  // namespace
}  // namespace flashattn::testing
