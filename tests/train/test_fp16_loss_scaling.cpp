// Why fp16 training needs loss scaling, shown on a two-layer fp16 model (nn::Linear<8, 16, fp16>
// then nn::Linear<16, 4, fp16>, softmax cross-entropy over a batch of 2^13):
//  - the second layer's weights are k * 2^-24 with |k| <= 1023 (fp16 subnormals, exact, all
//    below 2^-14) and dL/dlogits = (p - onehot) / 2^13 has a row sum of magnitudes <= 2 * 2^-13,
//    so every element of dL/dh = dL/dlogits W2 is at most 2 * 2^-13 * 2^-14 = 2^-26: below half
//    of fp16's smallest subnormal 2^-24. Unscaled, dL/dh rounds to exactly zero in fp16 and the
//    first layer's gradients are exactly zero, while the fp32 model's are not;
//  - multiplied by a loss scale of 2^16, dL/dh is around 2^-11 (fp16 normals) and the unscaled
//    first-layer gradients match the fp32 model's to within 2^-6 (relative, whole matrix);
//    training the first layer alone then lowers the loss, where unscaled training leaves it
//    bit-identical;
//  - overflow: a scale of 2^30 makes dL/dlogits overflow fp16's 65504 to inf (fp16 rounds to
//    inf, it does not saturate), the non-finite gradient is caught, the step skipped (weights
//    bit-identical) and the dynamic scaler backs off until a step goes through.
#include "support/exec_spaces.hpp"

#include <tessera/nn.hpp>
#include <tessera/train/loss_scaler.hpp>
#include <tessera/train/sgd.hpp>
#include <tessera/train/step.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using namespace tessera; // NOLINT: test file

namespace {

constexpr index_t batch = 8192; // 2^13

template <class P>
struct two_layer {
  Kokkos::DefaultExecutionSpace exec = testing::exec_space();
  nn::Linear<8, 16, P> l1{1};
  nn::Linear<16, 4, P> l2{2};
  nn::SoftmaxCrossEntropy ce;

