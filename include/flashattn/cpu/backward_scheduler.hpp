#pragma once
// The CPU backward's scheduler: runs the two programs of backward_kernel.hpp over the whole problem.
//
//   pass 1, items (batch, query head, query block): dQ, and each row's D and −LSE into `stats`;
//   pass 2, items (batch, KV head, key block):      dK and dV, reading `stats`.
//
// Each gradient element is written by one item, accumulated in an order fixed by the item alone, so the
// bits do not depend on the thread count or on which thread takes which item. Pass 2 starts when pass 1
// has finished (run_workers joins), which is the only ordering the statistics need.

#include "flashattn/core/backward_params.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/backward_kernel.hpp"
#include "flashattn/cpu/parallel.hpp"
#include "flashattn/cpu/work_items.hpp"

namespace flashattn::cpu {

// num_threads: the context's (0: the default).
template <class T, class TileConfig, int HeadDim, class Layout, class Mask>
void run_backward(int num_threads, const BackwardParams<T, Layout>& p, const Mask& mask) {
  using Kernel = BackwardKernel<T, TileConfig, HeadDim>;
  using Acc = typename Kernel::Acc;
  const int threads = num_threads > 0 ? num_threads : default_num_threads();

  // The only buffer that grows with the problem: two numbers per query row, O(batch·heads·seq_q).
  const index_t rows_per_head = p.seqs.total_q();
  const index_t stat_rows = p.q.heads * rows_per_head;
  AlignedBuffer<Acc> stat_buffer(2 * std::size_t(stat_rows));
  const RowStats<Acc> stats{stat_buffer.data(), stat_buffer.data() + stat_rows, rows_per_head};

  // Pass 1: the heaviest query blocks of a causal problem (the last ones) first, as in the forward.
  const WorkGrid dq_grid{p.batch(), p.q.heads, WorkGrid::blocks_of(p.seqs.max_q_len(), Kernel::BlockQ), true};
  run_workers(dq_grid.size(), threads, [&](WorkQueue& queue) {
    typename Kernel::DqScratch scratch(int(p.q.dim));
    for (index_t i; queue.next(i);) {
      const WorkItem item = dq_grid[i];
      const SequenceInfo seq = sequence_info(p.seqs, item.batch, item.head);
      if (item.block * Kernel::BlockQ >= seq.seq_q) continue;
      Kernel::run_dq(p, policy_for(mask, seq), seq, item.block * Kernel::BlockQ, scratch, stats);
    }
  });

  // Pass 2: key blocks in ascending order (under a causal mask the first ones see the most queries).
  const WorkGrid dkv_grid{p.batch(), p.k.heads, WorkGrid::blocks_of(p.seqs.max_kv_len(), Kernel::BlockKV), false};
  run_workers(dkv_grid.size(), threads, [&](WorkQueue& queue) {
    typename Kernel::DkvScratch scratch(int(p.q.dim));
    for (index_t i; queue.next(i);) {
      const WorkItem item = dkv_grid[i];
      if (item.block * Kernel::BlockKV >= p.seqs.kv_len(item.batch)) continue;
      Kernel::run_dkv(p, mask, item.batch, item.head, item.block * Kernel::BlockKV, scratch, stats);
    }
  });
}

}  // namespace flashattn::cpu
