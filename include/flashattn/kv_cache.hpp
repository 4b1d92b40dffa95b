#pragma once
// Attention on a KV cache, and appending to one (the views: core/kv_cache.hpp).
//
//   kv_cache_append(cache, k_new, v_new)            writes each request's new K/V rows after its lengths[b]
//                                                   rows and advances lengths[b]
//   attention_forward([ctx,] q, cache, o, options, lse)   q against each request's lengths[b] keys
//
// The cache may store another type than q and o: fp32 queries on an fp16 or bf16 cache (forward.hpp's
// mixed precision), the usual setup, which halves the bytes a decoding step reads.
//
// A decoding step appends the step's K/V, then attends; a chunk of a long prompt does the same with more
// rows (chunked prefill). options.causal aligns each request's query rows with the end of its keys, as for
// any seq_q ≠ seq_k call: query row i of a request with L keys sees keys [0, L − seq_q + i].

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "flashattn/core/kv_cache.hpp"
#include "flashattn/core/kv_cache_validate.hpp"
#include "flashattn/core/static_checks.hpp"
#include "flashattn/forward.hpp"

namespace flashattn {

// cache (batch, capacity, heads_kv, dim); lengths: keys per request. q, o: (batch, seq_q, heads_q, dim);
// lse, when given: (batch, heads_q, seq_q).
template <class Context, class T, class Accounting = NoAccounting, class = detail::if_context<Context>>
void attention_forward(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                       const detail::nondeduced<KvCacheView<const T>>& cache, TensorView<T> o,
                       const AttentionOptions& options = {}, LseView lse = {}, Accounting&& acct = Accounting{}) {
  if constexpr (detail::check_element_type<T>::value) {
    const auto p = make_cache_forward_params<T>(q, cache, o, lse, options);
    validate_context(ctx, p.head_dim(), p.value_dim());
    if (p.batch() == 0 || p.q.seq == 0) return;
    dispatch_forward(ctx, p, options, acct);
  }
}

template <class T, class Accounting = NoAccounting>
void attention_forward(detail::nondeduced<TensorView<const T>> q, const detail::nondeduced<KvCacheView<const T>>& cache,
                       TensorView<T> o, const AttentionOptions& options = {}, LseView lse = {},
                       Accounting&& acct = Accounting{}) {
  attention_forward<cpu::Context<>, T>(cpu::Context<>{}, q, cache, o, options, lse, std::forward<Accounting>(acct));
}

// A paged cache: pages (num_pages, page_size, heads_kv, dim), block table (batch, max_pages), lengths.
template <class Context, class T, class Accounting = NoAccounting, class = detail::if_context<Context>>
void attention_forward(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                       const detail::nondeduced<PagedKvCacheView<const T>>& cache, TensorView<T> o,
                       const AttentionOptions& options = {}, LseView lse = {}, Accounting&& acct = Accounting{}) {
  if constexpr (detail::check_element_type<T>::value) {
    const auto p = make_paged_forward_params<T>(q, cache, o, lse, options);
    validate_context(ctx, p.head_dim(), p.value_dim());
    if (p.batch() == 0 || p.q.seq == 0) return;
    dispatch_forward(ctx, p, options, acct);
  }
}

template <class T, class Accounting = NoAccounting>
void attention_forward(detail::nondeduced<TensorView<const T>> q,
                       const detail::nondeduced<PagedKvCacheView<const T>>& cache, TensorView<T> o,
                       const AttentionOptions& options = {}, LseView lse = {}, Accounting&& acct = Accounting{}) {
  attention_forward<cpu::Context<>, T>(cpu::Context<>{}, q, cache, o, options, lse, std::forward<Accounting>(acct));
}

// Mixed precision: q and o of type T on a cache of another element type (KvCacheView<E> or
// KvCacheView<const E>, likewise paged).
template <class Context, class T, class KvElem, class Accounting = NoAccounting, class = detail::if_context<Context>,
          class = detail::if_mixed_kv<T, KvElem>>
void attention_forward(const Context& ctx, detail::nondeduced<TensorView<const T>> q, const KvCacheView<KvElem>& cache,
                       TensorView<T> o, const AttentionOptions& options = {}, LseView lse = {},
                       Accounting&& acct = Accounting{}) {
  if constexpr (detail::check_element_type<T>::value) {
    using E = std::remove_const_t<KvElem>;
    const auto p = make_cache_forward_params<T, E>(q, KvCacheView<const E>(cache), o, lse, options);
    validate_context(ctx, p.head_dim(), p.value_dim());
    if (p.batch() == 0 || p.q.seq == 0) return;
    dispatch_forward(ctx, p, options, acct);
  }
}

template <class T, class KvElem, class Accounting = NoAccounting, class = detail::if_mixed_kv<T, KvElem>>
void attention_forward(detail::nondeduced<TensorView<const T>> q, const KvCacheView<KvElem>& cache, TensorView<T> o,
                       const AttentionOptions& options = {}, LseView lse = {}, Accounting&& acct = Accounting{}) {
  attention_forward<cpu::Context<>, T, KvElem>(cpu::Context<>{}, q, cache, o, options, lse,
                                               std::forward<Accounting>(acct));
}

template <class Context, class T, class KvElem, class Accounting = NoAccounting, class = detail::if_context<Context>,
          class = detail::if_mixed_kv<T, KvElem>>
void attention_forward(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                       const PagedKvCacheView<KvElem>& cache, TensorView<T> o, const AttentionOptions& options = {},
                       LseView lse = {}, Accounting&& acct = Accounting{}) {
  if constexpr (detail::check_element_type<T>::value) {
    using E = std::remove_const_t<KvElem>;
    const auto p = make_paged_forward_params<T, E>(q, PagedKvCacheView<const E>(cache), o, lse, options);
    validate_context(ctx, p.head_dim(), p.value_dim());
    if (p.batch() == 0 || p.q.seq == 0) return;
    dispatch_forward(ctx, p, options, acct);
  }
}

template <class T, class KvElem, class Accounting = NoAccounting, class = detail::if_mixed_kv<T, KvElem>>
void attention_forward(detail::nondeduced<TensorView<const T>> q, const PagedKvCacheView<KvElem>& cache,
                       TensorView<T> o, const AttentionOptions& options = {}, LseView lse = {},
                       Accounting&& acct = Accounting{}) {
  attention_forward<cpu::Context<>, T, KvElem>(cpu::Context<>{}, q, cache, o, options, lse,
                                               std::forward<Accounting>(acct));
}

namespace detail {

// k_new and v_new: (batch, n, heads_kv, dim) as the cache's K and V rows are (their head dims may differ),
// in memory apart from the cache's K and V (k_span, v_span), which must not start at one address and must
// be apart from the lengths.
template <class T>
void check_append(const char* k_name, const TensorView<T>& k_store, const TensorView<T>& v_store,
                  const TensorView<const T>& k_new, const TensorView<const T>& v_new, index_t batch,
                  const ByteSpan& k_span, const ByteSpan& v_span, const ByteSpan& lengths_span) {
  const ByteSpan new_spans[] = {check_view("k_new", k_new), check_view("v_new", v_new)};
  const char* new_names[] = {"k_new", "v_new"};
  // K and V may interleave in one buffer (pages of (2, rows, heads, dim)), so their spans may overlap; the
  // same first element is the mistake to catch.
  if (!k_span.empty() && k_span.begin == v_span.begin)
    fail(std::string(k_name) + ": the cache's K and V views start at the same address (K and V would overwrite "
         "each other)");
  for (int i = 0; i < 2; ++i) {
    if (new_spans[i].overlaps(k_span)) fail(overlap(new_names[i], new_spans[i], "the cache's", "K", k_span));
    if (new_spans[i].overlaps(v_span)) fail(overlap(new_names[i], new_spans[i], "the cache's", "V", v_span));
  }
  for (const ByteSpan* store : {&k_span, &v_span})
    if (store->overlaps(lengths_span)) fail(overlap("the cache's K/V", *store, "argument", "cache.lengths", lengths_span));
  if (k_new.batch != batch || v_new.batch != batch || v_new.seq != k_new.seq || k_new.heads != k_store.heads ||
      v_new.heads != k_store.heads || k_new.dim != k_store.dim || v_new.dim != v_store.dim)
    fail("k_new and v_new must be (batch=" + std::to_string(batch) + ", n, heads=" + std::to_string(k_store.heads) +
         ", dim=" + std::to_string(k_store.dim) + ") and (..., dim=" + std::to_string(v_store.dim) +
         ") to append to " + k_name + ": got " + describe("k_new", k_new) + ", " + describe("v_new", v_new));
}

// An append writes pages that no other entry of the used table names (a page shared by two requests, as a
// common prefix may be, is read-only: writing it would change the other request's keys, or the request's
// own earlier rows where it is listed twice).
template <class T>
void check_pages_written_once(const PagedKvCacheView<T>& c, index_t adding) {
  if (adding <= 0) return;
  const index_t ps = c.page_size();
  std::vector<std::int32_t> uses(std::size_t(c.num_pages()), 0);
  for (index_t b = 0; b < c.batch; ++b)
    for (index_t i = 0; i < (c.lengths[b] + adding + ps - 1) / ps; ++i) ++uses[std::size_t(c.page_of(b, i * ps))];
  for (index_t b = 0; b < c.batch; ++b)
    for (index_t i = c.lengths[b] / ps; i < (c.lengths[b] + adding + ps - 1) / ps; ++i) {
      const index_t page = c.page_of(b, i * ps);
      if (uses[std::size_t(page)] > 1)
        fail("kv_cache_append would write page " + std::to_string(page) + " (cache.block_table[" + std::to_string(b) +
             "][" + std::to_string(i) + "]), which the table names " + std::to_string(uses[std::size_t(page)]) +
             " times: a page that is written must belong to one request once");
    }
}

// Lengths are int32: a cache holds at most 2^31 − 1 keys per request, whatever its views could address.
inline index_t int32_capacity(index_t capacity) {
  return std::min<index_t>(capacity, std::numeric_limits<std::int32_t>::max());
}

template <class T>
void copy_row(T* dst, index_t dst_stride, const T* src, index_t src_stride, index_t dim) {
  if (dst_stride == 1 && src_stride == 1) {
    std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), std::size_t(dim) * sizeof(T));
    return;
  }
  for (index_t c = 0; c < dim; ++c) dst[c * dst_stride] = src[c * src_stride];
}

