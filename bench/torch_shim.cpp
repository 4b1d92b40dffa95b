// A C entry point into flashattn for bench/compare_torch.py: loaded with ctypes into the same Python
// process as PyTorch, so that the two kernels can be timed call by call, alternated, on the same tensors
// (same memory, same core, same clock state). Not part of the library's API.
//
// Tensors are given as PyTorch holds them: shape (B, H, S, D) with element strides, any layout
// (torch's contiguous BHSD, or a BSHD buffer viewed through transpose(1, 2)).
#include <Eigen/Core>
#include <cstdint>
#include <cstdio>
#include <exception>

#include "flashattn/flashattn.hpp"

namespace {

// A (B, H, S, D) torch tensor with strides `st` as flashattn's (batch, seq, heads, dim) view.
template <class T>
flashattn::TensorView<T> view(void* data, const std::int64_t* shape, const std::int64_t* st) {
  return {static_cast<T*>(data), shape[0], shape[2], shape[1], shape[3], st[0], st[2], st[1], st[3]};
}

// q and o with shape q_shape (B, H, Sq, D), k and v with kv_shape (B, Hk, Sk, D): equal in prefill, apart
// in decoding (GQA: H a multiple of Hk). strides: 4 per tensor, in the order q, k, v, o.
template <class T>
void forward(void* q, void* k, void* v, void* o, const std::int64_t* q_shape, const std::int64_t* kv_shape,
             const std::int64_t* strides, bool causal, int threads) {
  flashattn::AttentionOptions opts;
  opts.causal = causal;
  const flashattn::cpu::Context<> ctx{threads};
  flashattn::attention_forward(ctx, view<const T>(q, q_shape, strides), view<const T>(k, kv_shape, strides + 4),
                               view<const T>(v, kv_shape, strides + 8), view<T>(o, q_shape, strides + 12), opts);
}

// forward<T> for dtype 0 (fp32), 1 (bf16) or 2 (fp16): 0, or -1 after printing an exception's message.
int forward_of_dtype(const char* entry, int dtype, void* q, void* k, void* v, void* o, const std::int64_t* q_shape,
                     const std::int64_t* kv_shape, const std::int64_t* strides, bool causal, int threads) {
  try {
    if (dtype == 0) forward<float>(q, k, v, o, q_shape, kv_shape, strides, causal, threads);
    else if (dtype == 1) forward<Eigen::bfloat16>(q, k, v, o, q_shape, kv_shape, strides, causal, threads);
    else if (dtype == 2) forward<Eigen::half>(q, k, v, o, q_shape, kv_shape, strides, causal, threads);
    else return -1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", entry, e.what());
    return -1;
  }
  return 0;
}

}  // namespace

// dtype: 0 fp32, 1 bf16, 2 fp16. Returns 0, or -1 after printing the exception's message.
extern "C" __attribute__((visibility("default"))) int flashattn_shim_forward(void* q, void* k, void* v, void* o, int dtype, const std::int64_t* shape,
                                      const std::int64_t* strides, int causal, int threads) {
  return forward_of_dtype("flashattn_shim_forward", dtype, q, k, v, o, shape, shape, strides, causal != 0, threads);
}

// Decoding (bench/compare_torch_decode.py): the shapes of q/o and of k/v apart, no mask.
extern "C" __attribute__((visibility("default"))) int flashattn_shim_decode(void* q, void* k, void* v, void* o, int dtype,
                                                                           const std::int64_t* q_shape,
                                                                           const std::int64_t* kv_shape,
                                                                           const std::int64_t* strides, int threads) {
  return forward_of_dtype("flashattn_shim_decode", dtype, q, k, v, o, q_shape, kv_shape, strides, false, threads);
}
