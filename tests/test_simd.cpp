// The packet layer (cpu/simd.hpp), for every (accumulator, instruction set) compiled into this build:
// lane-wise arithmetic against scalar code, max's NaN rule (the same on every path), and exp2's accuracy
// and special values (−inf gives exactly 0, NaN stays NaN). Also the block transpose (cpu/transpose.hpp)
// the kernels move Q and O with.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "configs.hpp"
#include "flashattn/cpu/isa.hpp"
#include "flashattn/cpu/simd.hpp"
#include "flashattn/cpu/transpose.hpp"

namespace flashattn::testing {
namespace {

using cpu::Isa;

template <class Acc_, Isa isa_>
struct Packet {
  using Acc = Acc_;
  static constexpr Isa isa = isa_;
  static std::string name() { return scalar_name<Acc>() + "_" + cpu::isa_name(isa); }
};

template <class Acc, Isa isa>
using keep_packet = std::conditional_t<cpu::is_compiled(isa), std::tuple<Packet<Acc, isa>>, std::tuple<>>;

// Every instruction set compiled in, for both accumulator types.
using Packets = typename detail::as_gtest_types<decltype(std::tuple_cat(
    std::declval<keep_packet<float, Isa::Portable>>(), std::declval<keep_packet<double, Isa::Portable>>(),
    std::declval<keep_packet<float, Isa::Avx2>>(), std::declval<keep_packet<double, Isa::Avx2>>(),
    std::declval<keep_packet<float, Isa::Avx512>>(), std::declval<keep_packet<double, Isa::Avx512>>(),
    std::declval<keep_packet<float, Isa::Avx512Bf16>>(),
    std::declval<keep_packet<double, Isa::Avx512Bf16>>()))>::type;

template <class P>
class SimdTest : public ::testing::Test {
 protected:
  using Acc = typename P::Acc;
  using V = cpu::Simd<Acc, P::isa>;
  static constexpr int W = V::width;

  void SetUp() override {
    if (!cpu_runs(P::isa)) GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(P::isa);
  }

  // Applies a packet operation to consecutive packets of `x` (and `y`, `z`), W lanes at a time.
  template <class Op>
  static std::vector<Acc> lanes(const std::vector<Acc>& x, Op op) {
    std::vector<Acc> out(x.size());
    for (std::size_t i = 0; i + W <= x.size(); i += W) V::store(out.data() + i, op(V::load(x.data() + i)));
    return out;
  }

  static std::vector<Acc> values(std::size_t n, std::uint32_t seed) {
    std::vector<Acc> x(n);
    std::uint32_t s = seed;
    for (Acc& e : x) {
      s = s * 1664525u + 1013904223u;
      e = Acc(double(s >> 8) / double(1 << 24) * 8.0 - 4.0);
    }
    return x;
  }

