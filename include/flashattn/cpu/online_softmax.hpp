#pragma once
// The online softmax of FlashAttention, for a panel of Rows query rows. Scores arrive one key tile at a
// time, stored transposed: st[j * Rows + i] is the raw score of query row i against key j of the tile,
// so that a packet holds consecutive query rows and every reduction over keys is a vertical (lane-wise)
// max or sum. update() takes the factor c that turns raw scores into base-2 units (scale·log2 e), so
// that exp becomes exp2 and the scaling costs nothing: c > 0 commutes with max, and c·s − m is one FMA.
//
// The recurrence, per query row, over key tiles t = 1, 2, ..., with s_j = c·(raw score j):
//   m_t = max(m_{t-1}, max_j s_j)                 running max
//   p_j = 2^(s_j - m_t)                           this tile's unnormalised probabilities
//   ℓ_t = 2^(m_{t-1} - m_t) · ℓ_{t-1} + Σ_j p_j   running sum
//   O_t = 2^(m_{t-1} - m_t) · O_{t-1} + P·V       (the rescale factor is returned as `alpha`)
// and at the end O = O_T / ℓ_T and LSE = (m_T + log2 ℓ_T) · ln 2.
//
// −inf guards: a row that has seen only masked (−inf) scores has m = −inf, and 2^(−inf − (−inf)) would be
// NaN. Such rows subtract 0 instead of m, so their p and alpha are exactly 0 and O stays 0. A row that
// ends with ℓ = 0 (every key masked) finalises to O = 0 and LSE = −inf. NaN scores are not guarded:
// they make p, ℓ and so O NaN, which is the documented propagation.

#include <cmath>
#include <limits>

#include "flashattn/cpu/simd.hpp"

namespace flashattn::cpu {

// Whether an inv_l of OnlineSoftmax::finalize marks a row that kept no key: −0, where +0 is a factor.
template <class Acc>
bool kept_no_key(Acc inv_l) {
  return inv_l == Acc(0) && std::signbit(inv_l);
}

template <class Acc, int Rows, Isa isa>
class OnlineSoftmax {
  using V = Simd<Acc, isa>;
  static_assert(Rows % V::width == 0, "Rows must be a multiple of the packet width");

 public:
  OnlineSoftmax() { reset(); }

  void reset() {
    for (int i = 0; i < Rows; ++i) {
      m_[i] = -std::numeric_limits<Acc>::infinity();
      l_[i] = Acc(0);
    }
  }



  // st: (cols, Rows) raw scores, overwritten with p. score_scale: c > 0 above. alpha: (Rows) rescale
  // factors for O.
  void update(Acc* st, int cols, Acc score_scale, Acc* alpha) {
    constexpr int full = kPackets / kGroup * kGroup;
    for (int p = 0; p < full; p += kGroup) update_group<kGroup>(p * W, st, cols, score_scale, alpha);
    if constexpr (full < kPackets) update_group<kPackets - full>(full * W, st, cols, score_scale, alpha);
  }

  // inv_l: (Rows) factors that normalise O; −0 marks a row that kept no key (kNoKey: its O is written as
  // exactly 0, whatever a 0 weight times a non-finite V left in its accumulator), while +0 is a factor
  // like any other (a sink can scale a row's keys down to it). lse: natural-log LSE per row.
  void finalize(Acc* inv_l, Acc* lse) const {
    constexpr Acc ln2 = Acc(0.6931471805599453094);
    for (int i = 0; i < Rows; ++i) {
      const Acc l = l_[i];
      if (l == Acc(0)) {
        inv_l[i] = kNoKey;
        lse[i] = -std::numeric_limits<Acc>::infinity();
      } else {
        inv_l[i] = Acc(1) / l;
        lse[i] = m_[i] * ln2 + std::log(l);
      }
    }
  }

  // finalize() with an attention sink: one more logit, `sink` (base-2 units), in every row's denominator,
  // attending no value. It is merged in at the end, as the state (sink, 1, O = 0), so that a row that
  // kept no key still has ℓ = 0 before it and comes out exactly 0 (a 0 weight on a non-finite V entry
  // must not reach it), with LSE = sink.
  void finalize_with_sink(Acc* inv_l, Acc* lse, Acc sink) const {
    constexpr Acc ln2 = Acc(0.6931471805599453094);
    for (int i = 0; i < Rows; ++i) {
      if (l_[i] == Acc(0)) {
        inv_l[i] = kNoKey;
        lse[i] = sink * ln2;
        continue;
      }
      const Acc m = m_[i] > sink || m_[i] != m_[i] ? m_[i] : sink;  // a NaN max stays NaN
      const Acc keys = std::exp2(m_[i] - m);
      const Acc l = l_[i] * keys + std::exp2(sink - m);
      inv_l[i] = keys / l;
      lse[i] = m * ln2 + std::log(l);
    }
  }

  // The inv_l of a row that kept no key (tested by kept_no_key below).
  static constexpr Acc kNoKey = -Acc(0);

