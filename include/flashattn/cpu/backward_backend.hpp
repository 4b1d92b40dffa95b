#pragma once
// The CPU backend of the backward: runs the two programs of backward_kernel.hpp over the whole problem.
//
//   pass 1, items (batch, query head, query block): dQ, and each row's D and −LSE into `stats`;
//   pass 2, items (batch, KV head, key block):      dK and dV, reading `stats`.
//
// Each gradient element is written by one item, accumulated in an order fixed by the item alone, so the
// bits do not depend on the thread count or on which thread takes which item. Pass 2 starts when pass 1
// has finished (run_workers joins), which is the only ordering the statistics need.

#include "flashattn/backward_params.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/backward_kernel.hpp"
#include "flashattn/cpu/parallel.hpp"
#include "flashattn/masks.hpp"

namespace flashattn::cpu {

template <class T, class TileConfig, int HeadDim, class Mask>
void run_backward(const BackwardParams<T>& p, const Mask& mask) {
  using Kernel = BackwardKernel<T, TileConfig, HeadDim>;
  using Acc = typename Kernel::Acc;
  const int threads = p.num_threads > 0 ? p.num_threads : default_num_threads();

  // The only buffer that grows with the problem: two numbers per query row, O(batch·heads·seq_q).
  const index_t stat_rows = p.q.batch * p.q.heads * p.q.seq;
  AlignedBuffer<Acc> stat_buffer(2 * std::size_t(stat_rows));
  const RowStats<Acc> stats{stat_buffer.data(), stat_buffer.data() + stat_rows, p.q.heads, p.q.seq};

  // Pass 1. The heaviest query blocks of a causal problem (the last ones) go first, as in the forward.
  const index_t q_blocks = (p.q.seq + Kernel::BlockQ - 1) / Kernel::BlockQ;
  run_workers(p.q.batch * p.q.heads * q_blocks, threads, [&](WorkQueue& queue) {
    typename Kernel::DqScratch scratch(int(p.q.dim));
    for (index_t item; queue.next(item);) {
      const index_t q_block = q_blocks - 1 - item % q_blocks;
      const index_t bh = item / q_blocks;
      const index_t b = bh / p.q.heads, h = bh % p.q.heads;
      Kernel::run_dq(p, mask_for_head(mask, b, h), b, h, q_block * Kernel::BlockQ, scratch, stats);
    }
  });

  // Pass 2. Key blocks in ascending order: under a causal mask the first ones see the most queries.
  const index_t kv_blocks = (p.k.seq + Kernel::BlockKV - 1) / Kernel::BlockKV;
  run_workers(p.k.batch * p.k.heads * kv_blocks, threads, [&](WorkQueue& queue) {
    typename Kernel::DkvScratch scratch(int(p.q.dim));
    for (index_t item; queue.next(item);) {
      const index_t kv_block = item % kv_blocks;
      const index_t bh = item / kv_blocks;
      const index_t b = bh / p.k.heads, h_kv = bh % p.k.heads;
      Kernel::run_dkv(p, mask, b, h_kv, kv_block * Kernel::BlockKV, scratch, stats);
    }
  });
}

}  // namespace flashattn::cpu
