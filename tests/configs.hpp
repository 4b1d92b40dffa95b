#pragma once
// Test configurations shared by the typed tests: a (scalar, tile configuration) pair with a readable
// name, the filter that keeps only instruction sets compiled into this translation unit, and the runtime
// check that the CPU can execute one.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <string>
#include <tuple>
#include <type_traits>

#include "flashattn/cpu/amx.hpp"
#include "flashattn/cpu/isa.hpp"
#include "flashattn/cpu/tiles.hpp"

namespace flashattn::testing {

template <class T>
std::string scalar_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  if constexpr (std::is_same_v<T, double>) return "double";
  if constexpr (std::is_same_v<T, Eigen::half>) return "half";
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return "bfloat16";
  return "unknown";
}

// Whether this CPU executes the instructions of `isa` (compiled in is checked by cpu::is_compiled).
inline bool cpu_runs(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::Portable:
      return true;
    case cpu::Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case cpu::Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case cpu::Isa::Avx512Bf16:
      return cpu_runs(cpu::Isa::Avx512) && __builtin_cpu_supports("avx512bf16");
    case cpu::Isa::Amx:  // also asks the OS for the tile state (always true under FLASHATTN_AMX_EMULATE)
      return cpu_runs(cpu::Isa::Avx512Bf16) && cpu::amx::usable();
  }
  return false;
}

// Tile sizes as a type that names an instruction set without instantiating cpu::Tiles (whose
// static_assert rejects an instruction set this translation unit is not compiled for).
template <int BlockQ, int BlockKV, cpu::Isa isa = cpu::kBestIsa, int PanelQ = BlockQ>
struct TileSpec {
  static constexpr cpu::Isa kIsa = isa;
};

template <class T_, class Spec>
struct Config;

template <class T_, int BlockQ_, int BlockKV_, cpu::Isa isa, int PanelQ_>
struct Config<T_, TileSpec<BlockQ_, BlockKV_, isa, PanelQ_>> {
  using T = T_;
  using Tiles = cpu::Tiles<BlockQ_, BlockKV_, isa, PanelQ_>;
  static std::string name() {
    return scalar_name<T>() + "_q" + std::to_string(BlockQ_) + "_kv" + std::to_string(BlockKV_) +
           (PanelQ_ == BlockQ_ ? std::string() : "_p" + std::to_string(PanelQ_)) + "_" + cpu::isa_name(isa);
  }
};

// The gtest name generator of every typed test: e.g. "float_q32_kv64_avx512", "float_q96_kv32_p32_avx512"
// (96-row programs of 32-row panels).
struct ConfigName {
  template <class C>
  static std::string GetName(int) {
    return C::name();
  }
};

namespace detail {
template <class T, class Spec>
using keep_if_compiled = std::conditional_t<cpu::is_compiled(Spec::kIsa), std::tuple<Config<T, Spec>>, std::tuple<>>;

template <class Tuple>
struct as_gtest_types;
template <class... Cs>
struct as_gtest_types<std::tuple<Cs...>> {
  using type = ::testing::Types<Cs...>;
};
}  // namespace detail

// ::testing::Types of Config<T, Spec> for each listed (T, Spec) pair, dropping those whose instruction
// set is not compiled into this translation unit. Usage: CompiledConfigs<Pair<float, TileSpec<...>>, ...>.
template <class T, class Spec>
struct Pair {
  using type = detail::keep_if_compiled<T, Spec>;
};
template <class... Pairs>
using CompiledConfigs =
    typename detail::as_gtest_types<decltype(std::tuple_cat(std::declval<typename Pairs::type>()...))>::type;

}  // namespace flashattn::testing
