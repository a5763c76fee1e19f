#pragma once
// A two-layer perceptron written out by hand on nn::parameter (Linear In->H, ReLU, Linear
// H->Out, mean softmax cross-entropy), host loops only: the model the data-parallel machinery
// is checked with, independent of tessera::nn's layers. Gradients follow backward order:
// backward_layer2 finishes w2, b2 before backward_layer1 computes w1, b1.
#include <tessera/nn/parameter.hpp>

#include <boost/hana/for_each.hpp>
#include <boost/hana/tuple.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace tessera_test {

template <tessera::index_t In, tessera::index_t H, tessera::index_t Out>
struct tiny_mlp {
  tessera::nn::parameter<tessera::extents<H, In>> w1{"0.weight", {}};  // (H, In)
  tessera::nn::parameter<tessera::extents<H>> b1{"0.bias", {}};        // (H)
  tessera::nn::parameter<tessera::extents<Out, H>> w2{"2.weight", {}}; // (Out, H)
  tessera::nn::parameter<tessera::extents<Out>> b2{"2.bias", {}};      // (Out)
  std::vector<float> x_, h_, dz_;
  int batch_ = 0;

  explicit tiny_mlp(std::uint32_t seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> n(0.0f, 0.5f);
    auto fill = [&](auto& p) {
      for (tessera::index_t i = 0; i < p.size(); ++i) p.value.data()[i] = n(g);
    };
    fill(w1);
    fill(b1);
    fill(w2);
    fill(b2);
  }

  auto parameters() const { return boost::hana::make_tuple(w1, b1, w2, b2); }

  // x: (B, In) row-major; labels in [0, Out). Returns the mean loss; keeps what backward needs.
  double forward(const std::vector<float>& x, const std::vector<int>& labels) {
    batch_ = int(labels.size());
    x_ = x;
    h_.assign(std::size_t(batch_ * H), 0.0f);
    dz_.assign(std::size_t(batch_ * Out), 0.0f);
    double loss = 0;
    for (int b = 0; b < batch_; ++b) {
      for (int j = 0; j < H; ++j) {
        float s = b1.value.data()[j];
        for (int i = 0; i < In; ++i) s += w1.value.data()[j * In + i] * x[std::size_t(b * In + i)];
        h_[std::size_t(b * H + j)] = s > 0 ? s : 0;
      }
      float z[Out], zmax = -1e30f;
      for (int o = 0; o < Out; ++o) {
        float s = b2.value.data()[o];
        for (int j = 0; j < H; ++j) s += w2.value.data()[o * H + j] * h_[std::size_t(b * H + j)];
        z[o] = s;
        zmax = s > zmax ? s : zmax;
      }
      float sum = 0;
      for (int o = 0; o < Out; ++o) sum += std::exp(z[o] - zmax);
      loss += std::log(sum) + zmax - z[labels[std::size_t(b)]];
      for (int o = 0; o < Out; ++o) // d(mean loss)/dz
        dz_[std::size_t(b * Out + o)] =
            (std::exp(z[o] - zmax) / sum - (o == labels[std::size_t(b)] ? 1.0f : 0.0f)) /
            float(batch_);
    }
    return loss / batch_;
  }

  void backward_layer2() {
    for (int o = 0; o < Out; ++o) {
      float gb = 0;
      for (int b = 0; b < batch_; ++b) gb += dz_[std::size_t(b * Out + o)];
      b2.grad.data()[o] = gb;
      for (int j = 0; j < H; ++j) {
        float g = 0;
        for (int b = 0; b < batch_; ++b)
          g += dz_[std::size_t(b * Out + o)] * h_[std::size_t(b * H + j)];
        w2.grad.data()[o * H + j] = g;
      }
    }
  }

  void backward_layer1() {
    std::vector<float> dh(std::size_t(batch_ * H));
    for (int b = 0; b < batch_; ++b)
      for (int j = 0; j < H; ++j) {
        float s = 0;
        for (int o = 0; o < Out; ++o)
          s += dz_[std::size_t(b * Out + o)] * w2.value.data()[o * H + j];
        dh[std::size_t(b * H + j)] = h_[std::size_t(b * H + j)] > 0 ? s : 0;
      }
    for (int j = 0; j < H; ++j) {
      float gb = 0;
      for (int b = 0; b < batch_; ++b) gb += dh[std::size_t(b * H + j)];
      b1.grad.data()[j] = gb;
      for (int i = 0; i < In; ++i) {
        float g = 0;
        for (int b = 0; b < batch_; ++b)
          g += dh[std::size_t(b * H + j)] * x_[std::size_t(b * In + i)];
        w1.grad.data()[j * In + i] = g;
      }
    }
  }

  // Plain SGD on every parameter.
  void sgd(float lr) {
    boost::hana::for_each(parameters(), [&](const auto& p) {
      for (tessera::index_t i = 0; i < p.size(); ++i) p.value.data()[i] -= lr * p.grad.data()[i];
    });
  }
};

// Sample s of step t of a synthetic data set: In features in [-1, 1), a label in [0, Out).
template <int In, int Out>
void sample(int step, int s, float* x, int& label) {
  std::mt19937 g(std::uint32_t(7919 * step + 104729 * s + 1));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int i = 0; i < In; ++i) x[i] = u(g);
  label = int(g() % Out);
}

} // namespace tessera_test
