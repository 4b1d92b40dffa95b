#pragma once
// Runs independent work items on worker threads with dynamic scheduling: each worker takes the next item
// from a shared counter, so uneven items (causal blocks near the diagonal, GQA groups) balance by
// themselves. With OpenMP enabled (-fopenmp) the workers are an OpenMP team, so thread pinning and
// OMP_NUM_THREADS apply; without it they are the threads of a process-wide pool (thread_pool.hpp), started
// once and reused. No state of a call outlives it, and a call never waits for another call's work, so
// concurrent calls from many user threads do not interact.

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "flashattn/cpu/build_info.hpp"
#include "flashattn/cpu/denormals.hpp"
#include "flashattn/cpu/thread_pool.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn::cpu {

// Threads used when the caller passes 0.
inline int default_num_threads() {
#if defined(_OPENMP)
  return std::max(1, omp_get_max_threads());
#else
  return std::max(1u, std::thread::hardware_concurrency());
#endif
}

// Hands out item indices 0, 1, ..., items - 1 once each, across workers.
class WorkQueue {
 public:
  explicit WorkQueue(index_t items) : items_(items) {}
  bool next(index_t& item) {
    item = next_.fetch_add(1, std::memory_order_relaxed);
    return item < items_;
  }

 private:
  index_t items_;
  std::atomic<index_t> next_{0};
};

namespace detail {
// run_workers without its type: the worker is (call, worker) with call(worker, queue) running it. One copy
// of the launch, error and flush handling serves every kernel (compile time and code size: a template
// here was instantiated once per kernel lambda).
inline void run_workers_erased(index_t items, int threads, void (*call)(void*, WorkQueue&), void* worker) {
  announce_build_once();
  if (items <= 0) return;
  threads = int(std::min<index_t>(std::max(threads, 1), items));
  WorkQueue queue(items);
  if (threads == 1) {
    const ScopedFlushDenormals flush;
    call(worker, queue);
    return;
  }
  struct Shared {
    void (*call)(void*, WorkQueue&);
    void* worker;
    WorkQueue* queue;
    std::exception_ptr error;
    std::mutex error_mutex;
  } shared{call, worker, &queue, nullptr, {}};
  auto guarded = [](void* p) {
    auto& s = *static_cast<Shared*>(p);
    try {
      const ScopedFlushDenormals flush;
      s.call(s.worker, *s.queue);
    } catch (...) {
      std::lock_guard<std::mutex> lock(s.error_mutex);
      if (!s.error) s.error = std::current_exception();
    }
  };
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
  guarded(&shared);
#else
  ThreadPool::instance().run(threads - 1, guarded, &shared);
#endif
  if (shared.error) std::rethrow_exception(shared.error);
}
}  // namespace detail

// Calls worker(queue) on `threads` threads (the caller's included) and returns when all are done, each
// with subnormals flushed (denormals.hpp). The first exception thrown by a worker is rethrown here.
template <class Worker>
void run_workers(index_t items, int threads, Worker&& worker) {
  using Callable = std::remove_reference_t<Worker>;
  detail::run_workers_erased(
      items, threads, [](void* w, WorkQueue& queue) { (*static_cast<Callable*>(w))(queue); },
      const_cast<void*>(static_cast<const void*>(&worker)));
}

}  // namespace flashattn::cpu
