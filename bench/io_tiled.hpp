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

#include "flashattn/core/forward_validate.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/forward_kernel.hpp"
#include "flashattn/instrument/accounting.hpp"

namespace flashattn::bench::io {

namespace detail {
template <class T, class TileConfig, int HeadDim, class Mask, class Accounting>
void run_programs(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  using Kernel = cpu::ForwardKernel<T, TileConfig, HeadDim>;
  typename Kernel::Scratch scratch(int(p.head_dim()), int(p.value_dim()));
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h) {
      const SequenceInfo seq = sequence_info(p.seqs, b, h);
      const auto policy = policy_for(mask, seq);
      const index_t q_blocks = (seq.seq_q + Kernel::BlockQ - 1) / Kernel::BlockQ;
      for (index_t blk = q_blocks - 1; blk >= 0; --blk)  // the backend's order: last (heaviest) block first
        Kernel::run(p, policy, seq, blk * Kernel::BlockQ, scratch, acct);
    }
}

template <class T, class TileConfig, class Mask, class Accounting>
void run_head_dim(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  switch (p.head_dim()) {
    case 64:
      return run_programs<T, TileConfig, 64>(p, mask, acct);
    case 128:
      return run_programs<T, TileConfig, 128>(p, mask, acct);
    default:
      return run_programs<T, TileConfig, 0>(p, mask, acct);
  }
}
}  // namespace detail

// Like attention_forward(cpu::Context<TileConfig>{1}, q, k, v, o, options, lse, acct), never splitting the
// keys. Supports options.causal and the sliding window (BandMask), with the masks the public API builds
// from the options (core/masks.hpp's with_options_mask).
template <class TileConfig, class T, class Accounting = NoAccounting>
void tiled_forward_unsplit(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<T> o,
                           const AttentionOptions& options = {}, LseView lse = {}, Accounting&& acct = Accounting{}) {
  const ForwardParams<T> p = make_forward_params<T>(q, k, v, o, lse, options);
  cpu::validate_context(cpu::Context<TileConfig>{1}, p.head_dim());
  if (p.batch() == 0 || p.q.seq == 0) return;
  with_options_mask(options, [&](const auto& mask) { detail::run_head_dim<T, TileConfig>(p, mask, acct); });
}

}  // namespace flashattn::bench::io