  static bool same_bits(Acc a, Acc b) { return std::memcmp(&a, &b, sizeof a) == 0; }
  static constexpr Acc kInf = std::numeric_limits<Acc>::infinity();
  static constexpr Acc kNaN = std::numeric_limits<Acc>::quiet_NaN();
};

struct PacketName {
  template <class P>
  static std::string GetName(int) {
    return P::name();
  }
};
TYPED_TEST_SUITE(SimdTest, Packets, PacketName);

TYPED_TEST(SimdTest, WidthFitsTheInstructionSet) {
  using Acc = typename TestFixture::Acc;
  constexpr int bits = TestFixture::W * int(sizeof(Acc)) * 8;
  switch (TypeParam::isa) {
    case Isa::Portable:
      EXPECT_EQ(TestFixture::W, 1);
      break;
    case Isa::Avx2:
      EXPECT_EQ(bits, 256);
      break;
    case Isa::Avx512:
    case Isa::Avx512Bf16:
    case Isa::Amx:
      EXPECT_EQ(bits, 512);
      break;
  }
}

TYPED_TEST(SimdTest, ArithmeticMatchesScalarLaneByLane) {
  using Acc = typename TestFixture::Acc;
  using V = typename TestFixture::V;
  constexpr int W = TestFixture::W;
  const std::size_t n = 8 * W;
  const std::vector<Acc> a = this->values(n, 1), b = this->values(n, 2), c = this->values(n, 3);
  std::vector<Acc> out(n);
  for (std::size_t i = 0; i < n; i += W) {
    const auto pa = V::load(a.data() + i), pb = V::load(b.data() + i), pc = V::load(c.data() + i);
    V::store(out.data() + i, V::add(pa, pb));
    for (int l = 0; l < W; ++l) ASSERT_EQ(out[i + l], Acc(a[i + l] + b[i + l]));
    V::store(out.data() + i, V::sub(pa, pb));
    for (int l = 0; l < W; ++l) ASSERT_EQ(out[i + l], Acc(a[i + l] - b[i + l]));
    V::store(out.data() + i, V::mul(pa, pb));
    for (int l = 0; l < W; ++l) ASSERT_EQ(out[i + l], Acc(a[i + l] * b[i + l]));
    // fma may round once (fused) or twice (portable, when the compiler does not contract): within 1 ulp.
    V::store(out.data() + i, V::fma(pa, pb, pc));
    for (int l = 0; l < W; ++l) {
      const Acc want = std::fma(a[i + l], b[i + l], c[i + l]);
      ASSERT_NEAR(out[i + l], want, std::numeric_limits<Acc>::epsilon() * std::max<Acc>(Acc(1), std::abs(want)));
    }
    V::store(out.data() + i, V::set1(a[i]));
    for (int l = 0; l < W; ++l) ASSERT_EQ(out[i + l], a[i]);
    V::store(out.data() + i, V::zero());
    for (int l = 0; l < W; ++l) ASSERT_TRUE(this->same_bits(out[i + l], Acc(0)));
  }
}

// max(a, b) is `a > b ? a : b` in every lane (vmaxps' rule): a NaN in either operand gives b. The
// portable path follows the same rule, so that no path differs in which NaN survives.
TYPED_TEST(SimdTest, MaxFollowsOneNanRuleOnEveryPath) {
  using Acc = typename TestFixture::Acc;
  using V = typename TestFixture::V;
  constexpr int W = TestFixture::W;
  const Acc inf = TestFixture::kInf, nan = TestFixture::kNaN;
  const Acc specials[] = {Acc(1.5), Acc(-2), -inf, inf, nan, Acc(0), Acc(-0.0), Acc(7)};
  for (Acc x : specials)
    for (Acc y : specials) {
      std::vector<Acc> a(W, x), b(W, y), out(W);
      V::store(out.data(), V::max(V::load(a.data()), V::load(b.data())));
      const Acc want = x > y ? x : y;
      for (int l = 0; l < W; ++l)
        ASSERT_TRUE(this->same_bits(out[l], want)) << "max(" << x << ", " << y << ") = " << out[l];
    }
}

// exp2 over the softmax's whole range [-126, 0], against std::exp2 in double.
TYPED_TEST(SimdTest, Exp2IsAccurateOnTheSoftmaxRange) {
  using Acc = typename TestFixture::Acc;
  const std::size_t n = 1 << 16;
  std::vector<Acc> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = Acc(-126.0 * double(i) / double(n - 1));
  x[n - 1] = Acc(-126);
  const std::vector<Acc> y = this->lanes(x, [](auto r) { return TestFixture::V::exp2_nonpositive(r); });
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double want = std::exp2(double(x[i]));
    worst = std::max(worst, std::abs(double(y[i]) - want) / want);
  }
  // float: the degree-6 polynomial on [0, 1] (approximation error 2e-9) in Horner form, then an exact
  // scaling by 2^floor(x), measured on this grid at 0.53 epsilon (AVX-512) and 0.62 (AVX2, portable); the
  // degree-7 form on [-0.5, 0.5] before it measured 0.56. double: std::exp2 itself.
  const double ulps = 1.0;
  ::testing::Test::RecordProperty("worst_relative_error_ulps",
                                  std::to_string(worst / double(std::numeric_limits<Acc>::epsilon())));
  EXPECT_LE(worst, ulps * double(std::numeric_limits<Acc>::epsilon())) << "worst relative error " << worst;
}

// Integers are exact: 2^0 = 1, 2^-k = the power of two (the polynomial is exactly 1 at f = 0).
TYPED_TEST(SimdTest, Exp2OfIntegersIsExact) {
  using Acc = typename TestFixture::Acc;
  std::vector<Acc> x;
  for (int k = 0; k <= 126; ++k) x.push_back(Acc(-k));
  while (x.size() % TestFixture::W != 0) x.push_back(Acc(0));
  const std::vector<Acc> y = this->lanes(x, [](auto r) { return TestFixture::V::exp2_nonpositive(r); });
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], Acc(std::ldexp(1.0, int(x[i])))) << "2^" << x[i];
}

