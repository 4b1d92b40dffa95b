#pragma once
// Moving a block between the caller's row-major rows and the kernels' transposed layout: Q rows into Qᵀ
// when a program starts, Oᵀ into O rows when it ends. Element by element, each of these costs a few
// cycles per element (a strided store or load for every one), a visible share of a short forward; on
// AVX-512 a 16 × 16 block moves through registers instead (16 loads, 64 shuffles, 16 stores).
// The move converts as it goes when the two sides differ (fp16 or bf16 Q rows into an fp32 Qᵀ, an fp32 Oᵀ
// into fp16 O rows): the block is widened to fp32 as it is loaded and narrowed as it is stored, with the
// same rounding as a scalar conversion (round to nearest even; NaN, infinity and subnormals as Eigen's
// conversions give them), so the bits do not depend on which path moved an element. One exception: a
// signalling fp16 NaN is widened to a quiet one (vcvtph2ps sets the quiet bit; Eigen's scalar widening
// keeps it signalling); it stays a NaN with its sign and payload either way.

#include <cstdint>
#include <type_traits>

#include "flashattn/cpu/convert.hpp"
#include "flashattn/cpu/isa.hpp"
#include "flashattn/core/views.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace flashattn::cpu {

namespace detail {

#if defined(__AVX512F__)
// The all-lanes masked forms of the shuffles: GCC 12 flags the unmasked ones' undefined pass-through as
// uninitialised (GCC bug 105593, as in simd.hpp); same instructions.
inline __m512 unpacklo(__m512 a, __m512 b) { return _mm512_mask_unpacklo_ps(a, 0xFFFF, a, b); }
inline __m512 unpackhi(__m512 a, __m512 b) { return _mm512_mask_unpackhi_ps(a, 0xFFFF, a, b); }
template <int imm>  // within each 128-bit lane: two elements of a, then two of b
__m512 shuffle_ps(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_ps(a, 0xFFFF, a, b, imm);
}
template <int imm>  // 128-bit lanes: two of a, then two of b
__m512 shuffle_lanes(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, imm);
}

// The element types a 16 × 16 block can be loaded from and stored to as fp32 packets.
template <class E>
inline constexpr bool moves_as_packet = std::is_same_v<std::remove_cv_t<E>, float> || is_fp16<E> || is_bf16<E>;

template <class E>
void store_packet(E* p, __m512 x) {
  if constexpr (std::is_same_v<E, float>) {
    _mm512_storeu_ps(p, x);
  } else if constexpr (is_fp16<E>) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtps_ph(0xFFFF, x, _MM_FROUND_TO_NEAREST_INT));
  } else {
    // Eigen's bf16 rounding, lane by lane: round to nearest even on the upper 16 bits (subnormals kept, which
    // vcvtneps2bf16 would flush), and a NaN becomes the quiet NaN of its sign.
    const __m512i u = _mm512_castps_si512(x);
    const __m512i upper = _mm512_maskz_srli_epi32(0xFFFF, u, 16);
    const __m512i lsb = _mm512_and_si512(upper, _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
    __m512i r = _mm512_maskz_srli_epi32(0xFFFF, _mm512_add_epi32(u, bias), 16);
    const __m512i sign = _mm512_and_si512(upper, _mm512_set1_epi32(0x8000));
    const __m512i quiet_nan = _mm512_or_si512(sign, _mm512_set1_epi32(0x7FC0));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), quiet_nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtepi32_epi16(0xFFFF, r));
  }
}

