#pragma once
// Checks of the KV-cache calls (kv_cache.hpp): the views as forward_validate.hpp checks them, then the
// cache's own arguments, the lengths and the block table, before any work starts. Each failure throws
// InvalidArgument naming the argument and the values; nothing is read or written before all hold.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "flashattn/core/errors.hpp"
#include "flashattn/core/forward_params.hpp"
#include "flashattn/core/forward_validate.hpp"
#include "flashattn/core/kv_cache.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/validate.hpp"

namespace flashattn {

namespace detail {

// lengths[b] for b < batch, each in [0, capacity] (`capacity_what` says where the bound comes from).
// Returns the largest.
inline index_t check_cache_lengths(const std::int32_t* lengths, index_t batch, index_t capacity,
                                   const std::string& capacity_what) {
  if (batch > 0 && lengths == nullptr) fail("cache.lengths is null, but the batch has " + std::to_string(batch) +
                                            " requests (one int32 length per request)");
  index_t longest = 0;
  for (index_t b = 0; b < batch; ++b) {
    const index_t len = lengths[b];
    if (len < 0 || len > capacity)
      fail("cache.lengths[" + std::to_string(b) + "] = " + std::to_string(len) + " is outside [0, " +
           std::to_string(capacity) + "] (" + capacity_what + ")");
    longest = len > longest ? len : longest;
  }
  return longest;
}

// The pages a paged cache's requests use (the first ceil((lengths[b] + adding) / page_size) entries of each
// table row) must exist. Entries past that are never touched and not checked (they may be −1).
template <class T>
void check_block_table(const PagedKvCacheView<T>& c, index_t adding = 0) {
  if (c.batch > 0 && c.max_pages > 0 && c.block_table == nullptr)
    fail("cache.block_table is null, but the batch has " + std::to_string(c.batch) + " requests");
  for (index_t b = 0; b < c.batch; ++b) {
    const index_t used = (index_t(c.lengths[b]) + adding + c.page_size() - 1) / c.page_size();
    for (index_t i = 0; i < used; ++i) {
      const index_t page = c.block_table[b * c.table_stride + i];
      if (page < 0 || page >= c.num_pages())
        fail("cache.block_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " + std::to_string(page) +
             " is not a page of the cache (num_pages = " + std::to_string(c.num_pages()) + ")");
    }
  }
}

// The arguments of a paged cache, whatever the call (attention, or an append of `adding` rows): page size,
// lengths, table. Returns the longest length.
template <class T>
index_t check_paged_cache(const PagedKvCacheView<T>& c, index_t batch, index_t adding = 0) {
  if (c.page_size() < 1) fail("cache page size must be >= 1, got " + describe("cache.k_pages", c.k_pages));
  if (c.batch != batch)
    fail("cache.batch (" + std::to_string(c.batch) + ") must be q's batch (" + std::to_string(batch) + ")");
  if (c.max_pages < 0) fail("cache.max_pages must be >= 0, got " + std::to_string(c.max_pages));
  if (c.batch > 1 && c.table_stride < c.max_pages)
    fail("cache.table_stride (" + std::to_string(c.table_stride) + ") must be >= cache.max_pages (" +
         std::to_string(c.max_pages) + "): rows of the block table would overlap");
  index_t capacity = 0, table_extent = 0;
  if (__builtin_mul_overflow(c.max_pages, c.page_size(), &capacity) ||
      (c.batch > 0 && (__builtin_mul_overflow(c.batch - 1, c.table_stride, &table_extent) ||
                       __builtin_add_overflow(table_extent, c.max_pages, &table_extent))))
    fail("cache.max_pages (" + std::to_string(c.max_pages) + "), page size (" + std::to_string(c.page_size()) +
         ") or table_stride (" + std::to_string(c.table_stride) + ") overflow 64-bit offsets");
  const index_t longest = check_cache_lengths(
      c.lengths, c.batch, std::min<index_t>(capacity, std::numeric_limits<std::int32_t>::max()) - adding,
      "max_pages " + std::to_string(c.max_pages) + " x page_size " + std::to_string(c.page_size()) +
          (adding > 0 ? " less the " + std::to_string(adding) + " rows appended" : std::string()));
  check_block_table(c, adding);
  return longest;
}

// The bytes of `count` int32 values at `data` (lengths, a block table, offsets).
inline ByteSpan int32_span(const std::int32_t* data, index_t count) {
  if (data == nullptr || count <= 0) return {};
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  return {begin, begin + std::uintptr_t(count) * sizeof(std::int32_t)};
}

// The kernels read the lengths, block table or offsets while they write o and lse: those must not share
// memory, or early rows would change what later programs read.
template <class T>
void check_outputs_apart(const char* name, const ByteSpan& index_array, const TensorView<T>& o, const LseView& lse) {
  const ByteSpan o_span = check_view("o", o);
  if (o_span.overlaps(index_array)) fail(overlap("o", o_span, "argument", name, index_array));
  if (!lse.empty()) {
    const ByteSpan lse_span = checked_span<3>([&] { return describe(lse); }, lse.data, sizeof(float),
                                              {lse.batch, lse.heads, lse.seq},
                                              {lse.stride_batch, lse.stride_head, lse.stride_seq},
                                              {"batch", "heads", "seq"});
    if (lse_span.overlaps(index_array)) fail(overlap("lse", lse_span, "argument", name, index_array));
  }
}

// The rows of a paged cache's table its requests use, as bytes.
template <class T>
ByteSpan table_span(const PagedKvCacheView<T>& c) {
  return c.batch > 0 ? int32_span(c.block_table, (c.batch - 1) * c.table_stride + c.max_pages) : ByteSpan{};
}

}  // namespace detail

// A forward call on a contiguous cache: q (batch, seq_q, heads_q, dim) against the first lengths[b] keys of
// cache.k / cache.v (batch, capacity, heads_kv, dim).
// E, the cache's element type, may differ from T (fp32 queries on a 16-bit cache: forward.hpp).
template <class T, class E = T>
ForwardParams<T, DenseKv<E>, CacheLengths> make_cache_forward_params(const TensorView<const T>& q,
                                                                      const KvCacheView<const E>& cache,
                                                                      const TensorView<T>& o, const LseView& lse,
                                                                      const AttentionOptions& opts) {
  detail::check_forward_views(q, cache.k, cache.v, o, lse, detail::KvBatch::Requests, "cache.k", "cache.v");
  const index_t longest = detail::check_cache_lengths(cache.lengths, q.batch, cache.capacity(),
                                                      "the cache's capacity, cache.k's seq");
  detail::check_outputs_apart("cache.lengths", detail::int32_span(cache.lengths, q.batch), o, lse);
  ForwardParams<T, DenseKv<E>, CacheLengths> p;
  p.q = q;
  p.k = dense_kv(cache.k);
  p.v = dense_kv(cache.v);
  p.o = o;
  p.lse = lse;
  p.seqs = CacheLengths{q.batch, q.seq, longest, cache.lengths};
  p.scale = detail::resolve_scale(opts, q.dim);
  p.group = q.heads / cache.k.heads;
  return p;
}

// A forward call on a paged cache.
template <class T, class E = T>
ForwardParams<T, PagedKv<E>, CacheLengths> make_paged_forward_params(const TensorView<const T>& q,
                                                                      const PagedKvCacheView<const E>& cache,
                                                                      const TensorView<T>& o, const LseView& lse,
                                                                      const AttentionOptions& opts) {
  detail::check_forward_views(q, cache.k_pages, cache.v_pages, o, lse, detail::KvBatch::Pages, "cache.k_pages",
                              "cache.v_pages");
  const index_t longest = detail::check_paged_cache(cache, q.batch);
  detail::check_outputs_apart("cache.lengths", detail::int32_span(cache.lengths, q.batch), o, lse);
  detail::check_outputs_apart("cache.block_table", detail::table_span(cache), o, lse);
  ForwardParams<T, PagedKv<E>, CacheLengths> p;
  p.q = q;
  p.k = PagedKv<E>{cache.k_pages, cache.block_table, cache.table_stride};
  p.v = PagedKv<E>{cache.v_pages, cache.block_table, cache.table_stride};
  p.o = o;
  p.lse = lse;
  p.seqs = CacheLengths{q.batch, q.seq, longest, cache.lengths};
  p.scale = detail::resolve_scale(opts, q.dim);
  p.group = q.heads / cache.k_pages.heads;
  return p;
}

}  // namespace flashattn