  two_layer() {
    // W2 = k * 2^-24, |k| <= 1023: exact fp16 subnormals (the fp16 model uses W2 unrounded).
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> k(-1023, 1023);
    float* w = l2.weight().value.data();
    for (index_t i = 0; i < l2.weight().value.size(); ++i) w[i] = std::ldexp(float(k(rng)), -24);
  }
  /// Forward and backward with the loss gradient times `scale`; returns the loss.
  template <class X, class Y>
  double step(const X& x, const Y& y, float scale) {
    const auto h = l1.forward(exec, x);
    const auto logits = l2.forward(exec, h);
    const auto [loss, d] = ce.forward_backward(exec, logits, y, scale);
    last_dh = l2.backward(exec, d);
    l1.backward(exec, last_dh, false);
    return loss;
  }
  template <class X, class Y>
  double loss(const X& x, const Y& y) {
    return ce.forward(exec, l2.forward(exec, l1.forward(exec, x)), y);
  }
  Tensor<P, extents<dyn, 16>, layout_right, nn::detail::default_memory_space> last_dh;
};

struct data {
  Tensor<fp32, extents<dyn, 8>> x{"x", batch};
  Kokkos::View<int*> y{"y", batch};
  data() {
    std::mt19937 rng(2026);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (index_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
    for (index_t i = 0; i < batch; ++i) y(i) = static_cast<int>(rng() % 4);
  }
};

std::vector<float> values(const nn::parameter<extents<16, 8>>& p, bool grad) {
  const float* d = grad ? p.grad.data() : p.value.data();
  return std::vector<float>(d, d + p.value.size());
}

/// Elements of t that are not +-0.
template <class T>
index_t count_nonzero(const T& t) {
  index_t n = 0;
  for (index_t i = 0; i < t.size(); ++i) n += (t.data()[i].bits & 0x7fff) ? 1 : 0;
  return n;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

} // namespace

// (No ';' in a test name: catch_discover_tests would split the name there.)
TEST_CASE("fp16: without loss scaling the hidden gradient underflows to zero, with it it "
          "matches fp32",
          "[train][fp16][loss_scaling]") {
  const auto exec = testing::exec_space();
  const data d;
  two_layer<fp32> ref;
  two_layer<fp16> m;
  ref.step(d.x, d.y, 1.f);
  const auto g32 = values(ref.l1.weight(), true);
  double g32_max = 0;
  for (float g : g32) g32_max = std::max(g32_max, double(std::abs(g)));
  REQUIRE(g32_max > 0); // the true gradient of the first layer is not zero

  // Unscaled: dL/dh is exactly zero in fp16, and so are the first layer's gradients.
  m.step(d.x, d.y, 1.f);
  CHECK(count_nonzero(m.last_dh) == 0);
  for (float g : values(m.l1.weight(), true)) CHECK(g == 0.f);
  for (index_t i = 0; i < 16; ++i) CHECK(m.l1.bias().grad.data()[i] == 0.f);

  // Scaled by 2^16 (dynamic_scaler's initial scale) and unscaled by the scaler: close to fp32.
  train::dynamic_scaler<> scaler;
  REQUIRE(scaler.scale() == 65536.f);
  m.step(d.x, d.y, scaler.scale());
  CHECK(count_nonzero(m.last_dh) > m.last_dh.size() * 9 / 10);
  CHECK(scaler.unscale_and_check(exec, m.l1.parameters()));
  const double err = relative_error(values(m.l1.weight(), true), g32);
  INFO("relative error of the fp16 first-layer weight gradient against fp32: " << err);
  CHECK(err < 1.0 / 64);
}

TEST_CASE("fp16: training the first layer lowers the loss only with loss scaling",
          "[train][fp16][loss_scaling]") {
  const auto exec = testing::exec_space();
  const data d;
  // lr: the first layer's gradients are about 2^-13 and the loss' curvature along them is of
  // the order of |W2|^2 <= 2^-28, so even lr 1e5 (weights move by about 10 per step, the logits
  // by a few 0.01) is a small, safe step.
  const auto run = [&](bool scaled) {
    two_layer<fp16> m;
    train::sgd opt{.lr = 1e5f, .momentum = 0.f};
    train::dynamic_scaler<> scaler;
    const double before = m.loss(d.x, d.y);
    int applied = 0;
    for (int s = 0; s < 20; ++s) {
      m.step(d.x, d.y, scaled ? scaler.scale() : 1.f);
      if (scaled)
        applied += train::step(exec, opt, scaler, m.l1.parameters());
      else
        opt.step(exec, m.l1.parameters()), ++applied;
    }
    CHECK(applied == 20);
    return std::pair{before, m.loss(d.x, d.y)};
  };
  const auto [b0, a0] = run(false);
  const auto [b1, a1] = run(true);
  INFO("unscaled: " << b0 << " -> " << a0 << "; scaled: " << b1 << " -> " << a1);
  CHECK(a0 == b0);       // zero gradients: nothing learnt, bit for bit
  CHECK(a1 < b1 - 1e-4); // the scaled gradients do the work
}

TEST_CASE("fp16: a loss scale that overflows 65504 is detected, skipped and backed off",
          "[train][fp16][loss_scaling]") {
  const auto exec = testing::exec_space();
  const data d;
  two_layer<fp16> m;
  train::sgd opt{.lr = 1e4f, .momentum = 0.f};
  train::dynamic_scaler<> scaler({.init_scale = 0x1p30f});
  // 2^30 * |p - onehot| / 2^13 = 2^17 |p - y|, above 65504 for |p - y| > 0.5 (the label's
  // p is about 1/4): the fp16 dL/dlogits is inf.
  const auto w0 = values(m.l1.weight(), false);
  m.step(d.x, d.y, scaler.scale());
  CHECK_FALSE(train::step(exec, opt, scaler, m.l1.parameters()));
  CHECK(scaler.scale() == 0x1p29f);
  CHECK(std::memcmp(values(m.l1.weight(), false).data(), w0.data(), w0.size() * 4) == 0);
  int skipped = 1;
  bool applied = false;
  while (!applied && skipped < 40) {
    m.step(d.x, d.y, scaler.scale());
    applied = train::step(exec, opt, scaler, m.l1.parameters());
    skipped += applied ? 0 : 1;
  }
  INFO("skipped " << skipped << " steps, scale now " << scaler.scale());
  CHECK(applied);
  // Backs off until 2^s * max|p - onehot| / 2^13 fits in fp16: 2^29 * |p - y| / 2^13 <= 65504
  // for |p - y| <= 0.99, so within one or two halvings.
  CHECK(skipped <= 3);
  CHECK(scaler.scale() >= 0x1p27f);
}
