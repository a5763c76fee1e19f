// expect: tessera::scaled_tensor / quantize: the payload precision must be an fp8 precision
// Scaled tensors carry fp8 payloads; bf16 has fp32's range and needs no scale (use cast<bf16>).
#include <tessera/tensor.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<4>> x("x"); // (4) fp32
  auto q = tessera::quantize<tessera::bf16>(x);
  (void)q;
}
