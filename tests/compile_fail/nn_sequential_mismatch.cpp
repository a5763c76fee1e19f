// expect: layer_accepts_its_input<2
// Linear<784, 128> produces (B, 128) but layer 2 takes (B, 100): the failed assertion's
// expression is layer_accepts_its_input<2, false> (GCC prints it with the index, clang as
// layer_accepts_its_input<2UL, ok>), its sentence says that layer does not accept the output
// shape of the layer before it, and sequential_link<2, Linear<784, 128>, Linear<100, 10>,
// extents<-1, 128>> in the instantiation names both layers and the shape.
#include <tessera/nn.hpp>

void snippet() {
  tessera::nn::Sequential<tessera::nn::Linear<784, 128>, tessera::nn::ReLU,
                          tessera::nn::Linear<100, 10>>
      model(1);
  (void)model;
}
