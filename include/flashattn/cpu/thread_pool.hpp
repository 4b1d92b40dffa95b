#pragma once
// The worker threads behind run_workers (parallel.hpp) when OpenMP is off: started on first use, grown on
// demand, then kept, so that a call does not pay for starting and stopping threads (tens of microseconds
// each, a large share of a call that lasts a few milliseconds on 16 cores).
//
// A call hands the pool one job: "run task() on up to `helpers` threads". The caller runs task() too, and
// after its own run returns it waits only for the helpers that have *started*; the ones that have not are
// cancelled. That is enough because every task drains a shared WorkQueue: once the caller's run returns,
// the queue is empty and a late helper would find nothing to do. So a busy pool (another caller's job)
// delays a call but can never block it, and concurrent calls from several user threads stay independent.

#include <algorithm>
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
  // The process's pool. Never destroyed: joining its threads at exit would race with static destruction
  // elsewhere; idle threads blocked on a condition variable end with the process.
  //
  // A forked child gets a new, empty pool. It inherits the parent's pool object but none of its threads,
  // and the object's mutex and condition variables as they were at the fork: a condition variable with
  // waiters that no longer exist can block notify_all() for ever (glibc waits for those waiters to leave
  // the old group), and the mutex may be held by a thread that is gone. The child's first call therefore
  // must not touch the inherited object, which stays allocated and unused.
  static ThreadPool& instance() { return *current(); }

  // Calls task() on the calling thread and on up to `helpers` pool threads; returns when the caller's call
  // and every helper call that started have returned. task() must not throw.
  template <class Task>
  void run(int helpers, Task& task) {
    Job job{&invoke<Task>, &task, helpers, 0};
    if (helpers > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      while (int(threads_.size()) < helpers) threads_.emplace_back([this] { work(); });
      queue_.push_back(&job);
    }
    if (helpers > 0) work_cv_.notify_all();
    task();
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

  // The slot instance() reads, and the fork handler that refills it in a child (registered once, with the
  // first pool; in the child the forking thread is the only thread, so nothing reads the slot meanwhile).
  static ThreadPool*& current() {
    static ThreadPool* pool = [] {
#if defined(__unix__) || defined(__APPLE__)
      pthread_atfork(nullptr, nullptr, [] { current() = new ThreadPool; });
#endif
      return new ThreadPool;
    }();
    return pool;
  }

  struct Job {
    void (*call)(void*);
    void* task;
    int unclaimed;  // helper runs not yet taken by a thread
    int running;    // helper runs in progress
  };

  template <class Task>
  static void invoke(void* task) {
    (*static_cast<Task*>(task))();
  }

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
};

}  // namespace flashattn::cpu
