#pragma once
// Two variants of a call, alternated call by call within one benchmark so that both see the same machine
// state; returns the median seconds of each. The pattern behind every ratio target.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "references.hpp"

namespace flashattn::bench {

template <class A, class B>
std::pair<double, double> alternated_medians(benchmark::State& state, const RateClock& clock, A&& call_a,
                                             B&& call_b) {
  call_a();
  call_b();
  std::vector<double> ta, tb;
  for (auto _ : state) {
    double t0 = clock.now();
    call_a();
    ta.push_back(clock.now() - t0);
    t0 = clock.now();
    call_b();
    tb.push_back(clock.now() - t0);
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

}  // namespace flashattn::bench