// −inf (a masked score) gives exactly +0, far below the range gives 0, NaN stays NaN, and each lane is
// independent of its neighbours.
TYPED_TEST(SimdTest, Exp2SpecialValues) {
  using Acc = typename TestFixture::Acc;
  constexpr int W = TestFixture::W;
  const Acc inf = TestFixture::kInf, nan = TestFixture::kNaN;
  const Acc inputs[] = {-inf, nan, Acc(0), Acc(-1e30), Acc(-1000), Acc(-200.5), Acc(-0.5), Acc(-3.25)};
  const std::size_t count = sizeof(inputs) / sizeof(inputs[0]);
  // Below this, 2^x is less than half the smallest subnormal: -150 for float, -1075 for double.
  const Acc kBelowSubnormals =
      Acc(std::numeric_limits<Acc>::min_exponent - std::numeric_limits<Acc>::digits - 1);
  // Every rotation of the inputs across the lanes of a packet.
  for (std::size_t shift = 0; shift < count; ++shift) {
    std::vector<Acc> x(std::max<std::size_t>(W, count));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = inputs[(i + shift) % count];
    while (x.size() % W != 0) x.push_back(Acc(0));
    const std::vector<Acc> y = this->lanes(x, [](auto r) { return TestFixture::V::exp2_nonpositive(r); });
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) {
        ASSERT_TRUE(std::isnan(y[i])) << "NaN became " << y[i];
      } else if (x[i] < kBelowSubnormals) {
        ASSERT_TRUE(this->same_bits(y[i], Acc(0))) << "2^" << x[i] << " = " << y[i];
      } else {
        ASSERT_NEAR(double(y[i]), std::exp2(double(x[i])), 4 * std::numeric_limits<Acc>::epsilon()) << x[i];
      }
    }
  }
  // Between the smallest normal and nothing: for float exactly +0 on every path (the kernels' probabilities
  // must not be subnormal: Intel cores pay a microcode assist for each one, simd.hpp); for double 0 or the
  // subnormal, never more, never negative.
  for (Acc below : {Acc(-126.25), Acc(-130.5), Acc(-149.75)}) {
    std::vector<Acc> x(W, below);
    const std::vector<Acc> y = this->lanes(x, [](auto r) { return TestFixture::V::exp2_nonpositive(r); });
    for (Acc v : y) {
      if constexpr (std::is_same_v<Acc, float>) {
        EXPECT_TRUE(this->same_bits(v, Acc(0))) << "2^" << below << " = " << v;
      } else {
        EXPECT_GE(v, Acc(0));
        EXPECT_LE(double(v), std::exp2(-126.0));
      }
    }
  }
}

// The instruction sets: which are compiled in, and that the CPU runs every one of them (the build's
// -march must not promise more than the machine has, or every kernel test would crash).
// transpose() moves every element to its mirrored place and nothing else, for every shape around the
// 16 x 16 blocks of the AVX-512 path (full blocks, tails of rows and columns, fewer than 16 of either), with
// leading dimensions larger than the extents (the kernels' strided rows).
TYPED_TEST(SimdTest, TransposeMovesEveryElementOnce) {
  using Acc = typename TestFixture::Acc;
  for (int rows : {0, 1, 7, 15, 16, 17, 31, 32, 33, 64}) {
    for (int cols : {1, 5, 16, 19, 32, 48, 70}) {
      const index_t src_ld = cols + 3, dst_ld = rows + 5;
      std::vector<Acc> src(std::size_t(rows * src_ld + 1));
      for (std::size_t e = 0; e < src.size(); ++e) src[e] = Acc(e);
      const Acc untouched = Acc(-1);
      std::vector<Acc> dst(std::size_t(cols * dst_ld + 1), untouched);
      cpu::transpose<TypeParam::isa>(src.data(), src_ld, dst.data(), dst_ld, rows, cols);
      int wrong = 0;
      for (index_t c = 0; c < cols; ++c)
        for (index_t i = 0; i < dst_ld; ++i) {
          const Acc expected = i < rows ? src[std::size_t(i * src_ld + c)] : untouched;
          wrong += dst[std::size_t(c * dst_ld + i)] != expected;
        }
      EXPECT_EQ(wrong, 0) << "rows " << rows << " cols " << cols;
      EXPECT_EQ(dst.back(), untouched) << "rows " << rows << " cols " << cols;
    }
  }
}

