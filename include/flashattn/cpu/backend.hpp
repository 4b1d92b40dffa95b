#pragma once
// The CPU backend: runs forward programs over the whole problem. Work items are (batch, head, query
// block); the heaviest blocks of a causal problem (the last ones) are handed out first so that the
// dynamic schedule ends evenly.

#include "flashattn/accounting.hpp"
#include "flashattn/cpu/forward_kernel.hpp"
#include "flashattn/cpu/parallel.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/params.hpp"

namespace flashattn::cpu {

template <class T, class TileConfig, int HeadDim, class Mask, class Accounting = NoAccounting>
void run_forward(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  using Kernel = ForwardKernel<T, TileConfig, HeadDim>;
  const index_t q_blocks = (p.q.seq + Kernel::BlockQ - 1) / Kernel::BlockQ;
  const index_t items = p.q.batch * p.q.heads * q_blocks;
  const int threads = p.num_threads > 0 ? p.num_threads : default_num_threads();

  run_workers(items, threads, [&](WorkQueue& queue) {
    typename Kernel::Scratch scratch(int(p.q.dim));
    for (index_t item; queue.next(item);) {
      const index_t q_block = q_blocks - 1 - item % q_blocks;
      const index_t bh = item / q_blocks;
      const index_t b = bh / p.q.heads, h = bh % p.q.heads;
      Kernel::run(p, mask_for_head(mask, b, h), b, h, q_block * Kernel::BlockQ, scratch, acct);
    }
  });
}

}  // namespace flashattn::cpu
