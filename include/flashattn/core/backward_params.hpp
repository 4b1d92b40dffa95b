#pragma once
// A validated backward problem, as every backend receives it: the forward's views and its saved LSE, the
// incoming gradient dO, the three gradient outputs, the sequence layout, the resolved scale and the
// grouped-query ratio. Free of Eigen and of CPU types.

#include "flashattn/core/sequence.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

template <class T, class Layout = EqualLengths>
struct BackwardParams {
  TensorView<const T> q;    // (batch, seq_q, heads_q, dim)
  TensorView<const T> k;    // (batch, seq_k, heads_kv, dim)
  TensorView<const T> v;    // (batch, seq_k, heads_kv, dim)
  TensorView<const T> o;    // (batch, seq_q, heads_q, dim): the forward's output
  TensorView<const T> d_o;  // (batch, seq_q, heads_q, dim): dLoss/dO
  LseView lse;              // (batch, heads_q, seq_q): the forward's LSE (read only), never empty here
  TensorView<T> dq;         // like q
  TensorView<T> dk;         // like k: summed over the `group` query heads that share each KV head
  TensorView<T> dv;         // like v: idem
  Layout seqs;              // per-entry query and key counts
  double scale = 1.0;       // resolved: never unset here
  index_t group = 1;        // heads_q / heads_kv: query head h reads KV head h / group

  index_t kv_head(index_t h) const { return h / group; }
  index_t batch() const { return seqs.batch; }
  // The views shifted to entry b's rows (sequence.hpp's entry_rows / entry_key_rows), indexed (b, s, h) /
  // (b, h, s) whatever the layout: what a kernel program of entry b reads and writes.
  BackwardParams entry(index_t b) const {
    BackwardParams e = *this;
    e.q = seqs.entry_rows(q, b);
    e.o = seqs.entry_rows(o, b);
    e.d_o = seqs.entry_rows(d_o, b);
    e.dq = seqs.entry_rows(dq, b);
    e.lse = seqs.entry_rows(lse, b);
    e.k = seqs.entry_key_rows(k, b);
    e.v = seqs.entry_key_rows(v, b);
    e.dk = seqs.entry_key_rows(dk, b);
    e.dv = seqs.entry_key_rows(dv, b);
    return e;
  }
};

}  // namespace flashattn
