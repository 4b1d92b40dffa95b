#pragma once
// The backward's test oracle: the analytic gradient of attention computed the obvious way, one query row
// at a time with every score of the row materialised, in a chosen accumulator type:
//
//   s_j = scale·q·k_j,  s'_j = score(i, j, s_j),  P = softmax(s', plus the sink's logit if any),  O = P·V
//   dP_j = dO·v_j,  D = dO·O − dLSE,  dS_j = P_j (dP_j − D) · score_grad(i, j, s_j)
//   dq += scale Σ_j dS_j k_j,  dk_j += scale dS_j q,  dv_j += P_j dO,  dsink_h −= P_sink D
//
// reference_backward<double> is the fp64 reference of the tolerance rule; reference_backward<acc_t<T>, T>
// rounds scores, probabilities, O, dP, dS and the gradients to T between steps, as a naive implementation
// storing T would, and gives the "naive in the same precision" error that bounds the tiled kernel's.
// Independent of the library's kernels: only views and mask policies are shared.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "flashattn/core/masks.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"
#include "reference.hpp"

namespace flashattn::testing {

struct ReferenceGrads {
  std::vector<double> dq;  // (batch, seq_q, heads_q, dim), contiguous
  std::vector<double> dk;  // (batch, seq_k, heads_kv, dim), contiguous
  std::vector<double> dv;  // (batch, seq_k, heads_kv, v's dim), contiguous
  std::vector<double> d_sinks;  // (heads_q): dLoss/d sink logit, summed over the batch (0 without sinks)
};

template <class M, class = void>
struct reference_has_score_grad : std::false_type {};
template <class M>
struct reference_has_score_grad<M, std::void_t<decltype(std::declval<const M&>().score_grad(index_t{}, index_t{}, 0.0))>>
    : std::true_type {};

// With `rows` (reference.hpp), only those query rows of every head contribute: their dQ rows are whole,
// and so are dK and dV of the keys that no other row keeps (under a causal mask, the keys at or after
// rows.begin when rows end at the last row). d_lse: dLoss/dLSE, (batch, heads_q, seq_q) contiguous, or null.
// d_scores: where to put every dS_ij = dLoss/d score_ij (natural units, 0 where masked; what a bias over a
// mask receives as its gradient), (batch, heads_q, seq_q, seq_k) contiguous, or null.
template <class Calc, class Store = Calc, class T, class Mask>
ReferenceGrads reference_backward(const TensorView<const T>& q, const TensorView<const T>& k,
                                  const TensorView<const T>& v, const TensorView<const T>& d_o, double scale,
                                  const Mask& mask, RowRange rows = {}, const double* d_lse = nullptr,
                                  std::vector<double>* d_scores = nullptr) {
  // D: the head dim of q and k; Dv: of v, o and d_o.
  const index_t B = q.batch, Sq = q.seq, Sk = k.seq, H = q.heads, Hkv = k.heads, D = q.dim, Dv = v.dim;
  const index_t group = H / Hkv;
  const auto r = [](Calc x) { return round_to<Store>(x); };
  std::vector<Calc> dq(std::size_t(B * Sq * H * D), Calc(0)), dk(std::size_t(B * Sk * Hkv * D), Calc(0)),
      dv(std::size_t(B * Sk * Hkv * Dv), Calc(0)), d_sinks(std::size_t(H), Calc(0));
  const auto sk = static_cast<std::size_t>(Sk);
  std::vector<Calc> s(sk), g(sk), p(sk), o(static_cast<std::size_t>(Dv));
  std::vector<bool> kept(sk);
  const auto at_q = [&](index_t b, index_t i, index_t h) { return std::size_t(((b * Sq + i) * H + h) * D); };
  const auto at_k = [&](index_t b, index_t j, index_t h) { return std::size_t(((b * Sk + j) * Hkv + h) * D); };
  const auto at_v = [&](index_t b, index_t j, index_t h) { return std::size_t(((b * Sk + j) * Hkv + h) * Dv); };
  if (d_scores != nullptr) d_scores->assign(std::size_t(B * H * Sq * Sk), 0.0);

  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      const auto head_mask = policy_for(mask, SequenceInfo{b, h, Sq, Sk});
      using HeadMask = std::remove_cv_t<decltype(head_mask)>;
      const index_t hk = h / group;
      Calc sink = -std::numeric_limits<Calc>::infinity();
      if constexpr (has_sink_v<HeadMask>) sink = Calc(head_mask.sink_logit());
      for (index_t i = rows.begin; i < rows.end_in(Sq); ++i) {
        const Calc dlse = d_lse != nullptr ? Calc(d_lse[std::size_t((b * H + h) * Sq + i)]) : Calc(0);
        Calc m = -std::numeric_limits<Calc>::infinity();
        for (index_t j = 0; j < Sk; ++j) {
          const std::size_t jj = std::size_t(j);
          kept[jj] = head_mask.keep(i, j);
          g[jj] = Calc(1);
          if (!kept[jj]) continue;
          Calc dot = 0;
          for (index_t c = 0; c < D; ++c) dot += Calc(q(b, i, h, c)) * Calc(k(b, j, hk, c));
          Calc x = r(dot) * Calc(scale);
          if constexpr (modifies_scores_v<HeadMask>) {
            static_assert(reference_has_score_grad<HeadMask>::value, "score-changing policies need score_grad");
            g[jj] = Calc(head_mask.score_grad(i, j, x));
            x = Calc(head_mask.score(i, j, x));
          }
          s[jj] = x;
          m = std::max(m, x);
        }
        if (m == -std::numeric_limits<Calc>::infinity()) {
          // No key kept: every gradient term is 0, except that LSE = sink, so dsink gets dLSE.
          if (sink != -std::numeric_limits<Calc>::infinity()) d_sinks[std::size_t(h)] += dlse;
          continue;
        }
        m = std::max(m, sink);
        Calc l = std::exp(sink - m);  // 0 without a sink
        for (index_t j = 0; j < Sk; ++j) {
          const std::size_t jj = std::size_t(j);
          p[jj] = kept[jj] ? std::exp(s[jj] - m) : Calc(0);
          l += p[jj];
        }
        for (Calc& pj : p) pj = r(pj / l);
        const Calc p_sink = std::exp(sink - m) / l;
        std::fill(o.begin(), o.end(), Calc(0));
        for (index_t j = 0; j < Sk; ++j)
          for (index_t c = 0; c < Dv; ++c) o[std::size_t(c)] += p[std::size_t(j)] * Calc(v(b, j, hk, c));
        Calc delta = 0;
        for (index_t c = 0; c < Dv; ++c) delta += Calc(d_o(b, i, h, c)) * r(o[std::size_t(c)]);
        delta -= dlse;
        d_sinks[std::size_t(h)] -= p_sink * delta;
        for (index_t j = 0; j < Sk; ++j) {
          const std::size_t jj = std::size_t(j);
          if (!kept[jj]) continue;
          Calc dp = 0;
          for (index_t c = 0; c < Dv; ++c) dp += Calc(d_o(b, i, h, c)) * Calc(v(b, j, hk, c));
          const Calc ds = r(p[jj] * (r(dp) - delta) * g[jj]);
          if (d_scores != nullptr) (*d_scores)[std::size_t(((b * H + h) * Sq + i) * Sk + j)] = double(ds);
          for (index_t c = 0; c < D; ++c) {
            dq[at_q(b, i, h) + std::size_t(c)] += Calc(scale) * ds * Calc(k(b, j, hk, c));
            dk[at_k(b, j, hk) + std::size_t(c)] += Calc(scale) * ds * Calc(q(b, i, h, c));
          }
          for (index_t c = 0; c < Dv; ++c) dv[at_v(b, j, hk) + std::size_t(c)] += p[jj] * Calc(d_o(b, i, h, c));
        }
      }
    }
  }
  ReferenceGrads out;
  for (auto [from, to] : {std::pair{&dq, &out.dq}, std::pair{&dk, &out.dk}, std::pair{&dv, &out.dv},
                          std::pair{&d_sinks, &out.d_sinks}}) {
    to->reserve(from->size());
    for (Calc x : *from) to->push_back(double(r(x)));
  }
  return out;
}

}  // namespace flashattn::testing
