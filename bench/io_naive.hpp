#pragma once
// Standard (non-flash) attention as the IO model describes it: Algorithm 0 of the FlashAttention paper,
// blocked for a fast memory of M bytes. Three passes, S and P in main memory:
//
//   1. for each query block (BlockQ rows, held) and key tile (BlockKV rows, streamed): S_blk = scale·Q_blk·K_tileᵀ,
//      written to the (seq_q × seq_k) matrix S;
//   2. row by row: P = softmax(S), written to a second (seq_q × seq_k) matrix;
//   3. for each query block (its O accumulator held) and key tile: O_blk += P_blk·V_tile; O written once.
//
// The blocks are the tiled kernel's own (io::select_tiles(M, d)), so every block a pass holds fits in M and
// the only difference from the tiled schedule is S and P going through main memory. The traffic is then
// known exactly: io::naive_blocked_bytes = io::tiled_bytes + 4·seq_q·seq_k·e (S written, read; P written,
// read), which is what the accounting policy sees and what cachegrind should measure.
//
// Why not naive_attention_forward (include/flashattn/reference/naive_forward.hpp)? It is the same algorithm
// with whole-matrix Eigen GEMMs, which block for a hard-coded 1.5 MB L2 (Eigen 3.4's
// computeProductBlockingSizes ignores setCpuCacheSizes for that), so at a simulated M below that its packed
// panels are re-streamed and the traffic depends on Eigen's internals, not on the algorithm. Both are
// measured; docs/io.md compares them.
//
// fp32 storage, no masks, no LSE: what the IO sweep runs.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>

#include "flashattn/core/forward_validate.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/instrument/accounting.hpp"

namespace flashattn::bench::io {

template <class Accounting = NoAccounting>
void naive_forward_blocked(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                           TensorView<float> o, const AttentionOptions& options, index_t block_q, index_t block_kv,
                           Accounting&& acct = Accounting{}) {
  if (options.has_window()) throw std::invalid_argument("naive_forward_blocked: masks are not supported");
  if (block_q <= 0 || block_kv <= 0) throw std::invalid_argument("naive_forward_blocked: blocks must be positive");
  const ForwardParams<float> p = make_forward_params<float>(q, k, v, o, LseView{}, options);
  if (q.stride_dim != 1 || k.stride_dim != 1 || v.stride_dim != 1 || o.stride_dim != 1)
    throw std::invalid_argument("naive_forward_blocked: rows must be contiguous (stride_dim 1)");
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Map = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
  using ConstMap = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  const index_t sq = q.seq, sk = k.seq, d = q.dim, e = index_t(sizeof(float));
  // Rows of S and P are `ld` floats apart: whole lines plus one. With ld = seq_k (a power of two in the sweep)
  // the rows of a (BlockQ × BlockKV) block fall into a few cache sets and evict each other (cachegrind: 1.56x
  // the counted traffic at N = 2048, d = 64, M = 256 KiB); an odd number of lines spreads them over all sets.
  const index_t ld = (sk + 15) / 16 * 16 + 16;
  // Uninitialised on purpose: zero-filling them would be one more pass over each N×N matrix.
  const std::unique_ptr<float[]> s_buf(new float[std::size_t(sq * ld)]), p_buf(new float[std::size_t(sq * ld)]);
  const auto rows = [](const auto* base, index_t n, index_t cols, index_t stride) {
    return ConstMap(base, n, cols, Eigen::OuterStride<>(stride));
  };
  Mat o_blk(block_q, d);
  for (index_t b = 0; b < q.batch; ++b) {
    for (index_t h = 0; h < q.heads; ++h) {
      const float* qh = &q(b, 0, h, 0);
      const float* kh = &k(b, 0, h / p.group, 0);
      const float* vh = &v(b, 0, h / p.group, 0);
      // Pass 1: S = scale·Q·Kᵀ.
      for (index_t i0 = 0; i0 < sq; i0 += block_q) {
        const index_t bq = std::min(block_q, sq - i0);
        const ConstMap q_blk = rows(qh + i0 * q.stride_seq, bq, d, q.stride_seq);
        acct.read(Traffic::Q, bq * d * e);
        for (index_t j0 = 0; j0 < sk; j0 += block_kv) {
          const index_t bk = std::min(block_kv, sk - j0);
          Map s_blk(s_buf.get() + i0 * ld + j0, bq, bk, Eigen::OuterStride<>(ld));
          s_blk.noalias() = (p.scale * q_blk) * rows(kh + j0 * k.stride_seq, bk, d, k.stride_seq).transpose();
          acct.read(Traffic::K, bk * d * e);
          acct.write(Traffic::S, bq * bk * e);
        }
      }
      // Pass 2: P = softmax(S), row by row (one row of S and of P is in fast memory at a time).
      for (index_t i = 0; i < sq; ++i) {
        const float* s_row = s_buf.get() + i * ld;
        float* p_row = p_buf.get() + i * ld;
        const float m = *std::max_element(s_row, s_row + sk);
        float l = 0;
        for (index_t j = 0; j < sk; ++j) l += (p_row[j] = std::exp(s_row[j] - m));
        const float inv_l = 1.0f / l;
        for (index_t j = 0; j < sk; ++j) p_row[j] *= inv_l;
      }
      acct.read(Traffic::S, sq * sk * e);
      acct.write(Traffic::P, sq * sk * e);
      // Pass 3: O = P·V, the O block held across the key tiles.
      for (index_t i0 = 0; i0 < sq; i0 += block_q) {
        const index_t bq = std::min(block_q, sq - i0);
        auto acc = o_blk.topRows(bq);
        acc.setZero();
        for (index_t j0 = 0; j0 < sk; j0 += block_kv) {
          const index_t bk = std::min(block_kv, sk - j0);
          acc.noalias() += rows(p_buf.get() + i0 * ld + j0, bq, bk, ld) * rows(vh + j0 * v.stride_seq, bk, d, v.stride_seq);
          acct.read(Traffic::P, bq * bk * e);
          acct.read(Traffic::V, bk * d * e);
        }
        Map(&o(b, i0, h, 0), bq, d, Eigen::OuterStride<>(o.stride_seq)) = acc;
        acct.write(Traffic::O, bq * d * e);
      }
    }
  }
}

}  // namespace flashattn::bench::io
