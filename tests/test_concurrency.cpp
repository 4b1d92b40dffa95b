// Many user threads calling the API at once (issue 5). The library keeps no state between calls (scratch
// is per call and per worker), so concurrent calls on shared read-only inputs must give the same bits as
// one call on its own, whether each call runs on its caller's thread or starts workers of its own. Built
// and run under ThreadSanitizer by .ci/sanitizers.sh.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#if defined(__unix__)
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#endif

#include "flashattn/forward.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/parallel.hpp"
#include "reference.hpp"

namespace flashattn::testing {
namespace {

constexpr int kUserThreads = 8;

// Runs fn(t) on `threads` threads released at the same moment, so that the calls overlap.
void run_together(int threads, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      fn(t);
    });
  for (std::thread& th : pool) th.join();
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// One forward problem with shared inputs; each call writes its own output.
template <class T>
struct SharedProblem {
  index_t batch, seq_q, seq_k, heads_q, heads_kv, dim;
  HostTensor<T> q, k, v;
  SharedProblem(index_t b, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, std::uint32_t seed)
      : batch(b), seq_q(sq), seq_k(sk), heads_q(hq), heads_kv(hkv), dim(d),
        q(Layout::Bshd, b, sq, hq, d), k(Layout::Bhsd, b, sk, hkv, d), v(Layout::Bshd, b, sk, hkv, d) {
    fill_normal(q.view(), seed);
    fill_normal(k.view(), seed + 1);
    fill_normal(v.view(), seed + 2);
  }
  // o followed by the LSE bytes, for one bitwise comparison.
  struct Result {
    std::vector<T> o;
    std::vector<float> lse;
    bool operator==(const Result& r) const { return same_bits(o, r.o) && same_bits(lse, r.lse); }
  };
  template <class Call>
  Result run(const Call& call) const {
    HostTensor<T> o(Layout::Bshd, batch, seq_q, heads_q, dim, T(std::numeric_limits<float>::quiet_NaN()));
    std::vector<float> lse(std::size_t(batch * heads_q * seq_q), std::numeric_limits<float>::quiet_NaN());
    call(q.cview(), k.cview(), v.cview(), o.view(), lse_bhs(lse.data(), batch, heads_q, seq_q));
    return {o.storage(), lse};
  }
};

// The context of a call on `threads` workers (0: the default).
cpu::Context<> on_threads(int threads) { return {threads}; }

// 8 user threads × 3 calls each, every call single-threaded, on one shared causal GQA problem.
TEST(Concurrency, ManyUserThreadsGiveTheBitsOfOneCall) {
  const SharedProblem<float> p(2, 257, 257, 4, 2, 64, 1);
  AttentionOptions opts;
  opts.causal = true;
  const auto call = [&](int threads) {
    return p.run([&](auto q, auto k, auto v, auto o, auto lse) {
      attention_forward(on_threads(threads), q, k, v, o, opts, lse);
    });
  };
  const auto expected = call(1);
  std::vector<int> mismatches(kUserThreads, 0);
  run_together(kUserThreads, [&](int t) {
    for (int rep = 0; rep < 3; ++rep) mismatches[std::size_t(t)] += !(call(1) == expected);
  });
  for (int t = 0; t < kUserThreads; ++t) EXPECT_EQ(mismatches[std::size_t(t)], 0) << "user thread " << t;
}

// The same with 2 workers per call: 8 concurrent calls, each starting its own workers.
TEST(Concurrency, ManyUserThreadsWithTwoWorkersEach) {
  const SharedProblem<float> p(1, 300, 300, 4, 4, 64, 2);
  AttentionOptions opts;
  opts.window_left = 40;
  opts.window_right = 8;
  const auto call = [&](int threads) {
    return p.run([&](auto q, auto k, auto v, auto o, auto lse) {
      attention_forward(on_threads(threads), q, k, v, o, opts, lse);
    });
  };
  const auto expected = call(1);
  EXPECT_TRUE(call(2) == expected);  // any thread count: the same bits
  std::vector<int> mismatches(kUserThreads, 0);
  run_together(kUserThreads, [&](int t) {
    for (int rep = 0; rep < 2; ++rep) mismatches[std::size_t(t)] += !(call(2) == expected);
  });
  for (int t = 0; t < kUserThreads; ++t) EXPECT_EQ(mismatches[std::size_t(t)], 0) << "user thread " << t;
}

// Different problems at once: every scalar type, a mask policy, a score modifier, and a split-KV problem
// (one query block, many keys) whose partial results are merged by its own workers.
TEST(Concurrency, MixedProblemsAtOnce) {
  const SharedProblem<float> pf(1, 100, 180, 4, 1, 40, 3);
  const SharedProblem<double> pd(2, 65, 65, 2, 2, 64, 4);
  const SharedProblem<Eigen::half> ph(1, 130, 130, 6, 3, 128, 5);
  const SharedProblem<Eigen::bfloat16> pb(1, 77, 90, 2, 1, 32, 6);
  const SharedProblem<float> split(1, 16, 4096, 1, 1, 64, 7);

  const auto keep = [](index_t i, index_t j) { return (i * 7 + j * 3) % 5 != 0; };
  const auto softcap = [](index_t, index_t, auto s) { return 20 * std::tanh(s / 20); };
  std::vector<std::function<bool(int)>> jobs;  // job(threads) -> same bits as its single-threaded call
  const auto add = [&](const auto& problem, auto forward) {
    const auto expected = problem.run([&](auto q, auto k, auto v, auto o, auto lse) { forward(q, k, v, o, lse, 1); });
    jobs.push_back([&problem, forward, expected](int threads) {
      return problem.run([&](auto q, auto k, auto v, auto o, auto lse) { forward(q, k, v, o, lse, threads); }) ==
             expected;
    });
  };
  add(pf, [](auto q, auto k, auto v, auto o, auto lse, int t) {
    AttentionOptions opts;
    opts.causal = true;
    attention_forward(on_threads(t), q, k, v, o, opts, lse);
  });
  add(pd, [&](auto q, auto k, auto v, auto o, auto lse, int t) {
    attention_forward_masked(on_threads(t), q, k, v, o, element_mask(k.seq, keep), AttentionOptions{}, lse);
  });
  add(ph, [&](auto q, auto k, auto v, auto o, auto lse, int t) {
    attention_forward_masked(on_threads(t), q, k, v, o, score_mod(BandMask::causal(q.seq, k.seq), softcap),
                             AttentionOptions{}, lse);
  });
  add(pb, [](auto q, auto k, auto v, auto o, auto lse, int t) {
    AttentionOptions opts;
    opts.window_left = 5;
    attention_forward(on_threads(t), q, k, v, o, opts, lse);
  });
  add(split, [](auto q, auto k, auto v, auto o, auto lse, int t) {
    attention_forward(on_threads(t), q, k, v, o, AttentionOptions{}, lse);
  });

  const int n_jobs = int(jobs.size());
  std::vector<int> failures(std::size_t(2 * n_jobs), 0);
  run_together(2 * n_jobs, [&](int t) {
    // Each job twice at once: once on its caller's thread, once with 2 workers.
    failures[std::size_t(t)] = !jobs[std::size_t(t % n_jobs)](t < n_jobs ? 1 : 2);
  });
  for (int t = 0; t < 2 * n_jobs; ++t) EXPECT_EQ(failures[std::size_t(t)], 0) << "job " << t % n_jobs;
}

// The backward pass from several user threads at once: the same bits as one call.
TEST(Concurrency, BackwardFromManyThreads) {
  const index_t b = 1, n = 150, h = 2, d = 32;
  HostTensor<float> q(Layout::Bshd, b, n, h, d), k(Layout::Bshd, b, n, h, d), v(Layout::Bshd, b, n, h, d),
      o(Layout::Bshd, b, n, h, d), d_o(Layout::Bshd, b, n, h, d);
  HostLse lse(b, h, n);
  fill_normal(q.view(), 11);
  fill_normal(k.view(), 12);
  fill_normal(v.view(), 13);
  fill_normal(d_o.view(), 14);
  AttentionOptions opts;
  opts.causal = true;
  attention_forward(on_threads(1), q.cview(), k.cview(), v.cview(), o.view(), opts, lse.view());
  const auto grads = [&](int threads) {
    HostTensor<float> dq(Layout::Bshd, b, n, h, d), dk(Layout::Bshd, b, n, h, d), dv(Layout::Bshd, b, n, h, d);
    attention_backward(on_threads(threads), q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.view(),
                       dq.view(), dk.view(), dv.view(), opts);
    std::vector<float> all = dq.storage();
    all.insert(all.end(), dk.storage().begin(), dk.storage().end());
    all.insert(all.end(), dv.storage().begin(), dv.storage().end());
    return all;
  };
  const std::vector<float> expected = grads(1);
  std::vector<int> mismatches(4, 0);
  run_together(4, [&](int t) { mismatches[std::size_t(t)] = !same_bits(grads(1 + t % 2), expected); });
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[std::size_t(t)], 0) << "user thread " << t;
}

