#pragma once
// Cache-line-aligned scratch owned by one worker. Every scratch allocation of the CPU kernels goes through
// here, so that the bytes in use (and their peak) can be read by benchmarks and tests: the proof that the
// tiled path allocates O(tile) memory, never O(N²).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

namespace flashattn::cpu {

struct ScratchStats {
  std::int64_t current_bytes;
  std::int64_t peak_bytes;
};

namespace detail {
inline std::atomic<std::int64_t>& scratch_current() {
  static std::atomic<std::int64_t> bytes{0};
  return bytes;
}
inline std::atomic<std::int64_t>& scratch_peak() {
  static std::atomic<std::int64_t> bytes{0};
  return bytes;
}
}  // namespace detail

// Scratch bytes held by all live kernel workers of the process, and the peak since the last reset.
inline ScratchStats scratch_stats() { return {detail::scratch_current().load(), detail::scratch_peak().load()}; }
inline void reset_scratch_peak() { detail::scratch_peak().store(detail::scratch_current().load()); }

template <class T>
class AlignedBuffer {
 public:
  static constexpr std::size_t kAlignment = 64;

  explicit AlignedBuffer(std::size_t count)
      : data_(static_cast<T*>(::operator new(bytes(count), std::align_val_t{kAlignment}))), count_(count) {
    const std::int64_t now = detail::scratch_current().fetch_add(bytes(count)) + bytes(count);
    std::int64_t peak = detail::scratch_peak().load();
    while (now > peak && !detail::scratch_peak().compare_exchange_weak(peak, now)) {
    }
  }
  ~AlignedBuffer() {
    ::operator delete(data_, std::align_val_t{kAlignment});
    detail::scratch_current().fetch_sub(bytes(count_));
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }

 private:
  static std::int64_t bytes(std::size_t count) { return static_cast<std::int64_t>(count * sizeof(T)); }
  T* data_;
  std::size_t count_;
};

}  // namespace flashattn::cpu
