#pragma once
// Naive attention backward with Eigen GEMMs, for comparison: per (batch, head) it materialises the full
// (seq_q × seq_k) matrices S, P and dP/dS in main memory and runs the five products of the backward as
// whole-matrix GEMMs (S = Q·Kᵀ, dV += Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK += dSᵀ·Q). This is the memory-bound
// baseline the tiled backward is measured against; it takes the same arguments as attention_backward and
// validates them the same way, but recomputes the softmax from S itself (lse is validated, not read).
// Not part of the fast path: it allocates 2·seq_q·seq_k accumulator elements per call.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "flashattn/core/views.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/backward_validate.hpp"

namespace flashattn {

template <class T>
void naive_attention_backward(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                              detail::nondeduced<TensorView<const T>> v, detail::nondeduced<TensorView<const T>> o,
                              detail::nondeduced<TensorView<const T>> d_o, LseView lse, TensorView<T> dq,
                              detail::nondeduced<TensorView<T>> dk, detail::nondeduced<TensorView<T>> dv,
                              const AttentionOptions& options = {}) {
  using Acc = cpu::acc_t<T>;
  using Mat = Eigen::Matrix<Acc, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Vec = Eigen::Matrix<Acc, Eigen::Dynamic, 1>;
  const BackwardParams<T> p = make_backward_params<T>(q, k, v, o, d_o, lse, dq, dk, dv, options);
  const index_t sq = q.seq, sk = k.seq, d = q.dim;
  const BandMask band = BandMask::window(sq, sk, options.window_left, options.causal ? 0 : options.window_right);
  const bool masked = options.has_window();
  constexpr Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  const auto load = [d](const TensorView<const T>& x, index_t b, index_t h, Mat& m) {
    m.resize(x.seq, d);
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t c = 0; c < d; ++c) m(s, c) = Acc(x(b, s, h, c));
  };
  const auto store = [d](const TensorView<T>& x, index_t b, index_t h, const Mat& m) {
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t c = 0; c < d; ++c) x(b, s, h, c) = T(m(s, c));
  };
  Mat qm, km, vm, om, dom, s, dp, dqm, dkm, dvm;
  Vec delta;
  for (index_t b = 0; b < q.batch; ++b) {
    for (index_t hk = 0; hk < k.heads; ++hk) {
      load(k, b, hk, km);
      load(v, b, hk, vm);
      dkm.setZero(sk, d);
      dvm.setZero(sk, d);
      for (index_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        load(q, b, h, qm);
        load(o, b, h, om);
        load(d_o, b, h, dom);
        s.noalias() = qm * km.transpose();  // (sq, sk) in main memory
        s *= Acc(p.scale);
        for (index_t i = 0; i < sq; ++i) {  // P = softmax(S) in place
          Acc m = neg_inf;
          for (index_t j = 0; j < sk; ++j) {
            if (masked && !band.keep(i, j)) s(i, j) = neg_inf;
            m = std::max(m, s(i, j));
          }
          if (m == neg_inf) {
            s.row(i).setZero();
            continue;
          }
          Acc l = 0;
          for (index_t j = 0; j < sk; ++j) l += (s(i, j) = std::exp(s(i, j) - m));
          s.row(i) /= l;
        }
        dvm.noalias() += s.transpose() * dom;
        dp.noalias() = dom * vm.transpose();  // (sq, sk)
        delta = (dom.array() * om.array()).rowwise().sum();
        dp = (s.array() * (dp.colwise() - delta).array()).matrix();  // dS
        dqm.noalias() = dp * km;
        dqm *= Acc(p.scale);
        dkm.noalias() += dp.transpose() * qm;
        store(dq, b, h, dqm);
      }
      dkm *= Acc(p.scale);
      store(dk, b, hk, dkm);
      store(dv, b, hk, dvm);
    }
  }
}

}  // namespace flashattn
