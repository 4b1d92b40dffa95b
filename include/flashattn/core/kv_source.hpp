#pragma once
// The KV-source seam: how a kernel reaches the rows of K or V of one (batch, KV head). Operand staging
// (cpu/tile_ops*.hpp) and prefetching ask a source, never a TensorView, for key rows:
//
//   row(b, h, s)             pointer to key row s: `dim` elements, dim_stride() apart
//   dim_stride()             elements between consecutive elements of a row
//   even_run(b, h, s)        how many rows from s on are evenly spaced, row_stride() apart (at least 1), so
//                            that a tile of that many can be read in place as one strided matrix
//   row_stride()             that spacing
//   Elem                     the stored element type (a KV cache may store 16-bit K/V for fp32 queries)
//
// DenseKv is the dense source: a strided (batch, seq, heads, dim) view, all its rows evenly spaced. A paged
// KV cache (kv_cache.hpp's PagedKv) has the same members: row() looks the page up in a block table, and a
// run ends at the end of a page (a tile that crosses pages is gathered row by row, or, by the decode
// kernel, read through one pointer per row: row_pointers below).

#include <cstdint>

#include "flashattn/core/views.hpp"

namespace flashattn {

// A run length longer than any tile: "every row from here on".
inline constexpr index_t kUnboundedRun = index_t(1) << 62;

template <class T>
struct DenseKv {
  using Elem = T;
  TensorView<const T> view;  // (batch, seq_k, heads_kv, dim)

  FLASHATTN_HOST_DEVICE const T* row(index_t b, index_t h, index_t s) const { return view.row(b, s, h); }
  FLASHATTN_HOST_DEVICE index_t dim_stride() const { return view.stride_dim; }
  FLASHATTN_HOST_DEVICE index_t even_run(index_t, index_t, index_t) const { return kUnboundedRun; }
  FLASHATTN_HOST_DEVICE index_t row_stride() const { return view.stride_seq; }
};

template <class T>
FLASHATTN_HOST_DEVICE DenseKv<T> dense_kv(const TensorView<const T>& view) {
  return {view};
}

// Keys of variable-length entries packed into one (1, total_k, heads, dim) view: entry b's key s is row
// cu[b] + s.
template <class T>
struct PackedKv {
  using Elem = T;
  TensorView<const T> view;  // (1, total_k, heads_kv, dim)
  const std::int32_t* cu = nullptr;

  FLASHATTN_HOST_DEVICE const T* row(index_t b, index_t h, index_t s) const { return view.row(0, cu[b] + s, h); }
  FLASHATTN_HOST_DEVICE index_t dim_stride() const { return view.stride_dim; }
  FLASHATTN_HOST_DEVICE index_t even_run(index_t, index_t, index_t) const { return kUnboundedRun; }
  FLASHATTN_HOST_DEVICE index_t row_stride() const { return view.stride_seq; }
};

template <class Kv>
using kv_elem_t = typename Kv::Elem;

// out[j] = the row of key s + j, for j < n: one row() per run of evenly spaced rows, not per row (a paged
// source's row() divides by the page size).
template <class Rows, class Elem>
FLASHATTN_HOST_DEVICE void row_pointers(const Rows& x, index_t b, index_t h, index_t s, index_t n, const Elem** out) {
  for (index_t j = 0; j < n;) {
    const Elem* first = x.row(b, h, s + j);
    const index_t run = x.even_run(b, h, s + j), stride = x.row_stride();
    for (index_t r = 0; r < run && j < n; ++r, ++j) out[j] = first + r * stride;
  }
}

}  // namespace flashattn
