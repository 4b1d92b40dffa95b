#pragma once
// Views of a KV cache, the memory a decoder keeps K and V of past tokens in, and the sequence layout and
// KV source (sequence.hpp, kv_source.hpp) the kernels read it through.
//
//   KvCacheView       contiguous: K and V of shape (batch, capacity, heads_kv, dim), any strides (BSHD,
//                     BHSD, ...), request b using its first lengths[b] rows;
//   PagedKvCacheView  paged: K and V in pages of shape (num_pages, page_size, heads_kv, dim), request b's
//                     key s in row s % page_size of page block_table[b][s / page_size].
//
// `lengths` (int32, one per request, like FlashAttention's cache_seqlens) counts the keys a request has in
// the cache, the current step's included: append the step's K/V rows first (flashattn/kv_cache.hpp's
// kv_cache_append, which also advances the lengths), then attend. A view of mutable data has mutable
// lengths and can be appended to; a read-only view (what attention takes) cannot.

#include <cstdint>
#include <type_traits>

#include "flashattn/core/views.hpp"

namespace flashattn {

template <class T>
using cache_lengths_ptr = std::conditional_t<std::is_const_v<T>, const std::int32_t*, std::int32_t*>;

template <class T>
struct KvCacheView {
  TensorView<T> k, v;                // (batch, capacity, heads_kv, dim)
  cache_lengths_ptr<T> lengths = nullptr;  // (batch) keys in use, each in [0, capacity]

  index_t batch() const { return k.batch; }
  index_t capacity() const { return k.seq; }
  operator KvCacheView<const T>() const { return {k, v, lengths}; }
};

// A cache of `capacity` rows per request in (batch, capacity, heads_kv, dim) order: each step's new rows
// of all heads are contiguous, cheap to append.
template <class T>
KvCacheView<T> kv_cache_bshd(T* k, T* v, index_t batch, index_t capacity, index_t heads_kv, index_t dim,
                             cache_lengths_ptr<T> lengths) {
  return {bshd(k, batch, capacity, heads_kv, dim), bshd(v, batch, capacity, heads_kv, dim), lengths};
}

// The same in (batch, heads_kv, capacity, dim) order: one head's keys are contiguous, the order a decode
// step reads them in (docs/inference.md compares the two).
template <class T>
KvCacheView<T> kv_cache_bhsd(T* k, T* v, index_t batch, index_t heads_kv, index_t capacity, index_t dim,
                             cache_lengths_ptr<T> lengths) {
  return {bhsd(k, batch, heads_kv, capacity, dim), bhsd(v, batch, heads_kv, capacity, dim), lengths};
}

template <class T>
struct PagedKvCacheView {
  TensorView<T> k_pages, v_pages;            // (num_pages, page_size, heads_kv, dim): batch = pages
  const std::int32_t* block_table = nullptr;  // (batch, max_pages): request b's i-th page, row stride table_stride
  index_t batch = 0, max_pages = 0, table_stride = 0;
  cache_lengths_ptr<T> lengths = nullptr;  // (batch) keys in use, each in [0, max_pages · page_size]

  index_t num_pages() const { return k_pages.batch; }
  index_t page_size() const { return k_pages.seq; }
  index_t capacity() const { return max_pages * k_pages.seq; }  // keys a request can hold
  // The page holding request b's key s.
  index_t page_of(index_t b, index_t s) const { return block_table[b * table_stride + s / k_pages.seq]; }
  operator PagedKvCacheView<const T>() const {
    return {k_pages, v_pages, block_table, batch, max_pages, table_stride, lengths};
  }
};

// Pages stored contiguously, rows × heads × dim inside a page ("NHD": a step's new rows of all heads are
// contiguous), with a dense (batch, max_pages) table.
template <class T>
PagedKvCacheView<T> paged_kv_cache_nhd(T* k_pages, T* v_pages, index_t num_pages, index_t page_size,
                                       index_t heads_kv, index_t dim, const std::int32_t* block_table, index_t batch,
                                       index_t max_pages, cache_lengths_ptr<T> lengths) {
  return {bshd(k_pages, num_pages, page_size, heads_kv, dim),
          bshd(v_pages, num_pages, page_size, heads_kv, dim),
          block_table,
          batch,
          max_pages,
          max_pages,
          lengths};
}

// The same with heads × rows × dim inside a page ("HND": one head's rows of a page are contiguous, the
// order a decode step reads them in; docs/inference.md compares the two).
template <class T>
PagedKvCacheView<T> paged_kv_cache_hnd(T* k_pages, T* v_pages, index_t num_pages, index_t page_size,
                                       index_t heads_kv, index_t dim, const std::int32_t* block_table, index_t batch,
                                       index_t max_pages, cache_lengths_ptr<T> lengths) {
  return {bhsd(k_pages, num_pages, heads_kv, page_size, dim),
          bhsd(v_pages, num_pages, heads_kv, page_size, dim),
          block_table,
          batch,
          max_pages,
          max_pages,
          lengths};
}

// The sequence layout of a cached call: seq_q query rows per request (dense q), lengths[b] keys.
struct CacheLengths {
  index_t batch = 0;
  index_t seq_q = 0;
  index_t max_kv = 0;  // the largest of lengths[], found when the call is validated
  const std::int32_t* lengths = nullptr;

  FLASHATTN_HOST_DEVICE index_t q_len(index_t /*b*/) const { return seq_q; }
  FLASHATTN_HOST_DEVICE index_t kv_len(index_t b) const { return lengths[b]; }
  FLASHATTN_HOST_DEVICE index_t max_q_len() const { return seq_q; }
  FLASHATTN_HOST_DEVICE index_t max_kv_len() const { return max_kv; }
  FLASHATTN_HOST_DEVICE index_t total_q() const { return batch * seq_q; }
  FLASHATTN_HOST_DEVICE index_t q_row(index_t b, index_t s) const { return b * seq_q + s; }
  template <class View>
  FLASHATTN_HOST_DEVICE View entry_rows(const View& x, index_t /*b*/) const { return x; }
  template <class View>
  FLASHATTN_HOST_DEVICE View entry_key_rows(const View& x, index_t /*b*/) const { return x; }
};

// The KV source of a paged cache (kv_source.hpp's members): rows are evenly spaced within a page, so a
// tile that stays in one page is read in place and one that crosses pages is gathered row by row.
template <class T>
struct PagedKv {
  using Elem = T;
  TensorView<const T> pages;  // (num_pages, page_size, heads_kv, dim)
  const std::int32_t* table = nullptr;
  index_t table_stride = 0;

  FLASHATTN_HOST_DEVICE const T* row(index_t b, index_t h, index_t s) const {
    const index_t page = table[b * table_stride + s / pages.seq];
    return pages.row(page, s % pages.seq, h);
  }
  FLASHATTN_HOST_DEVICE index_t dim_stride() const { return pages.stride_dim; }
  FLASHATTN_HOST_DEVICE index_t even_run(index_t, index_t, index_t s) const { return pages.seq - s % pages.seq; }
  FLASHATTN_HOST_DEVICE index_t row_stride() const { return pages.stride_seq; }
};

}  // namespace flashattn
