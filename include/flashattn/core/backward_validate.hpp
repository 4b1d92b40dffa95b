#pragma once
// Checks every argument of a backward call before any work starts, in the forward's style
// (validate.hpp, forward_validate.hpp): flashattn::InvalidArgument with a message that names the argument
// and its values.

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>

#include "flashattn/core/backward_params.hpp"
#include "flashattn/core/errors.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/validate.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

namespace detail {

// Whether two views of one element type share an element. Exact when both have the same extents and
// strides, and their dimensions nest (sorted by stride, each stride steps over the whole extent of the
// previous one): the case of q, k, v or dq, dk, dv as slices of one fused (batch, seq, 3, heads, dim)
// buffer, whose byte ranges interleave without sharing an element. Otherwise conservative: overlapping
// byte ranges count as shared.
template <class A, class B>
bool views_share_element(const TensorView<A>& a, ByteSpan a_span, const TensorView<B>& b, ByteSpan b_span) {
  if (!a_span.overlaps(b_span)) return false;
  const std::array<index_t, 4> extent{a.batch, a.seq, a.heads, a.dim};
  const std::array<index_t, 4> stride{a.stride_batch, a.stride_seq, a.stride_head, a.stride_dim};
  if (sizeof(A) != sizeof(B) || extent != std::array<index_t, 4>{b.batch, b.seq, b.heads, b.dim} ||
      stride != std::array<index_t, 4>{b.stride_batch, b.stride_seq, b.stride_head, b.stride_dim})
    return true;
  const index_t byte_offset = index_t(b_span.begin) - index_t(a_span.begin);
  if (byte_offset % index_t(sizeof(A)) != 0) return true;  // elements would partly overlap

  // Dimensions by increasing stride; reach[r] = the largest offset dimensions 0..r can add up to.
  std::array<int, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(), [&](int x, int y) { return stride[x] < stride[y]; });
  std::array<index_t, 4> s{}, e{}, reach{};
  index_t covered = 1;
  for (int r = 0; r < 4; ++r) {
    s[r] = stride[order[r]];
    e[r] = extent[order[r]];
    if (e[r] > 1 && s[r] < covered) return true;  // not nested: fall back to the byte ranges
    if (e[r] > 1) covered = s[r] * e[r];
    reach[r] = (r > 0 ? reach[r - 1] : 0) + (e[r] - 1) * s[r];
  }
  // Shared iff the offset is Σ_r c_r·s[r] with |c_r| < e[r]. With nested strides, at each dimension
  // (largest first) only the two coefficients around offset / s[r] can leave a remainder that the smaller
  // dimensions reach.
  const auto representable = [&](const auto& self, index_t rest, int r) -> bool {
    if (r < 0) return rest == 0;
    if (e[r] <= 1) return self(self, rest, r - 1);
    const index_t below = r > 0 ? reach[r - 1] : 0;
    const index_t c0 = rest >= 0 ? rest / s[r] : -((-rest + s[r] - 1) / s[r]);  // floor(rest / s[r])
    for (index_t c = c0; c <= c0 + 1; ++c) {
      if (c <= -e[r] || c >= e[r]) continue;
      const index_t left = rest - c * s[r];
      if (left >= -below && left <= below && self(self, left, r - 1)) return true;
    }
    return false;
  };
  return representable(representable, byte_offset / index_t(sizeof(A)), 3);
}