// Invalid calls from many threads: each gets its own exception, and valid calls running beside them are
// unaffected.
TEST(Concurrency, ErrorsInSomeThreadsDoNotDisturbOthers) {
  const SharedProblem<float> p(1, 64, 64, 2, 2, 32, 8);
  const auto good = [&] {
    return p.run([&](auto q, auto k, auto v, auto o, auto lse) {
      attention_forward(on_threads(2), q, k, v, o, AttentionOptions{}, lse);
    });
  };
  const auto expected = good();
  std::vector<int> ok(kUserThreads, 0);
  run_together(kUserThreads, [&](int t) {
    if (t % 2 == 0) {
      ok[std::size_t(t)] = good() == expected;
      return;
    }
    try {
      p.run([&](auto q, auto k, auto v, auto o, auto lse) {
        AttentionOptions bad;
        bad.scale = -1.0;
        attention_forward(q, k, v, o, bad, lse);
      });
    } catch (const std::invalid_argument&) {
      ok[std::size_t(t)] = 1;
    }
  });
  for (int t = 0; t < kUserThreads; ++t) EXPECT_EQ(ok[std::size_t(t)], 1) << "user thread " << t;
}

// Every worker's scratch is returned when its call ends, however many calls overlapped.
TEST(Concurrency, ScratchIsReleasedAfterConcurrentCalls) {
  const SharedProblem<float> p(1, 200, 200, 2, 2, 64, 9);
  const std::int64_t before = cpu::scratch_stats().current_bytes;
  run_together(kUserThreads, [&](int t) {
    p.run([&](auto q, auto k, auto v, auto o, auto lse) {
      attention_forward(on_threads(1 + t % 2), q, k, v, o, AttentionOptions{}, lse);
    });
  });
  EXPECT_EQ(cpu::scratch_stats().current_bytes, before);
}

