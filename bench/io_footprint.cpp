// Footprint proof: the tiled forward pass for a long sequence needs O(tile) extra memory, never O(N²).
//
//   io_footprint [N=131072] [d=128] [threads=0 (all)] [causal=0]
//   /usr/bin/time -v build/bench/io_footprint          (the kernel's maximum resident set size)
//
// fp32, one head. The naive path would materialise S = N² floats (64 GiB at N = 131072). We report
//   io_bytes      Q, K, V, O and LSE, which the caller owns anyway
//   scratch_peak  tracked kernel scratch (cpu::scratch_stats) during the call, all workers together
//   heap_peak     every heap byte allocated during the call (bench/io_heap.hpp), scratch included
//   peak_rss      the process's high-water resident set (VmHWM), and peak_rss - io_bytes: everything else
//                 (program, libraries, thread stacks, scratch)
// and checks a few output rows against an fp64 computation of the same rows.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "io_heap.hpp"

namespace {

using flashattn::index_t;

// A field of /proc/self/status in bytes (VmRSS, VmHWM), or -1 where there is none.
std::int64_t proc_status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.compare(0, field.size() + 1, field + ":") == 0) return std::atoll(line.c_str() + field.size() + 1) * 1024;
  return -1;
}

double mib(std::int64_t bytes) { return double(bytes) / double(1 << 20); }

void fill(std::vector<float>& x, std::uint32_t seed) {
  std::uint32_t state = seed * 2654435761u + 1u;
  for (auto& e : x) {
    state = state * 1664525u + 1013904223u;
    e = float(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

// Row i of softmax(scale·Q·Kᵀ)·V in fp64, and its LSE, for the spot check.
double max_row_error(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<float>& o, index_t n, index_t d, index_t i, bool causal, double scale) {
  const index_t keys = causal ? i + 1 : n;
  std::vector<double> s(std::size_t(keys), 0.0);
  double m = -INFINITY;
  for (index_t j = 0; j < keys; ++j) {
    double dot = 0;
    for (index_t c = 0; c < d; ++c) dot += double(q[std::size_t(i * d + c)]) * double(k[std::size_t(j * d + c)]);
    s[std::size_t(j)] = dot * scale;
    m = std::max(m, s[std::size_t(j)]);
  }
  double l = 0;
  for (auto& e : s) l += (e = std::exp(e - m));
  double err = 0;
  for (index_t c = 0; c < d; ++c) {
    double acc = 0;
    for (index_t j = 0; j < keys; ++j) acc += s[std::size_t(j)] * double(v[std::size_t(j * d + c)]);
    err = std::max(err, std::abs(acc / l - double(o[std::size_t(i * d + c)])));
  }
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  const index_t n = argc > 1 ? std::atoll(argv[1]) : 131072;
  const index_t d = argc > 2 ? std::atoll(argv[2]) : 128;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 0;
  const bool causal = argc > 4 && std::atoi(argv[4]) != 0;
  if (n <= 0 || d <= 0) {
    std::fprintf(stderr, "usage: io_footprint [N] [d] [threads] [causal]\n");
    return 2;
  }

  std::vector<float> q(std::size_t(n * d)), k(q.size()), v(q.size()), o(q.size()), lse(static_cast<std::size_t>(n));
  fill(q, 1), fill(k, 2), fill(v, 3);
  std::fill(o.begin(), o.end(), 0.0f);  // touch every page the call will write, so it counts in io_bytes
  std::fill(lse.begin(), lse.end(), 0.0f);
  const std::int64_t io_bytes = std::int64_t((4 * q.size() + lse.size()) * sizeof(float));

  flashattn::AttentionOptions opts;
  opts.causal = causal;
  const flashattn::cpu::Context<> ctx{threads};
  const std::int64_t rss_before = proc_status_bytes("VmRSS");
  flashattn::cpu::reset_scratch_peak();
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t heap_peak = flashattn::bench::heap_peak_during([&] {
    flashattn::attention_forward(ctx, flashattn::bshd<const float>(q.data(), 1, n, 1, d),
                                 flashattn::bshd<const float>(k.data(), 1, n, 1, d),
                                 flashattn::bshd<const float>(v.data(), 1, n, 1, d), flashattn::bshd(o.data(), 1, n, 1, d),
                                 opts, flashattn::lse_bhs(lse.data(), 1, 1, n));
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::int64_t scratch_peak = flashattn::cpu::scratch_stats().peak_bytes;
  const std::int64_t peak_rss = proc_status_bytes("VmHWM");

  const double scale = 1.0 / std::sqrt(double(d));
  double err = 0;
  for (index_t i : {index_t(0), n / 3, n / 2 + 1, n - 1}) err = std::max(err, max_row_error(q, k, v, o, n, d, i, causal, scale));

  const int used_threads = threads > 0 ? threads : flashattn::cpu::default_num_threads();
  std::printf("tiled forward, fp32, N=%lld d=%lld heads=1 causal=%d threads=%d: %.1f s\n", (long long)n, (long long)d,
              int(causal), used_threads, seconds);
  std::printf("naive would hold S: N*N*4          = %10.1f MiB\n", mib(n * n * 4));
  std::printf("io_bytes (Q, K, V, O, LSE)          = %10.1f MiB\n", mib(io_bytes));
  std::printf("rss before the call                 = %10.1f MiB\n", mib(rss_before));
  std::printf("scratch_peak (tracked, all workers) = %10.3f MiB\n", mib(scratch_peak));
  std::printf("heap_peak during the call           = %10.3f MiB\n", mib(heap_peak));
  std::printf("peak_rss (VmHWM)                    = %10.1f MiB\n", mib(peak_rss));
  std::printf("peak_rss - io_bytes (extra memory)  = %10.1f MiB  (%s 100 MiB)\n", mib(peak_rss - io_bytes),
              peak_rss - io_bytes < (std::int64_t(100) << 20) ? "under" : "NOT under");
  std::printf("max |O - fp64| over 4 checked rows  = %.3g\n", err);
  return err < 1e-4 && peak_rss - io_bytes < (std::int64_t(100) << 20) ? 0 : 1;
}
