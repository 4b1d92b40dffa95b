#pragma once
// A validated forward problem, as every backend receives it: the views, the resolved scale and the
// grouped-query ratio. Free of Eigen and of CPU intrinsics.

#include "flashattn/views.hpp"

namespace flashattn {

template <class T>
struct ForwardParams {
  TensorView<const T> q;  // (batch, seq_q, heads_q, dim)
  TensorView<const T> k;  // (batch, seq_k, heads_kv, dim)
  TensorView<const T> v;  // (batch, seq_k, heads_kv, dim)
  TensorView<T> o;        // (batch, seq_q, heads_q, dim)
  LseView lse;            // (batch, heads_q, seq_q) or empty
  double scale = 1.0;     // resolved: never unset here
  index_t group = 1;      // heads_q / heads_kv: query head h reads KV head h / group
  int num_threads = 0;

  index_t kv_head(index_t h) const { return h / group; }
};

}  // namespace flashattn