// Row `s` of request b goes to dest(b, s, h); every head of every new row is copied, then lengths advance.
template <class T, class Dest>
void append_rows(std::int32_t* lengths, const TensorView<const T>& k_new, const TensorView<const T>& v_new,
                 Dest&& dest) {
  for (index_t b = 0; b < k_new.batch; ++b) {
    for (index_t i = 0; i < k_new.seq; ++i)
      for (index_t h = 0; h < k_new.heads; ++h) dest(b, lengths[b] + i, h, k_new.row(b, i, h), v_new.row(b, i, h));
    lengths[b] += std::int32_t(k_new.seq);
  }
}

}  // namespace detail

// Appends k_new / v_new (batch, n, heads_kv, dim) to a contiguous cache: request b's rows land at
// [lengths[b], lengths[b] + n), then lengths[b] += n. Throws InvalidArgument, before writing anything, when
// a request would pass the capacity.
template <class T>
void kv_cache_append(const KvCacheView<T>& cache, detail::nondeduced<TensorView<const T>> k_new,
                     detail::nondeduced<TensorView<const T>> v_new) {
  static_assert(!std::is_const_v<T>, "kv_cache_append writes the cache: pass a view of mutable data");
  const detail::ByteSpan k_span = detail::check_view("cache.k", cache.k), v_span = detail::check_view("cache.v", cache.v);
  detail::check_no_self_overlap<4>("cache.k", {cache.k.batch, cache.k.seq, cache.k.heads, cache.k.dim},
                                   {cache.k.stride_batch, cache.k.stride_seq, cache.k.stride_head, cache.k.stride_dim});
  detail::check_no_self_overlap<4>("cache.v", {cache.v.batch, cache.v.seq, cache.v.heads, cache.v.dim},
                                   {cache.v.stride_batch, cache.v.stride_seq, cache.v.stride_head, cache.v.stride_dim});
  if (cache.v.batch != cache.k.batch || cache.v.seq != cache.k.seq || cache.v.heads != cache.k.heads)
    detail::fail("cache.k and cache.v must have the same shape but for the head dim: " +
                 detail::describe("cache.k", cache.k) + ", " + detail::describe("cache.v", cache.v));
  detail::check_append("cache.k", cache.k, cache.v, k_new, v_new, cache.batch(), k_span, v_span,
                       detail::int32_span(cache.lengths, cache.batch()));
  detail::check_cache_lengths(cache.lengths, cache.batch(), detail::int32_capacity(cache.capacity()) - k_new.seq,
                              "capacity " + std::to_string(cache.capacity()) + " less the " +
                                  std::to_string(k_new.seq) + " rows appended");
  detail::append_rows(cache.lengths, k_new, v_new, [&](index_t b, index_t s, index_t h, const T* k, const T* v) {
    detail::copy_row(cache.k.row(b, s, h), cache.k.stride_dim, k, k_new.stride_dim, k_new.dim);
    detail::copy_row(cache.v.row(b, s, h), cache.v.stride_dim, v, v_new.stride_dim, v_new.dim);
  });
}

