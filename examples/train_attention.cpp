// Training one attention layer with flashattn's forward and backward (issue 6).
//
// The task is copying: each sequence is L random tokens followed by the same L tokens again, and from the
// end of the first copy on, the model must predict the next token, which it can only find L − 1 positions
// back (the token after the one L positions back). The model is one causal multi-head attention layer with learned projections
//
//     x_t = [onehot(token_t), sinusoidal(t)]          (vocab + 2·freqs)
//     Q = X·Wq, K = X·Wk, V = X·Wv                    (heads · head_dim each, viewed as BSHD)
//     O = attention(Q, K, V, causal)
//     logits = O·Wo,  loss = cross-entropy(logits_t, token_{t+1}) for t = L − 1 .. 2L − 2
//
// so it has to learn, in Wq and Wk, to rotate the position code by L − 1 steps (a query attends to the
// key L − 1 positions back) and, in Wv and Wo, to carry the token through. The gradients of Q, K, V come from
// attention_backward; the rest of the chain rule is a few Eigen GEMMs. Adam, fixed seeds: the run is the
// same on every machine with the same instruction set.
//
// Exits non-zero if the loss does not fall below a fifth of its starting value, or if flashattn's
// gradients of Q, K, V differ from those of the naive backward (reference/naive_backward.hpp) at any check.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "flashattn/reference/naive_backward.hpp"

namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using flashattn::index_t;

constexpr int kVocab = 8, kHalf = 16, kSeq = 2 * kHalf, kFreqs = 8, kIn = kVocab + 2 * kFreqs;
constexpr int kHeads = 2, kHeadDim = 16, kModel = kHeads * kHeadDim, kBatch = 32;
constexpr float kLearningRate = 0.01f;
constexpr double kPi = 3.14159265358979323846;

// A batch of sequences: inputs X (batch·seq, kIn) and target tokens (batch·seq).
struct Batch {
  Mat x;
  std::vector<int> tokens;
};

Batch make_batch(std::mt19937& rng) {
  std::uniform_int_distribution<int> token(0, kVocab - 1);
  Batch b{Mat::Zero(kBatch * kSeq, kIn), std::vector<int>(kBatch * kSeq)};
  for (int s = 0; s < kBatch; ++s) {
    for (int t = 0; t < kHalf; ++t) b.tokens[s * kSeq + t] = b.tokens[s * kSeq + t + kHalf] = token(rng);
    for (int t = 0; t < kSeq; ++t) {
      const int row = s * kSeq + t;
      b.x(row, b.tokens[row]) = 1.0f;
      for (int f = 0; f < kFreqs; ++f) {
        const double w = 2.0 * kPi * (f + 1) / kSeq;
        b.x(row, kVocab + 2 * f) = float(std::cos(w * t));
        b.x(row, kVocab + 2 * f + 1) = float(std::sin(w * t));
      }
    }
  }
  return b;
}

struct Param {
  Mat w, m, v;  // weights and Adam's moment estimates
  Param(int rows, int cols, float stddev, std::mt19937& rng) : w(rows, cols), m(Mat::Zero(rows, cols)), v(m) {
    std::normal_distribution<float> dist(0.0f, stddev);
    for (index_t i = 0; i < w.size(); ++i) w.data()[i] = dist(rng);
  }
  void adam_step(const Mat& grad, int step, float lr) {
    constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    m = b1 * m + (1 - b1) * grad;
    v = b2 * v + (1 - b2) * grad.cwiseProduct(grad);
    const float c1 = 1 - std::pow(b1, float(step)), c2 = 1 - std::pow(b2, float(step));
    w.array() -= lr * (m.array() / c1) / ((v.array() / c2).sqrt() + eps);
  }
};

// A (batch·seq, heads·head_dim) row-major matrix as a (batch, seq, heads, head_dim) view: no copy.
flashattn::TensorView<float> heads_view(Mat& m) { return flashattn::bshd(m.data(), kBatch, kSeq, kHeads, kHeadDim); }
flashattn::TensorView<const float> heads_view(const Mat& m) {
  return flashattn::bshd(m.data(), kBatch, kSeq, kHeads, kHeadDim);
}

float max_abs_diff(const Mat& a, const Mat& b) { return (a - b).cwiseAbs().maxCoeff(); }

}  // namespace

