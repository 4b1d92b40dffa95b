#pragma once
// Split-KV (FlashDecoding): when a forward has too few programs to keep the workers busy (decoding, or one
// long sequence on few heads), the keys are split into ranges as well. Each (range, block) program leaves
// its rows' unnormalised output and softmax state in a SplitKvPartials buffer, and combine() then merges
// the ranges of each row with core/softmax_state.hpp's rule.

#include <algorithm>
#include <cstddef>
#include <limits>

#include "flashattn/core/softmax_state.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"

namespace flashattn::cpu {

// Key ranges per query block. A function of the problem's shape only, never of the thread count, so that
// a call gives the same bits on any number of threads. Splitting stops at kTargetItems work items (enough
// for dynamic balance on a few dozen cores) and never makes a range shorter than kMinTilesPerSplit tiles.
inline index_t kv_splits(index_t items, index_t seq_k, int block_kv) {
  constexpr index_t kTargetItems = 64, kMinTilesPerSplit = 4;
  if (items >= kTargetItems) return 1;
  const index_t max_splits = seq_k / (kMinTilesPerSplit * block_kv);
  return std::max<index_t>(1, std::min((kTargetItems + items - 1) / items, max_splits));
}

// Key ranges for the decode path (forward_scheduler.hpp's run_decode), also a function of the shape only:
// up to kTargetItems work items, and ranges of at least min_keys keys (whole tiles of block_kv).
inline index_t decode_splits(index_t items, index_t seq_k, int block_kv, index_t min_keys) {
  constexpr index_t kTargetItems = 64;
  if (items >= kTargetItems) return 1;
  const index_t tiles = (seq_k + block_kv - 1) / block_kv;
  const index_t min_tiles = std::max<index_t>(1, (min_keys + block_kv - 1) / block_kv);
  return std::max<index_t>(1, std::min((kTargetItems + items - 1) / items, tiles / min_tiles));
}

// The partial states of `splits` key ranges for `rows` rows of d columns, indexed [split][row]: each
// row's unnormalised output (d elements), running max (base-2 units) and running sum.
template <class Acc>
class SplitKvPartials {
 public:
  SplitKvPartials(index_t splits, index_t rows, int d)
      : splits_(splits),
        rows_(rows),
        d_(d),
        o_(std::size_t(splits * rows * d)),
        m_(std::size_t(splits * rows)),
        l_(std::size_t(splits * rows)) {}

  index_t splits() const { return splits_; }
  // Where range `split` writes the state of rows [row, ...): output rows of d, then maxima, then sums.
  Acc* o(index_t split, index_t row) { return o_.data() + (split * rows_ + row) * d_; }
  Acc* m(index_t split, index_t row) { return m_.data() + split * rows_ + row; }
  Acc* l(index_t split, index_t row) { return l_.data() + split * rows_ + row; }

  // Merges the ranges of one row (and a sink, in base-2 units: core/softmax_state.hpp): out(c, value)
  // receives its normalised output; returns its LSE.
  template <class Out>
  Acc combine(index_t row, Acc* o_buf, Out&& out, Acc sink = -std::numeric_limits<Acc>::infinity()) {
    return merge_softmax_states<Acc>(
        int(splits_), d_, [&](int s) { return *m(s, row); }, [&](int s) { return *l(s, row); },
        [&](int s) { return static_cast<const Acc*>(o(s, row)); }, o_buf, out, sink);
  }

  // Bytes of the state of one row of one range (the traffic accounting's unit).
  static index_t row_bytes(int d) { return (index_t(d) + 2) * index_t(sizeof(Acc)); }

 private:
  index_t splits_, rows_;
  int d_;
  AlignedBuffer<Acc> o_, m_, l_;
};

}  // namespace flashattn::cpu
