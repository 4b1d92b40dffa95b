#pragma once
// The tolerance rule of FlashAttention's tests: the tiled kernel's max error against the fp64 reference
// must be at most twice the max error of a naive implementation computing in the same precision (the
// error that the storage type alone forces), plus a tiny epsilon of a few units in the last place of the
// storage type. LSE is always stored as float, so its epsilon is float's whatever T is.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "flashattn/cpu/tiles.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/options.hpp"
#include "flashattn/core/views.hpp"
#include "reference.hpp"

namespace flashattn::testing {

// max |a - b| over two equally long sequences. Equal infinities count as 0 (−inf LSE of fully masked
// rows); any other non-finite value, or a NaN on either side, makes the error infinite, so that NaN never
// passes a comparison.
inline double max_abs_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double err = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    const double e = std::abs(a[i] - b[i]);
    if (!std::isfinite(e)) return std::numeric_limits<double>::infinity();
    err = std::max(err, e);
  }
  return err;
}

inline double max_abs_finite(const std::vector<double>& a) {
  double m = 0.0;
  for (double x : a)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

// The tiny epsilon: a few units in the last place of type A (the accumulator type, where the tiled and
// the naive summation orders differ) at the largest magnitude of the result (at least 1). It absorbs
// reordering errors that the naive order happens not to make in a particular case.
template <class A>
double tiny_eps(double magnitude, double ulps = 4.0) {
  return ulps * double(Eigen::NumTraits<A>::epsilon()) * std::max(1.0, magnitude);
}

struct ToleranceCheck {
  double tiled_error = 0.0;
  double naive_error = 0.0;
  double eps = 0.0;
  double bound() const { return 2.0 * naive_error + eps; }
  bool ok() const { return tiled_error <= bound(); }
  std::string describe(const char* what) const {
    std::ostringstream s;
    s << what << ": max error " << tiled_error << " vs bound " << bound() << " (2 x naive " << naive_error
      << " + eps " << eps << ")";
    return s.str();
  }
};

template <class T>
ToleranceCheck check_output(const std::vector<double>& tiled, const std::vector<double>& naive,
                            const std::vector<double>& reference, double ulps = 4.0) {
  return {max_abs_error(tiled, reference), max_abs_error(naive, reference),
          tiny_eps<cpu::acc_t<T>>(max_abs_finite(reference), ulps)};
}

inline ToleranceCheck check_lse(const std::vector<double>& tiled, const std::vector<double>& naive,
                                const std::vector<double>& reference) {
  return {max_abs_error(tiled, reference), max_abs_error(naive, reference),
          tiny_eps<float>(max_abs_finite(reference))};
}

// The type the "exact" reference computes in: double, except for T = double, where the naive
// same-precision implementation would be the fp64 reference itself (error 0, and the rule would leave
// only epsilon): then x87 extended precision where the platform has it.
template <class T>
using exact_t = std::conditional_t<std::is_same_v<T, double> && (std::numeric_limits<long double>::digits > 53),
                                   long double, double>;

// Compares a computed output `o` (and `lse`, unless empty) with the fp64 reference of the same problem,
// under the tolerance rule. `mask` is the policy that describes the problem (NoMask, BandMask, ...).
// `ulps` sizes the output's epsilon (see tiny_eps); the default suits scores of magnitude up to ~4.
template <class T, class Mask>
::testing::AssertionResult matches_reference(const TensorView<const T>& q, const TensorView<const T>& k,
                                             const TensorView<const T>& v, const TensorView<const T>& o,
                                             const LseView& lse, double scale, const Mask& mask,
                                             double ulps = 4.0) {
  const ReferenceResult exact = reference_attention<exact_t<T>>(q, k, v, scale, mask);
  const ReferenceResult naive = reference_attention<cpu::acc_t<T>, T>(q, k, v, scale, mask);
  const ToleranceCheck out = check_output<T>(to_double(o), naive.o, exact.o, ulps);
  ::testing::AssertionResult result = out.ok() ? ::testing::AssertionSuccess() : ::testing::AssertionFailure();
  result << out.describe("o");
  if (!lse.empty()) {
    const ToleranceCheck l = check_lse(to_double(lse), naive.lse, exact.lse);
    if (!l.ok()) result = ::testing::AssertionFailure() << out.describe("o");
    result << "; " << l.describe("lse");
  }
  return result;
}

// As matches_reference, for a problem described by options: the band mask they imply, or none.
template <class T>
::testing::AssertionResult matches_reference_for_options(const TensorView<const T>& q, const TensorView<const T>& k,
                                                         const TensorView<const T>& v, const TensorView<const T>& o,
                                                         const LseView& lse, const AttentionOptions& opts,
                                                         double ulps = 4.0) {
  const double scale = opts.scale.value_or(1.0 / std::sqrt(double(q.dim)));
  if (opts.has_window())
    return matches_reference(q, k, v, o, lse, scale,
                             BandMask::window(q.seq, k.seq, opts.window_left, opts.causal ? 0 : opts.window_right),
                             ulps);
  return matches_reference(q, k, v, o, lse, scale, NoMask{k.seq}, ulps);
}

}  // namespace flashattn::testing
