#pragma once
// attention_combine: the result of attention over several disjoint sets of keys, from the results over
// each set. Part i gives, for every query row, its output O_i (normalised over its keys) and LSE_i; over
// all the keys together
//   LSE = log Σ_i exp(LSE_i),   O = Σ_i exp(LSE_i − LSE) · O_i.
// This is how partial results are merged when the keys are split: over threads or devices (split-KV,
// FlashDecoding), into a prefix shared by many requests and each request's own suffix (cascade
// inference), or over the ranks of ring attention. It is core/softmax_state.hpp's merge, with each part's
// state taken from its (O, LSE): running max LSE_i (as base-2 units), running sum 1.
//
// LSE views hold float, so the weights carry float's relative error (about 6e-8) whatever T is: an fp64
// combination is accurate to about 1e-7 relative, not to fp64's epsilon.
// A part whose LSE is −inf kept no key and weighs nothing; a row that no part kept is written as 0 with
// LSE −inf. A NaN in any part's LSE or in a weighed output propagates. The output may be one of the parts
// (every part's row is read before the row is written).
//
//   flashattn::attention_combine<float>({{o_prefix, lse_prefix}, {o_suffix, lse_suffix}}, o, lse);

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "flashattn/core/errors.hpp"
#include "flashattn/core/softmax_state.hpp"
#include "flashattn/core/validate.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

// One part of a combine: outputs (batch, seq_q, heads, dim) and their LSE (batch, heads, seq_q).
template <class T>
struct AttentionPart {
  TensorView<const T> o;
  LseView lse;
};

// o (and lse, unless empty) = the combination of `parts`. Every part has o's shape and an LSE of shape
// (batch, heads, seq_q). Throws InvalidArgument, before writing anything, for no part, a null or missing
// view, or a shape that differs.
template <class T>
void attention_combine(const std::vector<AttentionPart<T>>& parts, TensorView<T> o, LseView lse = {}) {
  if (parts.empty()) throw InvalidArgument("attention_combine: parts is empty: give at least one (O, LSE) part");
  if (o.data == nullptr && o.numel() > 0) throw InvalidArgument("attention_combine: o.data is null");
  if (!lse.empty() && (lse.batch != o.batch || lse.heads != o.heads || lse.seq != o.seq))
    throw InvalidArgument("attention_combine: lse has shape (" + std::to_string(lse.batch) + ", " +
                          std::to_string(lse.heads) + ", " + std::to_string(lse.seq) + "), o needs (" +
                          std::to_string(o.batch) + ", " + std::to_string(o.heads) + ", " + std::to_string(o.seq) + ")");
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const AttentionPart<T>& p = parts[i];
    const std::string name = "attention_combine: parts[" + std::to_string(i) + "]";
    if (p.o.batch != o.batch || p.o.seq != o.seq || p.o.heads != o.heads || p.o.dim != o.dim)
      throw InvalidArgument(detail::describe((name + ".o").c_str(), p.o) + " does not match " + detail::describe("o", o));
    if (p.lse.empty() || p.lse.batch != o.batch || p.lse.heads != o.heads || p.lse.seq != o.seq)
      throw InvalidArgument(name + ".lse must be (batch, heads, seq_q) = (" + std::to_string(o.batch) + ", " +
                            std::to_string(o.heads) + ", " + std::to_string(o.seq) + "), got (" +
                            std::to_string(p.lse.batch) + ", " + std::to_string(p.lse.heads) + ", " +
                            std::to_string(p.lse.seq) + ")");
    if (p.o.data == nullptr && p.o.numel() > 0) throw InvalidArgument(name + ".o.data is null");
  }

  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  constexpr Acc log2e = Acc(1.4426950408889634074);
  const int n = int(parts.size()), d = int(o.dim);
  std::vector<Acc> rows(std::size_t(n) * std::size_t(d)), o_buf(static_cast<std::size_t>(d));
  for (index_t b = 0; b < o.batch; ++b)
    for (index_t h = 0; h < o.heads; ++h)
      for (index_t s = 0; s < o.seq; ++s) {
        // Part i's row as a softmax state: max LSE_i·log2 e, sum 1 (0 where it kept no key), output O_i.
        for (int i = 0; i < n; ++i)
          for (int c = 0; c < d; ++c) rows[std::size_t(i) * d + c] = Acc(parts[std::size_t(i)].o(b, s, h, c));
        const auto lse_of = [&](int i) { return Acc(parts[std::size_t(i)].lse(b, h, s)); };
        const Acc merged = merge_softmax_states<Acc>(
            n, d, [&](int i) { return lse_of(i) * log2e; },
            [&](int i) { return lse_of(i) == -std::numeric_limits<Acc>::infinity() ? Acc(0) : Acc(1); },
            [&](int i) { return static_cast<const Acc*>(rows.data() + std::size_t(i) * d); }, o_buf.data(),
            [&](int c, Acc value) { o(b, s, h, c) = T(value); });
        if (!lse.empty()) lse(b, h, s) = float(merged);
      }
}

template <class T>
void attention_combine(std::initializer_list<AttentionPart<T>> parts, TensorView<T> o, LseView lse = {}) {
  attention_combine(std::vector<AttentionPart<T>>(parts), o, lse);
}

}  // namespace flashattn
