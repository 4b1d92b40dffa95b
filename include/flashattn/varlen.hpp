#pragma once
// Variable-length batches packed without padding (FlashAttention's varlen API): every sequence's tokens
// one after another in (total_tokens, heads, dim) tensors, sequence b's rows being [cu[b], cu[b + 1]).
//
//   attention_forward_varlen([ctx,] q, k, v, o, PackedBatch{cu_seqlens_q, cu_seqlens_k, batch}, options, lse)
//   attention_backward_varlen([ctx,] q, k, v, o, d_o, lse, dq, dk, dv, PackedBatch{...}, options)
//
// q, o: packed(data, total_q, heads_q, dim); k, v: packed(data, total_k, heads_kv, dim); lse, when given:
// lse_packed(data, heads_q, total_q). Each sequence attends to its own keys only; causal and windows align
// each sequence's rows with the end of its own keys, as in a separate call per sequence. The backward
// (packed training) takes the forward's packed tensors and LSE, d_o shaped like o, and writes dq, dk, dv
// shaped like q, k, v, with backward.hpp's rules (deterministic, LSE required).

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "flashattn/backward.hpp"
#include "flashattn/core/backward_params.hpp"
#include "flashattn/core/backward_validate.hpp"
#include "flashattn/core/errors.hpp"
#include "flashattn/core/forward_params.hpp"
#include "flashattn/core/forward_validate.hpp"
#include "flashattn/core/kv_cache_validate.hpp"
#include "flashattn/core/kv_source.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/validate.hpp"
#include "flashattn/core/static_checks.hpp"
#include "flashattn/forward.hpp"

