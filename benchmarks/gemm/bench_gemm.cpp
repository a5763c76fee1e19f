// GEMM benchmarks: tessera::gemm (automatic algorithm) in every input precision (fp32, bf16,
// e4m3, e5m2, e4m3 x e5m2; C fp32, row-major operands) beside OpenBLAS sgemm and oneDNN matmul
// (fp32 and bf16 -> fp32), measured in the same run, on 1 thread (tessera on Kokkos::Serial,
// the anchors set to 1 thread) and 2 threads (Kokkos::OpenMP, anchors set to 2 threads).
//
// Shapes (M, N, K): square 64 .. 2048 and (4096, 1024, 1024), (64, 4096, 4096) (issue 3).
//
// Timing: each benchmark repeats the call for >= 0.2 s and records the FASTEST call (the
// "time" Google Benchmark prints is the mean). The machine is shared: other processes preempt
// runs at random, which the minimum filters out and the mean does not. Every implementation is
// timed the same way, so the ratios compare like with like.
//
// Counters: GFLOP/s = 2 M N K / best time; x_<anchor> = anchor time / tessera time (> 1: tessera
// faster); peak = GFLOP/s / fp32 FMA peak of the threads used, where the per-core peak is
// measured at start-up (24 independent AVX-512 FMA chains, best of 200 short runs: 2 FMA
// units x 16 lanes x 2 flop x the clock the core actually runs at).
//
// After the Google Benchmark output a markdown table summarises everything. Use
//   bench_gemm --benchmark_out=gemm.json --benchmark_out_format=json
// for the JSON scripts/plot_gemm.py reads (scripts/bench_gemm.sh does both).
#include <tessera/gemm.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(TESSERA_HAVE_DNNL)
#include <dnnl.hpp>
#include <omp.h>
#endif
#if defined(TESSERA_HAVE_OPENBLAS)
#include <cblas.h>
#endif

