// expect: flashattn: the output view (o, or dq / dk / dv) is a view of const data
// The backward's dq made from a const pointer.
#include <flashattn/flashattn.hpp>

#include <vector>

int main() {
  std::vector<float> x(64), lse(8), dk(64), dv(64);
  const std::vector<float> dq(64);
  const auto in = flashattn::bshd<const float>(x.data(), 1, 8, 1, 8);
  flashattn::attention_backward(in, in, in, in, in, flashattn::lse_bhs(lse.data(), 1, 1, 8),
                                flashattn::bshd(dq.data(), 1, 8, 1, 8), flashattn::bshd(dk.data(), 1, 8, 1, 8),
                                flashattn::bshd(dv.data(), 1, 8, 1, 8));
}
