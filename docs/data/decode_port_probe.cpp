// Port probes behind docs/data/decode_zen5_experiments.txt, item 1: the core clock (a dependent imul
// chain), zmm FMA throughput, fp16 widening (vcvtph2ps) throughput, and the shape of qk's inner loop
// (4 widened K packets feeding 16 FMAs) with fp16, fp32 and bf16 K. Standalone, AVX-512 + F16C only:
//   g++ -O3 -march=native docs/data/decode_port_probe.cpp -o /tmp/decode_port_probe && /tmp/decode_port_probe
// Cycles are derived from the clock the imul chain measures (imul latency 3 assumed).
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdint>

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
#define KEEP8(a, b, c, d, e, f, g, h) __asm__ volatile("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d), "+v"(e), "+v"(f), "+v"(g), "+v"(h))
alignas(64) std::uint16_t g_buf[4096];

double clock_ghz() {
  const long n = 300000000;
  long x = 1, i = n;
  const auto t0 = std::chrono::steady_clock::now();
  __asm__ volatile("1: imul %0, %0\n imul %0, %0\n dec %1\n jnz 1b" : "+r"(x), "+r"(i));
  return 6.0 * n / seconds_since(t0) * 1e-9;
}

// 16 independent FMA chains: FMAs per second.
double fma_rate() {
  const long n = 50000000;
  __m512 a0 = _mm512_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
         a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-8f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    a0 = _mm512_fmadd_ps(a0, m, c); a1 = _mm512_fmadd_ps(a1, m, c); a2 = _mm512_fmadd_ps(a2, m, c); a3 = _mm512_fmadd_ps(a3, m, c);
    a4 = _mm512_fmadd_ps(a4, m, c); a5 = _mm512_fmadd_ps(a5, m, c); a6 = _mm512_fmadd_ps(a6, m, c); a7 = _mm512_fmadd_ps(a7, m, c);
    a8 = _mm512_fmadd_ps(a8, m, c); a9 = _mm512_fmadd_ps(a9, m, c); a10 = _mm512_fmadd_ps(a10, m, c); a11 = _mm512_fmadd_ps(a11, m, c);
    a12 = _mm512_fmadd_ps(a12, m, c); a13 = _mm512_fmadd_ps(a13, m, c); a14 = _mm512_fmadd_ps(a14, m, c); a15 = _mm512_fmadd_ps(a15, m, c);
    KEEP8(a0, a1, a2, a3, a4, a5, a6, a7);
    KEEP8(a8, a9, a10, a11, a12, a13, a14, a15);
  }
  return 16.0 * n / seconds_since(t0);
}

// 8 widenings (vcvtph2ps from memory) per iteration, each added into its own chain: widenings per second.
double cvt_rate() {
  const long n = 50000000;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const auto* p = reinterpret_cast<const __m256i*>(g_buf);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    const auto* q = p + (i & 63);
    a0 = _mm512_add_ps(a0, _mm512_cvtph_ps(_mm256_load_si256(q))); a1 = _mm512_add_ps(a1, _mm512_cvtph_ps(_mm256_load_si256(q + 1)));
    a2 = _mm512_add_ps(a2, _mm512_cvtph_ps(_mm256_load_si256(q + 2))); a3 = _mm512_add_ps(a3, _mm512_cvtph_ps(_mm256_load_si256(q + 3)));
    a4 = _mm512_add_ps(a4, _mm512_cvtph_ps(_mm256_load_si256(q + 4))); a5 = _mm512_add_ps(a5, _mm512_cvtph_ps(_mm256_load_si256(q + 5)));
    a6 = _mm512_add_ps(a6, _mm512_cvtph_ps(_mm256_load_si256(q + 6))); a7 = _mm512_add_ps(a7, _mm512_cvtph_ps(_mm256_load_si256(q + 7)));
    KEEP8(a0, a1, a2, a3, a4, a5, a6, a7);
  }
  return 8.0 * n / seconds_since(t0);
}

// kind 0: fp16 K widened by vcvtph2ps; 1: fp32 K loaded; 2: bf16 K widened by vpmovzxwd + vpslld.
__m512 load_k(const char* p, int kind) {
  if (kind == 0) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  if (kind == 1) return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// 4 K packets loaded (and widened) and 16 FMAs per iteration, as in qk's inner loop: seconds per iteration.
template <int kind>
double qk_shape() {
  const long n = 50000000;
  __m512 x0 = _mm512_setzero_ps(), x1 = x0, x2 = x0, x3 = x0, x4 = x0, x5 = x0, x6 = x0, x7 = x0, x8 = x0, x9 = x0,
         x10 = x0, x11 = x0, x12 = x0, x13 = x0, x14 = x0, x15 = x0;
  const __m512 m = _mm512_set1_ps(0.5f);
  const char* base = reinterpret_cast<const char*>(g_buf);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    const char* p = base + ((i * 256) & 4095);
    const __m512 k0 = load_k(p, kind), k1 = load_k(p + 64, kind), k2 = load_k(p + 128, kind), k3 = load_k(p + 192, kind);
    x0 = _mm512_fmadd_ps(k0, m, x0); x1 = _mm512_fmadd_ps(k0, m, x1); x2 = _mm512_fmadd_ps(k0, m, x2); x3 = _mm512_fmadd_ps(k0, m, x3);
    x4 = _mm512_fmadd_ps(k1, m, x4); x5 = _mm512_fmadd_ps(k1, m, x5); x6 = _mm512_fmadd_ps(k1, m, x6); x7 = _mm512_fmadd_ps(k1, m, x7);
    x8 = _mm512_fmadd_ps(k2, m, x8); x9 = _mm512_fmadd_ps(k2, m, x9); x10 = _mm512_fmadd_ps(k2, m, x10); x11 = _mm512_fmadd_ps(k2, m, x11);
    x12 = _mm512_fmadd_ps(k3, m, x12); x13 = _mm512_fmadd_ps(k3, m, x13); x14 = _mm512_fmadd_ps(k3, m, x14); x15 = _mm512_fmadd_ps(k3, m, x15);
    KEEP8(x0, x1, x2, x3, x4, x5, x6, x7);
    KEEP8(x8, x9, x10, x11, x12, x13, x14, x15);
  }
  return seconds_since(t0) / n;
}
}  // namespace

int main() {
  const double ghz = clock_ghz();
  std::printf("clock (dependent imul chain): %.2f GHz\n", ghz);
  std::printf("zmm FMA, 16 chains: %.2f per cycle\n", fma_rate() * 1e-9 / ghz);
  std::printf("vcvtph2ps zmm <- m256 (+ vaddps): %.2f per cycle\n", cvt_rate() * 1e-9 / ghz);
  std::printf("4 K packets + 16 FMAs, fp16 widened: %.2f cycles\n", qk_shape<0>() * 1e9 * ghz);
  std::printf("4 K packets + 16 FMAs, fp32 loaded:  %.2f cycles\n", qk_shape<1>() * 1e9 * ghz);
  std::printf("4 K packets + 16 FMAs, bf16 shifted: %.2f cycles\n", qk_shape<2>() * 1e9 * ghz);
  return 0;
}
