// Mixed precision (issue 22, item 2): fp32 Q and O against fp16 or bf16 K and V, through the dense, the
// contiguous-cache and the paged-cache entry points, on the prefill and the decode kernels. The K/V
// elements are widened exactly and every sum is fp32, so a mixed call must give the bits of the fp32
// call on the widened K/V (same tiles and thread count); with the default context (its own tile and split
// choices) it must meet the tolerance rule against the fp64 reference on those widened values. Bad
// arguments are still rejected by name before anything is written.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/kv_cache.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

struct MixedCase {
  index_t batch, seq_q, seq_k, heads, heads_kv, dim;
  bool causal = false;
  Layout layout = Layout::Bshd;

  std::string name() const {
    return "B" + std::to_string(batch) + " Sq" + std::to_string(seq_q) + " Sk" + std::to_string(seq_k) + " H" +
           std::to_string(heads) + ":" + std::to_string(heads_kv) + " d" + std::to_string(dim) +
           (causal ? " causal" : "") + (layout == Layout::Bhsd ? " bhsd" : " bshd");
  }
  AttentionOptions options() const {
    AttentionOptions o;
    o.causal = causal;
    return o;
  }
};

std::vector<MixedCase> cases() {
  return {
      {2, 1, 300, 8, 2, 128},                           // decode, GQA
      {1, 4, 777, 4, 4, 64, true},                      // speculative rows, causal
      {1, 1, 200, 6, 3, 40, false, Layout::Bhsd},       // decode, head dim off whole packets (staged)
      {2, 100, 150, 4, 2, 64, true},                    // prefill kernel
      {1, 70, 70, 2, 1, 33, false, Layout::Bhsd},       // prefill, odd head dim
  };
}

// fp32 Q/O, K/V stored as E, and the fp32 widening of that K/V.
template <class E>
struct MixedProblem {
  HostTensor<float> q, o;
  HostTensor<E> k, v;
  HostTensor<float> k32, v32;
  HostLse lse;
  explicit MixedProblem(const MixedCase& c)
      : q(c.layout, c.batch, c.seq_q, c.heads, c.dim),
        o(c.layout, c.batch, c.seq_q, c.heads, c.dim, -3.0f),
        k(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim),
        v(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim),
        k32(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim),
        v32(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim),
        lse(c.batch, c.heads, c.seq_q) {
    fill_normal(q.view(), 31);
    fill_normal(k.view(), 32);
    fill_normal(v.view(), 33);
    for (std::size_t i = 0; i < k.storage().size(); ++i) {
      k32.storage()[i] = float(k.storage()[i]);
      v32.storage()[i] = float(v.storage()[i]);
    }
  }
};

// The fp32 call on the widened K/V, on the same context.
template <class Ctx, class E>
std::vector<unsigned char> fp32_bits(const Ctx& ctx, const MixedCase& c, MixedProblem<E>& pr) {
  HostTensor<float> o(c.layout, c.batch, c.seq_q, c.heads, c.dim);
  attention_forward(ctx, pr.q.cview(), pr.k32.cview(), pr.v32.cview(), o.view(), c.options());
  return bytes_of(o.storage().data(), o.storage().size());
}

template <class E>
void check_dense_bits() {
  for (const MixedCase& c : cases()) {
    SCOPED_TRACE(c.name());
    for (int threads : {1, 2}) {
      const cpu::Context<cpu::DefaultTiles<float>> ctx{threads};
      MixedProblem<E> pr(c);
      attention_forward(ctx, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), c.options());
      EXPECT_EQ(bytes_of(pr.o.storage().data(), pr.o.storage().size()), fp32_bits(ctx, c, pr)) << threads << " threads";
    }
  }
}

TEST(MixedPrecision, Fp16KvGivesTheBitsOfFp32OnWidenedKv) { check_dense_bits<Eigen::half>(); }
TEST(MixedPrecision, Bf16KvGivesTheBitsOfFp32OnWidenedKv) { check_dense_bits<Eigen::bfloat16>(); }

// Every hardware thread, long enough keys to split, against fp64. The fp16 rows go through the call
// without a context (AutoTiles: the tile rule's choices for mixed calls), the bf16 rows name DefaultTiles
// (each AutoTiles instantiation adds minutes to the sanitizer builds).
template <class E>
void check_reference() {
  for (MixedCase c : cases()) {
    c.seq_k *= 5;
    SCOPED_TRACE(c.name());
    MixedProblem<E> pr(c);
    if constexpr (std::is_same_v<E, Eigen::half>) {
      attention_forward<float>(pr.q.cview(), pr.k.view(), pr.v.view(), pr.o.view(), c.options(), pr.lse.view());
    } else {
      attention_forward(cpu::Context<cpu::DefaultTiles<float>>{}, pr.q.cview(), pr.k.cview(), pr.v.cview(),
                        pr.o.view(), c.options(), pr.lse.view());
    }
    EXPECT_TRUE(matches_reference_for_options<float>(pr.q.cview(), pr.k32.cview(), pr.v32.cview(), pr.o.cview(),
                                                     pr.lse.view(), c.options()));
  }
}

