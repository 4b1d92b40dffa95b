// A forward-only program: every forward header of the library, with the backward's headers replaced by
// ones that fail to compile (the build puts them first on the include path). It compiles only if nothing
// on the forward's side includes the backward; it then runs a forward against the naive reference.
#include <Eigen/Core>

#include <cmath>
#include <cstdio>
#include <vector>

#include "flashattn/core/forward_validate.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/cpu/forward_dispatch.hpp"
#include "flashattn/eigen.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/instrument/accounting.hpp"
#include "flashattn/reference/naive_forward.hpp"

int main() {
  const int batch = 1, seq = 70, heads = 2, dim = 64;
  std::vector<float> q(std::size_t(batch) * seq * heads * dim), o(q.size()), ref(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i));
  const auto in = flashattn::bshd<const float>(q.data(), batch, seq, heads, dim);
  flashattn::AttentionOptions options;
  options.causal = true;
  flashattn::attention_forward(flashattn::cpu::Context<>{1}, in, in, in, flashattn::bshd(o.data(), batch, seq, heads, dim),
                               options);
  flashattn::naive_attention_forward<float>(in, in, in, flashattn::bshd(ref.data(), batch, seq, heads, dim), options);
  float worst = 0;
  for (std::size_t i = 0; i < o.size(); ++i) worst = std::fmax(worst, std::fabs(o[i] - ref[i]));
  std::printf("forward-only program: max |tiled - naive| = %g\n", double(worst));
  return worst < 1e-5f ? 0 : 1;
}