  // The state itself, for combining partial results over several key ranges (split-KV).
  Acc running_max(int i) const { return m_[i]; }
  Acc running_sum(int i) const { return l_[i]; }

 private:
  using Reg = typename V::Reg;
  static constexpr int W = V::width;
  static constexpr int kPackets = Rows / W;
  // Query packets updated together: for each key, the group's packets are independent, so their exp
  // chains and running sums overlap instead of one packet's `cols` dependent adds running alone. Each
  // row still sums its keys in order, so the results are the same bits as one packet at a time.
  static constexpr int kGroup = kPackets < 4 ? kPackets : 4;

  // Rows [i0, i0 + G·W): the running max, the exponentials in place, alpha, the running sum.
  template <int G>
  void update_group(int i0, Acc* st, int cols, Acc score_scale, Acc* alpha) {
    constexpr Acc neg_inf = -std::numeric_limits<Acc>::infinity();
    const Reg c = V::set1(score_scale);
    Reg neg_shift[G];
    bool huge[G];
    bool any_huge = false;
    for (int g = 0; g < G; ++g) {
      const int i = i0 + g * W;
      // Four independent running maxima: one chain of `cols` dependent max operations costs cols times the
      // max latency (4 cycles on recent Intel cores), which was most of the softmax's time there.
      Reg part[4] = {V::set1(neg_inf), V::set1(neg_inf), V::set1(neg_inf), V::set1(neg_inf)};
      int j = 0;
      for (; j + 4 <= cols; j += 4)
        for (int u = 0; u < 4; ++u) part[u] = V::max(part[u], V::load(st + (j + u) * Rows + i));
      for (; j < cols; ++j) part[0] = V::max(part[0], V::load(st + j * Rows + i));
      const Reg tile_max = V::max(V::max(part[0], part[1]), V::max(part[2], part[3]));
      const Reg m_old = V::load(m_ + i);
      const Reg m_new = V::max(m_old, V::mul(tile_max, c));
      V::store(m_ + i, m_new);
      // The −inf guard: subtract 0 where the row has seen no finite score yet.
      alignas(64) Acc m_safe[W];
      V::store(m_safe, m_new);
      huge[g] = false;  // some |m| >= kFmaSafe (see below)
      for (Acc& m : m_safe) {
        m = (m == neg_inf) ? Acc(0) : m;
        huge[g] = huge[g] || std::abs(m) >= kFmaSafe;
      }
      any_huge = any_huge || huge[g];
      neg_shift[g] = V::sub(V::zero(), V::load(m_safe));
      V::store(alpha + i, V::exp2_nonpositive(V::add(m_old, neg_shift[g])));
    }

    // The exponent s·c − m: fma(s, c, −m) rounds once, the accurate form. But m is round(max s·c), so
    // for the row's largest score the fma leaves the rounding residual, up to half an ulp of m: at most
    // 1/4 below kFmaSafe, but beyond it 2^x overflows or the whole row underflows to 0 (o = 0, LSE ±inf;
    // found by the fuzzer, docs/robustness.md). Such rows take round(s·c) − m, which is <= 0, and 0 at
    // the largest score; the products are stored first, since a compiler may fuse a multiply whose only
    // use is an add back into an fma.
    Reg row_sum[G];
    for (int g = 0; g < G; ++g) row_sum[g] = V::zero();
    if (!any_huge) {
      for (int j = 0; j < cols; ++j) {
        Acc* s_row = st + j * Rows + i0;
        FLASHATTN_UNROLL
        for (int g = 0; g < G; ++g) {
          const Reg p = V::exp2_nonpositive(V::fma(V::load(s_row + g * W), c, neg_shift[g]));
          V::store(s_row + g * W, p);
          row_sum[g] = V::add(row_sum[g], p);
        }
      }
    } else {
      for (int g = 0; g < G; ++g) {
        Acc* s_col = st + i0 + g * W;
        const auto accumulate = [&](auto exponent) {
          for (int j = 0; j < cols; ++j) {
            const Reg p = V::exp2_nonpositive(exponent(V::load(s_col + j * Rows)));
            V::store(s_col + j * Rows, p);
            row_sum[g] = V::add(row_sum[g], p);
          }
        };
        if (!huge[g]) {
          accumulate([&](Reg s) { return V::fma(s, c, neg_shift[g]); });
        } else {
          for (int j = 0; j < cols; ++j) V::store(s_col + j * Rows, V::mul(V::load(s_col + j * Rows), c));
          accumulate([&](Reg sc) { return V::add(sc, neg_shift[g]); });
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      const int i = i0 + g * W;
      V::store(l_ + i, V::fma(V::load(l_ + i), V::load(alpha + i), row_sum[g]));
    }
  }

  // Below this |m| the fma's rounding residual (half an ulp of m) is at most 1/4: 2^(digits − 2).
  static constexpr Acc kFmaSafe = Acc(1ull << (std::numeric_limits<Acc>::digits - 2));

  alignas(64) Acc m_[Rows];  // running max, base-2 units
  alignas(64) Acc l_[Rows];  // running sum of 2^(s - m)
};

}  // namespace flashattn::cpu
