// expect: tessera::deep_copy: dst and src must have the same rank
#include <tessera/tensor.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<6>> dst("dst");    // (6)
  tessera::Tensor<tessera::fp32, tessera::extents<2, 3>> src("src"); // (2, 3)
  tessera::deep_copy(dst, src);
}
