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
// check_backward_variants_on (below) does the same for the policies' backward.

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

// Max |got − exact| <= 2·max |naive − exact| + 4 ulps of Eps (the inputs' type; got's by default) at the
// exact gradient's magnitude.
template <class T, class Eps = T>
bool meets_tolerance(const std::vector<T>& got, const std::vector<double>& naive, const std::vector<double>& exact) {
  double err = 0, naive_err = 0, magnitude = 1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = to_double(got[i]);
    if (!std::isfinite(g)) return false;
    err = std::max(err, std::abs(g - exact[i]));
    naive_err = std::max(naive_err, std::abs(naive[i] - exact[i]));
    magnitude = std::max(magnitude, std::abs(exact[i]));
  }
  const double eps = 4.0 * to_double(std::numeric_limits<Eps>::epsilon()) * magnitude;
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

// dS of every (entry, head), (batch, heads, seq_q, seq_k), summed over a bias's broadcast extents: what
// BackwardExtras::d_bias receives.
inline std::vector<double> summed_bias_grad(const std::vector<double>& d_scores, const Problem& p) {
  const index_t plane = p.seq_q * p.seq_k;
  std::vector<double> out(std::size_t(p.bias_batch * p.bias_heads * plane), 0.0);
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t h = 0; h < p.heads_q; ++h) {
      const index_t to = ((p.bias_batch == 1 ? 0 : b) * p.bias_heads + (p.bias_heads == 1 ? 0 : h)) * plane;
      const index_t from = (b * p.heads_q + h) * plane;
      for (index_t e = 0; e < plane; ++e) out[std::size_t(to + e)] += d_scores[std::size_t(from + e)];
    }
  return out;
}