namespace {

using tessera::index_t;

struct shape {
  index_t m, n, k;
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
  double flops() const { return 2.0 * m * n * k; }
};

const std::vector<shape> shapes = {{64, 64, 64},       {128, 128, 128},    {256, 256, 256},
                                   {384, 384, 384},    {512, 512, 512},    {768, 768, 768},
                                   {1024, 1024, 1024}, {1536, 1536, 1536}, {2048, 2048, 2048},
                                   {4096, 1024, 1024}, {64, 4096, 4096}};

const char* const impls[] = {"openblas_fp32", "onednn_fp32",  "onednn_bf16",  "tessera_fp32",
                             "tessera_bf16",  "tessera_e4m3", "tessera_e5m2", "tessera_e4m3xe5m2"};

std::map<std::string, double> best_seconds; // key: shape/threads/impl

std::string key(const shape& s, int threads, const std::string& impl) {
  return s.name() + "/" + std::to_string(threads) + "/" + impl;
}

double peak_per_core = 0; // measured fp32 FMA GFLOP/s of one core

/// Best time of 200 short runs of 24 independent FMA chains (enough to hide the 4-cycle
/// latency behind 2 FMA units).
double measure_fp32_peak() {
#if defined(__AVX512F__)
  __m512 c[24];
  for (int i = 0; i < 24; ++i) c[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
  const long iters = 20000;
  double best = 1e30;
  for (int rep = 0; rep < 200; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
      for (int j = 0; j < 24; ++j) c[j] = _mm512_fmadd_ps(a, c[j], b);
    }
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  float sink = 0;
  for (int j = 0; j < 24; ++j) sink += _mm512_reduce_add_ps(c[j]);
  benchmark::DoNotOptimize(sink);
  return 24.0 * 32 * iters / best * 1e-9;
#else
  return 0;
#endif
}

/// Runs fn in the benchmark loop (after a warm-up call), keeps the fastest call.
template <class F>
void timed_loop(benchmark::State& st, const shape& s, const std::string& k, F&& fn) {
  fn(); // warm-up: packing buffers, page faults, oneDNN's JIT, AMX permission
  double best = 1e30;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  best_seconds[k] = best;
  st.counters["GFLOP/s"] = s.flops() / best * 1e-9;
}

template <class Exec, class PA, class PB>
void bm_tessera(benchmark::State& st, shape s, int threads, std::string impl) {
  using space = typename Exec::memory_space;
  const Exec exec;
  tessera::Tensor<PA, tessera::dextents<2>, tessera::layout_right, space> a("a", s.m, s.k);
  tessera::Tensor<PB, tessera::dextents<2>, tessera::layout_right, space> b("b", s.k, s.n);
  tessera::Tensor<tessera::fp32, tessera::dextents<2>, tessera::layout_right, space> c("c", s.m,
                                                                                       s.n);
  tessera::fill_uniform(exec, a, 1, -1.f, 1.f);
  tessera::fill_uniform(exec, b, 2, -1.f, 1.f);
  const std::string k = key(s, threads, impl);
  timed_loop(st, s, k, [&] { tessera::gemm(exec, a, b, c); });
  for (const char* anchor : {"openblas_fp32", "onednn_fp32", "onednn_bf16"}) {
    const auto it = best_seconds.find(key(s, threads, anchor));
    if (it != best_seconds.end())
      st.counters[std::string("x_") + anchor] = it->second / best_seconds[k];
  }
  if (peak_per_core > 0)
    st.counters["peak"] = s.flops() / best_seconds[k] * 1e-9 / (peak_per_core * threads);
}

#if defined(TESSERA_HAVE_DNNL)
void bm_onednn(benchmark::State& st, shape s, int threads, dnnl::memory::data_type dt) {
  using namespace dnnl; // NOLINT: benchmark source, not a header
  omp_set_num_threads(threads);
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::desc a_md({s.m, s.k}, dt, memory::format_tag::ab),
      b_md({s.k, s.n}, dt, memory::format_tag::ab),
      c_md({s.m, s.n}, memory::data_type::f32, memory::format_tag::ab);
  try {
    const matmul::primitive_desc pd(matmul::desc(a_md, b_md, c_md), eng);
    const matmul prim(pd);
    memory a(a_md, eng), b(b_md, eng), c(c_md, eng);
    std::memset(a.get_data_handle(), 0, a_md.get_size());
    std::memset(b.get_data_handle(), 0, b_md.get_size());
    const std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    const std::string impl = dt == memory::data_type::f32 ? "onednn_fp32" : "onednn_bf16";
    timed_loop(st, s, key(s, threads, impl), [&] {
      prim.execute(strm, args);
      strm.wait();
    });
  } catch (const dnnl::error& e) {
    st.SkipWithError(e.what());
    for (auto _ : st) {
    }
  }
}
#endif

#if defined(TESSERA_HAVE_OPENBLAS)
void bm_openblas(benchmark::State& st, shape s, int threads) {
  openblas_set_num_threads(threads);
  std::vector<float> a(static_cast<std::size_t>(s.m * s.k), 0.5f),
      b(static_cast<std::size_t>(s.k * s.n), 0.25f), c(static_cast<std::size_t>(s.m * s.n));
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  timed_loop(st, s, key(s, threads, "openblas_fp32"), [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a.data(), k, b.data(), n,
                0.f, c.data(), n);
  });
}
#endif

template <class Exec>
void register_tessera(const std::string& base, const shape& s, int threads) {
  using namespace tessera; // NOLINT: benchmark source
  const auto reg = [&]<class PA, class PB>(const char* impl, PA, PB) {
    benchmark::RegisterBenchmark(
        (base + impl).c_str(),
        [=](benchmark::State& st) { bm_tessera<Exec, PA, PB>(st, s, threads, impl); })
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.2)
        ->UseRealTime();
  };
  reg("tessera_fp32", fp32{}, fp32{});
  reg("tessera_bf16", bf16{}, bf16{});
  reg("tessera_e4m3", fp8_e4m3{}, fp8_e4m3{});
  reg("tessera_e5m2", fp8_e5m2{}, fp8_e5m2{});
  reg("tessera_e4m3xe5m2", fp8_e4m3{}, fp8_e5m2{});
}

void register_all() {
  for (int threads : {1, 2})
    for (const auto& s : shapes) {
      const std::string base = s.name() + "/threads:" + std::to_string(threads) + "/";
      const auto reg = [&](const std::string& impl, auto fn) {
        benchmark::RegisterBenchmark((base + impl).c_str(), fn)
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.2)
            ->UseRealTime();
      };
#if defined(TESSERA_HAVE_OPENBLAS)
      reg("openblas_fp32", [=](benchmark::State& st) { bm_openblas(st, s, threads); });
#endif
#if defined(TESSERA_HAVE_DNNL)
      reg("onednn_fp32",
          [=](benchmark::State& st) { bm_onednn(st, s, threads, dnnl::memory::data_type::f32); });
      reg("onednn_bf16",
          [=](benchmark::State& st) { bm_onednn(st, s, threads, dnnl::memory::data_type::bf16); });
#endif
      if (threads == 1) {
#if defined(KOKKOS_ENABLE_SERIAL)
        register_tessera<Kokkos::Serial>(base, s, threads);
#endif
      } else {
        register_tessera<Kokkos::DefaultHostExecutionSpace>(base, s, threads);
      }
    }
}

