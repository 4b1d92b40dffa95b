// Attention on KV caches (flashattn/kv_cache.hpp): a contiguous cache with spare capacity and a length per
// request, a paged cache with a block table, and kv_cache_append for both. Each request's rows are checked
// against the fp64 reference on exactly its lengths[b] keys (decode and prefill row counts, masks, GQA,
// both layouts, every storage type); a paged cache gives the bits of the contiguous one for every page size
// (pages shuffled, so neighbours in the table are not neighbours in memory); 1, 2 and 3 threads agree; and
// appends land where attention reads them.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashattn/cpu/context.hpp"
#include "flashattn/kv_cache.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

struct CacheCase {
  index_t seq_q, capacity, heads, heads_kv, dim;
  std::vector<std::int32_t> lengths;  // one per request
  bool causal = false;
  Layout layout = Layout::Bshd;

  index_t batch() const { return index_t(lengths.size()); }
  std::string name() const {
    std::string s = "Sq" + std::to_string(seq_q) + " cap" + std::to_string(capacity) + " H" + std::to_string(heads) +
                    ":" + std::to_string(heads_kv) + " d" + std::to_string(dim) + " lengths";
    for (auto l : lengths) s += " " + std::to_string(l);
    return s + (causal ? " causal" : "") + (layout == Layout::Bhsd ? " bhsd" : " bshd");
  }
  AttentionOptions options() const {
    AttentionOptions o;
    o.causal = causal;
    return o;
  }
};

std::vector<CacheCase> cases() {
  return {
      {1, 300, 8, 2, 128, {0, 1, 77, 300}},                       // decode, ragged, one empty request
      {4, 200, 4, 4, 64, {4, 130, 199}, true},                    // speculative rows, causal
      {1, 5000, 8, 1, 128, {4000, 17}, false, Layout::Bhsd},      // long enough to split
      {40, 256, 4, 2, 40, {40, 100, 256}, true},                  // chunked prefill through the prefill kernel
      {3, 64, 6, 3, 33, {64, 5}, false, Layout::Bhsd},            // head dim off whole packets
  };
}

// Request b of a (batch, ...) view as a batch of one, its first `seq` rows.
template <class T>
TensorView<T> request(TensorView<T> x, index_t b, index_t seq) {
  x.data += b * x.stride_batch;
  x.batch = 1;
  x.seq = seq;
  return x;
}
LseView request(LseView x, index_t b) {
  x.data += b * x.stride_batch;
  x.batch = 1;
  return x;
}

template <class T>
struct CacheProblem {
  CacheCase c;
  HostTensor<T> q, k, v, o;
  HostLse lse;
  explicit CacheProblem(const CacheCase& cc)
      : c(cc),
        q(c.layout, c.batch(), c.seq_q, c.heads, c.dim),
        k(c.layout, c.batch(), c.capacity, c.heads_kv, c.dim),
        v(c.layout, c.batch(), c.capacity, c.heads_kv, c.dim),
        o(c.layout, c.batch(), c.seq_q, c.heads, c.dim),
        lse(c.batch(), c.heads, c.seq_q) {
    fill_normal(q.view(), 11);
    fill_normal(k.view(), 12);
    fill_normal(v.view(), 13);
  }
  KvCacheView<const T> cache() const { return {k.cview(), v.cview(), c.lengths.data()}; }
};

// The same cache in pages of `page_size` rows, pages given to requests in a shuffled order, and unused
// table entries -1. BSHD pages.
template <class T>
struct PagedCopy {
  std::vector<T> k, v;
  std::vector<std::int32_t> table;
  index_t pages = 0, max_pages = 0, page_size = 0;
  PagedKvCacheView<T> writable;     // lengths unset
  PagedKvCacheView<const T> view;  // the case's lengths

