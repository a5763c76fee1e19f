// expect: tessera::nn::Sequential: layer I does not accept the output shape of layer I - 1
// Linear<784, 128> produces (B, 128) but the next layer takes (B, 100): the compiler prints the
// assertion with sequential_link<2, Linear<784, 128>, Linear<100, 10>, extents<-1, 128>>.
#include <tessera/nn.hpp>

void snippet() {
  tessera::nn::Sequential<tessera::nn::Linear<784, 128>, tessera::nn::ReLU,
                          tessera::nn::Linear<100, 10>>
      model(1);
  (void)model;
}
