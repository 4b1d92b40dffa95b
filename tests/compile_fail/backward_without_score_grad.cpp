// expect: flashattn: the policy changes scores (modifies_scores) but has no score_grad(i, j, s)
// The backward of a score_mod given no derivative (the fix: score_mod(mask, fn, grad_fn)).
#include <flashattn/flashattn.hpp>

#include <vector>

int main() {
  std::vector<float> x(64), lse(8), dq(64), dk(64), dv(64);
  const auto in = flashattn::bshd<const float>(x.data(), 1, 8, 1, 8);
  const auto policy = flashattn::score_mod(flashattn::causal_mask(),
                                           [](flashattn::index_t, flashattn::index_t, auto s) { return s * s; });
  flashattn::attention_backward_masked<float>(in, in, in, in, in, flashattn::lse_bhs(lse.data(), 1, 1, 8),
                                              flashattn::bshd(dq.data(), 1, 8, 1, 8),
                                              flashattn::bshd(dk.data(), 1, 8, 1, 8),
                                              flashattn::bshd(dv.data(), 1, 8, 1, 8), policy);
}
