#pragma once
// Views of a fused QKV projection's output, [q | k | v] = x · [Wq | Wk | Wv]: each token's row holds its
// query heads, then its key heads, then its value heads, so q, k and v are three strided views of one
// buffer and nothing is copied. The helper spells out the strides that users otherwise write by hand
// (nine fields each, and two swapped strides go unnoticed), and checks the row length.

#include <string>

#include "flashattn/core/errors.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

template <class T>
struct QkvViews {
  TensorView<T> q, k, v;
};

// data: batch · seq rows, one per token, each [heads_q · dim | heads_kv · dim | heads_kv · dim] followed
// by any padding up to row_stride elements (0: no padding). Throws InvalidArgument naming the argument
// for a negative batch or seq, heads or dim below 1, heads_q not a multiple of heads_kv, or a row_stride
// shorter than a row.
template <class T>
QkvViews<T> fused_qkv_bshd(T* data, index_t batch, index_t seq, index_t heads_q, index_t heads_kv, index_t dim,
                           index_t row_stride = 0) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("flashattn: fused_qkv_bshd: " + what); };
  if (batch < 0 || seq < 0)
    fail("batch and seq must be >= 0, got batch=" + std::to_string(batch) + ", seq=" + std::to_string(seq));
  if (heads_q < 1 || heads_kv < 1 || dim < 1)
    fail("heads_q, heads_kv and dim must be >= 1, got heads_q=" + std::to_string(heads_q) +
         ", heads_kv=" + std::to_string(heads_kv) + ", dim=" + std::to_string(dim));
  if (heads_q % heads_kv != 0)
    fail("heads_q must be a multiple of heads_kv, got " + std::to_string(heads_q) + " and " +
         std::to_string(heads_kv));
  const index_t row = (heads_q + 2 * heads_kv) * dim;
  if (row_stride == 0) row_stride = row;
  if (row_stride < row)
    fail("row_stride " + std::to_string(row_stride) + " is shorter than a row of (heads_q + 2·heads_kv)·dim = (" +
         std::to_string(heads_q) + " + 2·" + std::to_string(heads_kv) + ")·" + std::to_string(dim) + " = " +
         std::to_string(row) + " elements");
  const auto slice = [&](index_t first_head, index_t heads) {
    return TensorView<T>{data + first_head * dim, batch, seq, heads, dim, seq * row_stride, row_stride, dim, 1};
  };
  return {slice(0, heads_q), slice(heads_q, heads_kv), slice(heads_q + heads_kv, heads_kv)};
}

}  // namespace flashattn
