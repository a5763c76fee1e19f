// expect: the inner layers must give back their input's shape
// Residual<Linear<8, 4>> would add a (B, 4) f(x) to a (B, 8) x: when the Sequential checks its
// links, the residual's shape rule fails with its sentence, and residual_shape_check<extents
// <-1, 4>, extents<-1, 8>, false> names both shapes.
#include <tessera/nn.hpp>
#include <tessera/nn/residual.hpp>

void snippet() {
  tessera::nn::Sequential<tessera::nn::Linear<16, 8>,
                          tessera::nn::Residual<tessera::nn::Linear<8, 4>>>
      model(1);
  (void)model;
}
