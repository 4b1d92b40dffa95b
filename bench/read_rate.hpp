#pragma once
// The streaming-read reference of the memory-bound and re-streaming counters (bench_decode, bench_long):
// `threads` threads each sum their share of a buffer with independent vector accumulators (no reduction
// chain limits it), as a plain read loop would. Timed in the same run as the kernel it judges, on a
// buffer as large as what the kernel streams, so that both read from the same level of the hierarchy.

#include <cstddef>
#include <thread>
#include <vector>

#include "flashattn/cpu/simd.hpp"

namespace flashattn::bench {

// Each thread reads its share `passes` times (threads start once per call, so that a buffer read in a
// few microseconds is not timed as thread start-up). Returns the sum, so that the loop is not optimised
// away.
inline float read_all(const std::vector<float>& buf, int threads, int passes = 1) {
  using V = cpu::Simd<float, cpu::kBestIsa>;
  constexpr int kAcc = 8;
  std::vector<float> sums(std::size_t(threads), 0.0f);
  const auto part = [&](int t) {
    const std::size_t n = buf.size() / std::size_t(threads);
    const float* p = buf.data() + std::size_t(t) * n;
    typename V::Reg acc[kAcc];
    for (auto& a : acc) a = V::zero();
    std::size_t i = 0;
    for (int pass = 0; pass < passes; ++pass)
      for (i = 0; i + kAcc * V::width <= n; i += kAcc * V::width)
        for (int a = 0; a < kAcc; ++a) acc[a] = V::add(acc[a], V::load(p + i + a * V::width));
    alignas(64) float lanes[64];
    float s = 0.0f;
    for (auto& a : acc) {
      V::store(lanes, a);
      for (int l = 0; l < V::width; ++l) s += lanes[l];
    }
    for (; i < n; ++i) s += p[i];
    sums[std::size_t(t)] = s;
  };
  if (threads == 1) {
    part(0);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(part, t);
    for (auto& th : pool) th.join();
  }
  float s = 0.0f;
  for (float x : sums) s += x;
  return s;
}

}  // namespace flashattn::bench
