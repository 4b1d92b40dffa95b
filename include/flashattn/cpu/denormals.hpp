#pragma once
// While a kernel runs, subnormal floats are flushed to zero where they are produced (FTZ) and read as zero
// where they are consumed (DAZ), on every thread of the call; the caller's setting comes back when the
// kernel returns or throws. Why: probabilities far below a row's largest (ALiBi over long distances, a
// sink that dominates, scores masked by a large negative bias) and their products with dP or V land in
// the subnormal range, and Intel cores take a microcode assist of about a hundred cycles for each
// subnormal result or operand; the backward of ALiBi ran 1.22× the plain backward on a Xeon where
// flushing gave 1.09× (docs/performance.md). Nothing is lost: a subnormal term is below 2^-126 of a sum
// whose largest term is near 1. Mask and score callbacks run under the same setting.
// x86 only (MXCSR bits 15 and 6); elsewhere a no-op.

#if defined(__SSE2__) || defined(_M_X64)
#include <xmmintrin.h>
#define FLASHATTN_HAS_MXCSR 1
#else
#define FLASHATTN_HAS_MXCSR 0
#endif

namespace flashattn::cpu {

// Whether kernels run with subnormals flushed (and so read subnormal inputs as 0): docs/robustness.md.
inline constexpr bool kFlushesDenormals = FLASHATTN_HAS_MXCSR != 0;

class ScopedFlushDenormals {
 public:
  static constexpr unsigned kFtzDaz = 0x8040u;  // MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6)

#if FLASHATTN_HAS_MXCSR
  ScopedFlushDenormals() : saved_(_mm_getcsr() & kFtzDaz) { _mm_setcsr(_mm_getcsr() | kFtzDaz); }
  // Only the two bits go back: exception flags the kernel raised stay raised, as without the guard.
  ~ScopedFlushDenormals() { _mm_setcsr((_mm_getcsr() & ~kFtzDaz) | saved_); }
#else
  ScopedFlushDenormals() = default;
#endif
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
#if FLASHATTN_HAS_MXCSR
  unsigned saved_;  // the caller's FTZ and DAZ bits
#endif
};

}  // namespace flashattn::cpu
