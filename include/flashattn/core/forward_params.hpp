#pragma once
// A validated forward problem, as every backend receives it: the query-side views, the key and value
// sources (kv_source.hpp), the sequence layout (sequence.hpp), the resolved scale and the grouped-query
// ratio. How to run it (threads, tiles) is not here: that is the backend's context. Free of Eigen and of
// CPU types.

#include "flashattn/core/kv_source.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

template <class T, class KvSource = DenseKv<T>, class Layout = EqualLengths>
struct ForwardParams {
  TensorView<const T> q;  // (batch, seq_q, heads_q, dim)
  KvSource k;             // key rows of (batch, KV head), dim elements each
  KvSource v;             // value rows, likewise, of the value dim
  TensorView<T> o;        // (batch, seq_q, heads_q, value dim)
  LseView lse;            // (batch, heads_q, seq_q) or empty
  Layout seqs;            // per-entry query and key counts
  double scale = 1.0;     // resolved: never unset here
  index_t group = 1;      // heads_q / heads_kv: query head h reads KV head h / group

  index_t batch() const { return seqs.batch; }
  index_t heads() const { return q.heads; }
  index_t head_dim() const { return q.dim; }   // of q and k
  index_t value_dim() const { return o.dim; }  // of v and o: head_dim() unless V is narrower or wider (MLA)
  index_t kv_head(index_t h) const { return h / group; }
  // Entry b's rows of q, o and lse, indexed (b, s, h) / (b, h, s) whatever the layout (sequence.hpp).
  TensorView<const T> q_rows(index_t b) const { return seqs.entry_rows(q, b); }
  TensorView<T> o_rows(index_t b) const { return seqs.entry_rows(o, b); }
  LseView lse_rows(index_t b) const { return lse.empty() ? lse : seqs.entry_rows(lse, b); }
};

}  // namespace flashattn
