#pragma once
// The checks that every public call's validation is made of (forward_validate.hpp, backward_validate.hpp):
// views' extents, strides and memory spans, aliasing, and the resolved scale. Each throws InvalidArgument
// with a message that names the argument and the offending values. Nothing here depends on a backend.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "flashattn/core/errors.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn {

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

// The views every call reads, q, k and v, checked (check_view); their memory spans in that order.
template <class T>
std::array<ByteSpan, 3> check_inputs(const TensorView<const T>& q, const TensorView<const T>& k,
                                     const TensorView<const T>& v) {
  return {check_view("q", q), check_view("k", k), check_view("v", v)};
}

// An LSE view's memory (already checked by the call's validation): empty for an empty view.
inline ByteSpan lse_span(const LseView& l) {
  return checked_span<3>([&] { return describe(l); }, l.data, sizeof(float), {l.batch, l.heads, l.seq},
                         {l.stride_batch, l.stride_head, l.stride_seq}, {"batch", "heads", "seq"});
}

inline std::string sizes(index_t a, index_t b) { return std::to_string(a) + " vs " + std::to_string(b); }

// "out overlaps the memory of input q: out spans bytes [0x.., 0x..), q spans [0x.., 0x..)".
inline std::string overlap(const char* out, const ByteSpan& a, const char* role, const char* in, const ByteSpan& b) {
  std::ostringstream s;
  s << out << " overlaps the memory of " << role << " " << in << ": " << out << " spans bytes [0x" << std::hex
    << a.begin << ", 0x" << a.end << "), " << in << " spans [0x" << b.begin << ", 0x" << b.end << ")";
  return s.str();
}

// The scale every backend uses: options.scale, or 1/sqrt(head_dim) when unset (SDPA's default).
inline double resolve_scale(const AttentionOptions& opts, index_t head_dim) {
  double scale = 1.0 / std::sqrt(double(head_dim));
  if (opts.scale) {
    scale = *opts.scale;
    if (!std::isfinite(scale) || scale <= 0.0)
      fail("options.scale must be finite and > 0, got " + std::to_string(scale));
  }
  return scale;
}

}  // namespace detail

}  // namespace flashattn