TEST(MixedPrecision, Fp16KvMatchesReference) { check_reference<Eigen::half>(); }
TEST(MixedPrecision, Bf16KvMatchesReference) { check_reference<Eigen::bfloat16>(); }

// A contiguous cache of capacity seq_k + 3 and a paged one (pages of 16 rows, in reverse order) with E
// rows, each request using all seq_k keys: the bits of the dense fp32 call on the widened K/V.
template <class E>
void check_cache_bits() {
  for (const MixedCase& c : cases()) {
    if (c.layout != Layout::Bshd) continue;
    SCOPED_TRACE(c.name());
    const cpu::Context<cpu::DefaultTiles<float>> ctx{1};
    MixedProblem<E> pr(c);
    const std::vector<unsigned char> want = fp32_bits(ctx, c, pr);

    const index_t capacity = c.seq_k + 3;
    std::vector<E> kc(std::size_t(c.batch * capacity * c.heads_kv * c.dim)), vc(kc.size());
    std::vector<std::int32_t> lengths(std::size_t(c.batch), std::int32_t(c.seq_k));
    const KvCacheView<E> cache = kv_cache_bshd(kc.data(), vc.data(), c.batch, capacity, c.heads_kv, c.dim, lengths.data());
    const index_t page = 16, per_seq = (c.seq_k + page - 1) / page, pages = c.batch * per_seq;
    std::vector<E> kp(std::size_t(pages * page * c.heads_kv * c.dim)), vp(kp.size());
    std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
    std::iota(table.rbegin(), table.rend(), 0);
    const PagedKvCacheView<E> paged = paged_kv_cache_hnd(kp.data(), vp.data(), pages, page, c.heads_kv, c.dim,
                                                         table.data(), c.batch, per_seq, lengths.data());
    for (index_t b = 0; b < c.batch; ++b)
      for (index_t s = 0; s < c.seq_k; ++s)
        for (index_t h = 0; h < c.heads_kv; ++h)
          for (index_t d = 0; d < c.dim; ++d) {
            cache.k(b, s, h, d) = paged.k_pages(paged.page_of(b, s), s % page, h, d) = pr.k.view()(b, s, h, d);
            cache.v(b, s, h, d) = paged.v_pages(paged.page_of(b, s), s % page, h, d) = pr.v.view()(b, s, h, d);
          }

    attention_forward(ctx, pr.q.cview(), cache, pr.o.view(), c.options());
    EXPECT_EQ(bytes_of(pr.o.storage().data(), pr.o.storage().size()), want) << "contiguous cache";
    std::fill(pr.o.storage().begin(), pr.o.storage().end(), -3.0f);
    attention_forward(ctx, pr.q.cview(), PagedKvCacheView<const E>(paged), pr.o.view(), c.options());
    EXPECT_EQ(bytes_of(pr.o.storage().data(), pr.o.storage().size()), want) << "paged cache";
  }
}

TEST(MixedPrecision, Fp16CachesGiveTheDenseBits) { check_cache_bits<Eigen::half>(); }
TEST(MixedPrecision, Bf16CachesGiveTheDenseBits) { check_cache_bits<Eigen::bfloat16>(); }

// Mixed calls are validated as any other: InvalidArgument naming the argument, o untouched.
TEST(MixedPrecision, BadArgumentsThrowAndWriteNothing) {
  const MixedCase c{1, 1, 50, 4, 2, 64};
  const auto rejects = [&](auto&& call, const std::string& needle) {
    MixedProblem<Eigen::half> pr(c);
    try {
      call(pr);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      for (float x : pr.o.storage()) EXPECT_EQ(x, -3.0f);
      return;
    }
    ADD_FAILURE() << "no exception for " << needle;
  };
  using P = MixedProblem<Eigen::half>;
  rejects(
      [&](P& pr) {
        TensorView<Eigen::half> k = pr.k.view();
        k.dim = 32;
        attention_forward<float>(pr.q.cview(), k, pr.v.view(), pr.o.view());
      },
      "head dims must agree");
  rejects(
      [&](P& pr) {
        TensorView<Eigen::half> v = pr.v.view();
        v.heads = 1;
        attention_forward<float>(pr.q.cview(), pr.k.view(), v, pr.o.view());
      },
      "k and v must have the same heads");
  rejects(
      [&](P& pr) {
        std::vector<std::int32_t> lengths{51};
        attention_forward(cpu::Context<cpu::DefaultTiles<float>>{1}, pr.q.cview(),
                          KvCacheView<Eigen::half>{pr.k.view(), pr.v.view(), lengths.data()}, pr.o.view());
      },
      "lengths");
}

}  // namespace
}  // namespace flashattn::testing
