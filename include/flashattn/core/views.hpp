#pragma once
// Strided, non-owning views of the attention tensors. A view is a pointer plus a shape and strides (in
// elements), like a CuTe tensor or a DLPack tensor: BSHD, BHSD and slices of a fused QKV buffer are all
// the same type with different strides, so none needs a copy. Free of Eigen and of CPU intrinsics so that
// a CUDA backend can take the same views.

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__
#else
#define FLASHATTN_HOST_DEVICE
#endif

namespace flashattn {

// Every size and offset is 64-bit: seq_q * seq_k and batch * heads * seq * dim both pass 2^31.
using index_t = std::int64_t;

// A rank-4 tensor of shape (batch, seq, heads, dim).
template <class T>
struct TensorView {
  T* data = nullptr;
  index_t batch = 0, seq = 0, heads = 0, dim = 0;
  index_t stride_batch = 0, stride_seq = 0, stride_head = 0, stride_dim = 1;

  // Row `s` of head `h` in batch `b`: `dim` elements, `stride_dim` apart.
  FLASHATTN_HOST_DEVICE T* row(index_t b, index_t s, index_t h) const {
    return data + b * stride_batch + s * stride_seq + h * stride_head;
  }
  FLASHATTN_HOST_DEVICE T& operator()(index_t b, index_t s, index_t h, index_t d) const {
    return row(b, s, h)[d * stride_dim];
  }
  FLASHATTN_HOST_DEVICE index_t numel() const { return batch * seq * heads * dim; }

  // A view of mutable data converts to a read-only view, as a pointer does.
  FLASHATTN_HOST_DEVICE operator TensorView<const T>() const {
    return {data, batch, seq, heads, dim, stride_batch, stride_seq, stride_head, stride_dim};
  }
};

// Contiguous (batch, seq, heads, dim): the layout of a [B, S, H*D] activation (PyTorch's
// `transpose(1, 2)`-free layout, FlashAttention's native one).
template <class T>
TensorView<T> bshd(T* data, index_t batch, index_t seq, index_t heads, index_t dim) {
  return {data, batch, seq, heads, dim, seq * heads * dim, heads * dim, dim, 1};
}

// Contiguous (batch, heads, seq, dim): PyTorch SDPA's layout.
template <class T>
TensorView<T> bhsd(T* data, index_t batch, index_t heads, index_t seq, index_t dim) {
  return {data, batch, seq, heads, dim, heads * seq * dim, dim, seq * dim, 1};
}

// Log-sum-exp of each score row (natural log), shape (batch, heads, seq_q), always float.
struct LseView {
  float* data = nullptr;
  index_t batch = 0, heads = 0, seq = 0;
  index_t stride_batch = 0, stride_head = 0, stride_seq = 1;

  FLASHATTN_HOST_DEVICE float& operator()(index_t b, index_t h, index_t s) const {
    return data[b * stride_batch + h * stride_head + s * stride_seq];
  }
  FLASHATTN_HOST_DEVICE bool empty() const { return data == nullptr; }
};

// Contiguous (batch, heads, seq) LSE.
inline LseView lse_bhs(float* data, index_t batch, index_t heads, index_t seq) {
  return {data, batch, heads, seq, heads * seq, seq, 1};
}

// A (batch, heads, seq_q, seq_k) float tensor of additive score biases (bias(...) in score_variants.hpp);
// a batch or heads extent of 1 is broadcast over the call's. Rows of seq_k keys at stride_q, stride 1
// along keys.
struct BiasView {
  const float* data = nullptr;
  index_t batch = 0, heads = 0, seq_q = 0, seq_k = 0;
  index_t stride_batch = 0, stride_head = 0, stride_q = 0;
};

// Contiguous (batch, heads, seq_q, seq_k).
inline BiasView bias_bhqk(const float* data, index_t batch, index_t heads, index_t seq_q, index_t seq_k) {
  return {data, batch, heads, seq_q, seq_k, heads * seq_q * seq_k, seq_q * seq_k, seq_k};
}

namespace detail {
// Keeps a view parameter out of template argument deduction, so that views of non-const data convert to
// TensorView<const T> and T is taken from the output (every entry point's q, k, v).
template <class X>
struct identity {
  using type = X;
};
template <class X>
using nondeduced = typename identity<X>::type;
}  // namespace detail

}  // namespace flashattn
