// Where a forward tile's time goes: the three phases of the inner loop of cpu::ForwardKernel (Q·Kᵀ
// micro-kernel, online-softmax update, P·V micro-kernel) timed separately on one core, fp32, with the
// operands of one tile resident in cache as they are in the kernel. For profiling the kernel on a new CPU:
// a phase far below the machine's FMA rate is where to look.
//
//   kernel_phases [reps=20000]
//
// Prints, per (BlockQ, BlockKV, d): GFLOP/s of qk and pv (2·BlockQ·BlockKV·d flops each), nanoseconds of
// the softmax update per tile, and each phase's share of the tile's time.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/isa.hpp"
#include "flashattn/cpu/microkernel_fma.hpp"
#include "flashattn/cpu/online_softmax.hpp"

namespace {

using flashattn::index_t;
using flashattn::cpu::AlignedBuffer;
using flashattn::cpu::kBestIsa;

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

volatile float g_sink;

template <int BQ, int BKV, int D>
void phases(int reps) {
  using Ops = flashattn::cpu::FmaMicroKernel<float, BQ, D, kBestIsa>;
  using Softmax = flashattn::cpu::OnlineSoftmax<float, BQ, kBestIsa>;
  constexpr std::size_t kd = D, kq = BQ, kkv = BKV;
  AlignedBuffer<float> qt{kd * kq}, ot{kd * kq}, st{kkv * kq}, alpha{kq}, k{kkv * kd}, v{kkv * kd};
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  for (auto* b : {&qt, &k, &v})
    for (std::size_t i = 0; i < b->size(); ++i) b->data()[i] = dist(gen);
  for (std::size_t i = 0; i < ot.size(); ++i) ot.data()[i] = 0;
  for (int i = 0; i < BQ; ++i) alpha.data()[i] = 1;

  // Warm up (and bring the clock up) for a while before timing.
  for (int r = 0; r < reps / 4; ++r) Ops::qk(st.data(), qt.data(), k.data(), D, BKV, D);

  double t0 = cpu_seconds();
  for (int r = 0; r < reps; ++r) Ops::qk(st.data(), qt.data(), k.data(), D, BKV, D);
  const double t_qk = (cpu_seconds() - t0) / reps;

  // The softmax sees fresh scores each call (it overwrites Sᵀ with Pᵀ): restore them from a copy, and time
  // the copy alone to subtract it.
  AlignedBuffer<float> scores{st.size()};
  for (std::size_t i = 0; i < st.size(); ++i) scores.data()[i] = st.data()[i];
  t0 = cpu_seconds();
  for (int r = 0; r < reps; ++r) {
    std::copy(scores.data(), scores.data() + scores.size(), st.data());
    g_sink = st.data()[r % st.size()];
  }
  const double t_copy = (cpu_seconds() - t0) / reps;
  Softmax softmax;
  t0 = cpu_seconds();
  for (int r = 0; r < reps; ++r) {
    std::copy(scores.data(), scores.data() + scores.size(), st.data());
    softmax.update(st.data(), BKV, 0.125f, alpha.data());
  }
  const double t_softmax = std::max(0.0, (cpu_seconds() - t0) / reps - t_copy);

  for (int i = 0; i < BQ; ++i) alpha.data()[i] = 1;
  t0 = cpu_seconds();
  for (int r = 0; r < reps; ++r) Ops::pv(ot.data(), alpha.data(), st.data(), v.data(), D, BKV, D);
  const double t_pv = (cpu_seconds() - t0) / reps;
  g_sink = ot.data()[0];

  const double flops = 2.0 * BQ * BKV * D, total = t_qk + t_softmax + t_pv;
  std::printf("BlockQ=%3d BlockKV=%3d d=%3d: qk %6.1f GFLOP/s  pv %6.1f GFLOP/s  softmax %7.0f ns/tile  "
              "share qk/softmax/pv %4.1f/%4.1f/%4.1f %%  tile %6.1f GFLOP/s\n",
              BQ, BKV, D, flops / t_qk * 1e-9, flops / t_pv * 1e-9, t_softmax * 1e9, 100 * t_qk / total,
              100 * t_softmax / total, 100 * t_pv / total, 2 * flops / total * 1e-9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20000;
  std::printf("kernel phases, fp32, isa=%s, %d reps each\n", flashattn::cpu::isa_name(kBestIsa), reps);
  phases<64, 64, 64>(reps);
  phases<128, 64, 64>(reps);
  phases<64, 64, 128>(reps);
  phases<128, 64, 128>(reps);
  phases<128, 128, 128>(reps);
}
