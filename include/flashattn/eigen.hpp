#pragma once
// Eigen interop: attention for one head from Eigen matrices or Maps, (seq × head_dim), row-major. Inputs
// that are row-major with unit inner stride (Matrix, Map<..., OuterStride<>>, blocks of those) are read in
// place; other expressions are evaluated into a temporary first. The output must be row-major with direct
// access (a Matrix, or a Map of caller memory).

#include <Eigen/Core>
#include <string>
#include <type_traits>

#include "flashattn/core/options.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"

namespace flashattn {

template <class T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A (seq, dim) row-major block of memory as a one-batch, one-head view.
template <class T>
TensorView<T> single_head_view(T* data, index_t seq, index_t dim, index_t row_stride) {
  return {data, 1, seq, 1, dim, seq * row_stride, row_stride, dim, 1};
}

// o = softmax(scale · q · kᵀ [+ mask]) · v. q: (seq_q, d), k: (seq_k, d), v: (seq_k, dv), o: (seq_q, dv)
// (dv = d but for MLA-style heads). ctx: the backend context
// (cpu::Context<>{threads}, as for attention_forward); the overloads without one run on cpu::Context<>.
template <class Context, class DQ, class DK, class DV, class DO, class = detail::if_context<Context>>
void attention(const Context& ctx, const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
               const Eigen::MatrixBase<DV>& v, const Eigen::MatrixBase<DO>& o_out, const AttentionOptions& options = {}) {
  using T = typename DQ::Scalar;
  static_assert(std::is_same_v<typename DK::Scalar, T> && std::is_same_v<typename DV::Scalar, T> &&
                    std::is_same_v<typename DO::Scalar, T>,
                "q, k, v and o must have the same scalar type");
  static_assert(bool(DO::IsRowMajor) && (int(DO::Flags) & Eigen::DirectAccessBit) != 0,
                "o must be a row-major matrix or map with direct access");
  // Eigen's idiom for writable expression arguments (so that temporaries such as a Map can be passed).
  auto& o = const_cast<Eigen::MatrixBase<DO>&>(o_out).derived();
  if (o.innerStride() != 1)
    throw InvalidArgument("o: the inner (column) stride must be 1, got " + std::to_string(o.innerStride()));
  const Eigen::Ref<const RowMajorMatrix<T>> qr(q), kr(k), vr(v);
  const auto view = [](const auto& m) {
    return single_head_view<const T>(m.data(), m.rows(), m.cols(), m.outerStride());
  };
  attention_forward<Context, T>(ctx, view(qr), view(kr), view(vr),
                                single_head_view<T>(o.data(), o.rows(), o.cols(), o.outerStride()), options);
}

template <class DQ, class DK, class DV, class DO>
void attention(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v,
               const Eigen::MatrixBase<DO>& o_out, const AttentionOptions& options = {}) {
  attention(cpu::Context<>{}, q, k, v, o_out, options);
}

// As above, returning a new (seq_q, dv) matrix.
template <class Context, class DQ, class DK, class DV, class = detail::if_context<Context>>
RowMajorMatrix<typename DQ::Scalar> attention(const Context& ctx, const Eigen::MatrixBase<DQ>& q,
                                              const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v,
                                              const AttentionOptions& options = {}) {
  RowMajorMatrix<typename DQ::Scalar> o(q.rows(), v.cols());
  attention(ctx, q, k, v, o, options);
  return o;
}

template <class DQ, class DK, class DV>
RowMajorMatrix<typename DQ::Scalar> attention(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                                              const Eigen::MatrixBase<DV>& v, const AttentionOptions& options = {}) {
  return attention(cpu::Context<>{}, q, k, v, options);
}

}  // namespace flashattn
