// A tour of tessera's foundation: precision types, tensors, casts, fp8 quantization, and a short
// benchmark (conversion bandwidth, a small GEMM). Runs in a few seconds:
//
//   scripts/run.sh                 # bootstraps, builds this example and runs it
//   build/examples/tour [--quick]  # directly; --quick shrinks the benchmark sizes
#include <tessera/gemm.hpp>
#include <tessera/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using tessera::dyn;
using tessera::extents;
using tessera::index_t;
using tessera::Tensor;
using exec = Kokkos::DefaultExecutionSpace;
template <class P>
using matrix = Tensor<P, extents<dyn, dyn>>;

template <class P>
void print_traits() {
  using t = tessera::precision_traits<P>;
  std::printf("  %-9s %2d bits  e%d m%-2d  bias %3d  max %-12g min normal %-12g min subnormal "
              "%-12g eps %-10g inf:%s\n",
              t::name, t::bits, t::exponent_bits, t::mantissa_bits, t::bias,
              static_cast<double>(t::max_finite), static_cast<double>(t::min_normal),
              static_cast<double>(t::min_subnormal), static_cast<double>(t::epsilon),
              t::has_inf ? "yes" : "no");
}

struct error_stats {
  double max_rel = 0, rms_rel = 0; // over elements whose magnitude is >= the format's min normal
  index_t flushed = 0;             // elements that became 0 (underflow)
};

// Compares y (the round trip) with x element by element on the host.
error_stats compare(const matrix<tessera::fp32>& x, const matrix<tessera::fp32>& y,
                    float min_normal) {
  const auto hx = tessera::to_host(x);
  const auto hy = tessera::to_host(y);
  error_stats s;
  index_t counted = 0;
  for (index_t i = 0; i < hx.size(); ++i) {
    const double a = hx.data()[i], b = hy.data()[i];
    if (a != 0 && b == 0) ++s.flushed;
    if (std::fabs(a) < min_normal) continue;
    const double r = std::fabs(b - a) / std::fabs(a);
    s.max_rel = std::max(s.max_rel, r);
    s.rms_rel += r * r;
    ++counted;
  }
  s.rms_rel = counted ? std::sqrt(s.rms_rel / static_cast<double>(counted)) : 0;
  return s;
}

template <class P>
void round_trip(const matrix<tessera::fp32>& x) {
  using t = tessera::precision_traits<P>;
  const auto low = tessera::cast<P>(x);                // same shape, P storage
  const auto back = tessera::cast<tessera::fp32>(low); // exact widening
  const auto s = compare(x, back, t::min_normal);
  std::printf("  fp32 -> %-9s -> fp32: max rel err %.3e, rms %.3e (unit roundoff %.3e), "
              "%lld flushed to 0\n",
              t::name, s.max_rel, s.rms_rel, static_cast<double>(t::unit_roundoff),
              static_cast<long long>(s.flushed));
}

// Best-of-reps wall time of f, in seconds (best: the machine is shared and noisy).
template <class F>
double best_time(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Kokkos::Timer timer;
    f();
    best = std::min(best, timer.seconds());
  }
  return best;
}

template <class From, class To>
void bench_convert(index_t n, double memcpy_gbs) {
  Tensor<From, extents<dyn>> src("src", n);
  Tensor<To, extents<dyn>> dst("dst", n);
  tessera::fill_uniform(src, 1, -100.f, 100.f);
  const double bytes =
      static_cast<double>(n) * (sizeof(tessera::storage_t<From>) + sizeof(tessera::storage_t<To>));
  const double s = best_time(5, [&] { tessera::convert_into(exec{}, dst, src); });
  std::printf("  %-9s -> %-9s %7.2f GB/s  (%.2f x copy)\n", tessera::precision_traits<From>::name,
              tessera::precision_traits<To>::name, bytes / s * 1e-9, bytes / s * 1e-9 / memcpy_gbs);
}

template <class PA, class PB>
void bench_gemm(index_t m, index_t n, index_t k) {
  matrix<tessera::fp32> a32("a", m, k), b32("b", k, n); // (M, K), (K, N) row-major fp32
  tessera::fill_normal(a32, 3);
  tessera::fill_normal(b32, 4);
  const auto a = tessera::cast<PA>(a32);
  const auto b = tessera::cast<PB>(b32);
  matrix<tessera::fp32> c("c", m, n); // (M, N) row-major fp32
  const double s = best_time(3, [&] { tessera::gemm(exec{}, a, b, c); });

  // Check one row against a double-precision dot product of the same (rounded) inputs.
  const auto ha = tessera::to_host(tessera::cast<tessera::fp32>(a));
  const auto hb = tessera::to_host(tessera::cast<tessera::fp32>(b));
  const auto hc = tessera::to_host(c);
  double worst = 0;
  for (index_t j = 0; j < n; ++j) {
    double ref = 0, mag = 0;
    for (index_t p = 0; p < k; ++p) {
      ref += static_cast<double>(ha(m / 2, p)) * hb(p, j);
      mag += std::fabs(static_cast<double>(ha(m / 2, p)) * hb(p, j));
    }
    worst = std::max(worst, std::fabs(hc(m / 2, j) - ref) / mag);
  }
  std::printf("  %-8s x %-8s -> fp32  (%lld x %lld x %lld)  %7.2f GFLOP/s   row check: max |err| / "
              "sum|a b| = %.1e\n",
              tessera::precision_traits<PA>::name, tessera::precision_traits<PB>::name,
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
              2.0 * m * n * k / s * 1e-9, worst);
}

} // namespace

