#pragma once
// Checks every argument of a forward call before any work starts (validate.hpp's checks), and resolves the
// call into the parameters every backend takes. Limits of a backend's own (the CPU's largest head dim) are
// checked by that backend's validate_context (cpu/context.hpp), which the entry points call next.

#include <string>

#include "flashattn/core/errors.hpp"
#include "flashattn/core/forward_params.hpp"
#include "flashattn/core/kv_source.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/validate.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

namespace detail {

// What the batch extent of k and v is: the batch's (dense K/V, a contiguous cache), or the pages of a
// paged cache (then k and v must agree with each other, not with q).
enum class KvBatch { Requests, Pages };

// The checks every forward call makes on q, k, v, o and lse (k and v: the tensors the keys are stored in,
// of element type E: T, or a 16-bit type under fp32 queries).
template <class T, class E = T>
void check_forward_views(const TensorView<const T>& q, const TensorView<const E>& k, const TensorView<const E>& v,
                         const TensorView<T>& o, const LseView& lse, KvBatch kv_batch = KvBatch::Requests,
                         const char* k_name = "k", const char* v_name = "v") {
  const auto [q_span, k_span, v_span] =
      std::array<ByteSpan, 3>{check_view("q", q), check_view(k_name, k), check_view(v_name, v)};
  const ByteSpan o_span = check_view("o", o);

  if (o.batch != q.batch || (kv_batch == KvBatch::Requests && (k.batch != q.batch || v.batch != q.batch)))
    fail("batch sizes disagree: " + describe("q", q) + ", " + describe(k_name, k) + ", " + describe(v_name, v) +
         ", " + describe("o", o));
  if (v.batch != k.batch)
    fail(std::string(k_name) + " and " + v_name + " must have the same pages: " + describe(k_name, k) + ", " +
         describe(v_name, v));
  if (v.seq != k.seq)
    fail(std::string(k_name) + " and " + v_name + " must have the same seq length: " + describe(k_name, k) + ", " +
         describe(v_name, v));
  if (o.seq != q.seq) fail("o must have q's seq length: " + describe("q", q) + ", " + describe("o", o));
  if (q.heads < 1 || k.heads < 1)
    fail("heads must be >= 1: " + describe("q", q) + ", " + describe(k_name, k));
  if (v.heads != k.heads)
    fail(std::string(k_name) + " and " + v_name + " must have the same heads: " + describe(k_name, k) + ", " +
         describe(v_name, v));
  if (o.heads != q.heads) fail("o must have q's heads: " + describe("q", q) + ", " + describe("o", o));
  if (q.heads % k.heads != 0)
    fail("heads of q must be a multiple of heads of k/v (grouped-query attention): " + sizes(q.heads, k.heads));
  // Scores take q·k, so q and k share a head dim; the output is a mix of V rows, so o has V's. The two
  // may differ (MLA: 192 for q/k, 128 for v).
  if (q.dim < 1) fail("head dim must be >= 1: " + describe("q", q));
  if (v.dim < 1) fail("head dim must be >= 1: " + describe(v_name, v));
  if (k.dim != q.dim)
    fail(std::string("head dims must agree: q and ") + k_name + " (scores are q·k): " + describe("q", q) + ", " +
         describe(k_name, k));
  if (o.dim != v.dim)
    fail(std::string("head dims must agree: o and ") + v_name + " (o mixes rows of v): " + describe(v_name, v) +
         ", " + describe("o", o));

  check_no_self_overlap<4>("o", {o.batch, o.seq, o.heads, o.dim},
                                   {o.stride_batch, o.stride_seq, o.stride_head, o.stride_dim});
  const char* inputs[] = {"q", k_name, v_name};
  const detail::ByteSpan spans[] = {q_span, k_span, v_span};
  for (int i = 0; i < 3; ++i)
    if (o_span.overlaps(spans[i])) fail(overlap("o", o_span, "input", inputs[i], spans[i]));

  if (!lse.empty() || lse.batch != 0 || lse.heads != 0 || lse.seq != 0) {
    const detail::ByteSpan lse_span = checked_span<3>(
        [&] { return describe(lse); }, lse.data, sizeof(float), {lse.batch, lse.heads, lse.seq},
        {lse.stride_batch, lse.stride_head, lse.stride_seq}, {"batch", "heads", "seq"});
    if (lse.batch != q.batch || lse.heads != q.heads || lse.seq != q.seq)
      fail("lse must have shape (batch, heads_q, seq_q) = (" + std::to_string(q.batch) + ", " +
           std::to_string(q.heads) + ", " + std::to_string(q.seq) + "), got " + describe(lse));
    check_no_self_overlap<3>("lse", {lse.batch, lse.heads, lse.seq},
                                     {lse.stride_batch, lse.stride_head, lse.stride_seq});
    for (int i = 0; i < 3; ++i)
      if (lse_span.overlaps(spans[i]))
        fail(overlap("lse", lse_span, "input", inputs[i], spans[i]));
    if (lse_span.overlaps(o_span)) fail(overlap("lse", lse_span, "output", "o", o_span));
  }
}

}  // namespace detail

// Validates a forward call and resolves its options into the parameters every backend takes.
template <class T, class E = T>
ForwardParams<T, DenseKv<E>> make_forward_params(const TensorView<const T>& q, const TensorView<const E>& k,
                                                 const TensorView<const E>& v, const TensorView<T>& o,
                                                 const LseView& lse, const AttentionOptions& opts) {
  detail::check_forward_views(q, k, v, o, lse);
  const double scale = detail::resolve_scale(opts, q.dim);

  ForwardParams<T, DenseKv<E>> p;
  p.q = q;
  p.k = dense_kv(k);
  p.v = dense_kv(v);
  p.o = o;
  p.seqs = EqualLengths{q.batch, q.seq, k.seq};
  p.lse = lse;
  p.scale = scale;
  p.group = q.heads / k.heads;
  return p;
}

}  // namespace flashattn
