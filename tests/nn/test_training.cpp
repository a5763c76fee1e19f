// A short training run on 2,000 Fashion-MNIST images (the installed dataset) in fp32, bf16, fp8
// and fp16: a small CNN trained for 2 epochs with SGD (lr 0.05, momentum 0.9, batch 50; bf16,
// fp8 and fp16 through train::step with a dynamic loss scaler) must at least halve the mean
// loss on 500 held-out test images. The untrained loss is about ln 10 = 2.30 (PyTorch's init gives
// near-uniform predictions); halving it needs the model to learn the classes, not just their
// frequencies (balanced: a class prior alone stays at ln 10).
#include "nn_testing.hpp"

#include <tessera/data/idx.hpp>
#include <tessera/train/loss_scaler.hpp>
#include <tessera/train/sgd.hpp>
#include <tessera/train/step.hpp>

#include <numeric>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

template <class P>
using SmallCNN =
    nn::Sequential<nn::Input<1, 28, 28>, nn::Conv2d<1, 8, 5, nn::conv_options{.stride = 2}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Flatten, nn::Linear<288, 32, P>, nn::ReLU,
                   nn::Linear<32, 10, P>>;

struct batch {
  Tensor<fp32, extents<dyn, 1, 28, 28>> x;
  Kokkos::View<int*> y;
};

batch make_batch(const data::labelled_images& d, const std::vector<std::int64_t>& idx) {
  const auto n = static_cast<index_t>(idx.size());
  batch b{Tensor<fp32, extents<dyn, 1, 28, 28>>("x", n), Kokkos::View<int*>("y", idx.size())};
  for (index_t i = 0; i < n; ++i) {
    const auto s = idx[static_cast<std::size_t>(i)];
    for (index_t p = 0; p < 784; ++p)
      b.x.data()[i * 784 + p] =
          (d.images.data[static_cast<std::size_t>(s * 784 + p)] / 255.f - 0.2860f) / 0.3530f;
    b.y(i) = d.labels.data[static_cast<std::size_t>(s)];
  }
  return b;
}

template <class P>
std::pair<double, double> train_run(const data::labelled_images& train_set, const batch& held_out) {
  SmallCNN<P> model(2026);
  nn::SoftmaxCrossEntropy ce;
  train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  train::dynamic_scaler<> scaler;
  const auto params = model.parameters();
  const double before =
      ce.forward(exec_space(), model.forward(exec_space(), held_out.x), held_out.y);
  std::vector<std::int64_t> order(2000);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::shuffle(order.begin(), order.end(), std::mt19937_64(epoch));
    for (std::size_t b = 0; b < order.size(); b += 50) {
      const auto bt =
          make_batch(train_set, std::vector<std::int64_t>(order.begin() + long(b),
                                                          order.begin() + long(b) + 50));
      const auto logits = model.forward(exec_space(), bt.x);
      const bool scaled = !std::is_same_v<P, fp32>;
      const auto [l, d] =
          ce.forward_backward(exec_space(), logits, bt.y, scaled ? scaler.scale() : 1.f);
      model.backward(exec_space(), d);
      if (scaled) {
        train::step(exec_space(), opt, scaler, params);
      } else {
        opt.step(exec_space(), params);
      }
    }
  }
  const double after =
      ce.forward(exec_space(), model.forward(exec_space(), held_out.x), held_out.y);
  return {before, after};
}

} // namespace

TEST_CASE("nn training: 2,000 Fashion-MNIST images halve the held-out loss in fp32, bf16, fp8 "
          "and fp16",
          "[nn][training]") {
  const std::string dir = "/usr/share/datasets/fashion-mnist"; // scripts/bootstrap.sh installs it
  const auto train_set = data::load_mnist_like(dir, "train");
  const auto test_set = data::load_mnist_like(dir, "t10k");
  std::vector<std::int64_t> first(500);
  std::iota(first.begin(), first.end(), std::int64_t{0});
  const auto held_out = make_batch(test_set, first);
  const auto check = [](const char* p, std::pair<double, double> r) {
    INFO(p << ": held-out loss " << r.first << " -> " << r.second);
    CHECK(r.first > 2.0); // untrained: about ln 10
    CHECK(r.second < 0.5 * r.first);
  };
  check("fp32", train_run<fp32>(train_set, held_out));
  check("bf16", train_run<bf16>(train_set, held_out));
  check("fp8", train_run<nn::fp8<>>(train_set, held_out));
  check("fp16", train_run<fp16>(train_set, held_out));
}