  // room: rows past each request's length whose pages the table names too (for appends).
  PagedCopy(const CacheProblem<T>& pr, index_t page, index_t room = 0) : page_size(page) {
    const CacheCase& c = pr.c;
    max_pages = (c.capacity + page - 1) / page;
    std::vector<index_t> used(std::size_t(c.batch()));
    for (index_t b = 0; b < c.batch(); ++b) used[b] = (c.lengths[b] + room + page - 1) / page;
    pages = std::accumulate(used.begin(), used.end(), index_t(0)) + 3;  // three spare pages nobody owns
    std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(5));
    const index_t row = c.heads_kv * c.dim;
    k.assign(std::size_t(pages * page * row), T(0));
    v.assign(k.size(), T(0));
    table.assign(std::size_t(c.batch() * max_pages), -1);
    std::size_t next = 0;
    for (index_t b = 0; b < c.batch(); ++b)
      for (index_t i = 0; i < used[b]; ++i) table[b * max_pages + i] = order[next++];
    writable = paged_kv_cache_nhd(k.data(), v.data(), pages, page, c.heads_kv, c.dim, table.data(), c.batch(),
                                       max_pages, static_cast<std::int32_t*>(nullptr));
    for (index_t b = 0; b < c.batch(); ++b)
      for (index_t s = 0; s < c.lengths[b]; ++s)
        for (index_t h = 0; h < c.heads_kv; ++h) {
          const index_t p = writable.page_of(b, s);
          for (index_t d = 0; d < c.dim; ++d) {
            writable.k_pages(p, s % page, h, d) = pr.k.view()(b, s, h, d);
            writable.v_pages(p, s % page, h, d) = pr.v.view()(b, s, h, d);
          }
        }
    view = {writable.k_pages, writable.v_pages, table.data(), c.batch(), max_pages, max_pages, c.lengths.data()};
  }
};

template <class T>
void check_contiguous_against_reference() {
  for (const CacheCase& c : cases()) {
    SCOPED_TRACE(c.name());
    CacheProblem<T> pr(c);
    attention_forward<T>(pr.q.cview(), pr.cache(), pr.o.view(), c.options(), pr.lse.view());
    for (index_t b = 0; b < c.batch(); ++b) {
      SCOPED_TRACE("request " + std::to_string(b));
      EXPECT_TRUE(matches_reference_for_options<T>(
          request(pr.q.cview(), b, c.seq_q), request(pr.k.cview(), b, c.lengths[b]),
          request(pr.v.cview(), b, c.lengths[b]), request(pr.o.cview(), b, c.seq_q), request(pr.lse.view(), b),
          c.options()));
    }
  }
}

TEST(KvCache, ContiguousFp32MatchesReference) { check_contiguous_against_reference<float>(); }
TEST(KvCache, ContiguousFp64MatchesReference) { check_contiguous_against_reference<double>(); }
TEST(KvCache, ContiguousBf16MatchesReference) { check_contiguous_against_reference<Eigen::bfloat16>(); }
TEST(KvCache, ContiguousFp16MatchesReference) { check_contiguous_against_reference<Eigen::half>(); }

// A paged cache holds the same rows, so it must give the contiguous cache's bits (same kernel, same key
// ranges), whatever the page size: pages smaller than, equal to and larger than a key tile, and one row.
template <class T>
void check_paged_equals_contiguous() {
  for (const CacheCase& c : cases()) {
    CacheProblem<T> pr(c);
    attention_forward(cpu::Context<>{2}, pr.q.cview(), pr.cache(), pr.o.view(), c.options(), pr.lse.view());
    const std::vector<unsigned char> want = bytes_of(pr.o.storage());
    for (index_t page : {1, 7, 16, 64, 256}) {
      SCOPED_TRACE(c.name() + " page " + std::to_string(page));
      PagedCopy<T> paged(pr, page);
      HostTensor<T> o(c.layout, c.batch(), c.seq_q, c.heads, c.dim, T(-7));
      HostLse lse(c.batch(), c.heads, c.seq_q);
      attention_forward(cpu::Context<>{2}, pr.q.cview(), paged.view, o.view(), c.options(), lse.view());
      EXPECT_EQ(bytes_of(o.storage()), want);
      for (index_t b = 0; b < c.batch(); ++b)
        for (index_t h = 0; h < c.heads; ++h)
          for (index_t i = 0; i < c.seq_q; ++i) {
            const float x = lse.view()(b, h, i), y = pr.lse.view()(b, h, i);
            EXPECT_EQ(std::memcmp(&x, &y, sizeof(float)), 0) << "lse " << b << " " << h << " " << i;
          }
    }
  }
}

TEST(KvCache, PagedFp32EqualsContiguous) { check_paged_equals_contiguous<float>(); }
TEST(KvCache, PagedBf16EqualsContiguous) { check_paged_equals_contiguous<Eigen::bfloat16>(); }
TEST(KvCache, PagedFp16EqualsContiguous) { check_paged_equals_contiguous<Eigen::half>(); }

