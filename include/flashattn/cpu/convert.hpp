#pragma once
// Loading storage types into accumulator types, a row at a time: the staging step of the kernels for
// 16-bit and strided inputs. Vectorised for the common case (unit stride): bf16 -> fp32 is a 16-bit
// shift, fp16 -> fp32 is F16C's vcvtph2ps. Knows Eigen's 16-bit types by name only (forward declared),
// so nothing here includes Eigen.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "flashattn/cpu/simd.hpp"
#include "flashattn/core/views.hpp"

namespace Eigen {
struct half;
struct bfloat16;
}  // namespace Eigen

namespace flashattn::cpu {

template <class T>
inline constexpr bool is_bf16 = std::is_same_v<std::remove_cv_t<T>, Eigen::bfloat16>;
template <class T>
inline constexpr bool is_fp16 = std::is_same_v<std::remove_cv_t<T>, Eigen::half>;

#if defined(__AVX512F__)
namespace detail {
// 16 consecutive fp32, fp16 or bf16 elements widened to fp32 lanes: the one widening of 16-bit storage
// on AVX-512 (load_row below, and the converting transposes of transpose.hpp). The all-lanes maskz forms:
// GCC 12 flags the unmasked ones' undefined pass-through as uninitialised (simd.hpp).
template <class E>
__m512 load_packet(const E* p) {
  if constexpr (std::is_same_v<std::remove_cv_t<E>, float>) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (is_fp16<E>) return _mm512_maskz_cvtph_ps(0xFFFF, h);
    // bf16 is the upper half of an fp32: widening is a shift.
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
  }
}
}  // namespace detail
#endif

// dst[0 .. n) = Acc(src[0], src[stride], ..., src[(n - 1) * stride]) · scale.
template <class Acc, class T>
inline void load_row(Acc* dst, const T* src, index_t stride, int n, Acc scale = Acc(1)) {
  if constexpr (std::is_same_v<Acc, std::remove_cv_t<T>>) {
    if (stride == 1 && scale == Acc(1)) {  // a plain copy (K/V tiles kept by staged_tile_cache.hpp)
      std::memcpy(dst, src, sizeof(Acc) * std::size_t(n));
      return;
    }
  }
  int c = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (std::is_same_v<Acc, float> && (is_bf16<T> || is_fp16<T>)) {
    if (stride == 1) {
      const __m512 s = _mm512_set1_ps(scale);
      for (; c + 16 <= n; c += 16) _mm512_storeu_ps(dst + c, _mm512_mul_ps(detail::load_packet(src + c), s));
    }
  }
#endif
  for (; c < n; ++c) dst[c] = static_cast<Acc>(static_cast<Acc>(src[c * stride]) * scale);
}

}  // namespace flashattn::cpu
