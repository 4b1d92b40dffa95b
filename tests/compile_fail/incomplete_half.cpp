// expect: flashattn: the element type is incomplete here (only declared)
// Eigen::half through flashattn/forward.hpp alone, which only declares it (the fix: include <Eigen/Core>,
// or flashattn/flashattn.hpp, which does).
#include <flashattn/forward.hpp>

void run(Eigen::half* q, Eigen::half* k, Eigen::half* v, Eigen::half* o) {
  flashattn::attention_forward(flashattn::bshd(q, 1, 8, 1, 8), flashattn::bshd(k, 1, 8, 1, 8),
                               flashattn::bshd(v, 1, 8, 1, 8), flashattn::bshd(o, 1, 8, 1, 8));
}

int main() {}
