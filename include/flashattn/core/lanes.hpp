#pragma once
// Lanes<T, W>: W values of T operated on together, what a backend passes to a score functor that may be
// evaluated on packets (variants.hpp's lane_scores). A functor written generically,
//   [](auto i, auto j, auto s) { using S = decltype(s); return s - S(slope) * S(flashattn::abs(i - j)); }
// runs unchanged on one score (i, j: index_t, s: float) and on a row of a score tile (one of i, j the
// Positions of consecutive queries or keys, s a Lanes<float, W>), computing in each lane what it computes
// on one score: every operator is the scalar operator applied per lane, written as a plain loop that
// compilers turn into vector instructions. (The same bits, unless the compiler fuses a·b + c into an FMA
// in one form and not the other: -ffp-contract=off rules that out.) Integer lanes keep integer semantics (i / c and i % c are what they are on index_t).
// What has no lane form does not compile: a branch on a Lanes comparison (use flashattn::select), or a
// library function (use score_math.hpp's). Plain C++, no intrinsics.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

namespace flashattn {

template <int W>
struct Positions;

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

  // Positions converted: for a floating T, base + step·lane in T itself where every value is an exact
  // integer of T (one broadcast and one multiply-add, the same values as converting each position);
  // otherwise lane by lane.
  explicit Lanes(const Positions<W>& p);

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


// Positions<W>: W positions in arithmetic progression, base + step·lane, which is what a row of a score
// tile holds (consecutive queries or keys). A backend passes them to a lane-evaluated functor instead of
// Lanes<index_t, W>: adding or subtracting an integer, negating and scaling by an integer keep the
// progression, and converting it to float lanes is one multiply-add (64-bit lanes, which compilers
// assemble lane by lane, are never built); anything else converts it to Lanes<index_t, W> first, so
// every operation means what it means on one index.
template <int W>
struct Positions {
  std::int64_t base = 0, step = 1;

