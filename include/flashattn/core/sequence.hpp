#pragma once
// The sequence-layout seam: how many query rows and keys each batch entry has. The scheduler (how many
// query blocks an entry has), the mask policies (built per sequence, variants.hpp) and the kernels (where
// an entry's rows end) read lengths only through a layout type, never from a view's `seq`.
//
// Every layout also says where entry b's query rows are in the q / o / lse views (entry_rows): a view
// whose (b, s, h) element is entry b's query s; and likewise where its key rows are in k / v-shaped
// views (entry_key_rows: the backward's k, v, dk, dv; the forward reads keys through a KV source,
// kv_source.hpp). Dense layouts return the view itself; a packed one shifts it to the entry's first row,
// so the kernels index every layout the same way.
//
// EqualLengths: every entry has seq_q queries and seq_k keys, the dense (batch, seq, heads, dim) views.
// PackedLengths: variable-length entries packed into (total_tokens, heads, dim) tensors, entry b's rows
// being [cu[b], cu[b + 1]) (FlashAttention's cu_seqlens). kv_cache.hpp's CacheLengths: dense queries,
// a key count per request.

#include <cstdint>

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
  template <class View>
  FLASHATTN_HOST_DEVICE View entry_rows(const View& x, index_t /*b*/) const { return x; }
  template <class View>
  FLASHATTN_HOST_DEVICE View entry_key_rows(const View& x, index_t /*b*/) const { return x; }
};

// Packed variable-length entries: cu_q[b] .. cu_q[b + 1] are entry b's rows of the packed q / o (likewise
// cu_k for k / v), cu_q[0] = 0, both of batch + 1 non-decreasing int32 offsets.
struct PackedLengths {
  index_t batch = 0;
  const std::int32_t* cu_q = nullptr;
  const std::int32_t* cu_k = nullptr;
  index_t max_q = 0, max_k = 0;  // the longest entry's rows and keys, found when the call is validated

  FLASHATTN_HOST_DEVICE index_t q_len(index_t b) const { return cu_q[b + 1] - cu_q[b]; }
  FLASHATTN_HOST_DEVICE index_t kv_len(index_t b) const { return cu_k[b + 1] - cu_k[b]; }
  FLASHATTN_HOST_DEVICE index_t max_q_len() const { return max_q; }
  FLASHATTN_HOST_DEVICE index_t max_kv_len() const { return max_k; }
  FLASHATTN_HOST_DEVICE index_t total_q() const { return cu_q[batch]; }
  FLASHATTN_HOST_DEVICE index_t q_row(index_t b, index_t s) const { return cu_q[b] + s; }
  // The view from entry b's first row on, its batch stride 0: (b, s, h) is then entry b's row s.
  template <class View>
  FLASHATTN_HOST_DEVICE View entry_rows(View x, index_t b) const {
    return shifted(x, cu_q[b]);
  }
  template <class View>
  FLASHATTN_HOST_DEVICE View entry_key_rows(View x, index_t b) const {
    return shifted(x, cu_k[b]);
  }

 private:
  template <class View>
  FLASHATTN_HOST_DEVICE static View shifted(View x, index_t first_row) {
    x.data += first_row * x.stride_seq;
    x.stride_batch = 0;
    return x;
  }
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
