// Quick self-check of tessera::gemm against a double loop (all algorithms, a few shapes and
// precisions, an epilogue, a scaled fp8 output, a batch). Not a test: the correctness tests
// live in tests/gemm/; this is the helper's smoke run after changing a kernel.
#include <tessera/gemm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

using namespace tessera; // NOLINT: a benchmark-side program, not a header

namespace {

int failures = 0;

template <class PA, class PB, class PC, class Algo>
void check(const char* name, index_t m, index_t n, index_t k, bool ta, bool tb, float alpha,
           float beta, unsigned seed) {
  using E = Kokkos::DefaultHostExecutionSpace;
  Tensor<PA, dextents<2>> a("a", ta ? k : m, ta ? m : k);
  Tensor<PB, dextents<2>> b("b", tb ? n : k, tb ? k : n);
  Tensor<PC, dextents<2>> c("c", m, n);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (index_t i = 0; i < a.size(); ++i) a.data()[i] = from_float<PA>(u(g));
  for (index_t i = 0; i < b.size(); ++i) b.data()[i] = from_float<PB>(u(g));
  for (index_t i = 0; i < c.size(); ++i) c.data()[i] = from_float<PC>(u(g));
  std::vector<double> ref(static_cast<std::size_t>(m * n));
  const auto av = ta ? transpose(a.view()) : a.view().as_strided();
  const auto bv = tb ? transpose(b.view()) : b.view().as_strided();
  double worst = 0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0;
      for (index_t p = 0; p < k; ++p) s += double(to_float(av(i, p))) * to_float(bv(p, j));
      ref[i * n + j] = alpha * s + (beta != 0 ? beta * double(to_float(c(i, j))) : 0.0);
    }
  gemm(Algo{}, E{}, av, bv, c, gemm_options{alpha, beta});
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const double e = std::abs(to_float(c(i, j)) - ref[i * n + j]);
      if (!(e <= worst)) worst = e;
    }
  const double tol = (std::is_same_v<PC, fp32> ? 1e-5 : 1e-2) * std::sqrt(double(k) + 1) * 4;
  const bool ok = worst <= tol;
  if (!ok) ++failures;
  std::printf("%-5s %-12s m=%4ld n=%4ld k=%4ld ta=%d tb=%d err=%.3g %s\n", ok ? "ok" : "FAIL", name,
              long(m), long(n), long(k), ta, tb, worst, ok ? "" : "<<<<<");
}

template <class Algo>
void all(const char* name) {
  const index_t shapes[][3] = {{1, 1, 1},      {7, 5, 3},       {17, 33, 65},   {64, 64, 64},
                               {100, 37, 129}, {255, 257, 300}, {130, 515, 70}, {300, 40, 1000}};
  unsigned s = 1;
  for (const auto& sh : shapes)
    for (int t = 0; t < 4; ++t) {
      check<fp32, fp32, fp32, Algo>(name, sh[0], sh[1], sh[2], t & 1, t & 2, 1.5f,
                                    t == 3 ? 0.5f : 0.f, s++);
      check<bf16, bf16, fp32, Algo>(name, sh[0], sh[1], sh[2], t & 1, t & 2, 1.f, 0.f, s++);
      check<fp8_e4m3, fp8_e5m2, bf16, Algo>(name, sh[0], sh[1], sh[2], t & 1, t & 2, 1.f, 0.f, s++);
      check<fp32, bf16, fp32, Algo>(name, sh[0], sh[1], sh[2], t & 1, t & 2, 1.f, 1.f, s++);
    }
}

} // namespace

template <class PA, class PB>
void time_one(index_t n) {
  using E = Kokkos::DefaultHostExecutionSpace;
  Tensor<PA, dextents<2>> a("a", n, n);
  Tensor<PB, dextents<2>> b("b", n, n);
  Tensor<fp32, dextents<2>> c("c", n, n);
  double best = 1e9, bestcpu = 1e9;
  for (int r = 0; r < 10; ++r) {
    timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    Kokkos::Timer t;
    gemm(E{}, a, b, c);
    best = std::min(best, t.seconds());
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    bestcpu = std::min(bestcpu, (c1.tv_sec - c0.tv_sec) + 1e-9 * (c1.tv_nsec - c0.tv_nsec));
  }
  std::printf("%s x %s n=%ld: %.1f GFLOP/s wall, %.1f per cpu-second\n", precision_traits<PA>::name,
              precision_traits<PB>::name, long(n), 2.0 * n * n * n / best * 1e-9,
              2.0 * n * n * n / bestcpu * 1e-9);
}

/// bf16 x bf16 (n^3) through each host micro-kernel that can take it, on one thread (Serial),
/// best of 10 calls in thread CPU time (the machine is shared).
void time_kernels(index_t n) {
  using E = Kokkos::Serial;
  Tensor<bf16, dextents<2>> a("a", n, n), b("b", n, n);
  Tensor<fp32, dextents<2>> c("c", n, n);
  fill_uniform(E{}, a, 1, -1.f, 1.f);
  fill_uniform(E{}, b, 2, -1.f, 1.f);
  const auto pr =
      detail::make_problem(detail::to_gemm_operand(a), detail::to_gemm_operand(b),
                           detail::to_gemm_operand(c), detail::as_epilogue(gemm_options{}));
  const auto run = [&](const char* name, auto kernel) {
    using K = decltype(kernel);
    double best = 1e9;
    for (int r = 0; r < 10; ++r) {
      timespec c0, c1;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
      detail::hostgemm::run_parallel<K>(E{}, pr);
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
      best = std::min(best, (c1.tv_sec - c0.tv_sec) + 1e-9 * (c1.tv_nsec - c0.tv_nsec));
    }
    std::printf("bf16 n=%4ld %-7s %.1f GFLOP/s per cpu-second\n", long(n), name,
                2.0 * n * n * n / best * 1e-9);
  };
  run("fp32fma", detail::hostgemm::fma_kernel{});
#if TESSERA_GEMM_AVX512BF16
  run("dpbf16", detail::hostgemm::dpbf16_kernel{});
#endif
}

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  if (argc > 3 && std::string(argv[1]) == "prof") { // prof fp32|bf16 n: 200 calls
    const index_t n = std::atol(argv[3]);
    const bool f = std::string(argv[2]) == "fp32";
    for (int r = 0; r < 4; ++r) f ? time_one<fp32, fp32>(n) : time_one<bf16, bf16>(n);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "kernels") { // bf16 through each host kernel
    for (index_t n : {256, 512, 1024, 2048}) time_kernels(n);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "time") {
    for (index_t n : {256, 512, 1024, 2048}) time_one<fp32, fp32>(n);
    for (index_t n : {256, 512, 1024, 2048}) time_one<bf16, bf16>(n);
    for (index_t n : {1024}) time_one<fp8_e4m3, fp8_e5m2>(n);
    return 0;
  }
  all<gemm_algo::reference>("reference");
  all<gemm_algo::direct>("direct");
  all<gemm_algo::portable>("portable");
  all<gemm_algo::host_packed>("host_packed");
  all<gemm_algo::automatic>("automatic");
  std::printf("%d failures\n", failures);
  return failures != 0;
}
