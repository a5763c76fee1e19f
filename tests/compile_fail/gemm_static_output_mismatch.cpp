// expect: tessera::gemm: C must be (M, N) for B (K, N): the static extents give C a different
#include <tessera/gemm.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::dextents<2>> a("a", 4, 3); // (4, 3), dynamic
  tessera::Tensor<tessera::fp32, tessera::extents<3, 2>> b("b");     // (3, 2): N = 2
  tessera::Tensor<tessera::fp32, tessera::extents<4, 5>> c("c");     // (4, 5): N = 5
  tessera::gemm(Kokkos::DefaultHostExecutionSpace{}, a, b, c);
}