// The worker pool (thread_pool.hpp, when OpenMP is off) is reused across calls: every item of every call
// runs exactly once, whatever the thread count, including more threads than cores or items.
TEST(WorkerPool, EveryItemOnceAcrossManyCalls) {
  for (int call = 0; call < 200; ++call) {
    const index_t items = 1 + call % 37;
    const int threads = 1 + call % 9;
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(items));
    for (auto& h : hits) h.store(0);
    cpu::run_workers(items, threads, [&](cpu::WorkQueue& queue) {
      for (index_t i; queue.next(i);) {
        hits[std::size_t(i)].fetch_add(1);
        // Items of a few microseconds, so that helpers wake before the caller has taken every item.
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(5);
        while (std::chrono::steady_clock::now() < until) {
        }
      }
    });
    for (index_t i = 0; i < items; ++i)
      ASSERT_EQ(hits[std::size_t(i)].load(), 1) << "call " << call << " item " << i;
  }
}

// Several user threads dispatch to the one pool at the same time: each call still sees all its items done
// when it returns, even when the pool's threads are busy with the other calls' jobs.
TEST(WorkerPool, ConcurrentCallersShareThePool) {
  std::vector<int> ok(kUserThreads, 0);
  run_together(kUserThreads, [&](int t) {
    bool all = true;
    for (int call = 0; call < 50; ++call) {
      const index_t items = 64 + t;
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(items));
      for (auto& h : hits) h.store(0);
      cpu::run_workers(items, 4, [&](cpu::WorkQueue& queue) {
        for (index_t i; queue.next(i);) hits[std::size_t(i)].fetch_add(1);
      });
      for (auto& h : hits) all = all && h.load() == 1;
    }
    ok[std::size_t(t)] = all ? 1 : 0;
  });
  for (int t = 0; t < kUserThreads; ++t) EXPECT_EQ(ok[std::size_t(t)], 1) << "user thread " << t;
}

// A worker's exception reaches the caller, and the pool keeps working afterwards.
TEST(WorkerPool, ExceptionReachesCallerAndPoolSurvives) {
  EXPECT_THROW(cpu::run_workers(16, 4,
                                [&](cpu::WorkQueue& queue) {
                                  for (index_t i; queue.next(i);)
                                    if (i == 7) throw std::runtime_error("item 7");
                                }),
               std::runtime_error);
  std::atomic<index_t> sum{0};
  cpu::run_workers(100, 4, [&](cpu::WorkQueue& queue) {
    for (index_t i; queue.next(i);) sum.fetch_add(i);
  });
  EXPECT_EQ(sum.load(), 99 * 100 / 2);
}

#if defined(__unix__) && !defined(_OPENMP)
// A forked child inherits the pool object, none of its threads, and its mutex and condition variables as
// they were at the fork, with the parent's idle workers recorded as waiters. Its multi-threaded calls
// must still finish and be right. A child that notified that inherited condition variable could hang
// (glibc waits for the vanished waiters): with such a pool this test failed in 19 of 20 runs under load,
// and the single fork it made before hung ctest in CI. So it forks many times, each right after a threaded
// call, and alarm() ends a child that hangs, which fails the test instead of hanging it.
TEST(WorkerPool, ForkedChildCanStillCallWithThreads) {
  const SharedProblem<float> p(1, 300, 300, 2, 2, 32, 11);
  const auto call = [&](auto q, auto k, auto v, auto o, auto lse) {
    attention_forward(on_threads(4), q, k, v, o, AttentionOptions{}, lse);
  };
  const auto one = p.run(call);
  constexpr int kForks = 40;
  for (int i = 0; i < kForks; ++i) {
    ASSERT_EQ(p.run(call), one);  // the parent's workers have just gone back to waiting
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      signal(SIGALRM, SIG_DFL);  // an ignored SIGALRM is inherited; the alarm must end the child
      alarm(30);
      try {
        _exit(p.run(call) == one ? 0 : 1);
      } catch (...) {
        _exit(2);  // not gtest's handler: that would finish the test inside the child
      }
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "fork " << i << ": the child did not exit (signal "
                                   << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << "; SIGALRM means it hung)";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "fork " << i << (WEXITSTATUS(status) == 2 ? ": the child's call threw"
                                                                           : ": the child's result differs from the parent's");
  }
}
#endif

}  // namespace
}  // namespace flashattn::testing
