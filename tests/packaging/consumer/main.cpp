// A user's program: one causal GQA call through the views API and one through the Eigen interop, each
// checked against a direct loop. Exits non-zero on any mismatch, so the packaging tests assert that the
// package is usable, not only that it configures.
#include <flashattn/eigen.hpp>
#include <flashattn/flashattn.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

#if defined(CONSUMER_EXPECT_VERSION)
static_assert(FLASHATTN_VERSION_MAJOR == CONSUMER_VERSION_MAJOR && FLASHATTN_VERSION_MINOR == CONSUMER_VERSION_MINOR &&
                  FLASHATTN_VERSION_PATCH == CONSUMER_VERSION_PATCH,
              "flashattn/version.hpp disagrees with the version of the installed CMake package");
#endif

namespace {

// o[i] = sum_j softmax_j(scale * q_i . k_j) v_j over the keys query i may see (bottom-right causal).
double max_error_vs_loop(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                         const std::vector<float>& o, int seq_q, int seq_k, int heads_q, int heads_kv, int dim) {
  double worst = 0;
  const double scale = 1.0 / std::sqrt(double(dim));
  for (int h = 0; h < heads_q; ++h) {
    const int hk = h / (heads_q / heads_kv);
    for (int i = 0; i < seq_q; ++i) {
      const int last = i + (seq_k - seq_q);
      std::vector<double> p(std::size_t(seq_k), 0.0);
      double m = -INFINITY, l = 0;
      for (int j = 0; j <= last; ++j) {
        double s = 0;
        for (int c = 0; c < dim; ++c)
          s += double(q[std::size_t(((i * heads_q) + h) * dim + c)]) * k[std::size_t(((j * heads_kv) + hk) * dim + c)];
        p[std::size_t(j)] = s * scale;
        m = std::fmax(m, s * scale);
      }
      for (int j = 0; j <= last; ++j) l += (p[std::size_t(j)] = std::exp(p[std::size_t(j)] - m));
      for (int c = 0; c < dim; ++c) {
        double acc = 0;
        for (int j = 0; j <= last; ++j) acc += p[std::size_t(j)] * v[std::size_t(((j * heads_kv) + hk) * dim + c)];
        worst = std::fmax(worst, std::fabs(acc / l - o[std::size_t(((i * heads_q) + h) * dim + c)]));
      }
    }
  }
  return worst;
}

}  // namespace

int main() {
  const int seq_q = 37, seq_k = 53, heads_q = 4, heads_kv = 2, dim = 24;
  std::vector<float> q(std::size_t(seq_q * heads_q * dim)), k(std::size_t(seq_k * heads_kv * dim)), v(k.size()),
      o(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = float(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = float(std::cos(0.11 * double(i)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(std::sin(0.05 * double(i) + 1.0));

  flashattn::AttentionOptions options;
  options.causal = true;
  flashattn::attention_forward(flashattn::bshd(q.data(), 1, seq_q, heads_q, dim),
                               flashattn::bshd(k.data(), 1, seq_k, heads_kv, dim),
                               flashattn::bshd(v.data(), 1, seq_k, heads_kv, dim),
                               flashattn::bshd(o.data(), 1, seq_q, heads_q, dim), options);
  const double err_views = max_error_vs_loop(q, k, v, o, seq_q, seq_k, heads_q, heads_kv, dim);

  // The Eigen convenience call, on one head (heads 1, so the row-major matrices are the same data).
  using Mat = flashattn::RowMajorMatrix<float>;
  const Mat qm = Mat::Random(seq_q, dim), km = Mat::Random(seq_k, dim), vm = Mat::Random(seq_k, dim);
  const Mat om = flashattn::attention(qm, km, vm, options);
  const std::vector<float> qv(qm.data(), qm.data() + qm.size()), kv(km.data(), km.data() + km.size()),
      vv(vm.data(), vm.data() + vm.size()), ov(om.data(), om.data() + om.size());
  const double err_eigen = max_error_vs_loop(qv, kv, vv, ov, seq_q, seq_k, 1, 1, dim);

  std::printf("flashattn %d.%d.%d: max error views %.3g, eigen %.3g\n", FLASHATTN_VERSION_MAJOR,
              FLASHATTN_VERSION_MINOR, FLASHATTN_VERSION_PATCH, err_views, err_eigen);
  return err_views < 1e-5 && err_eigen < 1e-5 ? 0 : 1;
}