// The checks every backward call makes on its views. q, k, v, o and lse are the forward's inputs, output
// and saved LSE; d_o is the incoming gradient; dq, dk, dv receive the gradients (shapes of q, k, v).
template <class T>
void check_backward_views(const TensorView<const T>& q, const TensorView<const T>& k, const TensorView<const T>& v,
                          const TensorView<const T>& o, const TensorView<const T>& d_o, const LseView& lse,
                          const TensorView<T>& dq, const TensorView<T>& dk, const TensorView<T>& dv) {
  const auto [q_span, k_span, v_span] = detail::check_inputs(q, k, v);
  const detail::ByteSpan o_span = detail::check_view("o", o);
  const detail::ByteSpan do_span = detail::check_view("d_o", d_o);
  const detail::ByteSpan dq_span = detail::check_view("dq", dq);
  const detail::ByteSpan dk_span = detail::check_view("dk", dk);
  const detail::ByteSpan dv_span = detail::check_view("dv", dv);

  if (k.batch != q.batch || v.batch != q.batch || o.batch != q.batch || d_o.batch != q.batch || dq.batch != q.batch ||
      dk.batch != q.batch || dv.batch != q.batch)
    fail("batch sizes disagree: " + describe("q", q) + ", " + describe("k", k) + ", " + describe("v", v) + ", " +
         describe("o", o) + ", " + describe("d_o", d_o) + ", " + describe("dq", dq) + ", " + describe("dk", dk) + ", " +
         describe("dv", dv));
  if (v.seq != k.seq) fail("k and v must have the same seq length: " + describe("k", k) + ", " + describe("v", v));
  if (q.heads < 1 || k.heads < 1) fail("heads must be >= 1: " + describe("q", q) + ", " + describe("k", k));
  if (v.heads != k.heads) fail("k and v must have the same heads: " + describe("k", k) + ", " + describe("v", v));
  if (q.heads % k.heads != 0)
    fail("heads of q must be a multiple of heads of k/v (grouped-query attention): " + sizes(q.heads, k.heads));
  // q and k share a head dim; v's may differ (MLA), and o and d_o have it.
  if (q.dim < 1) fail("head dim must be >= 1: " + describe("q", q));
  if (v.dim < 1) fail("head dim must be >= 1: " + describe("v", v));
  if (k.dim != q.dim)
    fail("head dims must agree: q and k (scores are q·k): " + describe("q", q) + ", " + describe("k", k));
  // o and d_o have q's seq and heads with v's head dim, dq has q's shape; dk has k's, dv v's.
  const auto same_shape = [](const auto& a, const auto& b) {
    return a.seq == b.seq && a.heads == b.heads && a.dim == b.dim;
  };
  const auto output_shape = [&](const auto& a) { return a.seq == q.seq && a.heads == q.heads && a.dim == v.dim; };
  if (!output_shape(o))
    fail("o must have q's seq and heads and v's head dim: " + describe("q", q) + ", " + describe("v", v) + ", " +
         describe("o", o));
  if (!output_shape(d_o))
    fail("d_o must have q's seq and heads and v's head dim: " + describe("q", q) + ", " + describe("v", v) + ", " +
         describe("d_o", d_o));
  if (!same_shape(dq, q)) fail("dq must have q's shape: " + describe("q", q) + ", " + describe("dq", dq));
  if (!same_shape(dk, k)) fail("dk must have k's shape: " + describe("k", k) + ", " + describe("dk", dk));
  if (!same_shape(dv, v)) fail("dv must have v's shape: " + describe("v", v) + ", " + describe("dv", dv));

  // The LSE saved by the forward is required: recomputing P tile by tile needs each row's normaliser.
  if (lse.batch != q.batch || lse.heads != q.heads || lse.seq != q.seq)
    fail("lse (the forward's log-sum-exp, required by the backward) must have shape (batch, heads_q, seq_q) = (" +
         std::to_string(q.batch) + ", " + std::to_string(q.heads) + ", " + std::to_string(q.seq) + "), got " +
         describe(lse));
  const detail::ByteSpan lse_span =
      detail::checked_span<3>([&] { return describe(lse); }, lse.data, sizeof(float), {lse.batch, lse.heads, lse.seq},
                              {lse.stride_batch, lse.stride_head, lse.stride_seq}, {"batch", "heads", "seq"});

  // Outputs: none may alias itself, another output, or an input (they are written while inputs are read).
  // Slices of one fused buffer that interleave without sharing an element are accepted.
  const char* out_names[] = {"dq", "dk", "dv"};
  const detail::ByteSpan out_spans[] = {dq_span, dk_span, dv_span};
  detail::check_no_self_overlap<4>("dq", {dq.batch, dq.seq, dq.heads, dq.dim},
                                   {dq.stride_batch, dq.stride_seq, dq.stride_head, dq.stride_dim});
  detail::check_no_self_overlap<4>("dk", {dk.batch, dk.seq, dk.heads, dk.dim},
                                   {dk.stride_batch, dk.stride_seq, dk.stride_head, dk.stride_dim});
  detail::check_no_self_overlap<4>("dv", {dv.batch, dv.seq, dv.heads, dv.dim},
                                   {dv.stride_batch, dv.stride_seq, dv.stride_head, dv.stride_dim});
  const TensorView<const T> outs[] = {dq, dk, dv};
  const char* in_names[] = {"q", "k", "v", "o", "d_o"};
  const TensorView<const T> ins[] = {q, k, v, o, d_o};
  const detail::ByteSpan in_spans[] = {q_span, k_span, v_span, o_span, do_span};
  for (int a = 0; a < 3; ++a) {
    for (int b = a + 1; b < 3; ++b)
      if (detail::views_share_element(outs[a], out_spans[a], outs[b], out_spans[b]))
        fail(std::string(out_names[a]) + " overlaps the memory of output " + out_names[b]);
    for (int i = 0; i < 5; ++i)
      if (detail::views_share_element(outs[a], out_spans[a], ins[i], in_spans[i]))
        fail(std::string(out_names[a]) + " overlaps the memory of input " + in_names[i]);
    if (out_spans[a].overlaps(lse_span)) fail(std::string(out_names[a]) + " overlaps the memory of input lse");
  }
}

