#pragma once
// The KV-source seam: how a kernel reaches the rows of K or V of one (batch, KV head). Operand staging
// (cpu/tile_ops*.hpp) and prefetching ask a source, never a TensorView, for key rows:
//
//   row(b, h, s)             pointer to key row s: `dim` elements, dim_stride() apart
//   dim_stride()             elements between consecutive elements of a row
//   even_rows(b, h, s, n)    whether rows [s, s + n) are evenly spaced, row_stride() apart, so that a tile
//                            of them can be read in place as one strided matrix
//   row_stride()             that spacing, where rows are evenly spaced
//
// DenseKv is today's source: a strided (batch, seq, heads, dim) view, every run of rows evenly spaced. A
// paged KV cache is a second type with the same members: row() looks the page up in a block table, and
// even_rows() holds within one page (a tile that crosses pages is gathered row by row instead).

#include "flashattn/core/views.hpp"

namespace flashattn {

template <class T>
struct DenseKv {
  TensorView<const T> view;  // (batch, seq_k, heads_kv, dim)

  FLASHATTN_HOST_DEVICE const T* row(index_t b, index_t h, index_t s) const { return view.row(b, s, h); }
  FLASHATTN_HOST_DEVICE index_t dim_stride() const { return view.stride_dim; }
  FLASHATTN_HOST_DEVICE bool even_rows(index_t, index_t, index_t, index_t) const { return true; }
  FLASHATTN_HOST_DEVICE index_t row_stride() const { return view.stride_seq; }
};

template <class T>
FLASHATTN_HOST_DEVICE DenseKv<T> dense_kv(const TensorView<const T>& view) {
  return {view};
}

}  // namespace flashattn
