#pragma once
// Naive attention with Eigen GEMMs, for comparison: per (batch, head) it materialises the full
// (seq_q × seq_k) score matrix S = scale·Q·Kᵀ in main memory, turns it into P = softmax(S) in place, and
// computes O = P·V. This is the memory-bound baseline that the tiled kernels are measured against; it
// takes the same views, options and accounting policies. Not part of the fast path: it allocates
// seq_q·seq_k accumulator elements.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "flashattn/instrument/accounting.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/forward_validate.hpp"

namespace flashattn {

template <class T, class Accounting = NoAccounting>
void naive_attention_forward(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                             detail::nondeduced<TensorView<const T>> v, TensorView<T> o,
                             const AttentionOptions& options = {}, LseView lse = {},
                             Accounting&& acct = Accounting{}) {
  using Acc = cpu::acc_t<T>;
  using Mat = Eigen::Matrix<Acc, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const ForwardParams<T> p = make_forward_params<T>(q, k, v, o, lse, options);
  const index_t sq = q.seq, sk = k.seq, d = q.dim, dv = v.dim;  // dv: V's and O's head dim
  const BandMask band = BandMask::window(sq, sk, options.window_left,
                                         options.causal ? 0 : options.window_right);
  const bool masked = options.has_window();
  const auto load = [](const TensorView<const T>& x, index_t b, index_t h, Mat& m) {
    m.resize(x.seq, x.dim);
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t c = 0; c < x.dim; ++c) m(s, c) = Acc(x(b, s, h, c));
  };
  const index_t elem = index_t(sizeof(T)), acc_elem = index_t(sizeof(Acc));
  Mat qm, km, vm, s, om;
  for (index_t b = 0; b < q.batch; ++b) {
    for (index_t h = 0; h < q.heads; ++h) {
      load(q, b, h, qm);
      load(k, b, h / p.group, km);
      load(v, b, h / p.group, vm);
      // (sq, sk) in main memory. The scale rides in the GEMM's alpha: a separate `s *= scale` would be one
      // more full pass over S (measured with cachegrind, docs/io.md).
      s.noalias() = (Acc(p.scale) * qm) * km.transpose();
      acct.read(Traffic::Q, sq * d * elem);
      acct.read(Traffic::K, sk * d * elem);
      acct.write(Traffic::S, sq * sk * acc_elem);
      // Softmax in place, row by row: one read of S, one write of P.
      for (index_t i = 0; i < sq; ++i) {
        Acc m = -std::numeric_limits<Acc>::infinity();
        for (index_t j = 0; j < sk; ++j) {
          if (masked && !band.keep(i, j)) s(i, j) = -std::numeric_limits<Acc>::infinity();
          m = std::max(m, s(i, j));
        }
        const Acc shift = m == -std::numeric_limits<Acc>::infinity() ? Acc(0) : m;
        Acc l = 0;
        for (index_t j = 0; j < sk; ++j) l += (s(i, j) = std::exp(s(i, j) - shift));
        const Acc inv_l = l == Acc(0) ? Acc(0) : Acc(1) / l;
        s.row(i) *= inv_l;
        if (!lse.empty()) lse(b, h, i) = l == Acc(0) ? -std::numeric_limits<float>::infinity() : float(shift + std::log(l));
      }
      acct.read(Traffic::S, sq * sk * acc_elem);
      acct.write(Traffic::P, sq * sk * acc_elem);
      om.noalias() = s * vm;
      acct.read(Traffic::P, sq * sk * acc_elem);
      acct.read(Traffic::V, sk * dv * elem);
      for (index_t i = 0; i < sq; ++i)
        for (index_t c = 0; c < dv; ++c) o(b, i, h, c) = T(om(i, c));
      acct.write(Traffic::O, sq * dv * elem);
      if (!lse.empty()) acct.write(Traffic::Lse, sq * index_t(sizeof(float)));
    }
  }
}

}  // namespace flashattn
