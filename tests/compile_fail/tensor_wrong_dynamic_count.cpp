// expect: tessera::Tensor: pass exactly one size per tessera::dyn extent
// extents<dyn, 3> has one dynamic dimension; the static 3 must not be passed again.
#include <tessera/tensor.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<tessera::dyn, 3>> t("t", 2, 3);
  (void)t;
}
