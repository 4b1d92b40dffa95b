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

// Validates a forward call and resolves its options into the parameters every backend takes.
template <class T>
ForwardParams<T> make_forward_params(const TensorView<const T>& q, const TensorView<const T>& k,
                                     const TensorView<const T>& v, const TensorView<T>& o, const LseView& lse,
                                     const AttentionOptions& opts) {
  using detail::describe;
  using detail::fail;
  using detail::sizes;
  const auto [q_span, k_span, v_span] = detail::check_inputs(q, k, v);
  const detail::ByteSpan o_span = detail::check_view("o", o);

  if (k.batch != q.batch || v.batch != q.batch || o.batch != q.batch)
    fail("batch sizes disagree: " + describe("q", q) + ", " + describe("k", k) + ", " + describe("v", v) + ", " +
         describe("o", o));
  if (v.seq != k.seq) fail("k and v must have the same seq length: " + describe("k", k) + ", " + describe("v", v));
  if (o.seq != q.seq) fail("o must have q's seq length: " + describe("q", q) + ", " + describe("o", o));
  if (q.heads < 1 || k.heads < 1)
    fail("heads must be >= 1: " + describe("q", q) + ", " + describe("k", k));
  if (v.heads != k.heads) fail("k and v must have the same heads: " + describe("k", k) + ", " + describe("v", v));
  if (o.heads != q.heads) fail("o must have q's heads: " + describe("q", q) + ", " + describe("o", o));
  if (q.heads % k.heads != 0)
    fail("heads of q must be a multiple of heads of k/v (grouped-query attention): " + sizes(q.heads, k.heads));
  if (q.dim < 1) fail("head dim must be >= 1: " + describe("q", q));
  if (k.dim != q.dim || v.dim != q.dim || o.dim != q.dim)
    fail("head dims must agree: " + describe("q", q) + ", " + describe("k", k) + ", " + describe("v", v) + ", " +
         describe("o", o));

  detail::check_no_self_overlap<4>("o", {o.batch, o.seq, o.heads, o.dim},
                                   {o.stride_batch, o.stride_seq, o.stride_head, o.stride_dim});
  const char* inputs[] = {"q", "k", "v"};
  const detail::ByteSpan spans[] = {q_span, k_span, v_span};
  for (int i = 0; i < 3; ++i)
    if (o_span.overlaps(spans[i])) fail(detail::overlap("o", o_span, "input", inputs[i], spans[i]));

  if (!lse.empty() || lse.batch != 0 || lse.heads != 0 || lse.seq != 0) {
    const detail::ByteSpan lse_span = detail::checked_span<3>(
        [&] { return describe(lse); }, lse.data, sizeof(float), {lse.batch, lse.heads, lse.seq},
        {lse.stride_batch, lse.stride_head, lse.stride_seq}, {"batch", "heads", "seq"});
    if (lse.batch != q.batch || lse.heads != q.heads || lse.seq != q.seq)
      fail("lse must have shape (batch, heads_q, seq_q) = (" + std::to_string(q.batch) + ", " +
           std::to_string(q.heads) + ", " + std::to_string(q.seq) + "), got " + describe(lse));
    detail::check_no_self_overlap<3>("lse", {lse.batch, lse.heads, lse.seq},
                                     {lse.stride_batch, lse.stride_head, lse.stride_seq});
    for (int i = 0; i < 3; ++i)
      if (lse_span.overlaps(spans[i]))
        fail(detail::overlap("lse", lse_span, "input", inputs[i], spans[i]));
    if (lse_span.overlaps(o_span)) fail(detail::overlap("lse", lse_span, "output", "o", o_span));
  }

  const double scale = detail::resolve_scale(opts, q.dim);

  ForwardParams<T> p;
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
