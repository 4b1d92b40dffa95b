#pragma once
// Math for score functors, the same operations whether a backend calls the functor on one score or on a
// packet of them (core/lanes.hpp). A functor that wants to be evaluated on packets writes flashattn::tanh(s),
// flashattn::abs(x), flashattn::min / max / select: on a float or double they are the scalar functions
// below, on Lanes the same functions lane by lane, in a form a compiler turns into vector code (no
// branches, no library calls for float). Plain C++, no intrinsics: a CUDA backend can take the same calls.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "flashattn/core/lanes.hpp"

namespace flashattn {

namespace detail {

// 2^f for f in [0, 1]: a degree-6 polynomial fitted for least maximum relative error, with the constant
// term fixed at 1 so that p(0) = 1 exactly (2^n for integer n stays exact). Its approximation error is 2e-9,
// below half an ulp of float; with the rounding of Horner's steps and of f itself (f = x - floor(x) rounds
// for x in (-1, 0)), tests/test_simd.cpp measures 2^x within 0.62 epsilon on its grid of [-126, 0].
// Reducing x by its floor rather than to the nearest integer lets AVX-512 do the whole reduction in one
// instruction (vreduceps) and the scaling by 2^floor(x) in another (vscalefps), and costs one FMA less
// than the degree-7 Taylor form on [-0.5, 0.5] it replaces.
template <class V, class Fma, class Set1>
inline V exp2_poly(V f, Fma fma, Set1 set1) {
  V p = set1(2.161291486e-4f);
  p = fma(p, f, set1(1.246784581e-3f));
  p = fma(p, f, set1(9.675451554e-3f));
  p = fma(p, f, set1(5.548528209e-2f));
  p = fma(p, f, set1(2.402293086e-1f));
  p = fma(p, f, set1(6.931470633e-1f));
  p = fma(p, f, set1(1.0f));
  return p;
}

// The bits of a float and back.
// (GCC and Clang's __builtin_bit_cast, std::bit_cast before C++20: a memcpy through memory
// keeps GCC 12 from vectorising the loops these are used in.)
inline std::uint32_t float_bits(float x) {
#if defined(__GNUC__)
  return __builtin_bit_cast(std::uint32_t, x);
#else
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}
inline float bits_float(std::uint32_t b) {
#if defined(__GNUC__)
  return __builtin_bit_cast(float, b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// a where c, else b, chosen by bits. Written so because a compiler keeps `c ? a : b` on floats as a branch
// when a or b is an FP operation (under the default trapping-math rules it may not compute both), and a
// branch stops a loop over lanes from becoming vector code.
inline float select_bits(bool c, float a, float b) {
  return bits_float(c ? float_bits(a) : float_bits(b));
}

// Scalar float 2^x for x <= 0 (the softmax only exponentiates score - running max). Branch-free so that
// loops over it vectorise; exactly 0 below -126 (and for -inf), NaN stays NaN.
inline float exp2_nonpositive(float x) {
  const float magic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits
  const float t = x + magic;
  const std::uint32_t t_bits = float_bits(t);
  // floor(x): the nearest integer, one less where that lies above x.
  const bool above = std::isgreater(t - magic, x);  // quiet comparisons (no FP exception) throughout:
                                                    // a compiler turns only those into vector selects
  const float n = (t - magic) - select_bits(above, 1.0f, 0.0f);
  const float f = x - n;
  const std::uint32_t magic_bits = float_bits(magic);
  // 2^n built from its exponent bits; unsigned arithmetic, so a garbage n (x NaN) is defined behaviour.
  const std::uint32_t scale_bits = (t_bits - magic_bits - (above ? 1u : 0u) + 127u) << 23;
  const float scale = bits_float(scale_bits);
  const float p = exp2_poly(
      f, [](float a, float b, float c) { return a * b + c; }, [](float a) { return a; });
  return select_bits(std::isless(x, -126.0f), 0.0f, p * scale);
}


// tanh for float without a library call, so that loops over it vectorise: for |x| <= 1.5 the [7/6] Padé
// approximant of Lambert's continued fraction (its own error below 4e-10 there), beyond it
// (1 − e)/(1 + e) with e = 2^(−2|x|·log2 e) <= 0.05, where neither form cancels; one division for both;
// the sign restored last.
// tests/test_score_variants.cpp measures it against std::tanh.
// |x| <= 1.5: the Padé form alone (what tanh_float computes there, the same operations).
inline float tanh_float_near(float x) {
  const std::uint32_t sign = float_bits(x) & 0x80000000u;
  const float a = bits_float(float_bits(x) & 0x7fffffffu);
  const float a2 = a * a;
  const float t = (a * (135135.0f + a2 * (17325.0f + a2 * (378.0f + a2)))) /
                  (135135.0f + a2 * (62370.0f + a2 * (3150.0f + a2 * 28.0f)));
  return bits_float(float_bits(t) | sign);
}

inline float tanh_float(float x) {
  const std::uint32_t sign = float_bits(x) & 0x80000000u;
  const float a = bits_float(float_bits(x) & 0x7fffffffu);
  const float a2 = a * a;
  // Both forms as fractions, chosen before the one division.
  const float pade_num = a * (135135.0f + a2 * (17325.0f + a2 * (378.0f + a2)));
  const float pade_den = 135135.0f + a2 * (62370.0f + a2 * (3150.0f + a2 * 28.0f));
  const float e = exp2_nonpositive(-2.88539008f * a);  // 2·log2(e)
  const bool near = std::islessequal(a, 1.5f);        // NaN takes the far form, which stays NaN
  const float t = select_bits(near, pade_num, 1.0f - e) / select_bits(near, pade_den, 1.0f + e);
  return bits_float(float_bits(t) | sign);            // t >= 0: the sign of x, -0 included
}

}  // namespace detail

// ---- Scalars -------------------------------------------------------------------------------------------------

inline float tanh(float x) { return detail::tanh_float(x); }
inline double tanh(double x) { return std::tanh(x); }  // double is the accuracy reference, not a speed path
inline long double tanh(long double x) { return std::tanh(x); }

template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
T abs(T x) {
  if constexpr (std::is_floating_point_v<T>) return std::fabs(x);  // -0 and NaN lose the sign, as in lanes
  else return x < T(0) ? -x : x;
}
template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
T min(T a, T b) {
  return b < a ? b : a;
}
template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
T select(bool c, T a, T b) {
  return c ? a : b;
}

// ---- Lanes: the same, lane by lane -----------------------------------------------------------------------------

template <class T, int W>
Lanes<T, W> tanh(const Lanes<T, W>& x) {
  return x.map([](T v) { return flashattn::tanh(v); });
}
// Float lanes that are all within the Padé form's range (soft-capped scores mostly are: |s| well below the
// cap) skip the exponential: the same bits, about half the instructions.
template <int W>
Lanes<float, W> tanh(const Lanes<float, W>& x) {
  // The largest |x| by its bits: for non-negative floats integer order is float order, and NaN's bits
  // exceed every finite value's (an integer maximum is what compilers vectorise here).
  std::uint32_t largest = 0;
  for (int l = 0; l < W; ++l) {
    const std::uint32_t magnitude = detail::float_bits(x.v[l]) & 0x7fffffffu;
    largest = largest > magnitude ? largest : magnitude;
  }
  if (largest <= detail::float_bits(1.5f)) return x.map([](float v) { return detail::tanh_float_near(v); });
  return x.map([](float v) { return detail::tanh_float(v); });
}
template <class T, int W>
Lanes<T, W> abs(const Lanes<T, W>& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x.map([](float v) { return detail::bits_float(detail::float_bits(v) & 0x7fffffffu); });
  } else {
    return x.map([](T v) { return flashattn::abs(v); });
  }
}
template <int W>
Lanes<std::int64_t, W> abs(const Positions<W>& p) {
  return flashattn::abs(p.lanes());
}

template <class T, int W>
Lanes<T, W> min(const Lanes<T, W>& a, const Lanes<T, W>& b) {
  Lanes<T, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = flashattn::min(a.v[l], b.v[l]);
  return r;
}
template <class T, int W>
Lanes<T, W> max(const Lanes<T, W>& a, const Lanes<T, W>& b) {
  Lanes<T, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = flashattn::max(a.v[l], b.v[l]);
  return r;
}
template <class T, int W>
Lanes<T, W> select(const Lanes<bool, W>& c, const Lanes<T, W>& a, const Lanes<T, W>& b) {
  Lanes<T, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = c.v[l] ? a.v[l] : b.v[l];
  return r;
}

}  // namespace flashattn
