// GEMM benchmarks: tessera::gemm (automatic algorithm) in every input precision (fp32, bf16,
// e4m3, e5m2, e4m3 x e5m2; C fp32, row-major operands) beside OpenBLAS sgemm and oneDNN matmul
// (fp32 and bf16 -> fp32), measured in the same run, on 1 thread (tessera on Kokkos::Serial,
// the anchors set to 1 thread) and 2 threads (Kokkos::OpenMP, anchors set to 2 threads).
//
// Shapes (M, N, K): square 64 .. 2048 and (4096, 1024, 1024), (64, 4096, 4096) (issue 3); and
// cold/...: the char GPT's weight-gradient shapes with a transposed A and operands out of cache
// (bm_cold), tessera only; epi/...: fp32 C = relu(A B + bias[j]), a linear layer's epilogue,
// tessera's against oneDNN's matmul with a bias and a ReLU post-op, and tessera's plain GEMM
// (bm_tessera and bm_onednn with bias_relu, 1 thread).
// Filter with Google Benchmark's --benchmark_filter, e.g. '1024x1024x1024/threads:1/' or
// 'tessera_bf16|onednn_bf16'; the summary tables show what ran.
//
// Timing: the machine is shared, so each benchmark keeps its FASTEST batch of calls, over all
// batches of all repetitions (by default 3 repetitions in random order, --benchmark_repetitions=3
// --benchmark_enable_random_interleaving=true, so that a busy moment does not hit one
// implementation only). Time is CPU time, which other processes taking a core do not inflate
// (wall-clock time on this 2-core machine shared with builds made every call over ~5 ms on 2
// threads look 2-4x slower, at random): on 1 thread, the calling thread's (every implementation
// runs there: Serial, OpenBLAS and oneDNN with 1 thread); on 2 threads, the largest CPU time
// of any thread of the OpenMP team, which tessera (Kokkos::OpenMP) and oneDNN share: a thread
// that waits for the other at the end of a call spins and is charged, so imbalance counts.
// OpenBLAS runs on its own pthreads: wall-clock time for it on 2 threads. Calls are timed in
// batches of >= 2 ms. Every implementation is timed the same way, so the ratios compare like
// with like.
//
// Peak: measured at start-up on one core, after 0.2 s of warm-up, best of 200 short runs of 24
// independent chains of AVX-512 FMA (fp32: 2 FMA pipes x 16 lanes x 2 flop per cycle) and of
// VDPBF16PS (bf16: 32 products and sums per instruction), and where AMX is usable of TDPBF16PS
// on 4 accumulator tiles (16 x 16 x 32 x 2 flop each), at the clock the core actually runs at;
// times the number of threads. The bf16 columns are compared with AMX's peak where tessera's
// bf16 kernel is AMX, else with VDPBF16PS's.
//
// Output: Google Benchmark's (GFLOP/s and the fraction of peak as counters), then markdown
// tables: every implementation's GFLOP/s, the ratios of the targets (> 1: tessera
// faster), 2 threads over 1, and each target met or missed. For the JSON scripts/plot_gemm.py
// reads: --benchmark_out=gemm.json --benchmark_out_format=json (scripts/bench_gemm.sh does both).
#include <tessera/gemm.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <omp.h>
#if defined(TESSERA_HAVE_DNNL)
#include <dnnl.hpp>
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

// Measured GFLOP/s of one core (0: not measured): fp32 FMA, VDPBF16PS, AMX TDPBF16PS, and the
// bf16 peak the bf16 columns are compared with (AMX's where usable, else VDPBF16PS's).
double fp32_peak = 0, bf16_dot_peak = 0, amx_peak = 0, bf16_peak = 0;

