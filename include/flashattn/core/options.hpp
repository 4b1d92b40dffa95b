#pragma once
// What the caller asks for, with PyTorch scaled_dot_product_attention semantics: the math of the call, not
// how a backend runs it (threads and tiles are the backend's: cpu::Context). Free of Eigen and of CPU types
// so that every backend reads the same options.

#include <optional>

#include "flashattn/core/views.hpp"

namespace flashattn {

struct AttentionOptions {
  // Multiplies Q·Kᵀ before the softmax. Unset: 1/sqrt(head_dim), as in SDPA.
  std::optional<double> scale;

  // Query i may attend to key j only when j <= i + (seq_k - seq_q): the causal diagonal is aligned to the
  // bottom-right corner of the (seq_q, seq_k) score matrix, as in FlashAttention 2 (and SDPA's
  // `causal_lower_right`). With seq_q == seq_k this is the usual lower triangle; with seq_q < seq_k (a
  // prefill chunk after a KV cache) the last query sees every key; with seq_q > seq_k the first
  // seq_q - seq_k queries see no key at all, and their output is 0 with LSE -inf.
  bool causal = false;

  // Sliding-window (local) attention, on the same bottom-right diagonal: query i keeps keys j with
  // i + off - window_left <= j <= i + off + window_right, off = seq_k - seq_q. A negative value means
  // unbounded on that side. causal == true is the same as window_right == 0.
  index_t window_left = -1;
  index_t window_right = -1;

  bool has_window() const { return causal || window_left >= 0 || window_right >= 0; }
};

}  // namespace flashattn