  Lanes<std::int64_t, W> lanes() const {
    Lanes<std::int64_t, W> r;
    for (int l = 0; l < W; ++l) r.v[l] = base + step * std::int64_t(l);
    return r;
  }
  operator Lanes<std::int64_t, W>() const { return lanes(); }
};

template <class T, int W>
Lanes<T, W>::Lanes(const Positions<W>& p) {
  if constexpr (std::is_floating_point_v<T>) {
    constexpr std::int64_t exact = std::int64_t(1) << (std::numeric_limits<T>::digits - 1);
    const std::int64_t last = p.base + p.step * std::int64_t(W - 1);
    const auto magnitude = [](std::int64_t x) { return x < 0 ? -x : x; };
    if (magnitude(p.base) < exact && magnitude(last) < exact && magnitude(p.step) < exact / W) {
      // base + step·l: exact integers of T, an exact sum, whether or not it is fused.
      const T b = T(p.base), st = T(p.step);
      for (int l = 0; l < W; ++l) v[l] = b + st * kSteps[std::size_t(l)];
      return;
    }
  }
  for (int l = 0; l < W; ++l) v[l] = T(p.base + p.step * std::int64_t(l));
}

template <class X>
struct is_positions : std::false_type {};
template <int W>
struct is_positions<Positions<W>> : std::true_type {};

// The progression kept.
template <int W, class U, class = std::enable_if_t<std::is_integral_v<U>>>
Positions<W> operator+(const Positions<W>& p, U k) {
  return {p.base + std::int64_t(k), p.step};
}
template <int W, class U, class = std::enable_if_t<std::is_integral_v<U>>>
Positions<W> operator+(U k, const Positions<W>& p) {
  return {std::int64_t(k) + p.base, p.step};
}
template <int W, class U, class = std::enable_if_t<std::is_integral_v<U>>>
Positions<W> operator-(const Positions<W>& p, U k) {
  return {p.base - std::int64_t(k), p.step};
}
template <int W, class U, class = std::enable_if_t<std::is_integral_v<U>>>
Positions<W> operator-(U k, const Positions<W>& p) {
  return {std::int64_t(k) - p.base, -p.step};
}
template <int W, class U, class = std::enable_if_t<std::is_integral_v<U>>>
Positions<W> operator*(const Positions<W>& p, U k) {
  return {p.base * std::int64_t(k), p.step * std::int64_t(k)};
}
template <int W, class U, class = std::enable_if_t<std::is_integral_v<U>>>
Positions<W> operator*(U k, const Positions<W>& p) {
  return {std::int64_t(k) * p.base, std::int64_t(k) * p.step};
}
template <int W>
Positions<W> operator+(const Positions<W>& a, const Positions<W>& b) {
  return {a.base + b.base, a.step + b.step};
}
template <int W>
Positions<W> operator-(const Positions<W>& a, const Positions<W>& b) {
  return {a.base - b.base, a.step - b.step};
}
template <int W>
Positions<W> operator-(const Positions<W>& p) {
  return {-p.base, -p.step};
}

// Everything else through Lanes<int64_t, W>: with lanes of another type, with floating-point scalars for
// + − ·, and every other operator.
#define FLASHATTN_POSITIONS_WITH_LANES(op)                                                                 \
  template <int W, class B>                                                                                \
  auto operator op(const Positions<W>& a, const Lanes<B, W>& b) {                                          \
    return a.lanes() op b;                                                                                 \
  }                                                                                                        \
  template <class A, int W>                                                                                \
  auto operator op(const Lanes<A, W>& a, const Positions<W>& b) {                                          \
    return a op b.lanes();                                                                                 \
  }
#define FLASHATTN_POSITIONS_WITH_SCALARS(op, Allowed)                                                      \
  template <int W, class U, class = std::enable_if_t<Allowed<U>>>                                          \
  auto operator op(const Positions<W>& a, U b) {                                                           \
    return a.lanes() op b;                                                                                 \
  }                                                                                                        \
  template <int W, class U, class = std::enable_if_t<Allowed<U>>>                                          \
  auto operator op(U a, const Positions<W>& b) {                                                           \
    return a op b.lanes();                                                                                 \
  }
#define FLASHATTN_POSITIONS_PAIR(op)                                                                       \
  template <int W>                                                                                         \
  auto operator op(const Positions<W>& a, const Positions<W>& b) {                                         \
    return a.lanes() op b.lanes();                                                                         \
  }

namespace detail {
template <class U>
inline constexpr bool floating_scalar_v = std::is_floating_point_v<U>;
template <class U>
inline constexpr bool any_scalar_v = std::is_arithmetic_v<U>;
}  // namespace detail

FLASHATTN_POSITIONS_WITH_LANES(+)
FLASHATTN_POSITIONS_WITH_LANES(-)
FLASHATTN_POSITIONS_WITH_LANES(*)
FLASHATTN_POSITIONS_WITH_LANES(/)
FLASHATTN_POSITIONS_WITH_SCALARS(+, detail::floating_scalar_v)
FLASHATTN_POSITIONS_WITH_SCALARS(-, detail::floating_scalar_v)
FLASHATTN_POSITIONS_WITH_SCALARS(*, detail::floating_scalar_v)
FLASHATTN_POSITIONS_WITH_SCALARS(/, detail::any_scalar_v)
FLASHATTN_POSITIONS_PAIR(*)
FLASHATTN_POSITIONS_PAIR(/)
#define FLASHATTN_POSITIONS_COMPARE(op)  \
  FLASHATTN_POSITIONS_WITH_LANES(op)     \
  FLASHATTN_POSITIONS_WITH_SCALARS(op, detail::any_scalar_v) \
  FLASHATTN_POSITIONS_PAIR(op)
FLASHATTN_POSITIONS_COMPARE(<)
FLASHATTN_POSITIONS_COMPARE(<=)
FLASHATTN_POSITIONS_COMPARE(>)
FLASHATTN_POSITIONS_COMPARE(>=)
FLASHATTN_POSITIONS_COMPARE(==)
FLASHATTN_POSITIONS_COMPARE(!=)
#undef FLASHATTN_POSITIONS_COMPARE
#undef FLASHATTN_POSITIONS_PAIR
#undef FLASHATTN_POSITIONS_WITH_SCALARS
#undef FLASHATTN_POSITIONS_WITH_LANES

template <int W, class U, class = std::enable_if_t<std::is_integral_v<U>>>
Lanes<std::int64_t, W> operator%(const Positions<W>& a, U b) {
  return a.lanes() % b;
}

}  // namespace flashattn
