// The forward pass against the fp64 reference on the default instruction set: every scalar type times
// three tile shapes (square, wide key blocks, tall query blocks; for float and bf16 the tall blocks are
// three panels, tiles.hpp's PanelQ, as cpu::TallTiles are two). The cases are in forward_cases.hpp.

#include <type_traits>

#include "forward_cases.hpp"

namespace flashattn::testing {
namespace {

template <int BlockQ, int BlockKV, int PanelQ = BlockQ>
using Best = TileSpec<BlockQ, BlockKV, cpu::kBestIsa, PanelQ>;

// BlockQ must be a multiple of the packet width of the best instruction set: 16 floats on AVX-512.
using DefaultIsaConfigs = CompiledConfigs<
    Pair<float, Best<16, 16>>, Pair<float, Best<32, 64>>, Pair<float, Best<96, 32, 32>>,
    Pair<double, Best<16, 16>>, Pair<double, Best<32, 64>>, Pair<double, Best<64, 32>>,
    Pair<Eigen::half, Best<16, 16>>, Pair<Eigen::half, Best<32, 64>>, Pair<Eigen::half, Best<64, 32>>,
    Pair<Eigen::bfloat16, Best<16, 16>>, Pair<Eigen::bfloat16, Best<32, 64>>, Pair<Eigen::bfloat16, Best<96, 32, 32>>>;

INSTANTIATE_TYPED_TEST_SUITE_P(BestIsa, ForwardTest, DefaultIsaConfigs, ConfigName);

// The panel shapes that forward_dispatch.hpp picks on some machines only: cpu::TallTiles where L2 is at
// least 2 MiB (unmasked calls), cpu::TallerTiles once a head's K and V outgrow L2 (every type but bf16 on
// AMX, masked or not): run here whatever the L2.
static_assert(std::is_same_v<Config<float, Best<FLASHATTN_TALL_TILES>>::Tiles, cpu::TallTiles<float>> &&
                  std::is_same_v<Config<float, Best<FLASHATTN_TALLER_TILES>>::Tiles, cpu::TallerTiles<float>>,
              "the list below names the shipped panel shapes: keep them in step");
// (An A/B build with -DFLASHATTN_TALLER_TILES=128,64,64 makes the two the same: listed once then.)
using ShippedPanelConfigs = std::conditional_t<
    std::is_same_v<cpu::TallTiles<float>, cpu::TallerTiles<float>>, CompiledConfigs<Pair<float, Best<FLASHATTN_TALL_TILES>>>,
    CompiledConfigs<Pair<float, Best<FLASHATTN_TALL_TILES>>, Pair<float, Best<FLASHATTN_TALLER_TILES>>,
                    Pair<Eigen::bfloat16, Best<FLASHATTN_TALLER_TILES>>, Pair<Eigen::half, Best<FLASHATTN_TALLER_TILES>>>>;

INSTANTIATE_TYPED_TEST_SUITE_P(ShippedPanels, ForwardTest, ShippedPanelConfigs, ConfigName);

}  // namespace
}  // namespace flashattn::testing