void print_table() {
  const auto gf = [](const shape& s, const std::string& k) -> std::string {
    const auto it = best_seconds.find(k);
    if (it == best_seconds.end()) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", s.flops() / it->second * 1e-9);
    return buf;
  };
  const auto ratio = [](const std::string& num, const std::string& den) -> std::string {
    const auto a = best_seconds.find(num), b = best_seconds.find(den);
    if (a == best_seconds.end() || b == best_seconds.end()) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", b->second / a->second);
    return buf;
  };
  std::printf("\nfp32 FMA peak measured: %.1f GFLOP/s per core\n", peak_per_core);
  std::printf("\n| M x N x K | thr | OpenBLAS | oneDNN fp32 | oneDNN bf16 | tessera fp32 | bf16 | "
              "e4m3 | e5m2 | e4m3xe5m2 | fp32/OpenBLAS | fp32/oneDNN | fp32 peak | "
              "bf16/oneDNN bf16 | fp8/bf16 |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int t : {1, 2})
    for (const auto& s : shapes) {
      const auto k = [&](const char* impl) { return key(s, t, impl); };
      if (best_seconds.count(k("tessera_fp32")) == 0) continue;
      char peak[32] = "-";
      if (peak_per_core > 0)
        std::snprintf(peak, sizeof peak, "%.0f%%",
                      100 * s.flops() / best_seconds[k("tessera_fp32")] * 1e-9 /
                          (peak_per_core * t));
      // fp8 / bf16: the slower of the three fp8 variants against bf16.
      std::string fp8 = "-";
      if (best_seconds.count(k("tessera_bf16"))) {
        double worst = 0;
        for (const char* f : {"tessera_e4m3", "tessera_e5m2", "tessera_e4m3xe5m2"})
          if (best_seconds.count(k(f))) worst = std::max(worst, best_seconds[k(f)]);
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f", best_seconds[k("tessera_bf16")] / worst);
        if (worst > 0) fp8 = buf;
      }
      std::printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                  s.name().c_str(), t, gf(s, k("openblas_fp32")).c_str(),
                  gf(s, k("onednn_fp32")).c_str(), gf(s, k("onednn_bf16")).c_str(),
                  gf(s, k("tessera_fp32")).c_str(), gf(s, k("tessera_bf16")).c_str(),
                  gf(s, k("tessera_e4m3")).c_str(), gf(s, k("tessera_e5m2")).c_str(),
                  gf(s, k("tessera_e4m3xe5m2")).c_str(),
                  ratio(k("tessera_fp32"), k("openblas_fp32")).c_str(),
                  ratio(k("tessera_fp32"), k("onednn_fp32")).c_str(), peak,
                  ratio(k("tessera_bf16"), k("onednn_bf16")).c_str(), fp8.c_str());
    }
  std::printf("(GFLOP/s = 2 M N K / fastest call; ratios > 1 mean tessera is faster; fp8/bf16 is "
              "the slowest fp8 variant's speed over bf16's)\n");
  std::printf("\n| M x N x K | fp32 2 thr / 1 thr | bf16 2 thr / 1 thr |\n|---|---|---|\n");
  for (const auto& s : shapes) {
    const auto r = [&](const char* impl) -> std::string {
      const auto a = best_seconds.find(key(s, 1, impl)), b = best_seconds.find(key(s, 2, impl));
      if (a == best_seconds.end() || b == best_seconds.end()) return "-";
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f", a->second / b->second);
      return buf;
    };
    std::printf("| %s | %s | %s |\n", s.name().c_str(), r("tessera_fp32").c_str(),
                r("tessera_bf16").c_str());
  }
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  peak_per_core = measure_fp32_peak();
  benchmark::AddCustomContext("fp32_peak_gflops_per_core", std::to_string(peak_per_core));
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_table();
  return 0;
}
