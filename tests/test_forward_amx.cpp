// The AMX bf16 kernels (cpu/tile_ops_amx.hpp) on the scalar model of the tile unit (FLASHATTN_AMX_EMULATE,
// set for this binary only by tests/CMakeLists.txt): the whole forward suite, so that the kernels' tile
// layouts, zero padding (head dims and key counts that are not multiples of 32, odd dims), in-place and
// staged K, and the Oᵀ tail tile are checked against the fp64 reference on every CPU with AVX512-BF16.
// On an AMX CPU, test_forward_isa runs the same configurations on the real unit.

#include <type_traits>

#include "forward_cases.hpp"

namespace flashattn::testing {
namespace {

using cpu::Isa;

#if defined(FLASHATTN_AMX_EMULATE) && defined(__AVX512BF16__)
static_assert(cpu::is_compiled(Isa::Amx), "the emulated AMX path is compiled wherever AVX512-BF16 is");
static_assert(std::is_same_v<cpu::AmxTiles<Eigen::bfloat16>, cpu::Tiles<32, 128, Isa::Amx>> &&
                  std::is_same_v<cpu::AmxTallerTiles<Eigen::bfloat16>, cpu::Tiles<256, 128, Isa::Amx, 32>>,
              "the list below names the shipped AMX shapes: keep them in step");

// One query tile (16 rows: no 2-wide blocks), an odd number (3: 2 + 1), 2 × 2 blocks (64 × 64), and the
// shipped shapes (cpu::AmxTiles, 32 × 128; cpu::AmxTallerTiles, 256-row programs of 32-row panels).
using EmulatedAmxConfigs =
    CompiledConfigs<Pair<Eigen::bfloat16, TileSpec<16, 32, Isa::Amx>>, Pair<Eigen::bfloat16, TileSpec<48, 32, Isa::Amx>>,
                    Pair<Eigen::bfloat16, TileSpec<64, 64, Isa::Amx>>, Pair<Eigen::bfloat16, TileSpec<32, 128, Isa::Amx>>,
                    Pair<Eigen::bfloat16, TileSpec<256, 128, Isa::Amx, 32>>>;

INSTANTIATE_TYPED_TEST_SUITE_P(EmulatedAmx, ForwardTest, EmulatedAmxConfigs, ConfigName);

// AutoTiles on case c (bf16) has the bits of asking for Tiles (a different path would sum in another
// order), and is right against the reference.
template <class Tiles>
void expect_auto_tiles_are(const ForwardCase& c, std::uint32_t seed) {
  using T = Eigen::bfloat16;
  HostTensor<T> q(c.layout, c.batch, c.seq_q, c.heads_q, c.dim), k(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim),
      v(c.layout, c.batch, c.seq_k, c.heads_kv, c.dim), o_auto(c.layout, c.batch, c.seq_q, c.heads_q, c.dim),
      o_named(c.layout, c.batch, c.seq_q, c.heads_q, c.dim);
  fill_normal(q.view(), seed);
  fill_normal(k.view(), seed + 1);
  fill_normal(v.view(), seed + 2);
  attention_forward(c.context<cpu::AutoTiles>(), q.cview(), k.cview(), v.cview(), o_auto.view(), c.options());
  attention_forward(c.context<Tiles>(), q.cview(), k.cview(), v.cview(), o_named.view(), c.options());
  EXPECT_TRUE(matches_reference_for_options<T>(q.cview(), k.cview(), v.cview(), o_auto.cview(), LseView{}, c.options()))
      << c.describe();
  int differing = 0;
  for (std::size_t i = 0; i < o_auto.storage().size(); ++i) differing += !(o_auto.storage()[i] == o_named.storage()[i]);
  EXPECT_EQ(differing, 0) << c.describe();
}

// Where AMX is usable, AutoTiles sends bf16 to cpu::AmxTiles. Causal and full.
TEST(EmulatedAmx, AutoTilesPickAmxForBf16) {
  for (bool causal : {false, true}) {
    ForwardCase c;
    c.seq_q = 150;
    c.seq_k = 301;
    c.heads_q = 4;
    c.dim = 64;
    c.causal = causal;
    expect_auto_tiles_are<cpu::AmxTiles<Eigen::bfloat16>>(c, 7);
  }
}

// Once one head's K and V outgrow L2, AutoTiles sends bf16 to cpu::AmxTallerTiles (tiles.hpp). The key
// count is taken from this CPU's L2, so that the rule's boundary is crossed whatever the machine.
TEST(EmulatedAmx, AutoTilesPickAmxTallerTilesForLongKeys) {
  ForwardCase c;
  c.seq_q = 300;  // more than the decode kernel takes, two 256-row programs (one short)
  c.dim = 64;
  c.seq_k = cpu::l2_cache_bytes() / (2 * c.dim * index_t(sizeof(Eigen::bfloat16))) + 77;
  c.causal = true;
  ASSERT_TRUE(cpu::kv_head_exceeds_l2(c.seq_k, c.dim, sizeof(Eigen::bfloat16)));
  expect_auto_tiles_are<cpu::AmxTallerTiles<Eigen::bfloat16>>(c, 17);
}
#else
// forward_cases.hpp's suite has no instantiation in this build; gtest would report that as a failure.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ForwardTest);
TEST(EmulatedAmx, NeedsAvx512Bf16) {
  GTEST_SKIP() << "the AMX kernels build on AVX512-BF16, which this build does not target";
}
#endif

}  // namespace
}  // namespace flashattn::testing
