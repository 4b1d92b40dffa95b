#pragma once
// The worker threads behind run_workers (parallel.hpp) when OpenMP is off: started on first use, grown on
// demand, then kept, so that a call does not pay for starting and stopping threads (tens of microseconds
// each, a large share of a call that lasts a few milliseconds on 16 cores).
//
// A call hands the pool one job: "run call(task) on up to `helpers` threads". The caller runs it too, and
// after its own run returns it waits only for the helpers that have *started*; the ones that have not are
// cancelled. That is enough because every task drains a shared WorkQueue: once the caller's run returns,
// the queue is empty and a late helper would find nothing to do. So a busy pool (another caller's job)
// delays a call but can never block it, and concurrent calls from several user threads stay independent.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace flashattn::cpu {

class ThreadPool {
 public:
  // The process's pool, created by the first call that needs one. Never destroyed: joining its threads at
  // exit would race with static destruction elsewhere; idle threads blocked on a condition variable end
  // with the process.
  //
  // A forked child gets a new, empty pool. It inherits the parent's pool object but none of its threads,
  // and the object's mutex and condition variables as they were at the fork: a condition variable with
  // waiters that no longer exist can block notify_all() for ever (glibc waits for those waiters to leave
  // the old group), and the mutex may be held by a thread that is gone. So a fork handler empties the
  // slot in the child (and keeps the old object reachable, unused), and the child's first call creates a
  // pool of its own. The handler only swaps pointers: no allocation and no lock, nothing a fork-then-exec
  // child could wait on.
  static ThreadPool& instance() {
    ThreadPool* pool = current_.load(std::memory_order_acquire);
    if (pool != nullptr) return *pool;
#if defined(__unix__) || defined(__APPLE__)
    // Registered before the first pool is published, by whichever thread gets here first. (A fork that
    // lands between another thread's exchange and its pthread_atfork would leave that child with the
    // parent's pool: a window of nanoseconds, once per process.)
    if (!fork_handler_registered_.exchange(true)) pthread_atfork(nullptr, nullptr, &forget_pool_in_child);
#endif
    auto* fresh = new ThreadPool;
    if (current_.compare_exchange_strong(pool, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;  // another thread published its pool first; this one never started a thread
    return *pool;
  }

  // Calls call(task) on the calling thread and on up to `helpers` pool threads; returns when the caller's
  // call and every helper call that started have returned. call must not throw. Not a template: one copy
  // of the pool's code serves every parallel region of every kernel (a template here was instantiated,
  // with its std::thread and container members, once per kernel lambda: hundreds of copies per test file).
  void run(int helpers, void (*call)(void*), void* task) {
    Job job{call, task, helpers, 0};
    if (helpers > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      while (int(threads_.size()) < helpers) threads_.emplace_back([this] { work(); });
      queue_.push_back(&job);
    }
    if (helpers > 0) work_cv_.notify_all();
    call(task);
    std::unique_lock<std::mutex> lock(mutex_);
    if (job.unclaimed > 0) {  // helpers that did not start: cancelled
      queue_.erase(std::find(queue_.begin(), queue_.end(), &job));
      job.unclaimed = 0;
    }
    done_cv_.wait(lock, [&] { return job.running == 0; });
  }

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

 private:
  ThreadPool() = default;

  // In a forked child (the only thread there): empty the slot, chaining the inherited pool onto the
  // retired list so that it stays reachable (no leak report at the child's exit).
  static void forget_pool_in_child() {
    ThreadPool* inherited = current_.exchange(nullptr, std::memory_order_relaxed);
    if (inherited == nullptr) return;
    inherited->next_retired_ = retired_.load(std::memory_order_relaxed);
    retired_.store(inherited, std::memory_order_relaxed);
  }

  // Constant-initialised (no guard variable that a fork could leave locked).
  inline static std::atomic<ThreadPool*> current_{nullptr};
  inline static std::atomic<ThreadPool*> retired_{nullptr};  // pools inherited through fork, newest first
  inline static std::atomic<bool> fork_handler_registered_{false};

  struct Job {
    void (*call)(void*);
    void* task;
    int unclaimed;  // helper runs not yet taken by a thread
    int running;    // helper runs in progress
  };

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !queue_.empty(); });
      Job* job = queue_.front();
      if (--job->unclaimed == 0) queue_.pop_front();
      ++job->running;
      lock.unlock();
      job->call(job->task);
      lock.lock();
      if (--job->running == 0) done_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_cv_;  // a job was queued
  std::condition_variable done_cv_;  // a helper run returned
  std::deque<Job*> queue_;           // jobs with unclaimed helper runs, oldest first
  std::vector<std::thread> threads_;
  ThreadPool* next_retired_ = nullptr;  // the next older pool on the retired list
};

}  // namespace flashattn::cpu
