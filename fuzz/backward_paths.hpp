#pragma once
// The backward entry points under the fuzzer (flashattn/backward.hpp, and the packed backward of
// flashattn/varlen.hpp). A valid options-mask problem on a type's default tiles is copied into contiguous
// tensors, its forward run for O and the LSE, and a fuzzed dO drawn; then:
//   - the dense backward (on the chosen thread count) and the packed varlen backward of the same problem
//     as a batch of equal lengths (on the other), half the time both with a gradient of the LSE
//     (BackwardExtras::d_lse), must give the same bits: same tiles, and the backward's
//     bits do not depend on the thread count;
//   - with finite inputs of moderate size (|x| <= 4, scale <= 4, no subnormals: the bf16 dot-product kernels read
//     those as 0), dq, dk, dv must meet the tolerance rule against the fp64 gradients of
//     tests/reference_backward.hpp (2 × the same-precision naive backward's error + 4 ulps of T); double
//     is left to the tests, whose exact side would need a wider type than the reference has;
//   - about one time in four, the packed call gets corrupted offsets instead, which must throw
//     InvalidArgument and write nothing.
// Whatever the values, no call may throw on valid input, and the sanitizers watch every access.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "flashattn/backward.hpp"
#include "flashattn/varlen.hpp"
#include "reference_backward.hpp"

namespace flashattn_fuzz {

template <class T>
bool moderate_values(const std::vector<T>& x) {
  for (const T& e : x) {
    const double d = std::abs(to_double(e));
    if (!(d <= 4.0) || (d != 0.0 && d < 1e-4)) return false;
  }
  return true;
}

// Max |got − exact| <= 2·max |naive − exact| + 4 ulps of T at the exact gradient's magnitude.
template <class T>
bool meets_tolerance(const std::vector<T>& got, const std::vector<double>& naive, const std::vector<double>& exact) {
  double err = 0, naive_err = 0, magnitude = 1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = to_double(got[i]);
    if (!std::isfinite(g)) return false;
    err = std::max(err, std::abs(g - exact[i]));
    naive_err = std::max(naive_err, std::abs(naive[i] - exact[i]));
    magnitude = std::max(magnitude, std::abs(exact[i]));
  }
  const double eps = 4.0 * to_double(std::numeric_limits<T>::epsilon()) * magnitude;
  return err <= 2.0 * naive_err + eps;
}