TEST(KvCache, ThreadCountsGiveTheSameBits) {
  for (const CacheCase& c : cases()) {
    SCOPED_TRACE(c.name());
    std::vector<unsigned char> first;
    for (int threads : {1, 2, 3}) {
      CacheProblem<float> pr(c);
      PagedCopy<float> paged(pr, 16);
      attention_forward(cpu::Context<>{threads}, pr.q.cview(), paged.view, pr.o.view(), c.options());
      if (threads == 1) {
        first = bytes_of(pr.o.storage());
      } else {
        EXPECT_EQ(bytes_of(pr.o.storage()), first) << threads << " threads";
      }
    }
  }
}

// Appending a step's rows to both kinds of cache, then attending, equals attending over a cache that was
// written whole; the lengths advance by the rows appended; rows past a request's length stay untouched.
TEST(KvCache, AppendThenAttend) {
  const CacheCase c{2, 96, 4, 2, 64, {10, 70, 0}, true};
  CacheProblem<float> full(c);  // the cache as it must be after the append: lengths + 2
  std::vector<std::int32_t> after = c.lengths;
  for (auto& l : after) l += 2;

  HostTensor<float> k(Layout::Bshd, c.batch(), c.capacity, c.heads_kv, c.dim);
  HostTensor<float> v(Layout::Bshd, c.batch(), c.capacity, c.heads_kv, c.dim);
  HostTensor<float> k_new(Layout::Bshd, c.batch(), 2, c.heads_kv, c.dim);
  HostTensor<float> v_new(Layout::Bshd, c.batch(), 2, c.heads_kv, c.dim);
  for (index_t b = 0; b < c.batch(); ++b)
    for (index_t s = 0; s < after[b]; ++s)
      for (index_t h = 0; h < c.heads_kv; ++h)
        for (index_t d = 0; d < c.dim; ++d) {
          const bool is_new = s >= c.lengths[b];
          (is_new ? k_new : k).view()(b, is_new ? s - c.lengths[b] : s, h, d) = full.k.view()(b, s, h, d);
          (is_new ? v_new : v).view()(b, is_new ? s - c.lengths[b] : s, h, d) = full.v.view()(b, s, h, d);
        }
  std::vector<std::int32_t> lengths = c.lengths;
  kv_cache_append(KvCacheView<float>{k.view(), v.view(), lengths.data()}, k_new.cview(), v_new.cview());
  EXPECT_EQ(lengths, after);

  CacheCase grown = c;
  grown.lengths = after;
  CacheProblem<float> want(grown);  // same seeds: the same q, k and v as `full`
  attention_forward<float>(want.q.cview(), want.cache(), want.o.view(), c.options());
  HostTensor<float> o(Layout::Bshd, c.batch(), c.seq_q, c.heads, c.dim);
  attention_forward<float>(want.q.cview(), KvCacheView<const float>{k.cview(), v.cview(), lengths.data()}, o.view(),
                           c.options());
  EXPECT_EQ(bytes_of(o.storage()), bytes_of(want.o.storage()));
  for (index_t b = 0; b < c.batch(); ++b)  // the spare capacity is still zero
    for (index_t s = after[b]; s < c.capacity; ++s) EXPECT_EQ(k.view()(b, s, 0, 0), 0.0f);

  // The paged cache, from the pre-append rows: pages of 8, so request 1's append crosses a page.
  // The pages hold the pre-append rows only (the same values: CacheProblem(c) has full's seeds), and the
  // table names the pages the two appended rows need; the append must write them.
  CacheProblem<float> before(c);
  PagedCopy<float> paged(before, 8, 2);
  std::vector<std::int32_t> paged_lengths = c.lengths;
  PagedKvCacheView<float> writable = paged.writable;
  writable.lengths = paged_lengths.data();
  kv_cache_append(writable, k_new.cview(), v_new.cview());
  EXPECT_EQ(paged_lengths, after);
  HostTensor<float> o_paged(Layout::Bshd, c.batch(), c.seq_q, c.heads, c.dim);
  attention_forward<float>(want.q.cview(), PagedKvCacheView<const float>(writable), o_paged.view(), c.options());
  EXPECT_EQ(bytes_of(o_paged.storage()), bytes_of(want.o.storage()));
}

// An append that would pass a request's capacity throws and writes nothing, lengths included.
TEST(KvCache, AppendPastCapacityThrowsAndWritesNothing) {
  HostTensor<float> k(Layout::Bshd, 2, 8, 1, 4), v(Layout::Bshd, 2, 8, 1, 4);
  HostTensor<float> k_new(Layout::Bshd, 2, 3, 1, 4, 1.0f), v_new(Layout::Bshd, 2, 3, 1, 4, 1.0f);
  std::vector<std::int32_t> lengths{2, 6};
  try {
    kv_cache_append(KvCacheView<float>{k.view(), v.view(), lengths.data()}, k_new.cview(), v_new.cview());
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cache.lengths[1] = 6"), std::string::npos) << e.what();
  }
  EXPECT_EQ(lengths, (std::vector<std::int32_t>{2, 6}));
  for (float x : k.storage()) EXPECT_EQ(x, 0.0f);
}

