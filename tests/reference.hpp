#pragma once
// The test oracle: attention computed the obvious way, materialising each score row, with every
// intermediate in a chosen accumulator type. reference_attention<double> is the fp64 reference of the
// tolerance rule; reference_attention<acc_t<T>, T> (rounding scores, probabilities and outputs to T, as a
// naive implementation storing T would) gives the "naive in the same precision" error that bounds ours.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "flashattn/cpu/tiles.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn::testing {

struct ReferenceResult {
  std::vector<double> o;    // (batch, seq_q, heads_q, v's dim), contiguous
  std::vector<double> lse;  // (batch, heads_q, seq_q), contiguous
};

// Round x through storage type Store (identity for Store = Acc).
template <class Store, class Acc>
Acc round_to(Acc x) {
  return Acc(Store(x));
}

// The query rows [begin, end) of every head that a reference computes (end < 0: to the last row), so that
// a long sequence can be checked on sampled rows: each row of the forward, and of the backward's dQ, needs
// only its own row of scores (O(seq_k·d), not O(seq_q·seq_k·d)).
struct RowRange {
  index_t begin = 0, end = -1;
  index_t end_in(index_t seq) const { return end < 0 ? seq : std::min(end, seq); }
};

// softmax(scale·Q·Kᵀ, mask)·V. Calc: the type every sum and product is computed in. Store: the type
// scores, probabilities and outputs are rounded to between steps (Calc for the fp64 reference). Rows
// outside `rows` are left 0 (O) and 0 (LSE).
template <class Calc, class Store = Calc, class T, class Mask>
ReferenceResult reference_attention(const TensorView<const T>& q, const TensorView<const T>& k,
                                    const TensorView<const T>& v, double scale, const Mask& mask,
                                    RowRange rows = {}) {
  // D: the head dim of q and k; Dv: of v and the output (they differ in MLA).
  const index_t B = q.batch, Sq = q.seq, Sk = k.seq, H = q.heads, D = q.dim, Dv = v.dim, group = q.heads / k.heads;
  ReferenceResult r;
  r.o.assign(std::size_t(B * Sq * H * Dv), 0.0);
  r.lse.assign(std::size_t(B * H * Sq), 0.0);
  std::vector<Calc> s(static_cast<std::size_t>(Sk)), acc(static_cast<std::size_t>(Dv));
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      const auto head_mask = policy_for(mask, SequenceInfo{b, h, Sq, Sk});
      using HeadMask = std::decay_t<decltype(head_mask)>;
      // An attention sink (core/variants.hpp) is one more logit in the row's softmax, attending no value:
      // m = max(sink, max_j s_j), l = exp(sink − m) + Σ_j exp(s_j − m), L = m + log(l); a row that keeps
      // no key has L = sink and o = 0.
      Calc sink = -std::numeric_limits<Calc>::infinity();
      if constexpr (has_sink_v<HeadMask>) sink = Calc(head_mask.sink_logit());
      const index_t hk = h / group;
      for (index_t i = rows.begin; i < rows.end_in(Sq); ++i) {
        Calc m = sink;
        std::vector<bool> kept(static_cast<std::size_t>(Sk));
        for (index_t j = 0; j < Sk; ++j) {
          kept[std::size_t(j)] = head_mask.keep(i, j);
          if (!kept[std::size_t(j)]) {
            s[std::size_t(j)] = -std::numeric_limits<Calc>::infinity();
            continue;
          }
          Calc dot = 0;
          for (index_t c = 0; c < D; ++c) dot += Calc(q(b, i, h, c)) * Calc(k(b, j, hk, c));
          Calc x = round_to<Store>(dot) * Calc(scale);
          if constexpr (modifies_scores_v<HeadMask>) x = Calc(head_mask.score(i, j, x));
          s[std::size_t(j)] = x;
          // A NaN score wins (std::max would drop it): a row that keeps a NaN score is NaN, even when
          // every other score it keeps is −inf (documented propagation, docs/robustness.md).
          if (x > m || x != x) m = x;
        }
        const bool any = m != -std::numeric_limits<Calc>::infinity();
        Calc l = any ? std::exp(sink - m) : Calc(0);  // 0 without a sink
        for (index_t j = 0; j < Sk; ++j) {
          s[std::size_t(j)] = kept[std::size_t(j)] && any ? std::exp(s[std::size_t(j)] - m) : Calc(0);
          l += s[std::size_t(j)];
        }
        std::fill(acc.begin(), acc.end(), Calc(0));
        for (index_t j = 0; j < Sk; ++j) {
          if (!kept[std::size_t(j)]) continue;
          const Calc pj = round_to<Store>(s[std::size_t(j)] / l);
          for (index_t c = 0; c < Dv; ++c) acc[std::size_t(c)] += pj * Calc(v(b, j, hk, c));
        }
        for (index_t c = 0; c < Dv; ++c)
          r.o[std::size_t(((b * Sq + i) * H + h) * Dv + c)] = any ? double(round_to<Store>(acc[std::size_t(c)])) : 0.0;
        r.lse[std::size_t((b * H + h) * Sq + i)] =
            any ? double(m) + std::log(double(l)) : -std::numeric_limits<double>::infinity();
      }
    }
  }
  return r;
}

