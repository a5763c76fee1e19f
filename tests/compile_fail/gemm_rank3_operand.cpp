// expect: tessera::gemm: A, B and C must be rank-2 (matrices)
#include <tessera/gemm.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<2, 3, 4>> a("a"); // (2, 3, 4): not a matrix
  tessera::Tensor<tessera::fp32, tessera::extents<4, 5>> b("b");    // (4, 5)
  tessera::Tensor<tessera::fp32, tessera::extents<2, 5>> c("c");    // (2, 5)
  tessera::gemm(Kokkos::DefaultHostExecutionSpace{}, a, b, c);
}
