// expect: tessera::reshape: the new shape must have as many elements as the old one
// Both shapes are fully static, so the size mismatch (12 vs 10) is known at compile time.
#include <tessera/tensor.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<3, 4>> t("t"); // (3, 4) fp32
  auto r = tessera::reshape<tessera::extents<2, 5>>(t);
  (void)r;
}