// dst[c * dst_ld + i] = src[i * src_ld + c] for i, c < 16.
template <class S, class D>
void transpose16x16(const S* src, index_t src_ld, D* dst, index_t dst_ld) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = load_packet(src + i * src_ld);
  // Within each 128-bit lane L, for each group of four rows a, b, c, d (rows 4k .. 4k+3):
  // unpack: [a0 b0 a1 b1], [a2 b2 a3 b3], [c0 d0 c1 d1], [c2 d2 c3 d3]; then shuffle: column m of the
  // lane, [a_m b_m c_m d_m], lands in t[4k + m].
  for (int k = 0; k < 4; ++k) {
    const __m512 ab_lo = unpacklo(r[4 * k], r[4 * k + 1]);
    const __m512 ab_hi = unpackhi(r[4 * k], r[4 * k + 1]);
    const __m512 cd_lo = unpacklo(r[4 * k + 2], r[4 * k + 3]);
    const __m512 cd_hi = unpackhi(r[4 * k + 2], r[4 * k + 3]);
    t[4 * k + 0] = shuffle_ps<_MM_SHUFFLE(1, 0, 1, 0)>(ab_lo, cd_lo);
    t[4 * k + 1] = shuffle_ps<_MM_SHUFFLE(3, 2, 3, 2)>(ab_lo, cd_lo);
    t[4 * k + 2] = shuffle_ps<_MM_SHUFFLE(1, 0, 1, 0)>(ab_hi, cd_hi);
    t[4 * k + 3] = shuffle_ps<_MM_SHUFFLE(3, 2, 3, 2)>(ab_hi, cd_hi);
  }
  // Column 4L + m is lane L of t[m], t[4 + m], t[8 + m], t[12 + m] (row groups 0..3), gathered by two
  // rounds of 128-bit lane shuffles.
  for (int m = 0; m < 4; ++m) {
    const __m512 g01_lo = shuffle_lanes<0x44>(t[m], t[4 + m]);       // lanes 0 1 of group 0, of group 1
    const __m512 g01_hi = shuffle_lanes<0xEE>(t[m], t[4 + m]);       // lanes 2 3 of group 0, of group 1
    const __m512 g23_lo = shuffle_lanes<0x44>(t[8 + m], t[12 + m]);  // the same for groups 2 and 3
    const __m512 g23_hi = shuffle_lanes<0xEE>(t[8 + m], t[12 + m]);
    store_packet(dst + (0 + m) * dst_ld, shuffle_lanes<0x88>(g01_lo, g23_lo));
    store_packet(dst + (4 + m) * dst_ld, shuffle_lanes<0xDD>(g01_lo, g23_lo));
    store_packet(dst + (8 + m) * dst_ld, shuffle_lanes<0x88>(g01_hi, g23_hi));
    store_packet(dst + (12 + m) * dst_ld, shuffle_lanes<0xDD>(g01_hi, g23_hi));
  }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 32 × 32 blocks of 16-bit elements (bf16 bits), moved as they are, no conversion:
// dst[c * dst_ld + i] = rows[i][col0 + c] for i, c < 32, where rows i >= `rows_n` read as zero rows and
// columns c >= `cols_n` as zeros (and are not read), so that a block at the edge of a tile comes out zero-padded.
// Five rounds of in-lane and lane-crossing shuffles (160 for 1024 elements) instead of 1024 strided
// stores: the AMX kernels stage V transposed this way (tile_ops_amx.hpp).
inline void transpose32x32_u16(const std::uint16_t* const* rows, index_t col0, int rows_n, int cols_n,
                               std::uint16_t* dst, index_t dst_ld) {
  const __mmask32 cols_mask = cols_n >= 32 ? ~__mmask32(0) : ((__mmask32(1) << cols_n) - 1);
  __m512i r[32], t[32];
  for (int i = 0; i < 32; ++i)
    r[i] = i < rows_n ? _mm512_maskz_loadu_epi16(cols_mask, rows[i] + col0) : _mm512_setzero_si512();
  // Within each 128-bit lane (8 columns): for each group g of 8 rows a..h, three rounds of unpacks leave
  // column m of the lane, [a_m .. h_m], in t[8g + m].
  for (int g = 0; g < 4; ++g) {
    __m512i* x = r + 8 * g;
    __m512i u[8], w[8];
    for (int k = 0; k < 4; ++k) {  // rows 2k, 2k+1: [a0 b0 a1 b1 a2 b2 a3 b3], [a4 b4 .. a7 b7]
      u[2 * k] = _mm512_unpacklo_epi16(x[2 * k], x[2 * k + 1]);
      u[2 * k + 1] = _mm512_unpackhi_epi16(x[2 * k], x[2 * k + 1]);
    }
    for (int k = 0; k < 2; ++k)  // rows 4k .. 4k+3: columns (0,1), (2,3), (4,5), (6,7) as 4-row units
      for (int half = 0; half < 2; ++half) {
        const __m512i lo = u[4 * k + half], hi = u[4 * k + 2 + half];
        w[4 * k + 2 * half] = _mm512_unpacklo_epi32(lo, hi);
        w[4 * k + 2 * half + 1] = _mm512_unpackhi_epi32(lo, hi);
      }
    for (int m2 = 0; m2 < 4; ++m2) {  // 8-row columns 2·m2 and 2·m2 + 1
      t[8 * g + 2 * m2] = _mm512_unpacklo_epi64(w[m2], w[4 + m2]);
      t[8 * g + 2 * m2 + 1] = _mm512_unpackhi_epi64(w[m2], w[4 + m2]);
    }
  }
  // Column 8L + m is lane L of t[m], t[8 + m], t[16 + m], t[24 + m] (row groups 0..3): two rounds of
  // 128-bit lane shuffles, as in transpose16x16.
  for (int m = 0; m < 8; ++m) {
    const __m512i g01_lo = _mm512_shuffle_i32x4(t[m], t[8 + m], 0x44);
    const __m512i g01_hi = _mm512_shuffle_i32x4(t[m], t[8 + m], 0xEE);
    const __m512i g23_lo = _mm512_shuffle_i32x4(t[16 + m], t[24 + m], 0x44);
    const __m512i g23_hi = _mm512_shuffle_i32x4(t[16 + m], t[24 + m], 0xEE);
    _mm512_storeu_si512(dst + (0 + m) * dst_ld, _mm512_shuffle_i32x4(g01_lo, g23_lo, 0x88));
    _mm512_storeu_si512(dst + (8 + m) * dst_ld, _mm512_shuffle_i32x4(g01_lo, g23_lo, 0xDD));
    _mm512_storeu_si512(dst + (16 + m) * dst_ld, _mm512_shuffle_i32x4(g01_hi, g23_hi, 0x88));
    _mm512_storeu_si512(dst + (24 + m) * dst_ld, _mm512_shuffle_i32x4(g01_hi, g23_hi, 0xDD));
  }
}
#endif

}  // namespace detail

// dst[c * dst_ld + i] = D(src[i * src_ld + c]) for i < rows, c < cols.
template <Isa isa, class S, class D>
void transpose(const S* src, index_t src_ld, D* dst, index_t dst_ld, int rows, int cols) {
  int rows_done = 0, cols_done = 0;  // the corner moved in 16 x 16 blocks
#if defined(__AVX512F__)
  if constexpr (is_avx512(isa) && detail::moves_as_packet<S> && detail::moves_as_packet<D>) {
    rows_done = rows / 16 * 16;
    cols_done = cols / 16 * 16;
    for (int i0 = 0; i0 < rows_done; i0 += 16)
      for (int c0 = 0; c0 < cols_done; c0 += 16)
        detail::transpose16x16(src + i0 * src_ld + c0, src_ld, dst + c0 * dst_ld + i0, dst_ld);
  }
#endif
  // The rest element by element: the columns right of the blocks, then the rows below them.
  for (int i = 0; i < rows_done; ++i)
    for (int c = cols_done; c < cols; ++c) dst[c * dst_ld + i] = static_cast<D>(src[i * src_ld + c]);
  for (int i = rows_done; i < rows; ++i)
    for (int c = 0; c < cols; ++c) dst[c * dst_ld + i] = static_cast<D>(src[i * src_ld + c]);
}

}  // namespace flashattn::cpu