// Peaks: best time of 200 short runs of 24 independent chains (enough to hide a 4 to 6 cycle
// latency behind 2 pipes) of one instruction on registers. The chains are plain variables
// (an array, or a lambda around the instruction, made GCC keep them in memory).
#define TESSERA_BENCH_PEAK_LOOP(INIT, STEP, FLOPS)                                                 \
  /* distinct starting values: equal chains would be merged into one */                            \
  __m512 c0 = INIT(0), c1 = INIT(1), c2 = INIT(2), c3 = INIT(3), c4 = INIT(4), c5 = INIT(5),       \
         c6 = INIT(6), c7 = INIT(7), c8 = INIT(8), c9 = INIT(9), c10 = INIT(10), c11 = INIT(11),   \
         c12 = INIT(12), c13 = INIT(13), c14 = INIT(14), c15 = INIT(15), c16 = INIT(16),           \
         c17 = INIT(17), c18 = INIT(18), c19 = INIT(19), c20 = INIT(20), c21 = INIT(21),           \
         c22 = INIT(22), c23 = INIT(23);                                                           \
  const long iters = 20000;                                                                        \
  double best = 1e30;                                                                              \
  /* 0.2 s of warm-up first: a core runs its first wide instructions slower (frequency license, */ \
  /* powered-down upper lanes), which made the peak on an Intel Xeon 40% low before. */            \
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);       \
  for (int timed = 0; timed < 200;) {                                                              \
    const auto t0 = std::chrono::steady_clock::now();                                              \
    for (long i = 0; i < iters; ++i) {                                                             \
      c0 = STEP(c0), c1 = STEP(c1), c2 = STEP(c2), c3 = STEP(c3), c4 = STEP(c4), c5 = STEP(c5);    \
      c6 = STEP(c6), c7 = STEP(c7), c8 = STEP(c8), c9 = STEP(c9), c10 = STEP(c10);                 \
      c11 = STEP(c11), c12 = STEP(c12), c13 = STEP(c13), c14 = STEP(c14), c15 = STEP(c15);         \
      c16 = STEP(c16), c17 = STEP(c17), c18 = STEP(c18), c19 = STEP(c19), c20 = STEP(c20);         \
      c21 = STEP(c21), c22 = STEP(c22), c23 = STEP(c23);                                           \
    }                                                                                              \
    const auto t1 = std::chrono::steady_clock::now();                                              \
    if (t1 < warm_until) continue;                                                                 \
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());                         \
    ++timed;                                                                                       \
  }                                                                                                \
  const __m512 sum = _mm512_add_ps(                                                                \
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),                   \
                    _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7))),                  \
      _mm512_add_ps(                                                                               \
          _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),             \
                        _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))),          \
          _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c16, c17), _mm512_add_ps(c18, c19)),           \
                        _mm512_add_ps(_mm512_add_ps(c20, c21), _mm512_add_ps(c22, c23)))));        \
  benchmark::DoNotOptimize(sum);                                                                   \
  return 24.0 * (FLOPS)*iters / best * 1e-9

#define TESSERA_BENCH_INIT(i) _mm512_set1_ps(static_cast<float>(i) * 1e-3f)

#if defined(__AVX512F__)
double measure_fp32_peak() {
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
#define TESSERA_BENCH_FMA(c) _mm512_fmadd_ps(a, c, b)
  TESSERA_BENCH_PEAK_LOOP(TESSERA_BENCH_INIT, TESSERA_BENCH_FMA, 32);
#undef TESSERA_BENCH_FMA
}
#endif

#if defined(__AVX512BF16__)
double measure_bf16_peak() {
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80); // bf16 pairs (1, 1)
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x38003800); // (2^-15, 2^-15)
#define TESSERA_BENCH_DP(c) _mm512_dpbf16_ps(c, x, y)
  TESSERA_BENCH_PEAK_LOOP(TESSERA_BENCH_INIT, TESSERA_BENCH_DP, 64);
#undef TESSERA_BENCH_DP
}
#endif

