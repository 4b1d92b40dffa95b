// The library's inline assembly (the AMX tile instructions, cpu/amx.hpp) in a program compiled with
// -masm=intel, where the compiler emits Intel-syntax assembly (tests/CMakeLists.txt sets the flag, and the
// AMX flags where the compiler has them, for this binary only). That the binary builds is the first check:
// an AT&T-only asm string fails in the assembler. The second: a bf16 call, which goes to the tile unit
// where the CPU has one (else to AVX512-BF16 or the FMA kernels), agrees with the fp64 reference.

#include <gtest/gtest.h>

#include "flashattn/forward.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

TEST(IntelAsmDialect, Bf16ForwardMatchesReference) {
  using T = Eigen::bfloat16;
  const index_t batch = 1, seq_q = 150, seq_k = 301, heads = 2, dim = 64;
  for (bool causal : {false, true}) {
    HostTensor<T> q(Layout::Bshd, batch, seq_q, heads, dim), k(Layout::Bshd, batch, seq_k, heads, dim),
        v(Layout::Bshd, batch, seq_k, heads, dim), o(Layout::Bshd, batch, seq_q, heads, dim);
    fill_normal(q.view(), 1);
    fill_normal(k.view(), 2);
    fill_normal(v.view(), 3);
    AttentionOptions opts;
    opts.causal = causal;
    attention_forward(q.cview(), k.cview(), v.cview(), o.view(), opts);
    EXPECT_TRUE(matches_reference_for_options<T>(q.cview(), k.cview(), v.cview(), o.cview(), LseView{}, opts))
        << "causal=" << causal << (cpu::amx::usable() ? " (AMX)" : " (no AMX unit)");
  }
}

}  // namespace
}  // namespace flashattn::testing
