// expect: tessera::TensorView::slice: a rank-0 tensor has nothing to slice
#include <tessera/tensor.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<>> scalar("scalar"); // () fp32
  auto s = scalar.view().slice(0, 1);
  (void)s;
}