#if TESSERA_GEMM_AMX && !TESSERA_GEMM_AMX_EMULATED
// AMX: 4 accumulator tiles (16 x 16 fp32), each updated by TDPBF16PS from the same A and B tiles
// (16 x 32 bf16 and 16 pairs x 16): 16 * 16 * 32 * 2 = 16,384 flops per instruction, the four
// chains independent. Warm-up and best-of as above.
double measure_amx_peak() {
  if (!tessera::cpu::amx_bf16_usable()) return 0;
  alignas(64) static std::uint16_t ones[16 * 32];
  std::fill(std::begin(ones), std::end(ones), std::uint16_t(0x3f80)); // bf16 1.0
  tessera::detail::hostgemm::amx_kernel::begin();
  TESSERA_AMX_LOADD(4, ones, 64);
  TESSERA_AMX_LOADD(5, ones, 64);
  const long iters = 2000;
  double best = 1e30;
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  for (int timed = 0; timed < 200;) {
    TESSERA_AMX_ZERO(0);
    TESSERA_AMX_ZERO(1);
    TESSERA_AMX_ZERO(2);
    TESSERA_AMX_ZERO(3);
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < iters; ++i) {
      TESSERA_AMX_DPBF16PS(0, 4, 5);
      TESSERA_AMX_DPBF16PS(1, 4, 5);
      TESSERA_AMX_DPBF16PS(2, 4, 5);
      TESSERA_AMX_DPBF16PS(3, 4, 5);
    }
    alignas(64) float out[16 * 16];
    TESSERA_AMX_STORED(0, out, 64); // the chain's result is used
    benchmark::DoNotOptimize(out[0]);
    const auto t1 = std::chrono::steady_clock::now();
    if (t1 < warm_until) continue;
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    ++timed;
  }
  tessera::detail::hostgemm::amx_kernel::end();
  return 4.0 * 16384 * iters / best * 1e-9;
}
#endif

void measure_peaks() {
#if defined(__AVX512F__)
  fp32_peak = measure_fp32_peak();
#endif
#if defined(__AVX512BF16__)
  if (tessera::cpu::has_avx512bf16()) bf16_dot_peak = measure_bf16_peak();
#endif
  bf16_peak = bf16_dot_peak;
#if TESSERA_GEMM_AMX && !TESSERA_GEMM_AMX_EMULATED
  amx_peak = measure_amx_peak();
  // tessera's bf16/fp8 GEMM runs the AMX kernel where it is usable: its fraction is of AMX's.
  if (amx_peak > 0) bf16_peak = amx_peak;
#endif
}

/// n values uniform in [-1, 1) as fp32 or (bf16) their top 16 bits: the anchors get data like
/// tessera's (fill_uniform), since the power a core draws, and so its clock, depends on the
/// data (constant or zero operands run faster).
void fill_random(void* p, index_t n, bool bf16, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (index_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const float v = static_cast<float>(x >> 8) * (2.f / 16777216.f) - 1.f;
    if (bf16) {
      std::uint32_t u;
      std::memcpy(&u, &v, 4);
      const auto h = static_cast<std::uint16_t>(u >> 16);
      std::memcpy(static_cast<std::uint16_t*>(p) + i, &h, 2);
    } else {
      static_cast<float*>(p)[i] = v;
    }
  }
}

double thread_cpu() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/// How a batch of calls is timed (see the file comment).
enum class clock_kind {
  thread_cpu, ///< 1 thread: CPU time of the calling thread
  team_cpu,   ///< OpenMP threads (tessera on Kokkos::OpenMP, oneDNN): the largest CPU time
              ///< any thread of the team spent (working or spin-waiting for the others)
  wall        ///< anything else (OpenBLAS's own pthreads)
};

/// A clock reading: one value per thread of the team (team_cpu), else one.
std::vector<double> read_clock(clock_kind k, int threads) {
  if (k == clock_kind::thread_cpu) return {thread_cpu()};
  if (k == clock_kind::wall)
    return {
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count()};
  std::vector<double> t(static_cast<std::size_t>(threads));
#pragma omp parallel num_threads(threads)
  t[static_cast<std::size_t>(omp_get_thread_num())] = thread_cpu();
  return t;
}

/// Seconds between two readings: the largest per-thread difference.
double elapsed(const std::vector<double>& t0, const std::vector<double>& t1) {
  double d = 0;
  for (std::size_t i = 0; i < t0.size(); ++i) d = std::max(d, t1[i] - t0[i]);
  return d;
}

