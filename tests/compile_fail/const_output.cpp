// expect: flashattn: the output view (o, or dq / dk / dv) is a view of const data
// The output o made from a const pointer.
#include <flashattn/flashattn.hpp>

#include <vector>

int main() {
  std::vector<float> q(64), k(64), v(64);
  const std::vector<float> o(64);
  flashattn::attention_forward(flashattn::bshd(q.data(), 1, 8, 1, 8), flashattn::bshd(k.data(), 1, 8, 1, 8),
                               flashattn::bshd(v.data(), 1, 8, 1, 8), flashattn::bshd(o.data(), 1, 8, 1, 8));
}
