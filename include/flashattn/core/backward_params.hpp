#pragma once
// A validated backward problem, as every backend receives it: the forward's views and its saved LSE, the
// incoming gradient dO, the three gradient outputs, the sequence layout, the resolved scale and the
// grouped-query ratio. Free of Eigen and of CPU types.

#include "flashattn/core/sequence.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

// What a backward call may take and give beyond dq, dk and dv; both optional (the last argument of
// attention_backward / attention_backward_masked / attention_backward_varlen).
struct BackwardExtras {
  // dLoss/dLSE, shaped like the call's lse: for a loss that also reads the forward's LSE (ring
  // attention's merge, a z-loss). Enters the gradients as D_i − dLSE_i (docs/backward.md).
  LseView d_lse{};
  // Receives dLoss/d(sink logit) for each query head (heads_q floats, overwritten), summed over the batch
  // and rows: for a policy with a sink (sinks(...)) whose logits are learned. Needs such a policy.
  float* d_sinks = nullptr;
  // Receives dLoss/d bias for a policy with a bias(view, mask) (itself or under other variants):
  // contiguous (view.batch, view.heads, seq_q, seq_k) floats, overwritten; a broadcast extent (1) receives
  // the sum over the call's batch entries or heads. Needs the bias's own mask to leave scores unchanged.
  float* d_bias = nullptr;
};

// What the entry point found of a bias(view, mask) in the call's policy (score_variants.hpp's
// bias_in_policy): view null where there is none; base_changes_scores where the bias's own mask changes
// scores, which d_bias does not support (BackwardExtras::d_bias).
struct BiasInPolicy {
  const BiasView* view = nullptr;
  bool base_changes_scores = false;
};

// Where the backward writes dLoss/d bias (BackwardExtras::d_bias), with the bias's extents: batch and heads
// are the call's or 1 (summed over).
struct BiasGrad {
  float* data = nullptr;
  index_t batch = 0, heads = 0;
};

template <class T, class Layout = EqualLengths>
struct BackwardParams {
  TensorView<const T> q;     // (batch, seq_q, heads_q, dim)
  TensorView<const T> k;     // (batch, seq_k, heads_kv, dim)
  TensorView<const T> v;     // (batch, seq_k, heads_kv, value dim): v's head dim may differ from q/k's
  TensorView<const T> o;     // (batch, seq_q, heads_q, value dim): the forward's output
  TensorView<const T> d_o;   // (batch, seq_q, heads_q, value dim): dLoss/dO
  LseView lse;               // (batch, heads_q, seq_q): the forward's LSE (read only), never empty here
  TensorView<T> dq;          // like q
  TensorView<T> dk;          // like k: summed over the `group` query heads that share each KV head
  TensorView<T> dv;          // like v: idem
  Layout seqs;               // per-entry query and key counts
  double scale = 1.0;        // resolved: never unset here
  index_t group = 1;         // heads_q / heads_kv: query head h reads KV head h / group
  LseView d_lse{};           // dLoss/dLSE, shaped like lse; empty: none (BackwardExtras)
  float* d_sinks = nullptr;  // receives dLoss/d sink logit per query head; null: not wanted
  BiasGrad d_bias{};         // receives dLoss/d bias; data null: not wanted

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
    if (!d_lse.empty()) e.d_lse = seqs.entry_rows(d_lse, b);
    e.k = seqs.entry_key_rows(k, b);
    e.v = seqs.entry_key_rows(v, b);
    e.dk = seqs.entry_key_rows(dk, b);
    e.dv = seqs.entry_key_rows(dv, b);
    return e;
  }
};

}  // namespace flashattn