// ---- Test data ------------------------------------------------------------------------------------------

enum class Layout { Bshd, Bhsd };

// Owns the storage behind a TensorView. Moving keeps the view valid (a moved vector keeps its buffer);
// copying would not, so it is disabled.
template <class T>
class HostTensor {
 public:
  HostTensor(Layout layout, index_t batch, index_t seq, index_t heads, index_t dim, T fill = T(0))
      : data_(std::size_t(batch * seq * heads * dim), fill) {
    view_ = layout == Layout::Bshd ? bshd(data_.data(), batch, seq, heads, dim)
                                   : bhsd(data_.data(), batch, heads, seq, dim);
  }
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;

  TensorView<T> view() const { return view_; }
  TensorView<const T> cview() const { return view_; }
  std::vector<T>& storage() { return data_; }
  const std::vector<T>& storage() const { return data_; }

 private:
  std::vector<T> data_;
  TensorView<T> view_;
};

// Contiguous (batch, heads, seq) LSE storage.
class HostLse {
 public:
  HostLse(index_t batch, index_t heads, index_t seq, float fill = std::numeric_limits<float>::quiet_NaN())
      : data_(std::size_t(batch * heads * seq), fill), view_(lse_bhs(data_.data(), batch, heads, seq)) {}
  HostLse(const HostLse&) = delete;
  HostLse& operator=(const HostLse&) = delete;
  HostLse(HostLse&&) = default;
  HostLse& operator=(HostLse&&) = default;

  LseView view() const { return view_; }

 private:
  std::vector<float> data_;
  LseView view_;
};

// The bytes of n values, for bit-for-bit comparisons (NaNs included) of two results.
template <class T>
std::vector<unsigned char> bytes_of(const T* data, std::size_t n) {
  std::vector<unsigned char> out(n * sizeof(T));
  if (n > 0) std::memcpy(out.data(), data, out.size());
  return out;
}
template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& x) {
  return bytes_of(x.data(), x.size());
}

// Fills every element of a view with N(0, stddev²) values, rounded to T (the reference then reads the
// rounded values, so rounding the inputs is not an error of the kernel).
template <class T>
void fill_normal(const TensorView<T>& x, std::uint32_t seed, double stddev = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h)
        for (index_t d = 0; d < x.dim; ++d) x(b, s, h, d) = T(dist(rng));
}

// Every element of a view, as double, in (batch, seq, heads, dim) order (ReferenceResult::o's order).
template <class T>
std::vector<double> to_double(const TensorView<T>& x) {
  std::vector<double> out;
  out.reserve(std::size_t(x.numel()));
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h)
        for (index_t d = 0; d < x.dim; ++d) out.push_back(double(x(b, s, h, d)));
  return out;
}

// Every element of an LSE view in (batch, heads, seq) order (ReferenceResult::lse's order).
inline std::vector<double> to_double(const LseView& x) {
  std::vector<double> out;
  out.reserve(std::size_t(x.batch * x.heads * x.seq));
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t h = 0; h < x.heads; ++h)
      for (index_t s = 0; s < x.seq; ++s) out.push_back(double(x(b, h, s)));
  return out;
}

}  // namespace flashattn::testing
