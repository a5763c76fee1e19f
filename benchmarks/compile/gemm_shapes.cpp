// Compile-time benchmark TU (benchmarks/compile/measure.sh): fp32 GEMMs of four static shapes
// and one dynamic one, all row-major. Before gemm normalised its operands, each shape
// instantiated its own copy of the whole GEMM (checks, algorithm choice, host driver, kernels);
// measure.sh counts the functions of tessera::detail (hostgemm included) in this object.
#include <tessera/gemm.hpp>

#include <cstdio>

namespace {

using tessera::extents;
using tessera::fp32;
using tessera::Tensor;

template <tessera::index_t M, tessera::index_t K, tessera::index_t N>
float run(const Kokkos::DefaultHostExecutionSpace& exec) {
  Tensor<fp32, extents<M, K>> a("a"); // (M, K)
  Tensor<fp32, extents<K, N>> b("b"); // (K, N)
  Tensor<fp32, extents<M, N>> c("c"); // (M, N)
  tessera::gemm(exec, a, b, c);
  return c.view()(0, 0);
}

} // namespace

int main() {
  Kokkos::ScopeGuard guard;
  const Kokkos::DefaultHostExecutionSpace exec;
  float s = run<8, 16, 32>(exec) + run<64, 64, 64>(exec) + run<128, 3136, 10>(exec) +
            run<100, 200, 300>(exec);
  tessera::Tensor<fp32, tessera::dextents<2>> a("a", 5, 6), b("b", 6, 7), c("c", 5, 7);
  tessera::gemm(exec, a, b, c);
  std::printf("%g\n", static_cast<double>(s + c.view()(0, 0)));
}