template <class Tiles, class T>
void check_backward_paths_on(FuzzedDataProvider& fdp, const Problem& p, const fa::TensorView<const T>& q,
                             const fa::TensorView<const T>& k, const fa::TensorView<const T>& v) {
  if (p.mask != MaskKind::Options || p.batch == 0 || p.seq_q == 0) return;
  // D: the head dim of q and k; Dv: of v, o, d_o (and dv).
  const index_t B = p.batch, Sq = p.seq_q, Sk = p.seq_k, H = p.heads_q, Hkv = p.heads_kv, D = p.dim, Dv = p.dim_v;
  const std::vector<T> qp = packed_copy(q), kp = packed_copy(k), vp = packed_copy(v);
  std::vector<T> o(std::size_t(B * Sq * H * Dv), poison<T>()), d_o(o.size());
  Rng rng{fdp.ConsumeIntegral<std::uint64_t>()};
  for (T& x : d_o) x = from_double<T>(rng.symmetric());
  // One LSE buffer, (heads, batch · seq_q): the packed call's lse_packed and the dense call's (b, h, s).
  std::vector<float> lse_buf(std::size_t(H * B * Sq), poison<float>());
  const fa::LseView lse_dense{lse_buf.data(), B, H, Sq, Sq, B * Sq, 1};
  const index_t total_q = B * Sq, total_k = B * Sk;
  const auto dense = [&](const std::vector<T>& x, index_t seq, index_t heads, index_t dim) {
    return fa::bshd<const T>(x.data(), B, seq, heads, dim);
  };
  std::vector<std::int32_t> cu_q, cu_k;
  for (index_t b = 0; b <= B; ++b) {
    cu_q.push_back(std::int32_t(b * Sq));
    cu_k.push_back(std::int32_t(b * Sk));
  }

  // Half the time a gradient of the LSE too (BackwardExtras::d_lse), in the LSE's layout; the reference
  // reads it as (batch, heads, seq_q).
  const bool with_d_lse = fdp.ConsumeBool();
  std::vector<float> d_lse_buf(lse_buf.size());
  for (float& x : d_lse_buf) x = float(rng.symmetric());
  std::vector<double> d_lse_bhs(d_lse_buf.size());
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < Sq; ++i)
        d_lse_bhs[std::size_t((b * H + h) * Sq + i)] = d_lse_buf[std::size_t(h * B * Sq + b * Sq + i)];
  fa::BackwardExtras dense_extras, packed_extras;
  if (with_d_lse) {
    dense_extras.d_lse = fa::LseView{d_lse_buf.data(), B, H, Sq, Sq, B * Sq, 1};
    packed_extras.d_lse = fa::lse_packed(d_lse_buf.data(), H, total_q);
  }
  const double* ref_d_lse = with_d_lse ? d_lse_bhs.data() : nullptr;

  using Ctx = fa::cpu::Context<Tiles>;
  const int other_threads = p.threads == 1 ? 2 : 1;
  std::vector<T> dq1(qp.size(), poison<T>()), dk1(kp.size(), poison<T>()), dv1(vp.size(), poison<T>());
  std::vector<T> dq2 = dq1, dk2 = dk1, dv2 = dv1;
  try {
    fa::attention_forward(Ctx{p.threads}, dense(qp, Sq, H, D), dense(kp, Sk, Hkv, D), dense(vp, Sk, Hkv, Dv),
                          fa::bshd(o.data(), B, Sq, H, Dv), p.opts, lse_dense);
    fa::attention_backward(Ctx{p.threads}, dense(qp, Sq, H, D), dense(kp, Sk, Hkv, D), dense(vp, Sk, Hkv, Dv),
                           dense(o, Sq, H, Dv), dense(d_o, Sq, H, Dv), lse_dense, fa::bshd(dq1.data(), B, Sq, H, D),
                           fa::bshd(dk1.data(), B, Sk, Hkv, D), fa::bshd(dv1.data(), B, Sk, Hkv, Dv), p.opts,
                           dense_extras);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    finding("a valid backward call threw");
  }

  std::vector<std::int32_t> bad_q = cu_q, bad_k = cu_k;
  const bool corrupt = fdp.ConsumeIntegralInRange(0, 3) == 0;
  if (corrupt) {
    switch (fdp.ConsumeIntegralInRange(0, 2)) {
      case 0: bad_q[0] = 1; break;                                // not starting at 0
      case 1: bad_k[std::size_t(B)] = std::int32_t(total_k + 1); break;  // disagreeing with k's total
      default:                                                    // decreasing
        if (B >= 1) bad_q[1] = std::int32_t(total_q + 1);
        else bad_q[0] = -1;
        break;
    }
  }
  bool threw = false;
  try {
    fa::attention_backward_varlen(Ctx{other_threads}, fa::packed<const T>(qp.data(), total_q, H, D),
                                  fa::packed<const T>(kp.data(), total_k, Hkv, D),
                                  fa::packed<const T>(vp.data(), total_k, Hkv, Dv),
                                  fa::packed<const T>(o.data(), total_q, H, Dv),
                                  fa::packed<const T>(d_o.data(), total_q, H, Dv),
                                  fa::lse_packed(lse_buf.data(), H, total_q), fa::packed(dq2.data(), total_q, H, D),
                                  fa::packed(dk2.data(), total_k, Hkv, D), fa::packed(dv2.data(), total_k, Hkv, Dv),
                                  fa::PackedBatch{bad_q.data(), bad_k.data(), B}, p.opts, packed_extras);
  } catch (const fa::InvalidArgument&) {
    threw = true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    finding("a packed backward call threw something other than InvalidArgument");
  }
  if (corrupt) {
    FUZZ_CHECK(threw, "a packed backward call with bad offsets did not throw");
    for (const std::vector<T>* g : {&dq2, &dk2, &dv2})
      for (const T& x : *g) FUZZ_CHECK(same_bits(x, poison<T>()), "a rejected packed backward call wrote a gradient");
    return;
  }
  FUZZ_CHECK(!threw, "a valid packed backward call threw");
  const std::pair<const std::vector<T>*, const std::vector<T>*> pairs[] = {{&dq1, &dq2}, {&dk1, &dk2}, {&dv1, &dv2}};
  for (const auto& [a, b] : pairs)
    for (std::size_t i = 0; i < a->size(); ++i)
      FUZZ_CHECK(same_bits((*a)[i], (*b)[i]),
                 "the packed backward (or another thread count) gave other gradient bits than the dense one");

  if constexpr (!std::is_same_v<T, double>) {
    if (!moderate_values(qp) || !moderate_values(kp) || !moderate_values(vp)) return;
    const double scale = p.opts.scale ? *p.opts.scale : 1.0 / std::sqrt(double(D));
    if (!(scale <= 4.0)) return;
    const fa::BandMask mask = fa::BandMask::window(Sq, Sk, p.opts.window_left, p.opts.causal ? 0 : p.opts.window_right);
    const auto exact = fa::testing::reference_backward<double>(dense(qp, Sq, H, D), dense(kp, Sk, Hkv, D),
                                                               dense(vp, Sk, Hkv, Dv), dense(d_o, Sq, H, Dv), scale,
                                                               mask, {}, ref_d_lse);
    const auto naive = fa::testing::reference_backward<fa::cpu::acc_t<T>, T>(
        dense(qp, Sq, H, D), dense(kp, Sk, Hkv, D), dense(vp, Sk, Hkv, Dv), dense(d_o, Sq, H, Dv), scale, mask, {},
        ref_d_lse);
    FUZZ_CHECK(meets_tolerance(dq1, naive.dq, exact.dq), "dq misses the tolerance rule against fp64");
    FUZZ_CHECK(meets_tolerance(dk1, naive.dk, exact.dk), "dk misses the tolerance rule against fp64");
    FUZZ_CHECK(meets_tolerance(dv1, naive.dv, exact.dv), "dv misses the tolerance rule against fp64");
  }
}

// Only with each type's default tiles, as the cache paths (cache_paths.hpp).
template <class Tiles, class T>
void check_backward_paths(FuzzedDataProvider& fdp, const Problem& p, const fa::TensorView<const T>& q,
                          const fa::TensorView<const T>& k, const fa::TensorView<const T>& v) {
  if constexpr (std::is_same_v<Tiles, fa::cpu::DefaultTiles<T>>) check_backward_paths_on<Tiles, T>(fdp, p, q, k, v);
}

}  // namespace flashattn_fuzz
