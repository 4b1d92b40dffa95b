#include <Eigen/Core>
#include <cstdio>
#include <vector>
#include "flashattn/flashattn.hpp"
template <class T> void run(long kv, long seq_q, long H, FILE* f) {
  const long B = 1, Hk = 8, D = 128;
  std::vector<T> q(B * seq_q * H * D), o(q.size()), k(B * Hk * kv * D), v(k.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = T(float(int((i * 7) % 13) - 6) / 8.0f);
  for (size_t i = 0; i < k.size(); ++i) { k[i] = T(float(int((i * 5) % 251) - 125) / 64.0f); v[i] = T(float(int((i * 3) % 241) - 120) / 64.0f); }
  const flashattn::cpu::Context<> ctx{1};
  flashattn::attention_forward(ctx, flashattn::bshd<const T>(q.data(), B, seq_q, H, D), flashattn::bhsd<const T>(k.data(), B, Hk, kv, D),
                               flashattn::bhsd<const T>(v.data(), B, Hk, kv, D), flashattn::bshd<T>(o.data(), B, seq_q, H, D));
  fwrite(o.data(), sizeof(T), o.size(), f);
}
int main(int, char** argv) {
  FILE* f = fopen(argv[1], "wb");
  for (long kv : {1L, 7L, 67L, 1000L, 5003L})
    for (long sq : {1L, 3L, 4L})
      for (long H : {8L, 24L, 32L}) { run<float>(kv, sq, H, f); run<Eigen::half>(kv, sq, H, f); run<Eigen::bfloat16>(kv, sq, H, f); }
  fclose(f);
}
