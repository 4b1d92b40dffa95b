#pragma once
// Thread counts for the benchmarks: FLASHATTN_BENCH_THREADS="1,16" or, by default, 1 and every hardware thread.

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

namespace flashattn::bench {

inline int all_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

inline std::vector<int> thread_counts() {
  std::vector<int> counts;
  if (const char* env = std::getenv("FLASHATTN_BENCH_THREADS")) {
    for (const char* c = env; *c;) {
      char* end = nullptr;
      const long t = std::strtol(c, &end, 10);
      if (end == c) break;
      if (t > 0) counts.push_back(int(t));
      c = *end ? end + 1 : end;
    }
  }
  if (counts.empty()) counts = {1, all_threads()};
  if (counts.size() == 2 && counts[0] == counts[1]) counts.pop_back();
  return counts;
}

}  // namespace flashattn::bench
