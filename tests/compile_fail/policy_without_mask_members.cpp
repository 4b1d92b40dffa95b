// expect: flashattn: a mask policy needs kv_begin(q0, q1), kv_end(q0, q1), tile(q0, q1, k0, k1) and keep(i, j)
// A policy with keep() only (the fix: element_mask(seq_k, fn)).
#include <flashattn/flashattn.hpp>

#include <vector>

struct KeepOnly {
  bool keep(flashattn::index_t i, flashattn::index_t j) const { return j <= i; }
};

int main() {
  std::vector<float> q(64), k(64), v(64), o(64);
  flashattn::attention_forward_masked<float>(flashattn::bshd(q.data(), 1, 8, 1, 8), flashattn::bshd(k.data(), 1, 8, 1, 8),
                                             flashattn::bshd(v.data(), 1, 8, 1, 8), flashattn::bshd(o.data(), 1, 8, 1, 8),
                                             KeepOnly{});
}
