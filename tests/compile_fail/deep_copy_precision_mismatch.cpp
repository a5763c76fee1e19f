// expect: tessera::deep_copy: dst and src must have the same precision
// deep_copy copies bits; an fp32 tensor cannot take a bf16 tensor's bits (convert_into rounds).
#include <tessera/tensor.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<2, 3>> dst("dst"); // (2, 3) fp32
  tessera::Tensor<tessera::bf16, tessera::extents<2, 3>> src("src"); // (2, 3) bf16
  tessera::deep_copy(dst, src);
}
