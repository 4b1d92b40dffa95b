#pragma once
// Instrumentation, not attention: memory-traffic accounting policies. A kernel takes one as a template
// parameter and reports every transfer between the big arrays in main memory (Q, K, V, O, LSE; S and P
// for the naive path) and its tile working set. NoAccounting compiles to nothing; ByteCounter sums bytes
// per array. The categories are the algorithm's, not a backend's.

#include <array>
#include <atomic>
#include <cstdint>

namespace flashattn {

// Partial: the unnormalised partial outputs and softmax states of a call split over key ranges, written
// by each range and read back by the merge (core/softmax_state.hpp).
// StagedTiles: copies of K/V tiles that a backend stages once and keeps for reuse (the CPU's
// cpu/staged_tile_cache.hpp). Reads of a kept tile count as reads of K or V: the same bytes, from the copy.
enum class Traffic { Q, K, V, O, Lse, S, P, Partial, StagedTiles, kCount };

struct NoAccounting {
  static constexpr bool enabled = false;
  void read(Traffic, std::int64_t) {}
  void write(Traffic, std::int64_t) {}
};

// Thread-safe: workers add with relaxed atomics (one add per tile, not per element).
class ByteCounter {
 public:
  static constexpr bool enabled = true;
  void read(Traffic t, std::int64_t bytes) { reads_[index(t)].fetch_add(bytes, std::memory_order_relaxed); }
  void write(Traffic t, std::int64_t bytes) { writes_[index(t)].fetch_add(bytes, std::memory_order_relaxed); }

  std::int64_t read_bytes(Traffic t) const { return reads_[index(t)].load(); }
  std::int64_t written_bytes(Traffic t) const { return writes_[index(t)].load(); }
  std::int64_t total_bytes() const {
    std::int64_t sum = 0;
    for (int i = 0; i < kArrays; ++i) sum += reads_[i].load() + writes_[i].load();
    return sum;
  }
  void reset() {
    for (int i = 0; i < kArrays; ++i) {
      reads_[i] = 0;
      writes_[i] = 0;
    }
  }

 private:
  static constexpr int kArrays = static_cast<int>(Traffic::kCount);
  static constexpr int index(Traffic t) { return static_cast<int>(t); }
  std::array<std::atomic<std::int64_t>, kArrays> reads_{};
  std::array<std::atomic<std::int64_t>, kArrays> writes_{};
};

}  // namespace flashattn
