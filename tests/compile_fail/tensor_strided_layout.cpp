// expect: tessera::Tensor: an owning tensor is contiguous
// Strided access goes through TensorView (slices, transposes), not through an owning Tensor.
#include <tessera/tensor.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<2, 3>, tessera::layout_stride> t("t");
  (void)t;
}
