// The forward pass on every other instruction set this build can run: the portable path (packet width
// 1, so odd tile sizes are legal and exercised), AVX2, plain AVX-512 (also for the 16-bit types, whose
// default may be the bf16 dot-product path) with query blocks of an odd number of packets, and the
// AVX-512 BF16 path with an odd key block, and the AMX path. Instruction sets not compiled in are dropped from the list; those
// compiled in but not supported by the CPU are reported as skipped.

#include "forward_cases.hpp"

namespace flashattn::testing {
namespace {

using cpu::Isa;

// The default list (test_forward.cpp) already runs every scalar on the best path; on a CPU with AVX-512
// BF16 that is the bf16 dot-product path for bf16 and plain AVX-512 packets for the other types. This
// list adds each remaining path once per accumulator (float, double) and once per 16-bit conversion
// route, to keep the compile time down.
using OtherIsaConfigs = CompiledConfigs<
    Pair<float, TileSpec<5, 7, Isa::Portable>>, Pair<double, TileSpec<3, 4, Isa::Portable>>,
    Pair<Eigen::bfloat16, TileSpec<4, 9, Isa::Portable>>,
    Pair<float, TileSpec<16, 32, Isa::Avx2>>, Pair<double, TileSpec<8, 16, Isa::Avx2>>,
    Pair<Eigen::half, TileSpec<24, 8, Isa::Avx2>>,
    Pair<float, TileSpec<48, 16, Isa::Avx512>>, Pair<double, TileSpec<24, 40, Isa::Avx512>>,
    Pair<Eigen::bfloat16, TileSpec<32, 16, Isa::Avx512>>,
    // bf16 dot products take keys in pairs: an odd key block leaves a half pair in every tile.
    Pair<Eigen::bfloat16, TileSpec<48, 17, Isa::Avx512Bf16>>,
    // The AMX tile unit (where compiled in, i.e. -march on an AMX CPU): an odd number of 16-query tiles,
    // 2 × 2 blocks of query tiles, and the shipped shapes (cpu::AmxTiles, cpu::AmxTallerTiles).
    // tests/test_forward_amx.cpp runs the same on the emulated unit everywhere.
    Pair<Eigen::bfloat16, TileSpec<48, 32, Isa::Amx>>, Pair<Eigen::bfloat16, TileSpec<64, 64, Isa::Amx>>,
    Pair<Eigen::bfloat16, TileSpec<32, 128, Isa::Amx>>, Pair<Eigen::bfloat16, TileSpec<256, 128, Isa::Amx, 32>>>;

INSTANTIATE_TYPED_TEST_SUITE_P(OtherIsa, ForwardTest, OtherIsaConfigs, ConfigName);

}  // namespace
}  // namespace flashattn::testing