int main(int argc, char* argv[]) {
  setenv("OMP_PROC_BIND", "false", 0); // Kokkos' OpenMP backend warns without it
  Kokkos::ScopeGuard kokkos(argc, argv);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;

  std::printf("tessera %d.%d.%d on Kokkos %s, %d threads\n\n", TESSERA_VERSION_MAJOR,
              TESSERA_VERSION_MINOR, TESSERA_VERSION_PATCH, exec::name(), exec::concurrency());

  std::printf("Precisions (precision_traits<Tag>):\n");
  print_traits<tessera::fp32>();
  print_traits<tessera::bf16>();
  print_traits<tessera::fp8_e4m3>();
  print_traits<tessera::fp8_e5m2>();

  // A batch of 256 flattened 28x28 images, normally distributed (seed 42: the same numbers on
  // any thread count).
  matrix<tessera::fp32> x("x", 256, 784); // (256, 784) row-major fp32
  tessera::fill_normal(x, /*seed=*/42);
  std::printf("\nRound trips of a (256, 784) N(0, 1) tensor (rounding to nearest even; fp8 "
              "saturates):\n");
  round_trip<tessera::bf16>(x);
  round_trip<tessera::fp8_e4m3>(x);
  round_trip<tessera::fp8_e5m2>(x);

  // Small activations: plain e4m3 flushes most of them to zero, scaled e4m3 keeps them.
  matrix<tessera::fp32> small("small", 256, 784); // (256, 784) row-major fp32
  tessera::fill_normal(small, 7, 0.f, 1e-3f);
  const auto plain = tessera::cast<tessera::fp32>(tessera::cast<tessera::fp8_e4m3>(small));
  const auto q = tessera::quantize<tessera::fp8_e4m3>(small, /*margin=*/0);
  const auto deq = tessera::dequantize(q);
  const auto sp = compare(small, plain, 0.f), sq = compare(small, deq, 0.f);
  std::printf("\nN(0, 1e-3^2) data, amax %.3e:\n", static_cast<double>(tessera::amax(small)));
  std::printf("  cast to fp8_e4m3:             rms rel err %.3e, %6lld of %lld flushed to 0\n",
              sp.rms_rel, static_cast<long long>(sp.flushed), static_cast<long long>(small.size()));
  std::printf("  quantize (scale %.4g): rms rel err %.3e, %6lld of %lld flushed to 0\n",
              static_cast<double>(q.scale), sq.rms_rel, static_cast<long long>(sq.flushed),
              static_cast<long long>(small.size()));

  // Benchmark: conversions of 16 Mi elements (64 MiB as fp32: well beyond the caches), beside a
  // copy of fp32 data of the same total bytes as fp32 -> bf16 moves.
  const index_t n = quick ? index_t{1} << 20 : index_t{1} << 24;
  Tensor<tessera::fp32, extents<dyn>> c_src("c_src", n * 3 / 4), c_dst("c_dst", n * 3 / 4);
  const double copy_bytes = 2.0 * sizeof(float) * static_cast<double>(c_src.size());
  const double copy_gbs =
      copy_bytes / best_time(5, [&] { tessera::deep_copy(c_dst, c_src); }) * 1e-9;
  std::printf("\nConversion bandwidth, %lld elements (bytes read + written; copy: %.2f GB/s):\n",
              static_cast<long long>(n), copy_gbs);
  bench_convert<tessera::fp32, tessera::bf16>(n, copy_gbs);
  bench_convert<tessera::bf16, tessera::fp32>(n, copy_gbs);
  bench_convert<tessera::fp32, tessera::fp8_e4m3>(n, copy_gbs);
  bench_convert<tessera::fp8_e4m3, tessera::fp32>(n, copy_gbs);
  bench_convert<tessera::bf16, tessera::fp8_e5m2>(n, copy_gbs);

  // 384^3: 113 MFLOP per call, a fraction of a second even for the portable reference GEMM, and
  // (3 x 576 KiB fp32 matrices) larger than the L2 cache so blocking will show once it lands.
  const index_t g = quick ? 128 : 384;
  std::printf("\nGEMM (tessera::gemm, fp32 accumulation):\n");
  bench_gemm<tessera::fp32, tessera::fp32>(g, g, g);
  bench_gemm<tessera::bf16, tessera::bf16>(g, g, g);
  bench_gemm<tessera::fp8_e4m3, tessera::fp8_e4m3>(g, g, g);
  return 0;
}