// The backward of a policy (attention_backward_masked): every kind whose library policy is differentiable
// (the built-in variants, element, block and structured masks, sinks; not the user score_mods written
// without a derivative). On contiguous copies, its forward run for O and the LSE, a fuzzed dO drawn (and
// half the time a dLSE); with a sink, d_sinks is asked for, and with a bias, half the time d_bias. Then:
//   - the backward on the chosen thread count and on the other give the same bits (dq, dk, dv, d_sinks,
//     d_bias);
//   - with moderate finite inputs, every gradient meets the tolerance rule against the fp64 reference
//     backward of the reference policy (with_masks), d_bias against its dS summed over the bias's
//     broadcast extents.
template <class Tiles, class T>
void check_backward_variants_on(FuzzedDataProvider& fdp, const Problem& p, const fa::TensorView<const T>& q,
                                const fa::TensorView<const T>& k, const fa::TensorView<const T>& v) {
  if (p.mask == MaskKind::Options || p.batch == 0 || p.seq_q == 0) return;
  const index_t B = p.batch, Sq = p.seq_q, Sk = p.seq_k, H = p.heads_q, Hkv = p.heads_kv, D = p.dim, Dv = p.dim_v;
  const std::vector<T> qp = packed_copy(q), kp = packed_copy(k), vp = packed_copy(v);
  const auto dense = [&](const std::vector<T>& x, index_t seq, index_t heads, index_t dim) {
    return fa::bshd<const T>(x.data(), B, seq, heads, dim);
  };
  std::vector<T> o(std::size_t(B * Sq * H * Dv), poison<T>()), d_o(o.size());
  Rng rng{fdp.ConsumeIntegral<std::uint64_t>()};
  for (T& x : d_o) x = from_double<T>(rng.symmetric());
  // The LSE and its gradient, (batch, heads, seq_q) contiguous: the reference's layout for dLSE.
  std::vector<float> lse(std::size_t(B * H * Sq), poison<float>()), d_lse(lse.size());
  for (float& x : d_lse) x = float(rng.symmetric());
  const fa::LseView lse_view{lse.data(), B, H, Sq, H * Sq, Sq, 1};
  const bool with_d_lse = fdp.ConsumeBool(), with_d_bias = p.mask == MaskKind::BiasBuiltin && fdp.ConsumeBool();

  with_masks(p, [&](const auto& lib_mask, const auto& ref_mask) {
    using LibMask = std::decay_t<decltype(lib_mask)>;
    if constexpr (!std::is_same_v<LibMask, std::nullopt_t>) {
      using LibHead = decltype(fa::policy_for(lib_mask, fa::SequenceInfo{}));
      if constexpr (fa::differentiable_mask_v<LibHead>) {
        constexpr bool has_sink = fa::has_sink_v<LibHead>;
        using Ctx = fa::cpu::Context<Tiles>;
        struct Grads {
          std::vector<T> dq, dk, dv;
          std::vector<float> d_sinks, d_bias;
        };
        const auto backward = [&](int threads) {
          Grads g{std::vector<T>(qp.size(), poison<T>()), std::vector<T>(kp.size(), poison<T>()),
                  std::vector<T>(vp.size(), poison<T>()), {}, {}};
          fa::BackwardExtras extras;
          if (with_d_lse) extras.d_lse = fa::LseView{d_lse.data(), B, H, Sq, H * Sq, Sq, 1};
          if (has_sink) {
            g.d_sinks.assign(std::size_t(H), poison<float>());
            extras.d_sinks = g.d_sinks.data();
          }
          if (with_d_bias) {
            g.d_bias.assign(p.bias.size(), poison<float>());
            extras.d_bias = g.d_bias.data();
          }
          fa::attention_backward_masked(Ctx{threads}, dense(qp, Sq, H, D), dense(kp, Sk, Hkv, D),
                                        dense(vp, Sk, Hkv, Dv), dense(o, Sq, H, Dv), dense(d_o, Sq, H, Dv),
                                        lse_view, fa::bshd(g.dq.data(), B, Sq, H, D),
                                        fa::bshd(g.dk.data(), B, Sk, Hkv, D), fa::bshd(g.dv.data(), B, Sk, Hkv, Dv),
                                        lib_mask, p.opts, extras);
          return g;
        };
        Grads g1, g2;
        try {
          fa::attention_forward_masked(Ctx{p.threads}, dense(qp, Sq, H, D), dense(kp, Sk, Hkv, D),
                                       dense(vp, Sk, Hkv, Dv), fa::bshd(o.data(), B, Sq, H, Dv), lib_mask, p.opts,
                                       lse_view);
          g1 = backward(p.threads);
          g2 = backward(p.threads == 1 ? 2 : 1);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "exception: %s\n", e.what());
          finding("a valid backward call with a policy threw");
        }
        const auto same = [](const auto& a, const auto& b) {
          if (a.size() != b.size()) return false;
          for (std::size_t i = 0; i < a.size(); ++i)
            if (!same_bits(a[i], b[i])) return false;
          return true;
        };
        FUZZ_CHECK(same(g1.dq, g2.dq) && same(g1.dk, g2.dk) && same(g1.dv, g2.dv),
                   "a policy's backward gave other gradient bits on another thread count");
        FUZZ_CHECK(same(g1.d_sinks, g2.d_sinks), "d_sinks differs between thread counts");
        FUZZ_CHECK(same(g1.d_bias, g2.d_bias), "d_bias differs between thread counts");

        if constexpr (!std::is_same_v<T, double>) {
          if (!moderate_values(qp) || !moderate_values(kp) || !moderate_values(vp)) return;
          const double scale = p.opts.scale ? *p.opts.scale : 1.0 / std::sqrt(double(D));
          if (!(scale <= 4.0)) return;
          // A bias of large entries pushes the scores out of the moderate range the rule is written for.
          for (float x : p.bias)
            if (std::isfinite(x) && std::abs(x) > 4.0f) return;
          const double* ref_d_lse = nullptr;
          std::vector<double> d_lse_ref;
          if (with_d_lse) {
            d_lse_ref.assign(d_lse.begin(), d_lse.end());
            ref_d_lse = d_lse_ref.data();
          }
          std::vector<double> exact_ds, naive_ds;
          const auto exact = fa::testing::reference_backward<double>(
              dense(qp, Sq, H, D), dense(kp, Sk, Hkv, D), dense(vp, Sk, Hkv, Dv), dense(d_o, Sq, H, Dv), scale,
              ref_mask, {}, ref_d_lse, with_d_bias ? &exact_ds : nullptr);
          const auto naive = fa::testing::reference_backward<fa::cpu::acc_t<T>, T>(
              dense(qp, Sq, H, D), dense(kp, Sk, Hkv, D), dense(vp, Sk, Hkv, Dv), dense(d_o, Sq, H, Dv), scale,
              ref_mask, {}, ref_d_lse, with_d_bias ? &naive_ds : nullptr);
          FUZZ_CHECK(meets_tolerance(g1.dq, naive.dq, exact.dq), "dq (policy) misses the tolerance rule");
          FUZZ_CHECK(meets_tolerance(g1.dk, naive.dk, exact.dk), "dk (policy) misses the tolerance rule");
          FUZZ_CHECK(meets_tolerance(g1.dv, naive.dv, exact.dv), "dv (policy) misses the tolerance rule");
          if (has_sink)
            FUZZ_CHECK((meets_tolerance<float, T>(g1.d_sinks, naive.d_sinks, exact.d_sinks)),
                       "d_sinks misses the tolerance rule");
          if (with_d_bias)
            FUZZ_CHECK((meets_tolerance<float, T>(g1.d_bias, summed_bias_grad(naive_ds, p),
                                                  summed_bias_grad(exact_ds, p))),
                       "d_bias misses the tolerance rule");
        }
      }
    }
  });
}

// Only with each type's default tiles, as the cache paths (cache_paths.hpp).
template <class Tiles, class T>
void check_backward_paths(FuzzedDataProvider& fdp, const Problem& p, const fa::TensorView<const T>& q,
                          const fa::TensorView<const T>& k, const fa::TensorView<const T>& v) {
  if constexpr (std::is_same_v<Tiles, fa::cpu::DefaultTiles<T>>) {
    check_backward_paths_on<Tiles, T>(fdp, p, q, k, v);
    check_backward_variants_on<Tiles, T>(fdp, p, q, k, v);
  }
}

}  // namespace flashattn_fuzz
