// A model of decoding's memory pattern, without the library: K and V tiles of 16 KiB (64 fp16 rows of
// d = 128) of 8 heads × 32768 keys read alternately, with a fixed amount of FMA work per 256 bytes read
// standing in for the kernel's arithmetic, under four prefetch schemes (none; each tile's partner and the
// next K tile into L2, spread over the work, as decode_kernel.hpp does; the same into L1; each stream two
// tiles ahead). It tells how close to the streaming-read rate a kernel with a given arithmetic rate can
// get on this core (docs/data/decode_xeon_experiments.txt, item 4). Standalone:
//   g++ -O2 -march=native bench/overlap_model.cpp -o /tmp/overlap_model && /tmp/overlap_model 64
// (the argument: FMA rounds per 256 bytes; 64 makes the work alone run at about 15 GB/s on the Xeon).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static int g_work = 400;  // FMA rounds per 256 bytes read
// Reads `bytes` at p with compute between loads; every `every` 256-byte steps issues prefetches of `ahead`
// (n lines per issue, advancing).
__attribute__((noinline)) __m512 work(const char* p, size_t bytes, __m512 acc, const char* ahead, size_t ahead_bytes, int hint) {
  __m512 a[8]; for (int i = 0; i < 8; ++i) a[i] = acc;
  const __m512 m = _mm512_set1_ps(0.999f);
  size_t steps = bytes / 256, pf_per_step = ahead ? (ahead_bytes / 64 + steps - 1) / steps : 0, pf = 0;
  const int rounds = hint <= -2 ? 0 : g_work;  // hint <= -2: a plain read, no work
  for (size_t s = 0; s < steps; ++s) {
    for (size_t q = 0; q < pf_per_step && pf < ahead_bytes; ++q, pf += 64) {
      if (hint == 1) _mm_prefetch(ahead + pf, _MM_HINT_T1); else if (hint == 0) _mm_prefetch(ahead + pf, _MM_HINT_T0); else _mm_prefetch(ahead + pf, _MM_HINT_T2);
    }
    const char* x = p + s * 256;
    __m512 l0 = _mm512_load_ps((const float*)x), l1 = _mm512_load_ps((const float*)(x + 64)), l2 = _mm512_load_ps((const float*)(x + 128)), l3 = _mm512_load_ps((const float*)(x + 192));
    if (rounds == 0) {
      a[0] = _mm512_add_ps(a[0], l0); a[1] = _mm512_add_ps(a[1], l1); a[2] = _mm512_add_ps(a[2], l2); a[3] = _mm512_add_ps(a[3], l3);
    }
    for (int w = 0; w < rounds; w += 8) {
      a[0] = _mm512_fmadd_ps(a[0], m, l0); a[1] = _mm512_fmadd_ps(a[1], m, l1); a[2] = _mm512_fmadd_ps(a[2], m, l2); a[3] = _mm512_fmadd_ps(a[3], m, l3);
      a[4] = _mm512_fmadd_ps(a[4], m, l0); a[5] = _mm512_fmadd_ps(a[5], m, l1); a[6] = _mm512_fmadd_ps(a[6], m, l2); a[7] = _mm512_fmadd_ps(a[7], m, l3);
    }
  }
  __m512 r = a[0]; for (int i = 1; i < 8; ++i) r = _mm512_add_ps(r, a[i]); return r;
}
int main(int argc, char** argv) {
  g_work = argc > 1 ? atoi(argv[1]) : 64;
  const size_t tile = 16384, per_head = 32768ul * 256, heads = 8, total = per_head * heads;
  char* k = (char*)aligned_alloc(64, total); char* v = (char*)aligned_alloc(64, total); char* other = (char*)aligned_alloc(64, 2 * total);
  memset(k, 1, total); memset(v, 1, total); memset(other, 1, 2 * total);
  __m512 acc = _mm512_setzero_ps();
  for (int round = 0; round < 4; ++round) {
    double t[7];
    // the streaming read of a buffer as large as K+V, then the work alone on one cached tile
    const double r0 = now();
    for (size_t o = 0; o < 2 * total; o += tile) acc = work(other + o, tile, acc, nullptr, 0, -1 - g_work);
    t[6] = now() - r0;
    t[0] = now();
    for (size_t i = 0; i < 2 * heads * per_head / tile; ++i) acc = work(k, tile, acc, nullptr, 0, 1);
    t[1] = now();
    for (int mode = 0; mode < 4; ++mode) {
      // mode 0: no prefetch; 1: T1 a tile ahead, spread; 2: T0 a tile ahead spread; 3: T1 two tiles ahead spread
      for (size_t h = 0; h < heads; ++h)
        for (size_t o = 0; o < per_head; o += tile) {
          const char* kt = k + h * per_head + o; const char* vt = v + h * per_head + o;
          size_t dist = mode == 3 ? 2 * tile : tile;
          const char* kn = o + dist < per_head ? kt + dist : nullptr;
          const char* vn = o + dist < per_head ? vt + dist : nullptr;
          if (mode == 0) { acc = work(kt, tile, acc, nullptr, 0, 1); acc = work(vt, tile, acc, nullptr, 0, 1); }
          else if (mode == 3) { acc = work(kt, tile, acc, kn, kn ? tile : 0, 1); acc = work(vt, tile, acc, vn, vn ? tile : 0, 1); }
          else { acc = work(kt, tile, acc, vt, tile, mode == 1 ? 1 : 0); acc = work(vt, tile, acc, o + tile < per_head ? kt + tile : nullptr, o + tile < per_head ? tile : 0, mode == 1 ? 1 : 0); }
        }
      t[2 + mode] = now();
    }
    const double b = 2.0 * total;
    std::printf("read %.1f GB/s | work alone %.1f | no pf %.1f | T1 1 tile (V during K, next K during V) %.1f | T0 same %.1f | T1 2 tiles own stream %.1f\n",
                b / t[6] * 1e-9, b / (t[1] - t[0]) * 1e-9, b / (t[2] - t[1]) * 1e-9, b / (t[3] - t[2]) * 1e-9, b / (t[4] - t[3]) * 1e-9, b / (t[5] - t[4]) * 1e-9);
  }
  float r[16]; _mm512_storeu_ps(r, acc); return r[0] == 12345.f;
}