// The converting moves the kernels make with 16-bit storage (fp16/bf16 Q rows into an fp32 Qᵀ, an fp32 Oᵀ
// into fp16/bf16 O rows): every element lands where the plain transpose puts it, with the bits of a scalar
// conversion of that element. The sources hold every fp16 and every bf16 bit pattern (NaNs, infinities,
// subnormals, both zeros); the fp32 sources hold values around fp16's rounding boundaries (ties to even,
// overflow to infinity, the subnormal range) and, for bf16, values around bf16's.
template <class D>
std::uint32_t bits_of(const D& x) {
  if constexpr (sizeof(D) == 4) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  } else {
    std::uint16_t u;
    std::memcpy(&u, &x, 2);
    return u;
  }
}

// A value the transpose must leave alone where it writes nothing (the destination's padding rows).
template <class D>
D untouched_marker() {
  if constexpr (sizeof(D) == 4) return D(-12345.0f);
  else return Eigen::numext::bit_cast<D>(std::uint16_t(0x5A5A));
}

// Moves `values` through rows × cols blocks (the next rows · cols values each time, so that every value
// lands in a real element at least once) and counts elements whose bits differ from the scalar
// conversion (NaNs included, with the one exception below), plus padding elements of the destination that
// were written.
template <Isa isa, class S, class D>
int count_converting_mismatches(const std::vector<S>& values, int rows, int cols) {
  const index_t src_ld = cols + 2, dst_ld = rows + 3;
  std::vector<S> src(std::size_t(rows * src_ld), values[0]);
  std::vector<D> dst(std::size_t(cols * dst_ld));
  const D marker = untouched_marker<D>();
  const std::size_t per_block = std::size_t(rows) * std::size_t(cols);
  int wrong = 0;
  for (std::size_t offset = 0; offset < values.size(); offset += per_block) {
    for (index_t i = 0; i < rows; ++i)
      for (index_t c = 0; c < cols; ++c)
        src[std::size_t(i * src_ld + c)] = values[(offset + std::size_t(i * cols + c)) % values.size()];
    std::fill(dst.begin(), dst.end(), marker);
    cpu::transpose<isa>(src.data(), src_ld, dst.data(), dst_ld, rows, cols);
    for (index_t c = 0; c < cols; ++c)
      for (index_t i = 0; i < dst_ld; ++i) {
        const D got = dst[std::size_t(c * dst_ld + i)];
        const D expected = i < rows ? static_cast<D>(src[std::size_t(i * src_ld + c)]) : marker;
        std::uint32_t expected_bits = bits_of(expected);
        // The one difference: vcvtph2ps quiets a signalling fp16 NaN (sets fp32's quiet bit, keeps sign and
        // payload), where Eigen's scalar widening keeps it signalling. Either way a NaN goes on as a NaN.
        // Only elements of whole 16 × 16 blocks move by packets; the edges are converted one by one.
        const bool by_packet = cpu::is_avx512(isa) && i < rows / 16 * 16 && c < cols / 16 * 16;
        if constexpr (cpu::is_fp16<S>)
          if (by_packet && Eigen::numext::isnan(expected)) expected_bits |= 0x00400000u;
        wrong += bits_of(got) != expected_bits;
      }
  }
  return wrong;
}

// The 16-bit storage types convert to and from float only: every instruction set compiled in, float lanes.
using FloatPackets = typename detail::as_gtest_types<decltype(std::tuple_cat(
    std::declval<keep_packet<float, Isa::Portable>>(), std::declval<keep_packet<float, Isa::Avx2>>(),
    std::declval<keep_packet<float, Isa::Avx512>>(), std::declval<keep_packet<float, Isa::Avx512Bf16>>()))>::type;

