#pragma once
// Thread counts for the benchmarks: FLASHATTN_BENCH_THREADS="1,16" or, by default, 1 and every hardware thread.

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

namespace flashattn::bench {

inline int all_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

// The positive integers of a list in environment variable `name` ("1,16"), in order; empty when unset.
inline std::vector<long> env_positive_list(const char* name) {
  std::vector<long> out;
  if (const char* env = std::getenv(name)) {
    for (const char* c = env; *c;) {
      char* end = nullptr;
      const long x = std::strtol(c, &end, 10);
      if (end == c) break;
      if (x > 0) out.push_back(x);
      c = *end ? end + 1 : end;
    }
  }
  return out;
}

inline std::vector<int> thread_counts() {
  std::vector<int> counts;
  for (long t : env_positive_list("FLASHATTN_BENCH_THREADS")) counts.push_back(int(t));
  if (counts.empty()) counts = {1, all_threads()};
  if (counts.size() == 2 && counts[0] == counts[1]) counts.pop_back();
  return counts;
}

}  // namespace flashattn::bench
