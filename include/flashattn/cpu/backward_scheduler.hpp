#pragma once
// The CPU backward's scheduler: runs the two programs of backward_kernel.hpp over the whole problem.
//
//   pass 1, items (batch, query head, query block): dQ, and each row's D and −LSE into `stats` (and dS into
//           d_bias, where asked: then items (bias batch, bias head, query block));
//   pass 2, items (batch, KV head, key block):      dK and dV, reading `stats`.
//
// Each gradient element is written by one item, accumulated in an order fixed by the item alone, so the
// bits do not depend on the thread count or on which thread takes which item. Pass 2 starts when pass 1
// has finished (run_workers joins), which is the only ordering the statistics need.

#include <algorithm>
#include <cmath>
#include <limits>

#include "flashattn/core/backward_params.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/backward_kernel.hpp"
#include "flashattn/cpu/parallel.hpp"
#include "flashattn/cpu/work_items.hpp"

namespace flashattn::cpu {

// dLoss/d sink_h = −Σ_b Σ_i exp(sink_h − LSE_bhi)·(D_bhi − dLSE_bhi): a sink attends no value, so it reaches
// the loss through every row's normaliser only (O_i shrinks by its probability, the LSE grows by it). Read
// from the row statistics of pass 1 (whose D already holds −dLSE, and whose LSE the double path refined);
// summed serially in a fixed order, so the result has the same bits for any thread count.
template <class T, class Layout, class Mask, class Acc>
void sink_gradients(const BackwardParams<T, Layout>& p, const Mask& mask, const RowStats<Acc>& stats) {
  for (index_t h = 0; h < p.q.heads; ++h) {
    double sum = 0;
    for (index_t b = 0; b < p.batch(); ++b) {
      const SequenceInfo seq = sequence_info(p.seqs, b, h);
      const auto policy = policy_for(mask, seq);
      if constexpr (has_sink_v<decltype(policy)>) {
        const double sink = double(policy.sink_logit());
        const index_t row0 = stats.offset(h, p.seqs.q_row(b, 0));
        for (index_t i = 0; i < seq.seq_q; ++i) {
          const Acc neg_lse = stats.neg_lse[row0 + i];
          if (neg_lse == -std::numeric_limits<Acc>::infinity()) continue;
          sum += std::exp(sink + double(neg_lse)) * double(stats.delta[row0 + i]);
        }
      }
    }
    p.d_sinks[h] = float(-sum);
  }
}

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
  if (p.d_bias.data == nullptr) {
    const WorkGrid dq_grid{p.batch(), p.q.heads, WorkGrid::blocks_of(p.seqs.max_q_len(), Kernel::BlockQ), true};
    run_workers(dq_grid.size(), threads, [&](WorkQueue& queue) {
      typename Kernel::DqScratch scratch(int(p.q.dim), int(p.v.dim));
      for (index_t i; queue.next(i);) {
        const WorkItem item = dq_grid[i];
        const SequenceInfo seq = sequence_info(p.seqs, item.batch, item.head);
        if (item.block * Kernel::BlockQ >= seq.seq_q) continue;
        Kernel::run_dq(p, policy_for(mask, seq), seq, item.block * Kernel::BlockQ, scratch, stats);
      }
    });
  } else {
    // With d_bias (a bias on a dense call: every entry has the bias's seq_q x seq_k): items (bias batch, bias
    // head, query block), each zeroing its rows of the d_bias plane and then adding into them the dS of
    // every (batch entry, head) that the plane serves, entries then heads in order. A broadcast extent is
    // summed in a fixed order, so the bits do not depend on the thread count; dQ and the statistics are
    // those of the other grid.
    const BiasGrad& g = p.d_bias;
    const index_t seq_q = p.seqs.max_q_len(), seq_k = p.seqs.max_kv_len();
    const WorkGrid grid{g.batch, g.heads, WorkGrid::blocks_of(seq_q, Kernel::BlockQ), true};
    run_workers(grid.size(), threads, [&](WorkQueue& queue) {
      typename Kernel::DqScratch scratch(int(p.q.dim), int(p.v.dim));
      for (index_t i; queue.next(i);) {
        const WorkItem item = grid[i];
        const index_t q0 = item.block * Kernel::BlockQ;
        if (q0 >= seq_q) continue;
        float* rows = g.data + ((item.batch * g.heads + item.head) * seq_q + q0) * seq_k;
        std::fill(rows, rows + std::min(index_t(Kernel::BlockQ), seq_q - q0) * seq_k, 0.0f);
        const index_t b0 = g.batch == 1 ? 0 : item.batch, b1 = g.batch == 1 ? p.batch() : item.batch + 1;
        const index_t h0 = g.heads == 1 ? 0 : item.head, h1 = g.heads == 1 ? p.q.heads : item.head + 1;
        for (index_t b = b0; b < b1; ++b)
          for (index_t h = h0; h < h1; ++h) {
            const SequenceInfo seq = sequence_info(p.seqs, b, h);
            Kernel::run_dq(p, policy_for(mask, seq), seq, q0, scratch, stats, rows);
          }
      }
    });
  }

  if (p.d_sinks != nullptr) sink_gradients(p, mask, stats);

  // Pass 2: key blocks in ascending order (under a causal mask the first ones see the most queries).
  const WorkGrid dkv_grid{p.batch(), p.k.heads, WorkGrid::blocks_of(p.seqs.max_kv_len(), Kernel::BlockKV), false};
  run_workers(dkv_grid.size(), threads, [&](WorkQueue& queue) {
    typename Kernel::DkvScratch scratch(int(p.q.dim), int(p.v.dim));
    for (index_t i; queue.next(i);) {
      const WorkItem item = dkv_grid[i];
      if (item.block * Kernel::BlockKV >= p.seqs.kv_len(item.batch)) continue;
      Kernel::run_dkv(p, mask, item.batch, item.head, item.block * Kernel::BlockKV, scratch, stats);
    }
  });
}

}  // namespace flashattn::cpu