/// Runs fn in the benchmark loop (after a warm-up call) in batches of calls lasting >= 2 ms,
/// keeps the fastest batch's time per call (over all repetitions) in best_seconds. (Batches:
/// a single short call is timed unreliably; once in a few thousand, a 20 us call read as 7 us
/// of thread CPU time.)
template <class F>
void timed_loop(benchmark::State& st, const shape& s, int threads, const std::string& impl,
                F&& fn) {
  const clock_kind clk = threads == 1                                 ? clock_kind::thread_cpu
                         : impl.find("openblas") == std::string::npos ? clock_kind::team_cpu
                                                                      : clock_kind::wall;
  const auto w0 = read_clock(clk, threads);
  fn(); // warm-up: packing buffers, page faults, oneDNN's JIT, AMX permission
  const double once = std::max(elapsed(w0, read_clock(clk, threads)), 1e-7);
  const long calls = std::clamp(static_cast<long>(2e-3 / once) + 1, 1L, 10000L);
  double best = 1e30;
  for (auto _ : st) {
    const auto t0 = read_clock(clk, threads);
    for (long i = 0; i < calls; ++i) fn();
    best = std::min(best, elapsed(t0, read_clock(clk, threads)) / static_cast<double>(calls));
  }
  st.counters["calls/batch"] = static_cast<double>(calls);
  const std::string k = key(s, threads, impl);
  const auto it = best_seconds.find(k);
  best_seconds[k] = it == best_seconds.end() ? best : std::min(best, it->second);
  st.counters["GFLOP/s"] = s.flops() / best * 1e-9;
  const double peak = impl.find("fp32") != std::string::npos ? fp32_peak : bf16_peak;
  if (peak > 0) st.counters["peak"] = s.flops() / best * 1e-9 / (peak * threads);
}

template <class Exec, class PA, class PB>
/// tessera::gemm; with bias_relu, C = relu(A B + bias[j]) (epi::bias_col, then epi::relu: the
/// epi/ rows).
void bm_tessera(benchmark::State& st, shape s, int threads, std::string impl,
                bool bias_relu = false) {
  using space = typename Exec::memory_space;
  const Exec exec;
  tessera::Tensor<PA, tessera::dextents<2>, tessera::layout_right, space> a("a", s.m, s.k);
  tessera::Tensor<PB, tessera::dextents<2>, tessera::layout_right, space> b("b", s.k, s.n);
  tessera::Tensor<tessera::fp32, tessera::dextents<2>, tessera::layout_right, space> c("c", s.m,
                                                                                       s.n);
  tessera::Tensor<tessera::fp32, tessera::dextents<1>, tessera::layout_right, space> bias("bias",
                                                                                          s.n);
  tessera::fill_uniform(exec, a, 1, -1.f, 1.f);
  tessera::fill_uniform(exec, b, 2, -1.f, 1.f);
  tessera::fill_uniform(exec, bias, 3, -1.f, 1.f);
  if (bias_relu) {
    const auto e = tessera::make_epilogue({}, tessera::epi::bias_col{bias}, tessera::epi::relu{});
    timed_loop(st, s, threads, impl, [&] { tessera::gemm(exec, a, b, c, e); });
  } else {
    timed_loop(st, s, threads, impl, [&] { tessera::gemm(exec, a, b, c); });
  }
}

