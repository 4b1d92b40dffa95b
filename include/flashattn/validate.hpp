#pragma once
// Checks every argument of a public call before any work starts, and throws InvalidArgument with a
// message that names the argument and the offending values. Nothing here depends on the backend.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "flashattn/errors.hpp"
#include "flashattn/options.hpp"
#include "flashattn/params.hpp"
#include "flashattn/views.hpp"

namespace flashattn {

// Largest head dim accepted: the per-worker scratch grows as BlockQ·head_dim, and beyond this the tiles no
// longer fit the L2 of current CPUs.
inline constexpr index_t kMaxHeadDim = 512;

namespace detail {

template <class T>
std::string describe(const char* name, const TensorView<T>& x) {
  std::ostringstream s;
  s << name << " (batch=" << x.batch << ", seq=" << x.seq << ", heads=" << x.heads << ", dim=" << x.dim << ")";
  return s.str();
}

inline std::string describe(const LseView& x) {
  std::ostringstream s;
  s << "lse (batch=" << x.batch << ", heads=" << x.heads << ", seq=" << x.seq << ")";
  return s.str();
}

[[noreturn]] inline void fail(const std::string& what) { throw InvalidArgument(what); }

// The memory a view touches: [begin, end) in bytes, end == begin for an empty view.
struct ByteSpan {
  std::uintptr_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
  bool overlaps(const ByteSpan& o) const { return !empty() && !o.empty() && begin < o.end && o.begin < end; }
};

// Extents and strides of a view, checked: no negative size, no negative stride, no 64-bit overflow of
// the largest offset, and no null data behind a non-empty view. Returns the span. `name()` gives the
// view's description for a message; it is called only on failure, so a valid call formats no strings.
template <std::size_t Rank, class Name>
ByteSpan checked_span(const Name& name, const void* data, std::size_t elem_size,
                      const std::array<index_t, Rank>& extent, const std::array<index_t, Rank>& stride,
                      const std::array<const char*, Rank>& dim_names) {
  bool empty = false;
  for (std::size_t r = 0; r < Rank; ++r) {
    if (extent[r] < 0) fail(name() + ": " + dim_names[r] + " must be >= 0, got " + std::to_string(extent[r]));
    if (stride[r] < 0)
      fail(name() + ": negative strides are not supported, got stride " + std::to_string(stride[r]) + " for " +
           dim_names[r]);
    empty = empty || extent[r] == 0;
  }
  if (empty) return {};
  if (data == nullptr) fail(name() + ": data is null but the view is not empty");
  index_t last = 0;  // offset of the last element, in elements
  for (std::size_t r = 0; r < Rank; ++r) {
    index_t term = 0;
    if (__builtin_mul_overflow(extent[r] - 1, stride[r], &term) || __builtin_add_overflow(last, term, &last))
      fail(name() + ": the extent of " + dim_names[r] + " times its stride overflows 64-bit offsets");
  }
  index_t last_byte = 0;
  if (__builtin_mul_overflow(last + 1, index_t(elem_size), &last_byte))
    fail(name() + ": the view spans more bytes than a 64-bit offset holds");
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  return {begin, begin + std::uintptr_t(last_byte)};
}

// An output view must not write one element through two index tuples: with dimensions sorted by stride,
// each stride must step over the whole extent of the previous one.
template <std::size_t Rank>
void check_no_self_overlap(const std::string& name, std::array<index_t, Rank> extent,
                           std::array<index_t, Rank> stride) {
  // An empty view writes nothing, whatever its strides (bshd() of seq 0 gives a batch stride of 0).
  for (std::size_t r = 0; r < Rank; ++r)
    if (extent[r] == 0) return;
  std::array<std::size_t, Rank> order{};
  for (std::size_t r = 0; r < Rank; ++r) order[r] = r;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return stride[a] < stride[b]; });
  index_t covered = 1;  // elements spanned by the dimensions seen so far
  for (std::size_t r : order) {
    if (extent[r] <= 1) continue;
    if (stride[r] < covered)
      fail(name + ": strides make distinct elements share memory (stride " + std::to_string(stride[r]) +
           " < " + std::to_string(covered) + "); an output must not alias itself");
    covered = stride[r] * extent[r];
  }
}

template <class T>
ByteSpan check_view(const char* name, const TensorView<T>& x) {
  return checked_span<4>([&] { return describe(name, x); }, x.data, sizeof(T),
                         {x.batch, x.seq, x.heads, x.dim}, {x.stride_batch, x.stride_seq, x.stride_head, x.stride_dim},
                         {"batch", "seq", "heads", "dim"});
}

inline std::string sizes(index_t a, index_t b) { return std::to_string(a) + " vs " + std::to_string(b); }

// "out overlaps the memory of input q: out spans bytes [0x.., 0x..), q spans [0x.., 0x..)".
inline std::string overlap(const char* out, const ByteSpan& a, const char* role, const char* in, const ByteSpan& b) {
  std::ostringstream s;
  s << out << " overlaps the memory of " << role << " " << in << ": " << out << " spans bytes [0x" << std::hex
    << a.begin << ", 0x" << a.end << "), " << in << " spans [0x" << b.begin << ", 0x" << b.end << ")";
  return s.str();
}

}  // namespace detail

// Validates a forward call and resolves its options into the parameters every backend takes.
template <class T>
ForwardParams<T> make_forward_params(const TensorView<const T>& q, const TensorView<const T>& k,
                                     const TensorView<const T>& v, const TensorView<T>& o, const LseView& lse,
                                     const AttentionOptions& opts) {
  using detail::describe;
  using detail::fail;
  using detail::sizes;
  const detail::ByteSpan q_span = detail::check_view("q", q);
  const detail::ByteSpan k_span = detail::check_view("k", k);
  const detail::ByteSpan v_span = detail::check_view("v", v);
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
  if (q.dim > kMaxHeadDim)
    fail("head dim " + std::to_string(q.dim) + " is larger than the supported maximum " +
         std::to_string(kMaxHeadDim));

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

  double scale = 1.0 / std::sqrt(double(q.dim));
  if (opts.scale) {
    scale = *opts.scale;
    if (!std::isfinite(scale) || scale <= 0.0)
      fail("options.scale must be finite and > 0, got " + std::to_string(scale));
  }
  if (opts.num_threads < 0) fail("options.num_threads must be >= 0, got " + std::to_string(opts.num_threads));

  ForwardParams<T> p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  p.scale = scale;
  p.group = q.heads / k.heads;
  p.num_threads = opts.num_threads;
  return p;
}

}  // namespace flashattn
