#pragma once
// The state of a softmax over part of a row's keys, and how two such states combine. This is the LSE
// convention of every backend, and what split-KV (FlashDecoding), ring / distributed attention and a
// KV cache split over devices merge their partial results with.
//
// Over a set of keys J, a row's partial state is
//   m = max_j s_j          (base-2 units: s_j = scale·q·k_j·log2 e)
//   ℓ = Σ_j 2^(s_j − m)
//   o = Σ_j 2^(s_j − m)·v_j (unnormalised)
// Two states over disjoint key sets combine, with M = max(m₁, m₂), into
//   ℓ = 2^(m₁ − M)·ℓ₁ + 2^(m₂ − M)·ℓ₂,   o = 2^(m₁ − M)·o₁ + 2^(m₂ − M)·o₂
// and the final output is o / ℓ with LSE = (m + log2 ℓ)·ln 2 (natural log, as the public LSE is). A state
// that kept no key has ℓ = 0 and weighs nothing; a row that kept no key at all is output 0 with LSE −inf.
// ℓ, not m, says whether a state kept a key: the running max can drop a NaN score that the running sum
// keeps, so m = −inf with ℓ = NaN is a NaN row, and the NaN must win the max to reach the output.

#include <cmath>
#include <limits>

#include "flashattn/core/views.hpp"

namespace flashattn {

// The merged state of `n` partial states of one row: state i has running max m(i), running sum l(i) and
// unnormalised output o(i) (d elements); o_buf: d elements of scratch. `sink` (base-2 units; −inf: none)
// is an attention sink, one more state (sink, 1, o = 0) merged in when the row kept a key. Writes the
// normalised row through out(c, value) (exactly 0 for a row that kept no key, even if a NaN reached o
// through a 0 weight) and returns the row's LSE (natural log; for a row that kept no key the sink's, −inf
// without one).
template <class Acc, class MaxOf, class SumOf, class OutputOf, class Out>
Acc merge_softmax_states(int n, int d, MaxOf&& m_of, SumOf&& l_of, OutputOf&& o_of, Acc* o_buf, Out&& out,
                         Acc sink = -std::numeric_limits<Acc>::infinity()) {
  constexpr Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  constexpr Acc ln2 = Acc(0.6931471805599453094);
  Acc m = neg_inf;
  bool any = false;
  for (int s = 0; s < n; ++s) {
    if (l_of(s) == Acc(0)) continue;
    any = true;
    const Acc ms = m_of(s);
    if (ms > m || ms != ms) m = ms;  // NaN wins, so that it reaches the output
  }
  if (any && sink > m) m = sink;  // a NaN max stays NaN
  Acc l = 0;
  for (int c = 0; c < d; ++c) o_buf[c] = Acc(0);
  if (any) {
    l = std::exp2(sink - m);  // 0 without a sink
    for (int s = 0; s < n; ++s) {
      if (l_of(s) == Acc(0)) continue;
      const Acc w = std::exp2(m_of(s) - m);
      l += w * l_of(s);
      const Acc* os = o_of(s);
      for (int c = 0; c < d; ++c) o_buf[c] += w * os[c];
    }
  }
  const Acc inv_l = l == Acc(0) ? Acc(0) : Acc(1) / l;
  for (int c = 0; c < d; ++c) out(c, inv_l == Acc(0) ? Acc(0) : o_buf[c] * inv_l);
  if (l == Acc(0)) return any ? neg_inf : sink * ln2;
  return (m + std::log2(l)) * ln2;
}

}  // namespace flashattn
