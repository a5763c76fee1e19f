// Conversion throughput: tessera::convert_into (what tessera::cast runs, here into a
// preallocated tensor so that allocation is not timed) for each pair of precisions, on 1 thread
// (Kokkos::Serial) and 2 threads (Kokkos::OpenMP, whose concurrency is reported and must be 2:
// run with OMP_NUM_THREADS=2 or on a 2-core machine), beside a plain copy of the source bytes
// (std::memcpy on 1 thread; two halves copied by std::memcpy in a Kokkos::OpenMP parallel_for on
// 2 threads) as the memory bound.
//
// Bandwidth counts bytes read + bytes written (a copy of B bytes moves 2B). Sizes: 16 Mi
// elements (64 MiB of fp32, far beyond the 1 MiB L2 and 32 MiB L3 of a Zen 5 CCD) and 64 Ki
// elements (256 KiB of fp32 + its result: inside L2). After the Google Benchmark output a
// markdown table gives GB/s and the ratio to the copy of the same source bytes on the same
// number of threads.
#include <tessera/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

using tessera::index_t;
template <class P>
using vec_t =
    tessera::Tensor<P, tessera::extents<tessera::dyn>, tessera::layout_right, Kokkos::HostSpace>;

// Measured GB/s per (name, threads, n); the table is printed after the run.
std::map<std::tuple<std::string, int, index_t>, double> gbps;

template <class Exec>
int threads_of() {
  return Exec().concurrency();
}

template <class Exec>
void bm_copy(benchmark::State& st, std::size_t bytes) {
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  const auto* s = src.data();
  auto* d = dst.data();
  const int threads = threads_of<Exec>();
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    if constexpr (std::is_same_v<Exec, Kokkos::Serial>) {
      std::memcpy(d, s, bytes);
    } else {
      const std::size_t part = (bytes + threads - 1) / threads;
      Kokkos::parallel_for("copy", Kokkos::RangePolicy<Exec>(0, threads), [=](const int t) {
        const std::size_t b = t * part, e = std::min(bytes, b + part);
        if (b < e) std::memcpy(d + b, s + b, e - b);
      });
      Exec().fence();
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(d);
    benchmark::ClobberMemory();
  }
  const double rate = 2.0 * bytes * st.iterations() / seconds / 1e9;
  st.counters["GB/s"] = rate;
  st.counters["threads"] = threads;
  gbps[{"copy" + std::to_string(bytes), threads, 0}] = rate;
}

template <class Exec, class From, class To>
void bm_convert(benchmark::State& st, index_t n) {
  vec_t<From> src("src", n); // (n) host, precision From
  vec_t<To> dst("dst", n);   // (n) host, precision To
  // Values across e4m3's whole range (+-448), so fp8 targets see normals, subnormals and the
  // saturation boundary alike.
  tessera::fill_uniform(Kokkos::DefaultHostExecutionSpace(), src, 42, -500.f, 500.f);
  const Exec exec;
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    tessera::convert_into(exec, dst, src);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  const double bytes =
      static_cast<double>(n) * (sizeof(tessera::storage_t<From>) + sizeof(tessera::storage_t<To>));
  const double rate = bytes * st.iterations() / seconds / 1e9;
  st.counters["GB/s"] = rate;
  st.counters["threads"] = threads_of<Exec>();
  gbps[{std::string(tessera::precision_traits<From>::name) + "->" +
            tessera::precision_traits<To>::name,
        threads_of<Exec>(), n}] = rate;
}

constexpr index_t sizes[] = {index_t{1} << 16, index_t{1} << 24};

struct pair_info {
  std::string name;
  std::size_t src_bytes;
};
std::vector<pair_info> pairs;

template <class From, class To>
void register_pair() {
  const std::string name = std::string(tessera::precision_traits<From>::name) + "->" +
                           tessera::precision_traits<To>::name;
  pairs.push_back({name, sizeof(tessera::storage_t<From>)});
  for (index_t n : sizes) {
    benchmark::RegisterBenchmark(
        (name + "/1thread/" + std::to_string(n)).c_str(),
        [n](benchmark::State& st) { bm_convert<Kokkos::Serial, From, To>(st, n); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(
        (name + "/2threads/" + std::to_string(n)).c_str(),
        [n](benchmark::State& st) { bm_convert<Kokkos::OpenMP, From, To>(st, n); })
        ->UseRealTime();
  }
}

void register_all() {
  for (index_t n : sizes)
    for (std::size_t b : {1, 2, 4}) {
      const std::size_t bytes = static_cast<std::size_t>(n) * b;
      benchmark::RegisterBenchmark(
          ("copy/1thread/" + std::to_string(bytes) + "B").c_str(),
          [bytes](benchmark::State& st) { bm_copy<Kokkos::Serial>(st, bytes); })
          ->UseRealTime();
      benchmark::RegisterBenchmark(
          ("copy/2threads/" + std::to_string(bytes) + "B").c_str(),
          [bytes](benchmark::State& st) { bm_copy<Kokkos::OpenMP>(st, bytes); })
          ->UseRealTime();
    }
  using namespace tessera; // NOLINT: benchmark source, not a header
  register_pair<fp32, bf16>();
  register_pair<bf16, fp32>();
  register_pair<fp32, fp8_e4m3>();
  register_pair<fp8_e4m3, fp32>();
  register_pair<fp32, fp8_e5m2>();
  register_pair<fp8_e5m2, fp32>();
  register_pair<bf16, fp8_e4m3>();
  register_pair<fp8_e4m3, bf16>();
  register_pair<bf16, fp8_e5m2>();
  register_pair<fp8_e5m2, bf16>();
  register_pair<fp8_e4m3, fp8_e5m2>();
}

void print_table() {
  const int two = threads_of<Kokkos::OpenMP>();
  std::printf("\n| conversion | elements | 1 thread GB/s | vs copy | %d threads GB/s | vs copy |\n",
              two);
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (index_t n : sizes)
    for (const auto& p : pairs) {
      const std::string copy = "copy" + std::to_string(static_cast<std::size_t>(n) * p.src_bytes);
      const auto get = [&](const std::string& k, int t, index_t m) {
        const auto it = gbps.find({k, t, m});
        return it == gbps.end() ? 0.0 : it->second;
      };
      const double c1 = get(p.name, 1, n), c2 = get(p.name, two, n);
      const double m1 = get(copy, 1, 0), m2 = get(copy, two, 0);
      if (c1 == 0 && c2 == 0) continue; // filtered out
      std::printf("| %s | %lld | %.1f | %.2f | %.1f | %.2f |\n", p.name.c_str(),
                  static_cast<long long>(n), c1, m1 > 0 ? c1 / m1 : 0.0, c2,
                  m2 > 0 ? c2 / m2 : 0.0);
    }
  std::printf("\nCopy of the source bytes (GB/s, read + write):\n");
  for (const auto& [key, rate] : gbps)
    if (std::get<0>(key).rfind("copy", 0) == 0)
      std::printf("  %s bytes, %d thread(s): %.1f\n", std::get<0>(key).c_str() + 4,
                  std::get<1>(key), rate);
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  return 0;
}
