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

#if defined(_OPENMP)
#include <omp.h>
#endif

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

// Calls worker(queue) on `threads` threads (the caller's included) and returns when all are done, each
// with subnormals flushed (denormals.hpp). The first exception thrown by a worker is rethrown here.
template <class Worker>
void run_workers(index_t items, int threads, Worker&& worker) {
  if (items <= 0) return;
  threads = int(std::min<index_t>(std::max(threads, 1), items));
  WorkQueue queue(items);
  if (threads == 1) {
    const ScopedFlushDenormals flush;
    worker(queue);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  auto guarded = [&] {
    try {
      const ScopedFlushDenormals flush;
      worker(queue);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
  guarded();
#else
  ThreadPool::instance().run(threads - 1, guarded);
#endif
  if (error) std::rethrow_exception(error);
}

}  // namespace flashattn::cpu
