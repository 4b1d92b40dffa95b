#pragma once
// The tiled forward pass in the schedule the IO model describes: one worker runs the forward programs
// (cpu::ForwardKernel::run) of every query block of every head, each holding its Q block and O accumulator
// while it streams all of K and V. This is exactly what cpu::run_forward does whenever it does not split
// the keys (batch·heads·query-blocks >= 64, e.g. any single head at N >= 4096 with the default BlockQ = 64).
//
// Why the IO benchmarks call it instead of attention_forward: they run one head with large BlockQ (derived
// from M), so there are few query blocks, and the backend then splits the keys into ranges (split-KV) to
// find parallel work. That schedule reads each Q block once per range and writes and re-reads unnormalised
// partial outputs; it trades traffic for parallelism, which is not what the IO law is about. The split-KV
// traffic is measured separately ("api" in bench/io_sweep.py) and discussed in docs/io.md.

#include "flashattn/accounting.hpp"
#include "flashattn/cpu/forward_kernel.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/options.hpp"
#include "flashattn/validate.hpp"
#include "flashattn/views.hpp"

namespace flashattn::bench::io {

namespace detail {
template <class T, class TileConfig, int HeadDim, class Mask, class Accounting>
void run_programs(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  using Kernel = cpu::ForwardKernel<T, TileConfig, HeadDim>;
  typename Kernel::Scratch scratch(int(p.q.dim));
  const index_t q_blocks = (p.q.seq + Kernel::BlockQ - 1) / Kernel::BlockQ;
  for (index_t b = 0; b < p.q.batch; ++b)
    for (index_t h = 0; h < p.q.heads; ++h)
      for (index_t blk = q_blocks - 1; blk >= 0; --blk)  // the backend's order: last (heaviest) block first
        Kernel::run(p, mask_for_head(mask, b, h), b, h, blk * Kernel::BlockQ, scratch, acct);
}

template <class T, class TileConfig, class Mask, class Accounting>
void run_head_dim(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  switch (p.q.dim) {
    case 64:
      return run_programs<T, TileConfig, 64>(p, mask, acct);
    case 128:
      return run_programs<T, TileConfig, 128>(p, mask, acct);
    default:
      return run_programs<T, TileConfig, 0>(p, mask, acct);
  }
}
}  // namespace detail

// Like attention_forward<TileConfig>(q, k, v, o, options, lse, acct) on one thread, never splitting the keys.
// Supports options.causal and the sliding window (BandMask), as the public API does.
template <class TileConfig, class T, class Accounting = NoAccounting>
void tiled_forward_unsplit(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<T> o,
                           const AttentionOptions& options = {}, LseView lse = {}, Accounting&& acct = Accounting{}) {
  const ForwardParams<T> p = make_forward_params<T>(q, k, v, o, lse, options);
  if (p.q.batch == 0 || p.q.seq == 0) return;
  if (options.has_window())
    detail::run_head_dim<T, TileConfig>(
        p, BandMask::window(p.q.seq, p.k.seq, options.window_left, options.causal ? 0 : options.window_right), acct);
  else
    detail::run_head_dim<T, TileConfig>(p, NoMask{p.k.seq}, acct);
}

}  // namespace flashattn::bench::io