// The checks of a call's BackwardExtras. d_lse: the lse's shape, apart from the outputs (it is read while
// they are written). d_sinks: only for a policy with a sink (`policy_has_sink`), heads_q floats apart from
// every other argument (it is written after the gradients' first pass has read them). d_bias: only for a
// policy with a bias over a plain mask (`bias`), its floats apart from every other argument. Returns where
// d_bias goes (data null: nowhere).
template <class T>
BiasGrad check_backward_extras(const BackwardExtras& x, bool policy_has_sink, const BiasInPolicy& bias,
                               const TensorView<const T>& q, const TensorView<const T>& k, const TensorView<const T>& v,
                               const TensorView<const T>& o, const TensorView<const T>& d_o, const LseView& lse,
                               const TensorView<T>& dq, const TensorView<T>& dk, const TensorView<T>& dv) {
  const std::pair<const char*, ByteSpan> outputs[] = {
      {"dq", check_view("dq", dq)}, {"dk", check_view("dk", dk)}, {"dv", check_view("dv", dv)}};
  const auto lse_span_of = [](const LseView& l, const char* name) {
    return checked_span<3>([&] { return std::string(name) + " " + describe(l); }, l.data, sizeof(float),
                           {l.batch, l.heads, l.seq}, {l.stride_batch, l.stride_head, l.stride_seq},
                           {"batch", "heads", "seq"});
  };
  ByteSpan d_lse_span;
  if (!x.d_lse.empty()) {
    if (x.d_lse.batch != lse.batch || x.d_lse.heads != lse.heads || x.d_lse.seq != lse.seq)
      fail("extras.d_lse must have lse's shape (batch, heads_q, seq_q) = (" + std::to_string(lse.batch) + ", " +
           std::to_string(lse.heads) + ", " + std::to_string(lse.seq) + "), got " + describe(x.d_lse));
    d_lse_span = lse_span_of(x.d_lse, "extras.d_lse");
    for (const auto& [name, span] : outputs)
      if (span.overlaps(d_lse_span)) fail(std::string(name) + " overlaps the memory of input extras.d_lse");
  }
  if (x.d_sinks == nullptr && x.d_bias == nullptr) return {};

  // The two gradient outputs of the extras must not share memory with anything else of the call.
  const auto float_span = [](const float* p, index_t count) {
    const auto begin = reinterpret_cast<std::uintptr_t>(p);
    return ByteSpan{begin, begin + std::uintptr_t(count) * sizeof(float)};
  };
  ByteSpan sinks_span, bias_grad_span, bias_span;
  if (x.d_sinks != nullptr) {
    if (!policy_has_sink)
      fail(
          "extras.d_sinks is set, but the call's policy has no sink (sink_logit()): pass sinks(logits, mask) "
          "to attention_backward_masked, as to the forward");
    sinks_span = float_span(x.d_sinks, q.heads);
  }
  BiasGrad grad;
  if (x.d_bias != nullptr) {
    if (bias.view == nullptr)
      fail(
          "extras.d_bias is set, but the call's policy has no bias: pass bias(view, mask) (or a variant over "
          "it) to attention_backward_masked, as to the forward");
    if (bias.base_changes_scores)
      fail(
          "extras.d_bias: the bias's own mask changes scores (bias(view, soft_cap(...))); d_bias is computed "
          "for a bias over a plain mask, with any score change outside it (soft_cap(c, bias(view, mask)))");
    const BiasView& view = *bias.view;
    bias_span =
        checked_span<4>([] { return std::string("bias view"); }, view.data, sizeof(float),
                        {view.batch, view.heads, view.seq_q, view.seq_k},
                        {view.stride_batch, view.stride_head, view.stride_q, 1}, {"batch", "heads", "seq_q", "seq_k"});
    bias_grad_span = float_span(x.d_bias, view.batch * view.heads * q.seq * k.seq);
    grad = {x.d_bias, view.batch, view.heads};
  }
  const std::pair<const char*, ByteSpan> others[] = {
      {"q", check_view("q", q)},     {"k", check_view("k", k)},       {"v", check_view("v", v)},
      {"o", check_view("o", o)},     {"d_o", check_view("d_o", d_o)}, {"lse", lse_span_of(lse, "lse")},
      {"extras.d_lse", d_lse_span}, {"the bias", bias_span},         outputs[0],
      outputs[1],                    outputs[2]};
  for (const auto& [name, span] : others) {
    if (sinks_span.overlaps(span)) fail(std::string("extras.d_sinks overlaps the memory of ") + name);
    if (bias_grad_span.overlaps(span)) fail(std::string("extras.d_bias overlaps the memory of ") + name);
  }
  if (bias_grad_span.overlaps(sinks_span)) fail("extras.d_bias overlaps the memory of extras.d_sinks");
  return grad;
}

}  // namespace detail

// Validates a backward call and resolves its options.
template <class T>
BackwardParams<T> make_backward_params(const TensorView<const T>& q, const TensorView<const T>& k,
                                       const TensorView<const T>& v, const TensorView<const T>& o,
                                       const TensorView<const T>& d_o, const LseView& lse, const TensorView<T>& dq,
                                       const TensorView<T>& dk, const TensorView<T>& dv, const AttentionOptions& opts,
                                       const BackwardExtras& extras = {}, bool policy_has_sink = false,
                                       const BiasInPolicy& bias = {}) {
  detail::check_backward_views(q, k, v, o, d_o, lse, dq, dk, dv);
  const BiasGrad d_bias =
      detail::check_backward_extras(extras, policy_has_sink, bias, q, k, v, o, d_o, lse, dq, dk, dv);
  return BackwardParams<T>{q,
                           k,
                           v,
                           o,
                           d_o,
                           lse,
                           dq,
                           dk,
                           dv,
                           EqualLengths{q.batch, q.seq, k.seq},
                           detail::resolve_scale(opts, q.dim),
                           q.heads / k.heads,
                           extras.d_lse,
                           extras.d_sinks,
                           d_bias};
}

}  // namespace flashattn