// Bad arguments of the cache calls: each an InvalidArgument naming the argument and its values, thrown
// before anything is written (o keeps its NaN fill, the cache and the lengths their contents).
struct BadCacheCall {
  static constexpr index_t kPage = 4;
  HostTensor<float> q{Layout::Bshd, 2, 1, 4, 8}, o{Layout::Bshd, 2, 1, 4, 8, std::nanf("")};
  HostTensor<float> k{Layout::Bshd, 2, 12, 2, 8}, v{Layout::Bshd, 2, 12, 2, 8};
  std::vector<std::int32_t> lengths{5, 12};
  // A paged cache of 5 pages of 4 rows, 3 pages per request at most; request 0 uses pages 3 and 0, request 1
  // pages 1, 4 and 2.
  std::vector<float> k_pages = std::vector<float>(5 * kPage * 2 * 8, 1.0f), v_pages = std::vector<float>(k_pages.size(), 2.0f);
  std::vector<std::int32_t> table{3, 0, -1, 1, 4, 2};
  KvCacheView<const float> cache() const { return {k.cview(), v.cview(), lengths.data()}; }
  PagedKvCacheView<float> paged() {
    return paged_kv_cache_nhd(k_pages.data(), v_pages.data(), 5, kPage, 2, 8, table.data(), 2, 3, lengths.data());
  }
  bool untouched() const {
    for (float x : const_cast<HostTensor<float>&>(o).storage())
      if (!std::isnan(x)) return false;
    return true;
  }
};

template <class Run>
::testing::AssertionResult cache_call_rejects(const std::function<void(BadCacheCall&)>& corrupt,
                                              const std::string& needle, Run&& run) {
  BadCacheCall c;
  corrupt(c);
  const std::vector<std::int32_t> lengths = c.lengths;
  const std::vector<float> pages = c.k_pages, v_pages = c.v_pages;
  try {
    run(c);
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    if (what.find(needle) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << needle << "\"";
    if (!c.untouched() || c.lengths != lengths || c.k_pages != pages || c.v_pages != v_pages)
      return ::testing::AssertionFailure() << "something was written before the throw";
    return ::testing::AssertionSuccess() << what;
  }
  return ::testing::AssertionFailure() << "no exception";
}

const auto attend_contiguous = [](BadCacheCall& c) { attention_forward<float>(c.q.cview(), c.cache(), c.o.view()); };
const auto attend_paged = [](BadCacheCall& c) {
  attention_forward<float>(c.q.cview(), PagedKvCacheView<const float>(c.paged()), c.o.view());
};

TEST(KvCacheBadInputs, ContiguousCache) {
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall& c) { c.lengths[1] = 13; },
                                 "cache.lengths[1] = 13 is outside [0, 12]", attend_contiguous));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall& c) { c.lengths[0] = -1; },
                                 "cache.lengths[0] = -1 is outside [0, 12]", attend_contiguous));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "cache.lengths is null", [](BadCacheCall& c) {
    attention_forward<float>(c.q.cview(), KvCacheView<const float>{c.k.cview(), c.v.cview(), nullptr}, c.o.view());
  }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "cache.k and cache.v must have the same heads",
                                 [](BadCacheCall& c) {
                                   auto cache = c.cache();
                                   cache.v.heads = 1;
                                   attention_forward<float>(c.q.cview(), cache, c.o.view());
                                 }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "batch sizes disagree", [](BadCacheCall& c) {
    auto cache = c.cache();
    cache.k.batch = cache.v.batch = 1;
    attention_forward<float>(c.q.cview(), cache, c.o.view());
  }));
}