namespace flashattn {

// The offsets of a packed batch: batch + 1 int32 each, starting at 0, non-decreasing, ending at the
// packed tensors' token counts.
struct PackedBatch {
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  index_t batch = 0;
};

// A packed (total, heads, dim) tensor, contiguous: a view of batch 1.
template <class T>
TensorView<T> packed(T* data, index_t total, index_t heads, index_t dim) {
  return bshd(data, 1, total, heads, dim);
}
// The LSE of a packed batch, (heads, total_q) contiguous.
inline LseView lse_packed(float* data, index_t heads, index_t total_q) { return lse_bhs(data, 1, heads, total_q); }

namespace detail {

// cu[0] = 0, cu non-decreasing, cu[batch] = total. Returns the longest sequence.
inline index_t check_cu_seqlens(const char* name, const std::int32_t* cu, index_t batch, index_t total,
                                const char* total_what) {
  if (cu == nullptr && batch == 0 && total == 0) return 0;  // an empty batch needs no offsets
  if (cu == nullptr) fail(std::string(name) + " is null (batch + 1 int32 offsets are needed)");
  if (cu[0] != 0) fail(std::string(name) + "[0] must be 0, got " + std::to_string(cu[0]));
  index_t longest = 0;
  for (index_t b = 0; b < batch; ++b) {
    if (cu[b + 1] < cu[b])
      fail(std::string(name) + " must not decrease: " + name + "[" + std::to_string(b) + "] = " + std::to_string(cu[b]) +
           " > " + name + "[" + std::to_string(b + 1) + "] = " + std::to_string(cu[b + 1]));
    longest = std::max<index_t>(longest, cu[b + 1] - cu[b]);
  }
  if (cu[batch] != total)
    fail(std::string(name) + "[batch = " + std::to_string(batch) + "] = " + std::to_string(cu[batch]) + " must be " +
         total_what + " (" + std::to_string(total) + ")");
  return longest;
}

// The checks both directions make on the offsets (q: the packed queries, k: the packed keys), writing
// the longest sequences' lengths into `lengths`.
template <class T>
void check_packed_batch(const TensorView<const T>& q, const TensorView<const T>& k, const PackedBatch& seqs,
                        PackedLengths& lengths) {
  if (q.batch != 1)
    fail("packed tensors hold every sequence in one batch entry (packed(data, total, heads, dim)): got " +
         describe("q", q));
  if (seqs.batch < 0) fail("seqs.batch must be >= 0, got " + std::to_string(seqs.batch));
  lengths.batch = seqs.batch;
  lengths.cu_q = seqs.cu_seqlens_q;
  lengths.cu_k = seqs.cu_seqlens_k;
  lengths.max_q = check_cu_seqlens("cu_seqlens_q", seqs.cu_seqlens_q, seqs.batch, q.seq, "q's total rows");
  lengths.max_k = check_cu_seqlens("cu_seqlens_k", seqs.cu_seqlens_k, seqs.batch, k.seq, "k's total rows");
}

}  // namespace detail

template <class T>
ForwardParams<T, PackedKv<T>, PackedLengths> make_varlen_forward_params(const TensorView<const T>& q,
                                                                         const TensorView<const T>& k,
                                                                         const TensorView<const T>& v,
                                                                         const TensorView<T>& o,
                                                                         const PackedBatch& seqs, const LseView& lse,
                                                                         const AttentionOptions& opts) {
  detail::check_forward_views(q, k, v, o, lse);
  PackedLengths lengths;
  detail::check_packed_batch(q, k, seqs, lengths);
  detail::check_outputs_apart("cu_seqlens_q", detail::int32_span(seqs.cu_seqlens_q, seqs.batch + 1), o, lse);
  detail::check_outputs_apart("cu_seqlens_k", detail::int32_span(seqs.cu_seqlens_k, seqs.batch + 1), o, lse);
  ForwardParams<T, PackedKv<T>, PackedLengths> p;
  p.q = q;
  p.k = PackedKv<T>{k, seqs.cu_seqlens_k};
  p.v = PackedKv<T>{v, seqs.cu_seqlens_k};
  p.o = o;
  p.lse = lse;
  p.seqs = lengths;
  p.scale = detail::resolve_scale(opts, q.dim);
  p.group = q.heads / k.heads;
  return p;
}

template <class Context, class T, class Accounting = NoAccounting, class = detail::if_context<Context>>
void attention_forward_varlen(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                              detail::nondeduced<TensorView<const T>> k, detail::nondeduced<TensorView<const T>> v,
                              TensorView<T> o, const PackedBatch& seqs, const AttentionOptions& options = {},
                              LseView lse = {}, Accounting&& acct = Accounting{}) {
  if constexpr (detail::check_element_type<T>::value) {
    const auto p = make_varlen_forward_params<T>(q, k, v, o, seqs, lse, options);
    validate_context(ctx, p.head_dim(), p.value_dim());
    if (p.batch() == 0 || p.seqs.total_q() == 0) return;
    dispatch_forward(ctx, p, options, acct);
  }
}

template <class T, class Accounting = NoAccounting>
void attention_forward_varlen(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                              detail::nondeduced<TensorView<const T>> v, TensorView<T> o, const PackedBatch& seqs,
                              const AttentionOptions& options = {}, LseView lse = {}, Accounting&& acct = Accounting{}) {
  attention_forward_varlen<cpu::Context<>, T>(cpu::Context<>{}, q, k, v, o, seqs, options, lse,
                                              std::forward<Accounting>(acct));
}

// A packed backward: the gradients of attention_forward_varlen's output.
template <class T>
BackwardParams<T, PackedLengths> make_varlen_backward_params(
    const TensorView<const T>& q, const TensorView<const T>& k, const TensorView<const T>& v,
    const TensorView<const T>& o, const TensorView<const T>& d_o, const LseView& lse, const TensorView<T>& dq,
    const TensorView<T>& dk, const TensorView<T>& dv, const PackedBatch& seqs, const AttentionOptions& opts,
    const BackwardExtras& extras = {}) {
  detail::check_backward_views(q, k, v, o, d_o, lse, dq, dk, dv);
  detail::check_backward_extras(extras, false, BiasInPolicy{}, q, k, v, o, d_o, lse, dq, dk, dv);
  PackedLengths lengths;
  detail::check_packed_batch(q, k, seqs, lengths);
  // The programs read the offsets while they write the gradients.
  const std::pair<const char*, detail::ByteSpan> offsets[] = {
      {"cu_seqlens_q", detail::int32_span(seqs.cu_seqlens_q, seqs.batch + 1)},
      {"cu_seqlens_k", detail::int32_span(seqs.cu_seqlens_k, seqs.batch + 1)}};
  const std::pair<const char*, TensorView<T>> outputs[] = {{"dq", dq}, {"dk", dk}, {"dv", dv}};
  for (const auto& [out_name, out] : outputs) {
    const detail::ByteSpan out_span = detail::check_view(out_name, out);
    for (const auto& [name, span] : offsets)
      if (out_span.overlaps(span)) detail::fail(detail::overlap(out_name, out_span, "argument", name, span));
  }
  return BackwardParams<T, PackedLengths>{
      q,       k, v, o, d_o, lse, dq, dk, dv, lengths, detail::resolve_scale(opts, q.dim), q.heads / k.heads,
      extras.d_lse, nullptr};
}

template <class Context, class T, class = detail::if_context<Context>>
void attention_backward_varlen(const Context& ctx, detail::nondeduced<TensorView<const T>> q,
                               detail::nondeduced<TensorView<const T>> k, detail::nondeduced<TensorView<const T>> v,
                               detail::nondeduced<TensorView<const T>> o, detail::nondeduced<TensorView<const T>> d_o,
                               LseView lse, TensorView<T> dq, detail::nondeduced<TensorView<T>> dk,
                               detail::nondeduced<TensorView<T>> dv, const PackedBatch& seqs,
                               const AttentionOptions& options = {}, const BackwardExtras& extras = {}) {
  if constexpr (detail::check_element_type<T>::value) {
    const auto p = make_varlen_backward_params<T>(q, k, v, o, d_o, lse, dq, dk, dv, seqs, options, extras);
    validate_context(ctx, p.q.dim, p.v.dim);
    if (p.batch() == 0) return;
    dispatch_backward(ctx, p, options);
  }
}

template <class T>
void attention_backward_varlen(detail::nondeduced<TensorView<const T>> q, detail::nondeduced<TensorView<const T>> k,
                               detail::nondeduced<TensorView<const T>> v, detail::nondeduced<TensorView<const T>> o,
                               detail::nondeduced<TensorView<const T>> d_o, LseView lse, TensorView<T> dq,
                               detail::nondeduced<TensorView<T>> dk, detail::nondeduced<TensorView<T>> dv,
                               const PackedBatch& seqs, const AttentionOptions& options = {},
                               const BackwardExtras& extras = {}) {
  attention_backward_varlen<cpu::Context<>, T>(cpu::Context<>{}, q, k, v, o, d_o, lse, dq, dk, dv, seqs, options,
                                               extras);
}

}  // namespace flashattn
