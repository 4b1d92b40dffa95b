// Bit identity across header versions: runs the forward (and backward) of a fixed list of shapes for
// fp32, bf16, fp16 and fp64 and prints one hash of the outputs, LSE and gradients per shape and type.
// Build it against two versions of include/ and compare the printouts (docs/performance.md, "Structure"):
//
//   git worktree add /tmp/old 928f014
//   g++ -std=c++17 -O2 -march=native -I/tmp/old/include -isystem /usr/include/eigen3 scripts/same_bits.cpp \
//       -o /tmp/bits_old -lpthread                                  # 0.1 API: threads in the options
//   g++ -std=c++17 -O2 -march=native -DNEW_API -Iinclude -isystem /usr/include/eigen3 scripts/same_bits.cpp \
//       -o /tmp/bits_new -lpthread                                  # 0.2 API: threads in cpu::Context
//   diff <(/tmp/bits_old) <(/tmp/bits_new) && echo identical
//
// Rows: 'options' (the options' mask) then 'softcap' (a score_mod policy with its gradient on the same band).
// Columns: batch seq_q seq_k heads heads_kv dim causal window_left threads: fp32 bf16 fp16 fp64 hashes.
// The first two shapes (one and three query rows against 2048 and 1000 keys) take the split-KV path.
#include <Eigen/Core>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include "flashattn/flashattn.hpp"
#ifndef NEW_API
#include "flashattn/backward_masks.hpp"
#endif
using namespace flashattn;
static unsigned long long h_bytes(const void* p, size_t n, unsigned long long h) {
  auto* c = (const unsigned char*)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}
template <class T>
unsigned long long run(int B, int Sq, int Sk, int H, int Hk, int D, bool causal, int wl, int threads, bool bshd_layout,
                       bool bwd, bool mod) {
  std::vector<T> q((size_t)B * Sq * H * D), k((size_t)B * Sk * Hk * D), v(k.size()), o(q.size()), dq(q.size()),
      dk(k.size()), dv(k.size()), dout(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = T(std::sin(0.37f * i));
    dout[i] = T(std::cos(0.11f * i));
  }
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = T(std::cos(0.23f * i));
    v[i] = T(std::sin(0.05f * i + 1));
  }
  std::vector<float> lse((size_t)B * H * Sq);
  auto mk = [&](std::vector<T>& x, int S, int HH) {
    return bshd_layout ? bshd(x.data(), B, S, HH, D) : bhsd(x.data(), B, HH, S, D);
  };
  AttentionOptions opt;
  opt.causal = causal;
  opt.window_left = wl;
  auto L = lse_bhs(lse.data(), B, H, Sq);
  // A soft-capping score modifier with its derivative, on the band the options describe: the policy path.
  const auto cap = [](index_t, index_t, auto x) { return decltype(x)(20) * std::tanh(x / decltype(x)(20)); };
  const auto cap_grad = [](index_t, index_t, auto x) {
    const auto t = std::tanh(x / decltype(x)(20));
    return decltype(x)(1) - t * t;
  };
  const auto policy = score_mod(BandMask::window(Sq, Sk, wl, causal ? 0 : -1), cap, cap_grad);
  AttentionOptions plain;  // a policy call takes no band in the options
#ifdef NEW_API
  cpu::Context<> ctx{threads};
  if (mod) {
    attention_forward_masked(ctx, mk(q, Sq, H), mk(k, Sk, Hk), mk(v, Sk, Hk), mk(o, Sq, H), policy, plain, L);
    if (bwd)
      attention_backward_masked(ctx, mk(q, Sq, H), mk(k, Sk, Hk), mk(v, Sk, Hk), mk(o, Sq, H), mk(dout, Sq, H), L,
                                mk(dq, Sq, H), mk(dk, Sk, Hk), mk(dv, Sk, Hk), policy, plain);
  } else {
    attention_forward(ctx, mk(q, Sq, H), mk(k, Sk, Hk), mk(v, Sk, Hk), mk(o, Sq, H), opt, L);
    if (bwd)
      attention_backward(ctx, mk(q, Sq, H), mk(k, Sk, Hk), mk(v, Sk, Hk), mk(o, Sq, H), mk(dout, Sq, H), L,
                         mk(dq, Sq, H), mk(dk, Sk, Hk), mk(dv, Sk, Hk), opt);
  }
#else
  opt.num_threads = threads;
  plain.num_threads = threads;
  if (mod) {
    attention_forward_masked(mk(q, Sq, H), mk(k, Sk, Hk), mk(v, Sk, Hk), mk(o, Sq, H), policy, plain, L);
    if (bwd)
      attention_backward_masked(mk(q, Sq, H), mk(k, Sk, Hk), mk(v, Sk, Hk), mk(o, Sq, H), mk(dout, Sq, H), L,
                                mk(dq, Sq, H), mk(dk, Sk, Hk), mk(dv, Sk, Hk), policy, plain);
  } else {
    attention_forward(mk(q, Sq, H), mk(k, Sk, Hk), mk(v, Sk, Hk), mk(o, Sq, H), opt, L);
    if (bwd)
      attention_backward(mk(q, Sq, H), mk(k, Sk, Hk), mk(v, Sk, Hk), mk(o, Sq, H), mk(dout, Sq, H), L, mk(dq, Sq, H),
                         mk(dk, Sk, Hk), mk(dv, Sk, Hk), opt);
  }
#endif
  unsigned long long h = 1469598103934665603ull;
  h = h_bytes(o.data(), o.size() * sizeof(T), h);
  h = h_bytes(lse.data(), lse.size() * 4, h);
  if (bwd) {
    h = h_bytes(dq.data(), dq.size() * sizeof(T), h);
    h = h_bytes(dk.data(), dk.size() * sizeof(T), h);
    h = h_bytes(dv.data(), dv.size() * sizeof(T), h);
  }
  return h;
}
int main() {
  int cfg[][10] = {{1, 1, 2048, 4, 2, 128, 0, -1, 2, 1},  {1, 3, 1000, 2, 1, 64, 1, -1, 1, 0},
                   {2, 200, 200, 4, 2, 64, 1, -1, 2, 1},  {1, 130, 77, 2, 2, 96, 0, -1, 1, 1},
                   {1, 300, 300, 2, 1, 128, 1, 50, 2, 0}, {1, 512, 512, 8, 8, 128, 0, -1, 2, 0},
                   {1, 65, 129, 3, 1, 80, 1, -1, 1, 1},   {1, 4096, 4096, 1, 1, 128, 0, -1, 1, 0}};
  for (int mod = 0; mod < 2; ++mod)
    for (auto& c : cfg) {
      const unsigned long long a = run<float>(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[9], mod);
      const unsigned long long b =
          run<Eigen::bfloat16>(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9] == 0, c[9], mod);
      const unsigned long long f =
          run<Eigen::half>(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[9], mod);
      const unsigned long long d = run<double>(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], 0, mod);
      std::printf("%s %d %d %d %d %d %d %d %d %d: %016llx %016llx %016llx %016llx\n", mod ? "softcap" : "options", c[0],
                  c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], a, b, f, d);
    }
}