#if defined(TESSERA_HAVE_DNNL)
/// oneDNN's matmul; with bias_relu, C = relu(A B + bias[j]) by a bias and a ReLU post-op (the
/// epi/ rows, named onednn_fp32_bias_relu).
void bm_onednn(benchmark::State& st, shape s, int threads, dnnl::memory::data_type dt,
               bool bias_relu = false) {
  using namespace dnnl; // NOLINT: benchmark source, not a header
  omp_set_num_threads(threads);
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const auto f32 = memory::data_type::f32;
  const memory::desc a_md({s.m, s.k}, dt, memory::format_tag::ab),
      b_md({s.k, s.n}, dt, memory::format_tag::ab), c_md({s.m, s.n}, f32, memory::format_tag::ab),
      bias_md({1, s.n}, f32, memory::format_tag::ab);
  try {
    post_ops po;
    if (bias_relu) po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    primitive_attr attr;
    attr.set_post_ops(po);
    const matmul::primitive_desc pd(bias_relu ? matmul::desc(a_md, b_md, bias_md, c_md)
                                              : matmul::desc(a_md, b_md, c_md),
                                    attr, eng);
    const matmul prim(pd);
    memory a(a_md, eng), b(b_md, eng), c(c_md, eng), bias(bias_md, eng);
    fill_random(a.get_data_handle(), s.m * s.k, dt == memory::data_type::bf16, 1);
    fill_random(b.get_data_handle(), s.k * s.n, dt == memory::data_type::bf16, 2);
    fill_random(bias.get_data_handle(), s.n, false, 3);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    if (bias_relu) args.insert({DNNL_ARG_BIAS, bias});
    const std::string impl = bias_relu                      ? "onednn_fp32_bias_relu"
                             : dt == memory::data_type::f32 ? "onednn_fp32"
                                                            : "onednn_bf16";
    timed_loop(st, s, threads, impl, [&] {
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
  std::vector<float> a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.k * s.n)),
      c(static_cast<std::size_t>(s.m * s.n));
  fill_random(a.data(), s.m * s.k, false, 1);
  fill_random(b.data(), s.k * s.n, false, 2);
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  timed_loop(st, s, threads, "openblas_fp32", [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a.data(), k, b.data(), n,
                0.f, c.data(), n);
  });
}
#endif

/// Registers fn as benchmark `name`: milliseconds, at least 0.2 s, real time (the timed loops
/// keep their own clocks; see timed_loop).
template <class F>
void register_ms(const std::string& name, F fn) {
  benchmark::RegisterBenchmark(name.c_str(), fn)
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.2)
      ->UseRealTime();
}

