#pragma once
// The CPU backend: runs forward programs over the whole problem. Work items are (batch, head, query
// block); the heaviest blocks of a causal problem (the last ones) are handed out first so that the
// dynamic schedule ends evenly. When there are too few items to keep many cores busy (decoding, or one
// long sequence on few heads), the keys are split into ranges as well (split-KV, as FlashDecoding): each
// (range, block) item leaves an unnormalised partial result, and a second pass merges the partials of
// each row with the softmax's own rescaling.

#include <algorithm>
#include <cmath>
#include <limits>

#include "flashattn/accounting.hpp"
#include "flashattn/cpu/amx.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/forward_kernel.hpp"
#include "flashattn/cpu/parallel.hpp"
#include "flashattn/errors.hpp"
#include "flashattn/masks.hpp"
#include "flashattn/params.hpp"

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

// Threads worth starting: each must get at least ~4 MFLOP (tens of microseconds), or starting it costs
// more than it saves (small decode steps run on the calling thread). Results do not depend on it.
template <class T>
int worker_count(const ForwardParams<T>& p, int requested) {
  constexpr double kMinFlopsPerThread = 4e6;
  const double flops = 4.0 * double(p.q.batch) * double(p.q.heads) * double(p.q.seq) * double(p.k.seq) * double(p.q.dim);
  return int(std::max(1.0, std::min(double(requested), flops / kMinFlopsPerThread)));
}

template <class T, class TileConfig, int HeadDim, class Mask, class Accounting = NoAccounting>
void run_forward(const ForwardParams<T>& p, const Mask& mask, Accounting& acct) {
  if constexpr (TileConfig::isa == Isa::Amx && is_bf16<T>) {  // other types run AVX-512 packets
    if (!amx::usable())
      throw InvalidArgument("tiles: the instruction set is Isa::Amx, but this CPU or operating system does not "
                            "allow AMX tile instructions (use AutoTiles to pick the best usable path)");
  }
  using Kernel = ForwardKernel<T, TileConfig, HeadDim>;
  using Acc = typename Kernel::Acc;
  constexpr int BlockQ = Kernel::BlockQ, BlockKV = Kernel::BlockKV;
  const index_t q_blocks = (p.q.seq + BlockQ - 1) / BlockQ;
  const index_t items = p.q.batch * p.q.heads * q_blocks;
  const int d = int(p.q.dim);
  const int threads = worker_count(p, p.num_threads > 0 ? p.num_threads : default_num_threads());
  const index_t splits = kv_splits(items, p.k.seq, BlockKV);

  if (splits == 1) {
    run_workers(items, threads, [&](WorkQueue& queue) {
      typename Kernel::Scratch scratch(d);
      for (index_t item; queue.next(item);) {
        const index_t q_block = q_blocks - 1 - item % q_blocks;
        const index_t bh = item / q_blocks;
        const index_t b = bh / p.q.heads, h = bh % p.q.heads;
        Kernel::run(p, mask_for_head(mask, b, h), b, h, q_block * BlockQ, scratch, acct);
      }
    });
    return;
  }

  // Split-KV. Ranges are whole tiles; partials are indexed [split][batch][head][row].
  const index_t tiles = (p.k.seq + BlockKV - 1) / BlockKV;
  const index_t range = (tiles + splits - 1) / splits * BlockKV;
  const index_t rows_total = p.q.batch * p.q.heads * p.q.seq;
  AlignedBuffer<Acc> part_o(std::size_t(splits * rows_total * d));
  AlignedBuffer<Acc> part_m(std::size_t(splits * rows_total)), part_l(std::size_t(splits * rows_total));

  run_workers(items * splits, threads, [&](WorkQueue& queue) {
    typename Kernel::Scratch scratch(d);
    for (index_t item; queue.next(item);) {
      const index_t split = item % splits;
      const index_t block_item = item / splits;
      const index_t q_block = q_blocks - 1 - block_item % q_blocks;
      const index_t bh = block_item / q_blocks;
      const index_t b = bh / p.q.heads, h = bh % p.q.heads;
      const index_t q0 = q_block * BlockQ;
      const index_t row0 = split * rows_total + bh * p.q.seq + q0;
      Kernel::run_partial(p, mask_for_head(mask, b, h), b, h, q0, split * range, (split + 1) * range, scratch,
                          part_o.data() + row0 * d, part_m.data() + row0, part_l.data() + row0, acct);
      acct.write(Traffic::Partial, std::min<index_t>(BlockQ, p.q.seq - q0) * (d + 2) * index_t(sizeof(Acc)));
    }
  });

  // Merge: O = Σ_s 2^(m_s − M)·O_s / Σ_s 2^(m_s − M)·ℓ_s with M = max_s m_s; ranges that kept no key have
  // ℓ_s = 0 and weigh 0, and a row with no key at all is 0 with LSE −inf. (ℓ_s, not m_s, tells: the running
  // max can drop a NaN score that the running sum keeps, so m_s = −inf with ℓ_s = NaN is a NaN row.)
  constexpr Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  constexpr Acc ln2 = Acc(0.6931471805599453094);
  run_workers(p.q.batch * p.q.heads, threads, [&](WorkQueue& queue) {
    AlignedBuffer<Acc> o{std::size_t(d)};
    for (index_t bh; queue.next(bh);) {
      const index_t b = bh / p.q.heads, h = bh % p.q.heads;
      for (index_t i = 0; i < p.q.seq; ++i) {
        const index_t row = bh * p.q.seq + i;
        Acc m = neg_inf;
        bool any = false;
        for (index_t s = 0; s < splits; ++s) {
          const Acc ms = part_m.data()[s * rows_total + row];
          if (part_l.data()[s * rows_total + row] == Acc(0)) continue;
          any = true;
          if (ms > m || ms != ms) m = ms;  // NaN wins, so that it reaches the output
        }
        Acc l = 0;
        T* out = p.o.row(b, i, h);
        std::fill(o.data(), o.data() + d, Acc(0));
        if (any) {
          for (index_t s = 0; s < splits; ++s) {
            const Acc ms = part_m.data()[s * rows_total + row];
            if (part_l.data()[s * rows_total + row] == Acc(0)) continue;
            const Acc w = std::exp2(ms - m);
            l += w * part_l.data()[s * rows_total + row];
            const Acc* os = part_o.data() + (s * rows_total + row) * d;
            for (int c = 0; c < d; ++c) o.data()[c] += w * os[c];
          }
        }
        const Acc inv_l = l == Acc(0) ? Acc(0) : Acc(1) / l;
        for (int c = 0; c < d; ++c) out[c * p.o.stride_dim] = inv_l == Acc(0) ? T(0) : T(o.data()[c] * inv_l);
        if (!p.lse.empty()) p.lse(b, h, i) = l == Acc(0) ? -std::numeric_limits<float>::infinity() : float((m + std::log2(l)) * ln2);
      }
    }
  });
  acct.read(Traffic::Partial, splits * rows_total * (d + 2) * index_t(sizeof(Acc)));
  acct.write(Traffic::O, rows_total * d * index_t(sizeof(T)));
  if (!p.lse.empty()) acct.write(Traffic::Lse, rows_total * index_t(sizeof(float)));
}

}  // namespace flashattn::cpu
