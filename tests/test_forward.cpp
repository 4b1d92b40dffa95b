// The forward pass against the fp64 reference on the default instruction set: every scalar type times
// three tile shapes (square, wide key blocks, tall query blocks; for float and bf16 the tall blocks are
// three panels, tiles.hpp's PanelQ, as cpu::TallTiles are two). The cases are in forward_cases.hpp.

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

}  // namespace
}  // namespace flashattn::testing
