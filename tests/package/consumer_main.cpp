// The program both consumer projects build: a small computation through tessera's public
// headers, checked against exact integer arithmetic. Exit status 0 only if every value matches.
#include <tessera/gemm.hpp>
#include <tessera/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  using namespace tessera; // NOLINT: a consumer program, not a header
  constexpr index_t m = 3, k = 4, n = 5;

  Tensor<fp32, extents<dyn, k>> a32("a", m); // (M, K) row-major fp32
  Tensor<fp32, extents<k, n>> b32("b");      // (K, N) row-major fp32
  auto ha = to_host(a32);
  auto hb = to_host(b32);
  for (index_t i = 0; i < m; ++i)
    for (index_t p = 0; p < k; ++p) ha(i, p) = static_cast<float>(i + 2 * p);
  for (index_t p = 0; p < k; ++p)
    for (index_t j = 0; j < n; ++j) hb(p, j) = static_cast<float>(p - j);
  deep_copy(a32, ha);
  deep_copy(b32, hb);

  // Small integers are exact in bf16 and e4m3, so the product is exact too.
  auto a = cast<bf16>(a32);
  auto b = cast<fp8_e4m3>(b32);
  Tensor<fp32, extents<dyn, n>> c("c", m); // (M, N) row-major fp32
  gemm(Kokkos::DefaultExecutionSpace{}, a, b, c);

  auto hc = to_host(c);
  int wrong = 0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      index_t want = 0;
      for (index_t p = 0; p < k; ++p) want += (i + 2 * p) * (p - j);
      if (hc(i, j) != static_cast<float>(want)) {
        std::printf("c(%lld, %lld) = %g, expected %lld\n", static_cast<long long>(i),
                    static_cast<long long>(j), static_cast<double>(hc(i, j)),
                    static_cast<long long>(want));
        ++wrong;
      }
    }
  std::printf("tessera %d.%d.%d consumer: %s\n", TESSERA_VERSION_MAJOR, TESSERA_VERSION_MINOR,
              TESSERA_VERSION_PATCH, wrong ? "WRONG" : "ok");
  return wrong ? 1 : 0;
}
