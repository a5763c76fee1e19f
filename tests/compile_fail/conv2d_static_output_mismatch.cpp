// expect: differ from the size the static parameters give
// A 28x28 input with a 3x3 kernel, stride 1 and padding 1 gives 28x28, not 26x26.
#include <tessera/conv.hpp>

void snippet() {
  using tessera::dyn;
  using tessera::extents;
  using tessera::fp32;
  tessera::Tensor<fp32, extents<dyn, 1, 28, 28>> x("x", 2);
  tessera::Tensor<fp32, extents<32, 1, 3, 3>> w("w");
  tessera::Tensor<fp32, extents<dyn, 32, 26, 26>> y("y", 2);
  tessera::conv2d_forward(Kokkos::DefaultExecutionSpace(), x, w, y,
                          tessera::conv2d_static_params<1, 1, 1>{});
}