int main() {
  std::mt19937 rng(2024);
  Param wq(kIn, kModel, 0.3f, rng), wk(kIn, kModel, 0.3f, rng), wv(kIn, kModel, 0.3f, rng),
      wo(kModel, kVocab, 0.3f, rng);
  flashattn::AttentionOptions options;
  options.causal = true;
  std::vector<float> lse(kBatch * kHeads * kSeq);
  const flashattn::LseView lse_view = flashattn::lse_bhs(lse.data(), kBatch, kHeads, kSeq);

  constexpr int kSteps = 200;
  float first_loss = 0, last_loss = 0;
  bool gradients_ok = true;
  for (int step = 1; step <= kSteps; ++step) {
    const Batch batch = make_batch(rng);
    // Forward.
    const Mat q = batch.x * wq.w, k = batch.x * wk.w, v = batch.x * wv.w;
    Mat o(kBatch * kSeq, kModel);
    flashattn::attention_forward(heads_view(q), heads_view(k), heads_view(v), heads_view(o), options, lse_view);
    const Mat logits = o * wo.w;

    // Cross-entropy of the next-token predictions of the second copy, and its gradient wrt the logits.
    Mat d_logits = Mat::Zero(logits.rows(), logits.cols());
    double loss = 0;
    const float count = float(kBatch * kHalf);
    for (int s = 0; s < kBatch; ++s)
      for (int t = kHalf - 1; t < kSeq - 1; ++t) {
        const int row = s * kSeq + t, next = batch.tokens[row + 1];
        const float top = logits.row(row).maxCoeff();
        const Eigen::RowVectorXf e = (logits.row(row).array() - top).exp().matrix();
        const float sum = e.sum();
        loss -= std::log(e(next) / sum);
        d_logits.row(row) = e / sum / count;
        d_logits(row, next) -= 1.0f / count;
      }
    loss /= count;

    // Backward: the chain rule around the attention, flashattn for the attention itself.
    const Mat d_wo = o.transpose() * d_logits;
    const Mat d_o = d_logits * wo.w.transpose();
    Mat dq(q.rows(), q.cols()), dk(k.rows(), k.cols()), dv(v.rows(), v.cols());
    flashattn::attention_backward(heads_view(q), heads_view(k), heads_view(v), heads_view(o), heads_view(d_o),
                                  lse_view, heads_view(dq), heads_view(dk), heads_view(dv), options);

    if (step == 1 || step == 40 || step == kSteps) {
      // The same gradients from the naive backward (materialised P, Eigen GEMMs).
      Mat nq(q.rows(), q.cols()), nk(k.rows(), k.cols()), nv(v.rows(), v.cols());
      flashattn::naive_attention_backward<float>(heads_view(q), heads_view(k), heads_view(v), heads_view(o),
                                                 heads_view(d_o), lse_view, heads_view(nq), heads_view(nk),
                                                 heads_view(nv), options);
      const float scale = std::max({nq.cwiseAbs().maxCoeff(), nk.cwiseAbs().maxCoeff(), nv.cwiseAbs().maxCoeff()});
      const float err = std::max({max_abs_diff(dq, nq), max_abs_diff(dk, nk), max_abs_diff(dv, nv)});
      const bool ok = err <= 1e-4f * scale;
      gradients_ok = gradients_ok && ok;
      std::printf("step %3d  gradient check vs naive backward: max |diff| %.2e (max |grad| %.2e) %s\n", step,
                  double(err), double(scale), ok ? "ok" : "MISMATCH");
    }

    wq.adam_step(batch.x.transpose() * dq, step, kLearningRate);
    wk.adam_step(batch.x.transpose() * dk, step, kLearningRate);
    wv.adam_step(batch.x.transpose() * dv, step, kLearningRate);
    wo.adam_step(d_wo, step, kLearningRate);

    if (step == 1) first_loss = float(loss);
    last_loss = float(loss);
    if (step == 1 || step % 10 == 0) std::printf("step %3d  loss %.4f\n", step, loss);
  }

  const bool learned = last_loss < 0.2f * first_loss;
  std::printf("loss %.4f -> %.4f (chance: ln %d = %.4f): %s; gradients %s\n", double(first_loss),
              double(last_loss), kVocab, std::log(double(kVocab)), learned ? "learned" : "DID NOT LEARN",
              gradients_ok ? "match" : "MISMATCH");
  return learned && gradients_ok ? 0 : 1;
}