// The same for a paged cache: row s of request b goes to row s % page_size of page block_table[b][s /
// page_size]; the table must name a page for every row written.
template <class T>
void kv_cache_append(const PagedKvCacheView<T>& cache, detail::nondeduced<TensorView<const T>> k_new,
                     detail::nondeduced<TensorView<const T>> v_new) {
  static_assert(!std::is_const_v<T>, "kv_cache_append writes the cache: pass a view of mutable data");
  const detail::ByteSpan k_span = detail::check_view("cache.k_pages", cache.k_pages),
                         v_span = detail::check_view("cache.v_pages", cache.v_pages);
  const auto& kp = cache.k_pages;
  const auto& vp = cache.v_pages;
  detail::check_no_self_overlap<4>("cache.k_pages", {kp.batch, kp.seq, kp.heads, kp.dim},
                                   {kp.stride_batch, kp.stride_seq, kp.stride_head, kp.stride_dim});
  detail::check_no_self_overlap<4>("cache.v_pages", {vp.batch, vp.seq, vp.heads, vp.dim},
                                   {vp.stride_batch, vp.stride_seq, vp.stride_head, vp.stride_dim});
  if (cache.v_pages.batch != cache.k_pages.batch || cache.v_pages.seq != cache.k_pages.seq ||
      cache.v_pages.heads != cache.k_pages.heads)
    detail::fail("cache.k_pages and cache.v_pages must have the same shape but for the head dim: " +
                 detail::describe("cache.k_pages", cache.k_pages) + ", " +
                 detail::describe("cache.v_pages", cache.v_pages));
  detail::check_append("cache.k_pages", cache.k_pages, cache.v_pages, k_new, v_new, cache.batch, k_span, v_span,
                       detail::int32_span(cache.lengths, cache.batch));
  detail::check_paged_cache(cache, cache.batch, k_new.seq);
  const detail::ByteSpan table = detail::table_span(cache);
  for (const detail::ByteSpan* store : {&k_span, &v_span})
    if (store->overlaps(table))
      detail::fail(detail::overlap("the cache's K/V", *store, "argument", "cache.block_table", table));
  detail::check_pages_written_once(cache, k_new.seq);
  const index_t page_size = cache.page_size();
  detail::append_rows(cache.lengths, k_new, v_new, [&](index_t b, index_t s, index_t h, const T* k, const T* v) {
    const index_t page = cache.page_of(b, s), row = s % page_size;
    detail::copy_row(cache.k_pages.row(page, row, h), cache.k_pages.stride_dim, k, k_new.stride_dim, k_new.dim);
    detail::copy_row(cache.v_pages.row(page, row, h), cache.v_pages.stride_dim, v, v_new.stride_dim, v_new.dim);
  });
}

}  // namespace flashattn
