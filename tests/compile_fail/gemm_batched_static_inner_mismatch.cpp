// expect: tessera::gemm: the inner dimensions must agree: A is (M, K) and B is (K, N)
#include <tessera/gemm.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<2, 4, 3>> a("a"); // (batch, 4, 3): K = 3
  tessera::Tensor<tessera::fp32, tessera::extents<2, 5, 2>> b("b"); // (batch, 5, 2): K = 5
  tessera::Tensor<tessera::fp32, tessera::extents<2, 4, 2>> c("c"); // (batch, 4, 2)
  tessera::gemm_batched(Kokkos::DefaultHostExecutionSpace{}, a, b, c);
}