template <class Exec>
void register_tessera(const std::string& base, const shape& s, int threads) {
  using namespace tessera; // NOLINT: benchmark source
  const auto reg = [&]<class PA, class PB>(const char* impl, PA, PB) {
    register_ms(base + impl,
                [=](benchmark::State& st) { bm_tessera<Exec, PA, PB>(st, s, threads, impl); });
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
      const auto reg = [&](const std::string& impl, auto fn) { register_ms(base + impl, fn); };
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

/// The weight-gradient GEMMs of the char GPT (dW (Out, In) = dY^T X over B t = 2048 rows: (M,
/// N, K) = (Out, In, 2048)) with operands out of cache, as in training, where a layer's saved
/// input and its output gradient come back from memory: A = dY^T is a transposed view (the
/// strided packing path), and each call takes the next of enough copies of A and B to pass
/// 64 MiB (more than the last-level cache). 1 thread; named cold/MxNxK/threads:1/tessera_P,
/// outside the tables (no anchor runs this form).
template <class P>
void bm_cold(benchmark::State& st, shape s, const std::string& impl) {
#if defined(KOKKOS_ENABLE_SERIAL)
  const Kokkos::Serial exec;
  using tensor = tessera::Tensor<P, tessera::dextents<2>, tessera::layout_right, Kokkos::HostSpace>;
  const std::size_t bytes = std::size_t(s.k * (s.m + s.n)) * sizeof(tessera::storage_t<P>);
  const std::size_t copies = std::max<std::size_t>(2, (std::size_t(64) << 20) / bytes + 1);
  std::vector<tensor> as, bs;
  for (std::size_t i = 0; i < copies; ++i) {
    as.emplace_back("a", s.k, s.m); // dY (K, M): A = dY^T
    bs.emplace_back("b", s.k, s.n);
    tessera::fill_uniform(exec, as.back(), std::uint64_t(2 * i + 1), -1.f, 1.f);
    tessera::fill_uniform(exec, bs.back(), std::uint64_t(2 * i + 2), -1.f, 1.f);
  }
  tessera::Tensor<tessera::fp32, tessera::dextents<2>, tessera::layout_right, Kokkos::HostSpace> c(
      "c", s.m, s.n);
  std::size_t next = 0;
  timed_loop(st, s, 1, impl, [&] {
    tessera::gemm(exec, tessera::transpose(as[next].view()), bs[next], c);
    next = (next + 1) % copies;
  });
#else
  st.SkipWithError("Kokkos::Serial is not enabled");
  for (auto _ : st) {
  }
  (void)s;
  (void)impl;
#endif
}

void register_cold() {
  for (const shape s : {shape{512, 128, 2048}, shape{128, 512, 2048}, shape{384, 128, 2048},
                        shape{128, 128, 2048}}) {
    const std::string base = "cold/" + s.name() + "/threads:1/";
    const auto reg = [&](const std::string& impl, auto fn) { register_ms(base + impl, fn); };
    reg("tessera_fp32",
        [=](benchmark::State& st) { bm_cold<tessera::fp32>(st, s, "tessera_fp32"); });
    reg("tessera_bf16",
        [=](benchmark::State& st) { bm_cold<tessera::bf16>(st, s, "tessera_bf16"); });
  }
}

/// A linear layer's epilogue: fp32 C = relu(A B + bias[j]) (epi::bias_col, then epi::relu), 1
/// thread; oneDNN runs the same as a matmul with a bias and a ReLU post-op. Also tessera's plain
/// GEMM of the shape (the epilogue's cost). Named epi/MxNxK/threads:1/<impl>.
const std::vector<shape> epi_shapes = {{256, 3136, 64}, {512, 512, 128}, {1024, 1024, 1024}};
const char* const epi_impls[] = {"tessera_fp32_plain", "tessera_fp32_bias_relu",
                                 "onednn_fp32_bias_relu"};

void register_epilogue() {
  for (const shape& s : epi_shapes) {
    const std::string base = "epi/" + s.name() + "/threads:1/";
    const auto reg = [&](const std::string& impl, auto fn) { register_ms(base + impl, fn); };
#if defined(KOKKOS_ENABLE_SERIAL)
    using tessera::fp32;
    reg(epi_impls[0], [=](benchmark::State& st) {
      bm_tessera<Kokkos::Serial, fp32, fp32>(st, s, 1, epi_impls[0]);
    });
    reg(epi_impls[1], [=](benchmark::State& st) {
      bm_tessera<Kokkos::Serial, fp32, fp32>(st, s, 1, epi_impls[1], true);
    });
#endif
#if defined(TESSERA_HAVE_DNNL)
    reg(epi_impls[2],
        [=](benchmark::State& st) { bm_onednn(st, s, 1, dnnl::memory::data_type::f32, true); });
#endif
  }
}

/// Fastest time of an implementation, or 0 if it did not run.
double secs(const shape& s, int t, const char* impl) {
  const auto it = best_seconds.find(key(s, t, impl));
  return it == best_seconds.end() ? 0 : it->second;
}

std::string fmt(double v, const char* f) {
  if (!(v > 0)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// The slowest of the three fp8 variants (0 if none ran).
double fp8_secs(const shape& s, int t) {
  double worst = 0;
  for (const char* f : {"tessera_e4m3", "tessera_e5m2", "tessera_e4m3xe5m2"})
    worst = std::max(worst, secs(s, t, f));
  return worst;
}

/// Ratio a / b of times (speed of b over a) or 0.
double speedup(double a, double b) {
  return a > 0 && b > 0 ? a / b : 0;
}

void print_tables() {
  std::printf("\nPeak measured on one core: fp32 FMA %.1f GFLOP/s, bf16 VDPBF16PS %.1f GFLOP/s, "
              "AMX TDPBF16PS %.1f GFLOP/s (0: not available); tessera's bf16/fp8 kernel here: "
              "%s\n",
              fp32_peak, bf16_dot_peak, amx_peak,
              amx_peak > 0 ? "AMX" : (bf16_dot_peak > 0 ? "AVX512_BF16" : "fp32 FMA"));
  std::printf(
      "\nGFLOP/s (2 M N K / time per call in the fastest batch):\n\n"
      "| M x N x K | thr | OpenBLAS fp32 | oneDNN fp32 | oneDNN bf16 | tessera fp32 | bf16 | "
      "e4m3 | e5m2 | e4m3 x e5m2 |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (int t : {1, 2})
    for (const auto& s : shapes) {
      bool any = false;
      for (const char* i : impls) any = any || secs(s, t, i) > 0;
      if (!any) continue;
      std::printf("| %s | %d |", s.name().c_str(), t);
      for (const char* i : impls) {
        const double sec = secs(s, t, i);
        std::printf(" %s |", fmt(sec > 0 ? s.flops() / sec * 1e-9 : 0, "%.0f").c_str());
      }
      std::printf("\n");
    }
  std::printf("\nRatios (> 1: tessera faster) and fractions of the measured peak of the threads "
              "used; fp8 = the slowest of e4m3, e5m2, e4m3 x e5m2:\n\n"
              "| M x N x K | thr | fp32 / OpenBLAS | fp32 / oneDNN fp32 | fp32 %% peak | "
              "bf16 / oneDNN bf16 | bf16 %% bf16 peak | fp8 / bf16 |\n"
              "|---|---|---|---|---|---|---|---|\n");
  for (int t : {1, 2})
    for (const auto& s : shapes) {
      const double f = secs(s, t, "tessera_fp32"), b = secs(s, t, "tessera_bf16");
      if (f == 0 && b == 0) continue;
      const double fp = f > 0 && fp32_peak > 0 ? 100 * s.flops() / f * 1e-9 / (fp32_peak * t) : 0;
      const double bp = b > 0 && bf16_peak > 0 ? 100 * s.flops() / b * 1e-9 / (bf16_peak * t) : 0;
      std::printf("| %s | %d | %s | %s | %s | %s | %s | %s |\n", s.name().c_str(), t,
                  fmt(speedup(secs(s, t, "openblas_fp32"), f), "%.2f").c_str(),
                  fmt(speedup(secs(s, t, "onednn_fp32"), f), "%.2f").c_str(),
                  fmt(fp, "%.0f%%").c_str(),
                  fmt(speedup(secs(s, t, "onednn_bf16"), b), "%.2f").c_str(),
                  fmt(bp, "%.0f%%").c_str(), fmt(speedup(b, fp8_secs(s, t)), "%.2f").c_str());
    }
  std::printf("\n| M x N x K | fp32 2 thr / 1 thr | bf16 2 thr / 1 thr |\n|---|---|---|\n");
  for (const auto& s : shapes) {
    const auto r = [&](const char* i) {
      return fmt(speedup(secs(s, 1, i), secs(s, 2, i)), "%.2f");
    };
    if (secs(s, 1, "tessera_fp32") > 0 || secs(s, 1, "tessera_bf16") > 0)
      std::printf("| %s | %s | %s |\n", s.name().c_str(), r("tessera_fp32").c_str(),
                  r("tessera_bf16").c_str());
  }
  // The linear layer's epilogue (the epi/ rows), where it ran.
  bool any_epi = false;
  for (const auto& s : epi_shapes)
    for (const char* i : epi_impls) any_epi = any_epi || secs(s, 1, i) > 0;
  if (any_epi) {
    std::printf("\nfp32 C = relu(A B + bias[j]), 1 thread, GFLOP/s; epilogue cost = plain GEMM "
                "time over the epilogue's; ratio > 1: tessera faster:\n\n"
                "| M x N x K | tessera plain | tessera bias + relu | oneDNN bias + relu | "
                "epilogue cost | tessera / oneDNN |\n|---|---|---|---|---|---|\n");
    for (const auto& s : epi_shapes) {
      const double p = secs(s, 1, epi_impls[0]), t = secs(s, 1, epi_impls[1]),
                   o = secs(s, 1, epi_impls[2]);
      const auto g = [&](double sec) { return fmt(sec > 0 ? s.flops() / sec * 1e-9 : 0, "%.0f"); };
      std::printf("| %s | %s | %s | %s | %s | %s |\n", s.name().c_str(), g(p).c_str(), g(t).c_str(),
                  g(o).c_str(), fmt(speedup(p, t), "%.2f").c_str(),
                  fmt(speedup(o, t), "%.2f").c_str());
    }
  }
  // The targets: the worst case over the sizes each one covers.
  std::printf("\nTargets (issue 3; worst case over the sizes covered, '-' where not measured):\n\n"
              "| target | measured | met |\n|---|---|---|\n");
  const auto row = [](const char* what, double v, double need, const char* f) {
    std::printf("| %s | %s | %s |\n", what, fmt(v, f).c_str(),
                v > 0 ? (v >= need ? "yes" : "no") : "-");
  };
  double ob = 1e9, od = 1e9, bd = 1e9, f8 = 1e9;
  for (const auto& s : shapes) {
    const bool big = std::min({s.m, s.n, s.k}) >= 256;
    const double f = secs(s, 1, "tessera_fp32");
    if (big && f > 0) {
      if (const double r = speedup(secs(s, 1, "openblas_fp32"), f); r > 0) ob = std::min(ob, r);
      if (const double r = speedup(secs(s, 1, "onednn_fp32"), f); r > 0) od = std::min(od, r);
    }
    for (int t : {1, 2}) {
      const double b = secs(s, t, "tessera_bf16");
      if (const double r = speedup(secs(s, t, "onednn_bf16"), b); r > 0) bd = std::min(bd, r);
      if (const double r = speedup(b, fp8_secs(s, t)); r > 0) f8 = std::min(f8, r);
    }
  }
  const auto none = [](double v) { return v < 1e9 ? v : 0; };
  const shape k1{1024, 1024, 1024};
  const double f1 = secs(k1, 1, "tessera_fp32");
  row("fp32 1 thr / OpenBLAS >= 1.1 (sizes >= 256)", none(ob), 1.1, "%.2f");
  row("fp32 1 thr / oneDNN >= 1.0 (sizes >= 256)", none(od), 1.0, "%.2f");
  row("fp32 1 thr >= 85% of FMA peak at 1024^3",
      f1 > 0 && fp32_peak > 0 ? 100 * k1.flops() / f1 * 1e-9 / fp32_peak : 0, 85, "%.0f%%");
  row("bf16 / oneDNN bf16 >= 1.0 (all sizes, 1 and 2 thr)", none(bd), 1.0, "%.2f");
  row("fp8 / bf16 >= 0.9 (all sizes, 1 and 2 thr)", none(f8), 0.9, "%.2f");
  row("fp32 2 thr / 1 thr >= 1.8 at 1024^3",
      speedup(secs(k1, 1, "tessera_fp32"), secs(k1, 2, "tessera_fp32")), 1.8, "%.2f");
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  // Defaults (see the file comment) unless given on the command line.
  std::vector<char*> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=3",
              shuffle = "--benchmark_enable_random_interleaving=true",
              aggregates = "--benchmark_display_aggregates_only=true";
  const auto given = [&](const char* flag) {
    for (int i = 1; i < argc; ++i)
      if (std::strncmp(argv[i], flag, std::strlen(flag)) == 0) return true;
    return false;
  };
  if (!given("--benchmark_repetitions")) args.push_back(reps.data());
  if (!given("--benchmark_enable_random_interleaving")) args.push_back(shuffle.data());
  if (!given("--benchmark_display_aggregates_only")) args.push_back(aggregates.data());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  measure_peaks();
  benchmark::AddCustomContext("fp32_peak_gflops_per_core", std::to_string(fp32_peak));
  benchmark::AddCustomContext("bf16_peak_gflops_per_core", std::to_string(bf16_dot_peak));
  benchmark::AddCustomContext("amx_peak_gflops_per_core", std::to_string(amx_peak));
  register_all();
  register_cold();
  register_epilogue();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_tables();
  return 0;
}
