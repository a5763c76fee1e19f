// Compile-time benchmark TU (benchmarks/compile/measure.sh): the smallest whole training
// program, FashionCNN (the model of examples/train_fashion_mnist.cpp) in fp32 with SGD, trained
// for two steps on zero data (fp32 alone: each further precision roughly doubles the time). It
// stands for "a user's training program" without the example's option parsing, data loading
// and MPI plans.
#include <tessera/nn.hpp>
#include <tessera/train/sgd.hpp>

#include <cstdio>

namespace {

namespace nn = tessera::nn;
using tessera::dyn;

template <class P>
using FashionCNN =
    nn::Sequential<nn::Input<1, 28, 28>, nn::Conv2d<1, 32, 3, nn::conv_options{.pad = 1}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Conv2d<32, 64, 3, nn::conv_options{.pad = 1}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Flatten, nn::Linear<3136, 128, P>, nn::ReLU,
                   nn::Linear<128, 10, P>>;

template <class P>
float train(const Kokkos::DefaultExecutionSpace& exec) {
  FashionCNN<P> model(1);
  nn::SoftmaxCrossEntropy loss;
  tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  const auto params = model.parameters();
  tessera::Tensor<tessera::fp32, tessera::extents<dyn, 1, 28, 28>> x("x", 8); // (8, 1, 28, 28)
  Kokkos::View<int*> y("y", 8);
  float sum = 0.f;
  for (int s = 0; s < 2; ++s) {
    const auto logits = model.forward(exec, x);
    const auto [l, dlogits] = loss.forward_backward(exec, logits, y, 1.f);
    model.backward(exec, dlogits);
    opt.step(exec, params);
    sum += l;
  }
  return sum;
}

} // namespace

int main() {
  Kokkos::ScopeGuard guard;
  const Kokkos::DefaultExecutionSpace exec;
  std::printf("%g\n", static_cast<double>(train<tessera::fp32>(exec)));
}
