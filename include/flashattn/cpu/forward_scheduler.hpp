#pragma once
// The CPU forward's scheduler: runs forward programs (forward_kernel.hpp) over the whole problem on the
// worker threads. Work items are (batch, head, query block) (work_items.hpp). When there are too few to
// keep many cores busy, the keys are split into ranges as well and the partial results merged
// (split_kv.hpp). Calls with few query rows (decoding) run the decode kernel instead (run_decode below).

#include <algorithm>
#include <limits>

#include "flashattn/core/forward_params.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/decode_kernel.hpp"
#include "flashattn/cpu/forward_kernel.hpp"
#include "flashattn/cpu/parallel.hpp"
#include "flashattn/cpu/split_kv.hpp"
#include "flashattn/cpu/work_items.hpp"
#include "flashattn/instrument/accounting.hpp"

namespace flashattn::cpu {

// Threads worth starting: each must get at least ~4 MFLOP (tens of microseconds), or starting it costs
// more than it saves (small decode steps run on the calling thread). Results do not depend on it.
template <class T, class Kv, class Layout>
int worker_count(const ForwardParams<T, Kv, Layout>& p, int requested) {
  constexpr double kMinFlopsPerThread = 4e6;
  const double flops = 2.0 * double(p.batch()) * double(p.heads()) * double(p.seqs.max_q_len()) *
                       double(p.seqs.max_kv_len()) * double(p.head_dim() + p.value_dim());
  return int(std::max(1.0, std::min(double(requested), flops / kMinFlopsPerThread)));
}

// The last step of a split call: each row's key ranges merged (split_kv.hpp) into its O row (through the
// policy's output transform, with its sink) and LSE. partial_row(seq, i): the partials' row of query i.
template <class Kernel, class T, class Kv, class Layout, class Mask, class PartialRow, class Accounting>
void write_merged_rows(int threads, const ForwardParams<T, Kv, Layout>& p, const Mask& mask,
                       SplitKvPartials<typename Kernel::Acc>& partials, PartialRow&& partial_row, Accounting& acct) {
  using Acc = typename Kernel::Acc;
  const int d = int(p.value_dim());
  const index_t rows_per_head = p.seqs.total_q();
  run_workers(p.batch() * p.heads(), threads, [&](WorkQueue& queue) {
    AlignedBuffer<Acc> o_buf{std::size_t(d)};
    for (index_t bh; queue.next(bh);) {
      const SequenceInfo seq = sequence_info(p.seqs, bh / p.heads(), bh % p.heads());
      const auto policy = policy_for(mask, seq);
      Acc sink = -std::numeric_limits<Acc>::infinity();
      if constexpr (has_sink_v<decltype(policy)>) sink = Acc(policy.sink_logit()) * Kernel::kLog2e;
      const TensorView<T> o = p.o_rows(seq.batch);
      const LseView lse_rows = p.lse_rows(seq.batch);
      for (index_t i = 0; i < seq.seq_q; ++i) {
        T* out = o.row(seq.batch, i, seq.head);
        const Acc lse = partials.combine(partial_row(seq, i), o_buf.data(), [&](int c, Acc value) {
          if constexpr (transforms_output_v<decltype(policy)>) value = Acc(policy.transform_output(i, c, value));
          out[c * o.stride_dim] = T(value);
        }, sink);
        if (!lse_rows.empty()) lse_rows(seq.batch, seq.head, i) = float(lse);
      }
    }
  });
  acct.read(Traffic::Partial, partials.splits() * p.heads() * rows_per_head * partials.row_bytes(d));
  acct.write(Traffic::O, p.heads() * rows_per_head * d * index_t(sizeof(T)));
  if (!p.lse.empty()) acct.write(Traffic::Lse, p.heads() * rows_per_head * index_t(sizeof(float)));
}

// num_threads: the context's (0: the default).
template <class T, class TileConfig, int HeadDim, class Kv, class Layout, class Mask, class Accounting>
void run_forward(int num_threads, const ForwardParams<T, Kv, Layout>& p, const Mask& mask, Accounting& acct) {
  using Kernel = ForwardKernel<T, TileConfig, HeadDim>;
  using Acc = typename Kernel::Acc;
  constexpr int BlockQ = Kernel::BlockQ, BlockKV = Kernel::BlockKV;
  const WorkGrid grid{p.batch(), p.heads(), WorkGrid::blocks_of(p.seqs.max_q_len(), BlockQ), true};
  const int dk = int(p.head_dim()), dv = int(p.value_dim());
  const int threads = worker_count(p, num_threads > 0 ? num_threads : default_num_threads());
  const index_t splits = kv_splits(grid.size(), p.seqs.max_kv_len(), BlockKV);

  if (splits == 1) {
    run_workers(grid.size(), threads, [&](WorkQueue& queue) {
      typename Kernel::Scratch scratch(dk, dv);
      for (index_t i; queue.next(i);) {
        const WorkItem item = grid[i];
        const SequenceInfo seq = sequence_info(p.seqs, item.batch, item.head);
        if (item.block * BlockQ >= seq.seq_q) continue;
        Kernel::run(p, policy_for(mask, seq), seq, item.block * BlockQ, scratch, acct);
      }
    });
    return;
  }

  // Split-KV: ranges are whole tiles; partial rows are indexed (head, the layout's row of (batch, row)).
  const index_t range = WorkGrid::blocks_of(WorkGrid::blocks_of(p.seqs.max_kv_len(), BlockKV), int(splits)) * BlockKV;
  const index_t rows_per_head = p.seqs.total_q();
  SplitKvPartials<Acc> partials(splits, p.heads() * rows_per_head, dv);
  const auto partial_row = [&](const SequenceInfo& seq, index_t i) {
    return seq.head * rows_per_head + p.seqs.q_row(seq.batch, i);
  };

  run_workers(grid.size() * splits, threads, [&](WorkQueue& queue) {
    typename Kernel::Scratch scratch(dk, dv);
    for (index_t i; queue.next(i);) {
      const index_t split = i % splits;
      const WorkItem item = grid[i / splits];
      const SequenceInfo seq = sequence_info(p.seqs, item.batch, item.head);
      const index_t q0 = item.block * BlockQ;
      if (q0 >= seq.seq_q) continue;
      const index_t row0 = partial_row(seq, q0);
      Kernel::run_partial(p, policy_for(mask, seq), seq, q0, split * range, (split + 1) * range, scratch,
                          partials.o(split, row0), partials.m(split, row0), partials.l(split, row0), acct);
      acct.write(Traffic::Partial, std::min<index_t>(BlockQ, seq.seq_q - q0) * partials.row_bytes(dv));
    }
  });

  write_merged_rows<Kernel>(threads, p, mask, partials, partial_row, acct);
}

// The decode path (decode_kernel.hpp), for calls of at most DecodeKernel::kRows query rows per sequence.
// Work items are (batch entry, KV head, chunk of its query heads, key range): a chunk packs as many query
// heads of the group as the kernel's rows hold, so K and V are read once per chunk (once per group when
// seq_q · group ≤ kRows). Decoding is bound by reading K and V, so the work is cut by bytes:
//  - key ranges: decode_splits (a function of the shape only, never of the thread count, so that every
//    thread count gives the same bits): enough items for dynamic balance, ranges of at least kMinBytes;
//  - threads: one per kMinBytes of K/V read at least (starting a thread costs more than reading less).
// Every program leaves partial states; write_merged_rows then merges each row's ranges.
template <class T, class TileConfig, int HeadDim, class Kv, class Layout, class Mask, class Accounting>
void run_decode(int num_threads, const ForwardParams<T, Kv, Layout>& p, const Mask& mask, Accounting& acct) {
  using Kernel = DecodeKernel<T, HeadDim, TileConfig::isa>;
  using Acc = typename Kernel::Acc;
  constexpr index_t kMinBytes = index_t(256) << 10;
  const int dk = int(p.head_dim()), dv = int(p.value_dim());
  const index_t heads_kv = p.heads() / p.group;
  const index_t per_program = Kernel::heads_per_program(p.seqs.max_q_len(), p.group);
  const index_t chunks = WorkGrid::blocks_of(p.group, int(per_program));
  const index_t items = p.batch() * heads_kv * chunks;
  const index_t key_bytes = (dk + dv) * index_t(sizeof(kv_elem_t<Kv>));  // one key's K and V row
  const index_t splits = decode_splits(items, p.seqs.max_kv_len(), Kernel::BlockKV, kMinBytes / key_bytes);
  const index_t range =
      WorkGrid::blocks_of(WorkGrid::blocks_of(p.seqs.max_kv_len(), Kernel::BlockKV), int(splits)) * Kernel::BlockKV;

  const double bytes = double(items) * double(p.seqs.max_kv_len()) * double(key_bytes);
  const int requested = num_threads > 0 ? num_threads : default_num_threads();
  const int threads = int(std::max(1.0, std::min({double(requested), double(items * splits), bytes / kMinBytes})));

  const index_t rows_per_head = p.seqs.total_q();
  SplitKvPartials<Acc> partials(splits, p.heads() * rows_per_head, dv);
  run_workers(items * splits, threads, [&](WorkQueue& queue) {
    typename Kernel::Scratch scratch(dk, dv);
    for (index_t i; queue.next(i);) {
      const index_t split = i % splits, item = i / splits;
      const index_t chunk = item % chunks, bh_kv = item / chunks;
      const index_t b = bh_kv / heads_kv, h0 = (bh_kv % heads_kv) * p.group + chunk * per_program;
      const int heads = int(std::min(per_program, (bh_kv % heads_kv + 1) * p.group - h0));
      Kernel::run(p, mask, b, h0, heads, split * range, (split + 1) * range, scratch, partials, split,
                  [&](index_t h, index_t q) { return h * rows_per_head + p.seqs.q_row(b, q); }, acct);
    }
  });
  write_merged_rows<Kernel>(threads, p, mask, partials,
                            [&](const SequenceInfo& seq, index_t q) {
                              return seq.head * rows_per_head + p.seqs.q_row(seq.batch, q);
                            },
                            acct);
}

}  // namespace flashattn::cpu
