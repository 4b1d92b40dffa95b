#pragma once
// The packet layer: the few vector operations the tile ops need (load, store, broadcast, fma, max,
// exp2), one specialisation per (accumulator type, instruction set). The kernels are written once against
// this interface, as Eigen's evaluators are written against pmul/padd/pexp; adding an instruction set is
// adding a specialisation here.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "flashattn/core/score_math.hpp"
#include "flashattn/cpu/isa.hpp"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// Register blocks (the micro-kernels' accumulators, the softmax's groups of packets) live in small arrays
// indexed by compile-time loops; unrolling those loops is what puts them in registers. GCC unrolls them on
// its own only at -O3, so the loops ask for it (at -O2 the micro-kernels otherwise run at a third of their
// speed).
#if defined(__clang__)
#define FLASHATTN_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define FLASHATTN_UNROLL _Pragma("GCC unroll 16")
#else
#define FLASHATTN_UNROLL
#endif

namespace flashattn::cpu {

namespace detail {
// The scalar 2^x and its polynomial live in core/score_math.hpp (score functors use them too); the packet
// forms below reuse the polynomial.
using flashattn::detail::exp2_nonpositive;
using flashattn::detail::exp2_poly;
}  // namespace detail

template <class Acc, Isa isa>
struct Simd;

// One lane: the reference implementation every other path must agree with, and the fallback on CPUs
// without a specialisation.
template <class Acc>
struct Simd<Acc, Isa::Portable> {
  using Reg = Acc;
  static constexpr int width = 1;
  static Reg load(const Acc* p) { return *p; }
  static void store(Acc* p, Reg v) { *p = v; }
  static Reg set1(Acc a) { return a; }
  static Reg zero() { return Acc(0); }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg sub(Reg a, Reg b) { return a - b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg fma(Reg a, Reg b, Reg c) { return a * b + c; }
  // As vmaxps/vmaxpd: b unless a > b, so a NaN in either operand gives b (the x86 paths agree lane by lane).
  static Reg max(Reg a, Reg b) { return a > b ? a : b; }
  static Reg exp2_nonpositive(Reg x) {
    if constexpr (std::is_same_v<Acc, float>) {
      return detail::exp2_nonpositive(x);
    } else {
      return std::exp2(x);
    }
  }
};

// Double lanes beyond the portable path reuse std::exp2 lane by lane: double is the accuracy reference,
// not a speed target.
template <class Simd>
inline typename Simd::Reg exp2_lanewise(typename Simd::Reg x) {
  alignas(64) double lanes[Simd::width];
  Simd::store(lanes, x);
  for (double& lane : lanes) lane = std::exp2(lane);
  return Simd::load(lanes);
}

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Simd<float, Isa::Avx2> {
  using Reg = __m256;
  static constexpr int width = 8;
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg set1(float a) { return _mm256_set1_ps(a); }
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  // max_ps returns its second operand when either is NaN: `a` is the running value, so NaN in `b` wins.
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg exp2_nonpositive(Reg x) {
    const Reg n = _mm256_floor_ps(x);
    const Reg f = _mm256_sub_ps(x, n);
    const Reg p = detail::exp2_poly(f, fma, set1);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const Reg r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    // Ordered compare: false for NaN, so NaN passes through.
    const Reg underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
    return _mm256_andnot_ps(underflow, r);
  }
};

template <>
struct Simd<double, Isa::Avx2> {
  using Reg = __m256d;
  static constexpr int width = 4;
  static Reg load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, Reg v) { _mm256_storeu_pd(p, v); }
  static Reg set1(double a) { return _mm256_set1_pd(a); }
  static Reg zero() { return _mm256_setzero_pd(); }
  static Reg add(Reg a, Reg b) { return _mm256_add_pd(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_pd(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_pd(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_pd(a, b, c); }
  static Reg max(Reg a, Reg b) { return _mm256_max_pd(a, b); }
  static Reg exp2_nonpositive(Reg x) { return exp2_lanewise<Simd>(x); }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
// GCC 12 implements some unmasked AVX-512 intrinsics with an _mm512_undefined_ps() pass-through that it
// then reports as maybe-uninitialized in the caller (GCC bug 105593). The all-lanes masked forms below
// (mask 0xFFFF, pass-through = a defined operand) compile to the same instructions without the warning.
template <>
struct Simd<float, Isa::Avx512> {
  using Reg = __m512;
  static constexpr int width = 16;
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg set1(float a) { return _mm512_set1_ps(a); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg max(Reg a, Reg b) { return _mm512_mask_max_ps(a, 0xFFFF, a, b); }
  // 2^x = 2^f · 2^floor(x): vreduceps gives f = x - floor(x) in one instruction and vscalefps multiplies by
  // 2^floor(x) with exact IEEE handling; for x = -inf vreduceps gives 0 and vscalefps 1 · 2^-inf = +0, and
  // NaN passes through both. Results below 2^-126 are flushed to 0 by the zero-masking of vscalefps, as
  // the other paths do: a subnormal probability changes no sum it joins (the row's largest term is 1),
  // but on Intel cores each one costs a microcode assist where it is made and again in the GEMM that
  // reads it (ALiBi without a mask, whose far scores are all below it, ran 3x slower on a Xeon).
  static Reg exp2_nonpositive(Reg x) {
    const Reg f = _mm512_mask_reduce_ps(x, 0xFFFF, x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const Reg p = detail::exp2_poly(f, fma, set1);
    const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);  // NaN: kept
    return _mm512_maskz_scalef_ps(normal, p, x);
  }
};

template <>
struct Simd<double, Isa::Avx512> {
  using Reg = __m512d;
  static constexpr int width = 8;
  static Reg load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, Reg v) { _mm512_storeu_pd(p, v); }
  static Reg set1(double a) { return _mm512_set1_pd(a); }
  static Reg zero() { return _mm512_setzero_pd(); }
  static Reg add(Reg a, Reg b) { return _mm512_add_pd(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_pd(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_pd(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_pd(a, b, c); }
  static Reg max(Reg a, Reg b) { return _mm512_mask_max_pd(a, 0xFF, a, b); }
  static Reg exp2_nonpositive(Reg x) { return exp2_lanewise<Simd>(x); }
};

// Same packets; the bf16 dot products live in the bf16 tile ops.
template <class Acc>
struct Simd<Acc, Isa::Avx512Bf16> : Simd<Acc, Isa::Avx512> {};
template <class Acc>
struct Simd<Acc, Isa::Amx> : Simd<Acc, Isa::Avx512> {};
#endif

}  // namespace flashattn::cpu
