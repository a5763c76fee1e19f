// expect: tessera::gemm: the inner dimensions must agree: A is (M, K) and B is (K, N)
#include <tessera/gemm.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<4, 3>> a("a");     // (4, 3): K = 3
  tessera::Tensor<tessera::fp32, tessera::extents<5, 2>> b("b");     // (5, 2): K = 5
  tessera::Tensor<tessera::fp32, tessera::dextents<2>> c("c", 4, 2); // (4, 2)
  tessera::gemm(Kokkos::DefaultHostExecutionSpace{}, a, b, c);
}