TEST(KvCacheBadInputs, PagedCache) {
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall& c) { c.table[4] = 5; },
                                 "cache.block_table[1][1] = 5 is not a page of the cache (num_pages = 5)",
                                 attend_paged));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall& c) { c.table[1] = -1; },
                                 "cache.block_table[0][1] = -1 is not a page of the cache", attend_paged));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall& c) { c.lengths[1] = 13; },
                                 "cache.lengths[1] = 13 is outside [0, 12] (max_pages 3 x page_size 4)", attend_paged));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "cache page size must be >= 1", [](BadCacheCall& c) {
    auto cache = c.paged();
    cache.k_pages.seq = cache.v_pages.seq = 0;
    attention_forward<float>(c.q.cview(), PagedKvCacheView<const float>(cache), c.o.view());
  }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "cache.block_table is null", [](BadCacheCall& c) {
    auto cache = c.paged();
    cache.block_table = nullptr;
    attention_forward<float>(c.q.cview(), PagedKvCacheView<const float>(cache), c.o.view());
  }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "cache.batch (1) must be q's batch (2)", [](BadCacheCall& c) {
    auto cache = c.paged();
    cache.batch = 1;
    attention_forward<float>(c.q.cview(), PagedKvCacheView<const float>(cache), c.o.view());
  }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "cache.table_stride (2) must be >= cache.max_pages (3)",
                                 [](BadCacheCall& c) {
                                   auto cache = c.paged();
                                   cache.table_stride = 2;
                                   attention_forward<float>(c.q.cview(), PagedKvCacheView<const float>(cache),
                                                            c.o.view());
                                 }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "cache.k_pages and cache.v_pages must have the same pages",
                                 [](BadCacheCall& c) {
                                   auto cache = c.paged();
                                   cache.v_pages.batch = 4;
                                   attention_forward<float>(c.q.cview(), PagedKvCacheView<const float>(cache),
                                                            c.o.view());
                                 }));
}

// The kernels read the lengths and the table while they write o and lse: an output on top of either is
// rejected.
TEST(KvCacheBadInputs, OutputsOverlappingLengthsOrTable) {
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "lse overlaps the memory of argument cache.lengths",
                                 [](BadCacheCall& c) {
                                   attention_forward<float>(c.q.cview(), c.cache(), c.o.view(), {},
                                                            lse_bhs(reinterpret_cast<float*>(c.lengths.data()), 2, 4, 1));
                                 }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "lse overlaps the memory of argument cache.block_table",
                                 [](BadCacheCall& c) {
                                   attention_forward<float>(c.q.cview(), PagedKvCacheView<const float>(c.paged()),
                                                            c.o.view(), {},
                                                            lse_bhs(reinterpret_cast<float*>(c.table.data()), 2, 4, 1));
                                 }));
}

TEST(KvCacheBadInputs, Append) {
  HostTensor<float> one_row(Layout::Bshd, 2, 1, 2, 8, 2.0f), wrong_heads(Layout::Bshd, 2, 1, 1, 8, 2.0f);
  // Request 0 has 5 rows in pages 3 and 0; its 9th row would need table[0][2] = -1.
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall& c) { c.lengths = {8, 4}; },
                                 "cache.block_table[0][2] = -1 is not a page of the cache", [&](BadCacheCall& c) {
                                   kv_cache_append(c.paged(), one_row.cview(), one_row.cview());
                                 }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "cache.lengths[1] = 12 is outside [0, 11]",
                                 [&](BadCacheCall& c) {
                                   kv_cache_append(c.paged(), one_row.cview(), one_row.cview());
                                 }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "k_new and v_new must be (batch=2, n, heads=2, dim=8) and (..., dim=8)",
                                 [&](BadCacheCall& c) {
                                   kv_cache_append(c.paged(), wrong_heads.cview(), wrong_heads.cview());
                                 }));
  // Both requests' next rows go to page 2, which both list.
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall& c) { c.lengths = {5, 8}; c.table[1] = 2; },
                                 "kv_cache_append would write page 2", [&](BadCacheCall& c) {
                                   kv_cache_append(c.paged(), one_row.cview(), one_row.cview());
                                 }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "the cache's K and V views start at the same address",
                                 [&](BadCacheCall& c) {
                                   auto cache = c.paged();
                                   cache.v_pages.data = cache.k_pages.data;
                                   kv_cache_append(cache, one_row.cview(), one_row.cview());
                                 }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall& c) { c.lengths = {5, 4}; }, "k_new overlaps the memory of the cache's K",
                                 [&](BadCacheCall& c) {
                                   auto cache = c.paged();
                                   const TensorView<const float> inside = bshd<const float>(c.k_pages.data(), 2, 1, 2, 8);
                                   kv_cache_append(cache, inside, one_row.cview());
                                 }));
  EXPECT_TRUE(cache_call_rejects([](BadCacheCall&) {}, "overflow 64-bit offsets", [&](BadCacheCall& c) {
    auto cache = c.paged();
    cache.table_stride = std::numeric_limits<index_t>::max();
    kv_cache_append(cache, one_row.cview(), one_row.cview());
  }));
}

}  // namespace
}  // namespace flashattn::testing
