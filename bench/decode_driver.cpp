// A decode call repeated on one thread, for A/B builds and profilers (perf record): one K/V type per build,
// so a variant compiles in about a minute where bench_decode, every type and configuration, takes four.
// Prints the median call time and the K+V rate; the cache is as large as asked, so a small one is read
// from the caches (the kernel's own rate) and a large one from memory. Not a benchmark of record: the
// figures of docs/ come from bench_decode's same-run ratios, or from variants of this driver alternated
// in one script (docs/data says which).
//
//   g++ -std=c++17 -O3 -march=native -DNDEBUG -isystem /usr/include/eigen3 -Iinclude
//       -DDECODE_DRIVER_TYPE=Eigen::bfloat16 bench/decode_driver.cpp -lpthread -o /tmp/decode_driver
//   /tmp/decode_driver KEYS SEQ_Q CALLS [QUERY_HEADS]      (8 KV heads, d = 128, BHSD, as bench_decode)
//
// -DDECODE_DRIVER_DEFAULT_TILES runs cpu::DefaultTiles (no AMX) instead of cpu::AutoTiles.

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flashattn/flashattn.hpp"

#ifndef DECODE_DRIVER_TYPE
#define DECODE_DRIVER_TYPE float
#endif

int main(int argc, char** argv) {
  using T = DECODE_DRIVER_TYPE;
  using flashattn::index_t;
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s KEYS SEQ_Q CALLS [QUERY_HEADS]\n", argv[0]);
    return 2;
  }
  const index_t kv = std::atol(argv[1]), seq_q = std::atol(argv[2]), H = argc > 4 ? std::atol(argv[4]) : 32;
  const int calls = std::atoi(argv[3]);
  const index_t B = 1, Hk = 8, D = 128;
#if defined(DECODE_DRIVER_DEFAULT_TILES)
  const flashattn::cpu::Context<flashattn::cpu::DefaultTiles<T>> ctx{1};
#else
  const flashattn::cpu::Context<> ctx{1};
#endif
  std::vector<T> q(std::size_t(B * seq_q * H * D)), o(q.size()), k(std::size_t(B * Hk * kv * D)), v(k.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = T(float(int(i % 13) - 6) / 8.0f);
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = T(float(int(i % 251) - 125) / 64.0f);
    v[i] = T(float(int(i % 241) - 120) / 64.0f);
  }
  const auto qv = flashattn::bshd<const T>(q.data(), B, seq_q, H, D);
  const auto ov = flashattn::bshd<T>(o.data(), B, seq_q, H, D);
  const auto kvw = flashattn::bhsd<const T>(k.data(), B, Hk, kv, D), vvw = flashattn::bhsd<const T>(v.data(), B, Hk, kv, D);
  flashattn::attention_forward(ctx, qv, kvw, vvw, ov);  // first touch, pool
  std::vector<double> t;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    flashattn::attention_forward(ctx, qv, kvw, vvw, ov);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  const double s = t[t.size() / 2], bytes = 2.0 * double(k.size()) * sizeof(T);
  std::printf("keys %ld seq_q %ld heads %ld: %.3f ms %.2f GB/s\n", long(kv), long(seq_q), long(H), s * 1e3, bytes / s * 1e-9);
  return 0;
}
