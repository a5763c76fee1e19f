// expect: tessera::Tensor: the first template argument must be a precision tag
// float is a storage type; the precision tag is tessera::fp32.
#include <tessera/tensor.hpp>

void snippet() {
  tessera::Tensor<float, tessera::extents<2>> t("t");
  (void)t;
}
