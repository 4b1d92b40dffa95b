#pragma once
// Lanes<T, W>: W values of T operated on together, what a backend passes to a score functor that may be
// evaluated on packets (variants.hpp's lane_scores). A functor written generically,
//   [](auto i, auto j, auto s) { using S = decltype(s); return s - S(slope) * S(flashattn::abs(i - j)); }
// runs unchanged on one score (i, j: index_t, s: float) and on a row of a score tile (one of i, j a
// Lanes<index_t, W> of consecutive positions, s a Lanes<float, W>), with the same bits lane by lane:
// every operator is the scalar operator applied per lane, written as a plain loop that compilers turn into
// vector instructions. Integer lanes keep integer semantics (i / c and i % c are what they are on index_t).
// What has no lane form does not compile: a branch on a Lanes comparison (use flashattn::select), or a
// library function (use score_math.hpp's). Plain C++, no intrinsics.

#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

namespace flashattn {

template <class T, int W>
struct Lanes {
  static constexpr int width = W;
  // 0, 1, ..., W − 1 as one constant (written per lane inside iota, GCC assembles it lane by lane).
  static constexpr std::array<T, W> kSteps = [] {
    std::array<T, W> s{};
    for (int l = 0; l < W; ++l) s[std::size_t(l)] = T(l);
    return s;
  }();
  T v[W];

  Lanes() = default;
  // A broadcast: S(2) or S(slope) in a generic functor.
  template <class U, class = std::enable_if_t<std::is_arithmetic_v<U>>>
  explicit Lanes(U x) {
    for (int l = 0; l < W; ++l) v[l] = T(x);
  }
  // A conversion lane by lane: S(i - j) turns index lanes into score lanes as T(i - j) does one index.
  template <class U>
  explicit Lanes(const Lanes<U, W>& x) {
    for (int l = 0; l < W; ++l) v[l] = T(x.v[l]);
  }

  // base, base + 1, ..., base + W − 1: the positions of a tile row.
  static Lanes iota(T base) {
    Lanes r;
    for (int l = 0; l < W; ++l) r.v[l] = kSteps[std::size_t(l)] + base;  // a constant vector plus a broadcast
    return r;
  }
  static Lanes load(const T* p) {
    Lanes r;
    for (int l = 0; l < W; ++l) r.v[l] = p[l];
    return r;
  }
  void store(T* p) const {
    for (int l = 0; l < W; ++l) p[l] = v[l];
  }
  template <class F>
  Lanes map(F&& f) const {
    Lanes r;
    for (int l = 0; l < W; ++l) r.v[l] = f(v[l]);
    return r;
  }
};

template <class X>
struct is_lanes : std::false_type {};
template <class T, int W>
struct is_lanes<Lanes<T, W>> : std::true_type {};

namespace detail {
// The lane type of a binary operation on lanes of A and B: what A op B is in C++ (float op index_t is
// float), so that s * (i - j) means on lanes what it means on scalars.
template <class A, class B, int W>
using lanes_result_t = Lanes<decltype(std::declval<A>() + std::declval<B>()), W>;
}  // namespace detail

#define FLASHATTN_LANES_BINARY(op)                                                                         \
  template <class A, class B, int W>                                                                       \
  detail::lanes_result_t<A, B, W> operator op(const Lanes<A, W>& a, const Lanes<B, W>& b) {               \
    detail::lanes_result_t<A, B, W> r;                                                                     \
    for (int l = 0; l < W; ++l) r.v[l] = a.v[l] op b.v[l];                                                 \
    return r;                                                                                              \
  }                                                                                                        \
  template <class A, class U, int W, class = std::enable_if_t<std::is_arithmetic_v<U>>>                    \
  detail::lanes_result_t<A, U, W> operator op(const Lanes<A, W>& a, U b) {                                 \
    detail::lanes_result_t<A, U, W> r;                                                                     \
    for (int l = 0; l < W; ++l) r.v[l] = a.v[l] op b;                                                      \
    return r;                                                                                              \
  }                                                                                                        \
  template <class U, class B, int W, class = std::enable_if_t<std::is_arithmetic_v<U>>>                    \
  detail::lanes_result_t<U, B, W> operator op(U a, const Lanes<B, W>& b) {                                 \
    detail::lanes_result_t<U, B, W> r;                                                                     \
    for (int l = 0; l < W; ++l) r.v[l] = a op b.v[l];                                                      \
    return r;                                                                                              \
  }

FLASHATTN_LANES_BINARY(+)
FLASHATTN_LANES_BINARY(-)
FLASHATTN_LANES_BINARY(*)
FLASHATTN_LANES_BINARY(/)
#undef FLASHATTN_LANES_BINARY

// Integer lanes only, as on scalars.
template <class A, int W, class U, class = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<U>>>
Lanes<A, W> operator%(const Lanes<A, W>& a, U b) {
  Lanes<A, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = a.v[l] % A(b);
  return r;
}

template <class T, int W>
Lanes<T, W> operator-(const Lanes<T, W>& a) {
  Lanes<T, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = -a.v[l];
  return r;
}

// Comparisons give Lanes<bool, W>, for flashattn::select (score_math.hpp).
#define FLASHATTN_LANES_COMPARE(op)                                                                        \
  template <class A, class B, int W>                                                                       \
  Lanes<bool, W> operator op(const Lanes<A, W>& a, const Lanes<B, W>& b) {                                 \
    Lanes<bool, W> r;                                                                                      \
    for (int l = 0; l < W; ++l) r.v[l] = a.v[l] op b.v[l];                                                 \
    return r;                                                                                              \
  }                                                                                                        \
  template <class A, class U, int W, class = std::enable_if_t<std::is_arithmetic_v<U>>>                    \
  Lanes<bool, W> operator op(const Lanes<A, W>& a, U b) {                                                  \
    Lanes<bool, W> r;                                                                                      \
    for (int l = 0; l < W; ++l) r.v[l] = a.v[l] op b;                                                      \
    return r;                                                                                              \
  }                                                                                                        \
  template <class U, class B, int W, class = std::enable_if_t<std::is_arithmetic_v<U>>>                    \
  Lanes<bool, W> operator op(U a, const Lanes<B, W>& b) {                                                  \
    Lanes<bool, W> r;                                                                                      \
    for (int l = 0; l < W; ++l) r.v[l] = a op b.v[l];                                                      \
    return r;                                                                                              \
  }

FLASHATTN_LANES_COMPARE(<)
FLASHATTN_LANES_COMPARE(<=)
FLASHATTN_LANES_COMPARE(>)
FLASHATTN_LANES_COMPARE(>=)
FLASHATTN_LANES_COMPARE(==)
FLASHATTN_LANES_COMPARE(!=)
#undef FLASHATTN_LANES_COMPARE

}  // namespace flashattn
