// Eigen interop (eigen.hpp): one head from Eigen matrices, Maps and blocks, (seq × head_dim) row-major,
// against the fp64 reference; other expressions are evaluated first; the output may be a Map or block
// of caller memory; bad shapes and strides are reported like the core API's.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <string>
#include <vector>

#include "configs.hpp"
#include "flashattn/eigen.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

template <class T>
using Mat = RowMajorMatrix<T>;

template <class T>
Mat<T> random_matrix(index_t rows, index_t cols, std::uint32_t seed) {
  Mat<T> m(rows, cols);
  fill_normal(single_head_view<T>(m.data(), rows, cols, cols), seed);
  return m;
}

template <class T>
TensorView<const T> view_of(const Mat<T>& m) {
  return single_head_view<const T>(m.data(), m.rows(), m.cols(), m.cols());
}

template <class T>
class EigenInterop : public ::testing::Test {};

// The interop layer is the same code for every scalar: one 32-bit and one 16-bit type.
using Scalars = ::testing::Types<float, Eigen::half>;
struct ScalarName {
  template <class T>
  static std::string GetName(int) {
    return scalar_name<T>();
  }
};
TYPED_TEST_SUITE(EigenInterop, Scalars, ScalarName);

// Matrices in, a new matrix out, and the same into a caller's matrix: both match the reference, bit for bit
// each other.
TYPED_TEST(EigenInterop, MatricesMatchTheReference) {
  using T = TypeParam;
  for (bool causal : {false, true})
    for (auto [sq, sk] : {std::pair<index_t, index_t>{37, 37}, {20, 70}, {70, 20}}) {
      const Mat<T> q = random_matrix<T>(sq, 16, 1), k = random_matrix<T>(sk, 16, 2), v = random_matrix<T>(sk, 16, 3);
      AttentionOptions opts;
      opts.causal = causal;
      const Mat<T> o = attention(q, k, v, opts);
      ASSERT_EQ(o.rows(), sq);
      ASSERT_EQ(o.cols(), 16);
      EXPECT_TRUE(matches_reference_for_options<T>(view_of(q), view_of(k), view_of(v), view_of(o), LseView{}, opts))
          << "seq_q=" << sq << " seq_k=" << sk << " causal=" << causal;
      Mat<T> into(sq, 16);
      attention(q, k, v, into, opts);
      EXPECT_TRUE(into == o);
    }
}

// Maps over a fused (seq, 3·d) QKV activation and blocks of it are read in place: only their outer
// stride differs from a matrix. The output goes into a padded Map of caller memory, padding untouched.
TYPED_TEST(EigenInterop, MapsAndBlocksOfForeignMemory) {
  using T = TypeParam;
  const index_t seq = 45, d = 24;
  const Mat<T> qkv = random_matrix<T>(seq, 3 * d, 4);
  using ConstMap = Eigen::Map<const Mat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
  const ConstMap q(qkv.data(), seq, d, Eigen::OuterStride<>(3 * d));
  const ConstMap k(qkv.data() + d, seq, d, Eigen::OuterStride<>(3 * d));

  const index_t padded = d + 5;
  std::vector<T> out(std::size_t(seq * padded), T(-3.0f));
  Eigen::Map<Mat<T>, Eigen::Unaligned, Eigen::OuterStride<>> o(out.data(), seq, d, Eigen::OuterStride<>(padded));
  AttentionOptions opts;
  opts.causal = true;
  attention(q, k, qkv.middleCols(2 * d, d), o, opts);

  const TensorView<const T> qv = single_head_view<const T>(qkv.data(), seq, d, 3 * d),
                            kv = single_head_view<const T>(qkv.data() + d, seq, d, 3 * d),
                            vv = single_head_view<const T>(qkv.data() + 2 * d, seq, d, 3 * d),
                            ov = single_head_view<const T>(out.data(), seq, d, padded);
  EXPECT_TRUE(matches_reference_for_options<T>(qv, kv, vv, ov, LseView{}, opts));
  for (index_t i = 0; i < seq; ++i)
    for (index_t c = d; c < padded; ++c) ASSERT_EQ(float(out[std::size_t(i * padded + c)]), -3.0f) << i << ", " << c;

  // A block of a larger row-major matrix as the output gives the same bits.
  Mat<T> wide = Mat<T>::Constant(seq, 2 * d, T(9.0f));
  attention(q, k, qkv.middleCols(2 * d, d), wide.rightCols(d), opts);
  EXPECT_TRUE(wide.rightCols(d) == o);
  EXPECT_TRUE((wide.leftCols(d).array() == T(9.0f)).all());
}

// Column-major matrices and arbitrary expressions are evaluated into row-major temporaries first.
TYPED_TEST(EigenInterop, OtherExpressionsAreEvaluated) {
  using T = TypeParam;
  const index_t sq = 19, sk = 33, d = 16;
  const Mat<T> q = random_matrix<T>(sq, d, 5), k = random_matrix<T>(sk, d, 6), v = random_matrix<T>(sk, d, 7);
  const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor> k_col = k;
  const Mat<T> want = attention(q, k, v);
  EXPECT_TRUE(attention(q, k_col, v) == want);
  EXPECT_TRUE(attention(q, k, v.transpose().transpose()) == want);
  // An expression with arithmetic: q scaled by 2 gives the result of the evaluated product.
  const Mat<T> q2 = q * T(2.0f);
  EXPECT_TRUE(attention(q * T(2.0f), k, v) == attention(q2, k, v));
}

TEST(EigenInteropErrors, BadOutputStrideAndShapes) {
  const Mat<float> q = random_matrix<float>(8, 4, 1), k = random_matrix<float>(8, 4, 2);
  std::vector<float> buf(8 * 8);
  Eigen::Map<Mat<float>, Eigen::Unaligned, Eigen::Stride<Eigen::Dynamic, 2>> strided(
      buf.data(), 8, 4, Eigen::Stride<Eigen::Dynamic, 2>(8, 2));
  try {
    attention(q, k, k, strided);
    FAIL() << "an output with inner stride 2 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("o: the inner (column) stride must be 1, got 2"), std::string::npos)
        << e.what();
  }
  const Mat<float> k3 = random_matrix<float>(8, 3, 3);
  try {
    (void)attention(q, k3, k3);
    FAIL() << "mismatched head dims were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head dims must agree"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("k (batch=1, seq=8, heads=1, dim=3)"), std::string::npos) << e.what();
  }
  AttentionOptions opts;
  opts.scale = -1.0;
  EXPECT_THROW((void)attention(q, k, k, opts), std::invalid_argument);
}

}  // namespace
}  // namespace flashattn::testing
