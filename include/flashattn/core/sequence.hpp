#pragma once
// The sequence-layout seam: how many query rows and keys each batch entry has. The scheduler (how many
// query blocks an entry has), the mask policies (built per sequence, variants.hpp) and the kernels (where
// an entry's rows end) read lengths only through a layout type, never from a view's `seq`.
//
// EqualLengths is today's layout: every entry has seq_q queries and seq_k keys, the dense
// (batch, seq, heads, dim) views. A packed variable-length layout (cu_seqlens: entry b's rows are
// [cu[b], cu[b + 1]) of a (total_tokens, heads, dim) tensor) or a KV cache with per-request lengths is a
// second type with the same members.

#include "flashattn/core/views.hpp"

namespace flashattn {

struct EqualLengths {
  index_t batch = 0;
  index_t seq_q = 0;  // query rows of every entry
  index_t seq_k = 0;  // keys of every entry

  FLASHATTN_HOST_DEVICE index_t q_len(index_t /*b*/) const { return seq_q; }
  FLASHATTN_HOST_DEVICE index_t kv_len(index_t /*b*/) const { return seq_k; }
  // Largest q_len over the batch: what a scheduler sizes its grid of query blocks by.
  FLASHATTN_HOST_DEVICE index_t max_q_len() const { return seq_q; }
  // Largest kv_len over the batch.
  FLASHATTN_HOST_DEVICE index_t max_kv_len() const { return seq_k; }
  // Query rows of the whole batch, per head: what buffers indexed by (batch, head, row) are sized by.
  FLASHATTN_HOST_DEVICE index_t total_q() const { return batch * seq_q; }
  // Row s of entry b in those buffers (per head).
  FLASHATTN_HOST_DEVICE index_t q_row(index_t b, index_t s) const { return b * seq_q + s; }
};

// One sequence of one head, as a kernel program and a policy see it.
struct SequenceInfo {
  index_t batch = 0;  // entry of the batch
  index_t head = 0;   // query head
  index_t seq_q = 0;  // this entry's query rows
  index_t seq_k = 0;  // this entry's keys
};

template <class Layout>
FLASHATTN_HOST_DEVICE SequenceInfo sequence_info(const Layout& layout, index_t b, index_t h) {
  return {b, h, layout.q_len(b), layout.kv_len(b)};
}

}  // namespace flashattn