template <class P>
class ConvertingTransposeTest : public SimdTest<P> {};
TYPED_TEST_SUITE(ConvertingTransposeTest, FloatPackets, PacketName);

TYPED_TEST(ConvertingTransposeTest, RoundsLikeScalarConversion) {
  constexpr Isa isa = TypeParam::isa;
  std::vector<Eigen::half> halves(1 << 16);
  std::vector<Eigen::bfloat16> bf16s(1 << 16);
  for (std::uint32_t u = 0; u < (1u << 16); ++u) {
    halves[u] = Eigen::numext::bit_cast<Eigen::half>(std::uint16_t(u));
    bf16s[u] = Eigen::numext::bit_cast<Eigen::bfloat16>(std::uint16_t(u));
  }
  // fp32 values near each fp16's neighbours (every 7th fp16 below infinity, both signs): the value, the
  // midpoint (a tie), and one fp32 ulp either side of the midpoint; plus values beyond fp16's range.
  std::vector<float> floats;
  for (std::uint32_t u = 0; u < 0x7C00; u += 7) {
    const float a = float(Eigen::numext::bit_cast<Eigen::half>(std::uint16_t(u)));
    const float b = float(Eigen::numext::bit_cast<Eigen::half>(std::uint16_t(u + 1)));
    const float mid = a + (b - a) / 2;
    for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      floats.push_back(x);
      floats.push_back(-x);
    }
  }
  // ... and near each bf16's neighbours (every 97th bf16 below infinity, both signs), subnormals included.
  for (std::uint32_t u = 0; u < 0x7F80; u += 97) {
    const float a = float(Eigen::numext::bit_cast<Eigen::bfloat16>(std::uint16_t(u)));
    const float b = float(Eigen::numext::bit_cast<Eigen::bfloat16>(std::uint16_t(u + 1)));
    const float mid = a + (b - a) / 2;
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      floats.push_back(x);
      floats.push_back(-x);
    }
  }
  using limits = std::numeric_limits<float>;
  for (float x : {limits::max(), 3.4e38f, 65504.0f, 65519.0f, 65520.0f, 1e6f, limits::infinity(), limits::quiet_NaN(),
                  limits::denorm_min()}) {
    floats.push_back(x);
    floats.push_back(-x);
  }
  for (auto [rows, cols] : {std::pair{16, 16}, std::pair{64, 128}, std::pair{33, 70}, std::pair{7, 5}}) {
    EXPECT_EQ((count_converting_mismatches<isa, Eigen::half, float>(halves, rows, cols)), 0)
        << "fp16 -> fp32, rows " << rows << " cols " << cols;
    EXPECT_EQ((count_converting_mismatches<isa, Eigen::bfloat16, float>(bf16s, rows, cols)), 0)
        << "bf16 -> fp32, rows " << rows << " cols " << cols;
    EXPECT_EQ((count_converting_mismatches<isa, float, Eigen::half>(floats, rows, cols)), 0)
        << "fp32 -> fp16, rows " << rows << " cols " << cols;
    EXPECT_EQ((count_converting_mismatches<isa, float, Eigen::bfloat16>(floats, rows, cols)), 0)
        << "fp32 -> bf16, rows " << rows << " cols " << cols;
  }
}

TEST(Isa, CompiledPathsRunOnThisCpu) {
  EXPECT_TRUE(cpu::is_compiled(Isa::Portable));
  // (Isa::Amx is left out: compiled in, it still needs the OS's permission, which dispatch asks at run time.)
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16}) {
    if (cpu::is_compiled(isa)) {
      EXPECT_TRUE(cpu_runs(isa)) << cpu::isa_name(isa);
    }
  }
  EXPECT_TRUE(cpu::is_compiled(cpu::kBestIsa));
  // The best path is the widest compiled one.
  const Isa widest = cpu::is_compiled(Isa::Avx512Bf16) ? Isa::Avx512Bf16
                     : cpu::is_compiled(Isa::Avx512)   ? Isa::Avx512
                     : cpu::is_compiled(Isa::Avx2)     ? Isa::Avx2
                                                       : Isa::Portable;
  EXPECT_EQ(cpu::kBestIsa, widest);
  EXPECT_STRNE(cpu::isa_name(Isa::Avx2), cpu::isa_name(Isa::Avx512));
}

}  // namespace
}  // namespace flashattn::testing
