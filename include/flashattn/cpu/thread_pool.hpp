#pragma once
// The worker threads behind run_workers (parallel.hpp) when OpenMP is off: started on first use, grown on
// demand, then kept, so that a call does not pay for starting and stopping threads (tens of microseconds
// each, a large share of a call that lasts a few milliseconds on 16 cores).
//
// A call hands the pool one job: "run task() on up to `helpers` threads". The caller runs task() too, and
// after its own run returns it waits only for the helpers that have *started*; the ones that have not are
// cancelled. That is enough because every task drains a shared WorkQueue: once the caller's run returns,
// the queue is empty and a late helper would find nothing to do. So a busy pool (another caller's job) or
// a pool without threads (the child of a fork) delays a call but can never block it, and concurrent calls
// from several user threads stay independent.

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace flashattn::cpu {

class ThreadPool {
 public:
  // The process's pool. Never destroyed: joining its threads at exit would race with static destruction
  // elsewhere and would hang in a forked child (which inherits the object but not the threads); idle
  // threads blocked on a condition variable end with the process.
  static ThreadPool& instance() {
    static ThreadPool* pool = new ThreadPool;
    return *pool;
  }

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
