#pragma once
// Heap tracking for the IO benchmarks: counts the bytes of every live heap block of the process, and
// their peak, by interposing the C allocation functions (glibc only). Both paths are measured the same
// way: the naive path's score matrix comes from Eigen's aligned malloc, which cpu::scratch_stats() does
// not see; the tiled path's scratch comes from aligned operator new, which ends in aligned_alloc here.
//
// Include from exactly one translation unit of a benchmark binary: it defines malloc and friends for the
// whole process. Elsewhere (not glibc) heap_tracking_available() is false and the numbers read -1.

#include <atomic>
#include <cstddef>
#include <cstdint>

// Sanitizers interpose malloc themselves: tracking stays off under them.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define FLASHATTN_NO_HEAP_TRACKING 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FLASHATTN_NO_HEAP_TRACKING 1
#endif

#if defined(__GLIBC__) && !defined(FLASHATTN_NO_HEAP_TRACKING)
#define FLASHATTN_HEAP_TRACKING 1
#include <malloc.h>

#include <cerrno>
#endif

namespace flashattn::bench {

namespace detail {
inline std::atomic<std::int64_t> g_heap_current{0};
inline std::atomic<std::int64_t> g_heap_peak{0};

inline void heap_add(std::int64_t bytes) {
  const std::int64_t now = g_heap_current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::int64_t peak = g_heap_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_heap_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
inline void heap_sub(std::int64_t bytes) { g_heap_current.fetch_sub(bytes, std::memory_order_relaxed); }
}  // namespace detail

struct HeapStats {
  std::int64_t current_bytes;
  std::int64_t peak_bytes;
};

inline bool heap_tracking_available() {
#if defined(FLASHATTN_HEAP_TRACKING)
  return true;
#else
  return false;
#endif
}

// Bytes in live heap blocks (as malloc_usable_size reports them) and the peak since the last reset.
inline HeapStats heap_stats() {
  if (!heap_tracking_available()) return {-1, -1};
  return {detail::g_heap_current.load(), detail::g_heap_peak.load()};
}
inline void reset_heap_peak() { detail::g_heap_peak.store(detail::g_heap_current.load()); }

// Peak heap bytes allocated during fn() on top of what was live before it.
template <class F>
std::int64_t heap_peak_during(F&& fn) {
  if (!heap_tracking_available()) {
    fn();
    return -1;
  }
  const std::int64_t before = heap_stats().current_bytes;
  reset_heap_peak();
  fn();
  return heap_stats().peak_bytes - before;
}

}  // namespace flashattn::bench

#if defined(FLASHATTN_HEAP_TRACKING)
namespace flashattn::bench::detail {
inline void* heap_tracked(void* p) {
  if (p) heap_add(std::int64_t(malloc_usable_size(p)));
  return p;
}
}  // namespace flashattn::bench::detail

// glibc's own entry points, which the definitions below forward to.
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);

void* malloc(std::size_t size) noexcept { return flashattn::bench::detail::heap_tracked(__libc_malloc(size)); }
void* calloc(std::size_t count, std::size_t size) noexcept { return flashattn::bench::detail::heap_tracked(__libc_calloc(count, size)); }
void free(void* p) noexcept {
  if (!p) return;
  flashattn::bench::detail::heap_sub(std::int64_t(malloc_usable_size(p)));
  __libc_free(p);
}
void* realloc(void* p, std::size_t size) noexcept {
  const std::int64_t old = p ? std::int64_t(malloc_usable_size(p)) : 0;
  void* q = __libc_realloc(p, size);
  if (q || size == 0) flashattn::bench::detail::heap_sub(old);  // on failure the old block is still live
  return flashattn::bench::detail::heap_tracked(q);
}
void* memalign(std::size_t alignment, std::size_t size) noexcept { return flashattn::bench::detail::heap_tracked(__libc_memalign(alignment, size)); }
void* aligned_alloc(std::size_t alignment, std::size_t size) noexcept { return memalign(alignment, size); }
int posix_memalign(void** out, std::size_t alignment, std::size_t size) noexcept {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = memalign(alignment, size);
  if (!p && size != 0) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(std::size_t size) noexcept { return memalign(4096, size); }
void* pvalloc(std::size_t size) noexcept { return memalign(4096, (size + 4095) / 4096 * 4096); }
}
#endif
