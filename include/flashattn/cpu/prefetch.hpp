#pragma once
// Software prefetch of the next K/V rows while the current tile computes. K and V rows of one head are
// usually far apart in memory (BSHD: heads·dim elements between rows, a new page every row or two), a
// pattern the hardware prefetchers follow poorly, so the tile after the current one would otherwise
// arrive from L3 or DRAM on demand. The micro-kernels issue a few rows of prefetches per block of work,
// spreading them over the tile instead of bursting them.

#include <cstdint>
#include <type_traits>

#include "flashattn/core/views.hpp"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

// Off unless asked for (-DFLASHATTN_PREFETCH=1): on some cores software prefetches compete with demand
// misses for the L1 miss buffers and cost more than they save (docs/performance.md has the sweeps).
#ifndef FLASHATTN_PREFETCH
#define FLASHATTN_PREFETCH 0
#endif

namespace flashattn::cpu {

// Rows [0, rows) of a row-major block: `row_bytes` bytes each, `stride_bytes` apart. Empty by default.
struct PrefetchRows {
  const char* base = nullptr;
  index_t stride_bytes = 0;
  int rows = 0;
  int row_bytes = 0;

  // Prefetches rows [r0, r1) ∩ [0, rows), every cache line of each.
  void issue(int r0, int r1) const {
#if FLASHATTN_PREFETCH && defined(__SSE__)
    if (r1 > rows) r1 = rows;
    for (int r = r0; r < r1; ++r) {
      const char* row = base + r * stride_bytes;
      for (int off = 0; off < row_bytes; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
    }
#else
    (void)r0;
    (void)r1;
#endif
  }
  // The share of the rows that belongs to step `step` of `steps` equal steps.
  void issue_share(int step, int steps) const { issue(step * rows / steps, (step + 1) * rows / steps); }
};

// Rows [k0, k0 + rows) of one head of a row source (core/kv_source.hpp), when they are worth prefetching
// (unit dim stride, evenly spaced).
template <class Rows>
PrefetchRows prefetch_rows(const Rows& x, index_t b, index_t h, index_t k0, int rows, int d) {
  using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(x.row(b, h, k0))>>;
  if (rows <= 0 || x.dim_stride() != 1 || x.even_run(b, h, k0) < rows) return {};
  return {reinterpret_cast<const char*>(x.row(b, h, k0)), x.row_stride() * index_t(sizeof(Elem)), rows,
          int(d * sizeof(Elem))};
}

}  // namespace flashattn::cpu
