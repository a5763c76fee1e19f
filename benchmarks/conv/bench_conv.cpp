// Convolution benchmarks: forward, backward-data and backward-weight of tessera's im2col + GEMM
// convolution (fp32, bf16, fp8) beside oneDNN's convolution (fp32, bf16) and a plain im2col +
// OpenBLAS sgemm baseline, measured in the same run, on 1 thread (tessera on Kokkos::Serial) and
// on 2 threads (Kokkos::OpenMP; oneDNN and OpenBLAS set to 2 threads).
//
// Layers (issue 4): the ResNet-50 3x3 layers at 56, 28 and 14 pixels, its 7x7/2 stem and a 1x1
// expansion, at batch 8; the two Fashion-MNIST layers at batch 64. All NCHW.
//
// Precisions: fp32 = every tensor fp32. bf16 = every tensor bf16. fp8 = x and w fp8_e4m3, dy
// fp8_e5m2 (the usual fp8 training split), outputs y, dx, dw in bf16.
// oneDNN chooses its own (blocked) layouts (format_tag::any) and the reorders are not timed: the
// strongest form of the anchor. The OpenBLAS baseline keeps NCHW, runs a plain single-threaded
// im2col / col2im per image and one cblas_sgemm per image and group (1x1 stride-1 convolutions
// skip im2col, as Caffe does).
//
// After the Google Benchmark output, a markdown table gives GFLOP/s (1 thread: from the median
// CPU time per call; 2 threads: from the shortest wall time, see timed_loop) per implementation and
// the ratios of tessera fp32 to the anchors, plus the path tessera fp32 takes: implicit GEMM, a
// GEMM straight on x / dy (1x1), direct loops (depthwise), or im2col / col2im + GEMM, with the time
// of the im2col (forward, backward-weight) or col2im (backward-data) tiles alone and their share of
// the pass.
//
// Runtime: each benchmark runs for >= 0.1 s on 1 thread, 0.25 s on 2 (--benchmark_min_time
// overrides it); the whole run about 5 minutes. Filter, e.g.
//   bench_conv --benchmark_filter='fmnist'     (the two small layers only)
// On a host shared with other jobs, run it as
//   OMP_PROC_BIND=false OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4 bench_conv
// Spinning OpenMP workers (libgomp's default) and OpenBLAS threads spinning for ~0.1 s after each
// call otherwise take the cores the next 2-thread benchmark needs: single calls then took 100x
// longer than their work (0.1 GFLOP/s for the 28 x 28 Fashion-MNIST layer), whichever library
// ran them. Passive waiting affects tessera (Kokkos::OpenMP) and oneDNN alike (both libgomp).
#include <tessera/conv.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if defined(TESSERA_HAVE_DNNL)
#include <dnnl.hpp>
#include <omp.h>
#endif
#if defined(TESSERA_HAVE_OPENBLAS)
#include <cblas.h>
#endif

namespace {

using tessera::index_t;

struct layer {
  const char* name;
  index_t N, C, H, W, K, R, S, stride, pad, groups = 1;
  tessera::conv2d_params params() const {
    return {.stride_h = stride,
            .stride_w = stride,
            .pad_top = pad,
            .pad_bottom = pad,
            .pad_left = pad,
            .pad_right = pad,
            .groups = groups};
  }
  index_t P() const { return params().output_hw(H, W, R, S)[0]; }
  index_t Q() const { return params().output_hw(H, W, R, S)[1]; }
  /// Multiply-adds x 2; the same for all three passes.
  double flops() const { return 2.0 * N * K * P() * Q() * (C / groups) * R * S; }
};

const layer layers[] = {
    {"res3x3_56", 8, 64, 56, 56, 64, 3, 3, 1, 1},
    {"res3x3_28", 8, 128, 28, 28, 128, 3, 3, 1, 1},
    {"res3x3_14", 8, 256, 14, 14, 256, 3, 3, 1, 1},
    {"stem7x7_224", 8, 3, 224, 224, 64, 7, 7, 2, 3},
    {"res1x1_56", 8, 64, 56, 56, 256, 1, 1, 1, 0},
    {"fmnist1", 64, 1, 28, 28, 32, 3, 3, 1, 1},
    {"fmnist2", 64, 32, 14, 14, 64, 3, 3, 1, 1},
    // Beyond the list: a MobileNet-style depthwise layer (groups == C), direct kernels.
    {"dw3x3_56", 8, 128, 56, 56, 128, 3, 3, 1, 1, 128}};

enum class pass { forward, backward_data, backward_weight };
const char* pass_name(pass p) {
  return p == pass::forward ? "fwd" : p == pass::backward_data ? "bwd_data" : "bwd_weight";
}

// Seconds per call of every benchmark that ran, keyed "layer/pass/threads/impl", for the ratio
// counters and the closing table. Benchmarks of one layer, pass and thread count are registered
// anchors first, so tessera's ratios use anchors measured moments earlier.
std::map<std::string, double> seconds_per_call;
std::map<std::string, double> im2col_seconds;  // tessera fp32's im2col / col2im part alone
std::map<std::string, std::string> fp32_paths; // tessera fp32's path (see fp32_path)

std::string key(const layer& l, pass p, int threads, const std::string& impl) {
  return std::string(l.name) + "/" + pass_name(p) + "/" + std::to_string(threads) + "/" + impl;
}

/// Seconds of CPU time the calling thread has used.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// Times fn in the benchmark loop; records seconds per call and a GFLOP/s counter.
/// The host is shared with other jobs (2 cores, load 2-6 while these numbers were taken), so
/// wall time mostly measures the scheduler. On 1 thread every implementation runs on the calling
/// thread, and the median of its CPU time per call is recorded: the work, not the waiting. On 2
/// threads the shortest wall time of a call is recorded: the one least disturbed by other jobs.
template <class F>
void timed_loop(benchmark::State& st, const layer& l, int threads, const std::string& k, F&& fn) {
  fn(); // warm-up: workspaces, page faults, oneDNN's JIT
  std::vector<double> calls;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    fn();
    const double c1 = thread_cpu_seconds();
    const auto t1 = std::chrono::steady_clock::now();
    calls.push_back(threads == 1 ? c1 - c0 : std::chrono::duration<double>(t1 - t0).count());
  }
  std::sort(calls.begin(), calls.end());
  const std::size_t n = calls.size();
  double s = 0.0;
  if (n > 0) s = threads == 1 ? calls[n / 2] : calls[0];
  seconds_per_call[k] = s;
  st.counters["GFLOP/s"] = l.flops() / s * 1e-9;
}

struct cfg_fp32 {
  using x = tessera::fp32;
  using w = tessera::fp32;
  using out = tessera::fp32;
  using dy = tessera::fp32;
  static constexpr const char* name = "fp32";
};
struct cfg_bf16 {
  using x = tessera::bf16;
  using w = tessera::bf16;
  using out = tessera::bf16;
  using dy = tessera::bf16;
  static constexpr const char* name = "bf16";
};
struct cfg_fp8 {
  using x = tessera::fp8_e4m3;
  using w = tessera::fp8_e4m3;
  using out = tessera::bf16;
  using dy = tessera::fp8_e5m2;
  static constexpr const char* name = "fp8";
};

template <class P, class Space>
using t4 = tessera::Tensor<P, tessera::dextents<4>, tessera::layout_right, Space>;

/// The path tessera fp32 takes on the host for a pass (the dispatch of conv/conv2d.hpp).
std::string fp32_path(const tessera::detail::conv2d_problem& pb, pass p) {
  namespace td = tessera::detail;
  if (pb.one_channel_per_group()) return "direct";
  const index_t crs = pb.Cg * pb.R * pb.S, krs = pb.Kg * pb.R * pb.S;
  const bool stride1 = pb.prm.stride_h == 1 && pb.prm.stride_w == 1;
  if (p == pass::forward && td::use_implicit(pb, pb.Kg, crs)) return "implicit";
  if (p == pass::backward_data && stride1 && td::use_implicit(pb, pb.Cg, krs)) return "implicit";
  if (p == pass::backward_weight && pb.Kg >= td::implicit_min_channels && pb.N > 0)
    return "implicit";
  if (pb.pointwise()) return "gemm";
  return p == pass::backward_data ? "col2im" : "im2col";
}

/// Runs only the im2col (or col2im) part of a tessera fp32 pass, with the same tiling, and
/// returns its seconds per call (the best of 3; CPU time on 1 thread, as timed_loop).
template <class Exec>
double rearrangement_seconds(const Exec& exec, const tessera::detail::conv2d_problem& pb, pass p,
                             int threads, const t4<tessera::fp32, typename Exec::memory_space>& x) {
  namespace td = tessera::detail;
  if (pb.pointwise() || pb.one_channel_per_group()) return 0.0; // no im2col / col2im
  const index_t crs = pb.C * pb.R * pb.S;
  const auto plan =
      td::plan_tiles(pb, tessera::conv2d_workspace<>::default_column_budget, crs * pb.Q, 4);
  std::vector<float> col(static_cast<std::size_t>(crs * plan.max_cols(pb.Q)));
  std::vector<float> img(static_cast<std::size_t>(plan.images * pb.C * pb.H * pb.W));
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    td::for_each_tile(pb, plan, [&](const td::conv_tile& t) {
      if (p == pass::backward_data) {
        td::col2im_tile(exec, col.data(), t, pb.C, pb.R, pb.S, pb.Q, pb.prm, img.data(),
                        pb.C * pb.H * pb.W, pb.H * pb.W, pb.H, pb.W, plan.rows < pb.P);
      } else {
        td::im2col_tile(exec, x.view(), t, 0, pb.C, pb.R, pb.S, pb.Q, pb.prm, col.data());
      }
    });
    exec.fence();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, threads == 1 ? thread_cpu_seconds() - c0 : wall);
  }
  return best;
}

template <class Exec, class Cfg>
void bm_tessera(benchmark::State& st, layer l, pass p, int threads) {
  using space = typename Exec::memory_space;
  const Exec exec;
  const auto prm = l.params();
  t4<typename Cfg::x, space> x("x", l.N, l.C, l.H, l.W);            // (N, C, H, W)
  t4<typename Cfg::w, space> w("w", l.K, l.C / l.groups, l.R, l.S); // (K, C/g, R, S)
  tessera::Tensor<tessera::fp32, tessera::dextents<1>, tessera::layout_right, space> b("b", l.K);
  t4<typename Cfg::out, space> y("y", l.N, l.K, l.P(), l.Q());          // (N, K, P, Q)
  t4<typename Cfg::dy, space> dy("dy", l.N, l.K, l.P(), l.Q());         // (N, K, P, Q)
  t4<typename Cfg::out, space> dx("dx", l.N, l.C, l.H, l.W);            // (N, C, H, W)
  t4<typename Cfg::out, space> dw("dw", l.K, l.C / l.groups, l.R, l.S); // (K, C/g, R, S)
  tessera::fill_uniform(exec, x, 1, -1.f, 1.f);
  tessera::fill_uniform(exec, w, 2, -1.f, 1.f);
  tessera::fill_uniform(exec, dy, 3, -1.f, 1.f);
  tessera::conv2d_workspace<space> ws;
  const std::string k = key(l, p, threads, std::string("tessera_") + Cfg::name);
  timed_loop(st, l, threads, k, [&] {
    if (p == pass::forward) tessera::conv2d_forward(exec, x, w, b, y, prm, ws);
    if (p == pass::backward_data) tessera::conv2d_backward_data(exec, dy, w, dx, prm, ws);
    if (p == pass::backward_weight) tessera::conv2d_backward_weight(exec, x, dy, dw, prm, ws);
  });
  for (const char* anchor : {"onednn_fp32", "openblas_fp32"}) {
    const auto it = seconds_per_call.find(key(l, p, threads, anchor));
    if (it != seconds_per_call.end())
      st.counters[std::string("x_") + anchor] = it->second / seconds_per_call[k];
  }
  if constexpr (std::is_same_v<Cfg, cfg_fp32>) {
    const auto pb = tessera::detail::check_conv2d("bench_conv", "x", x.view(), "w", w.view(), "y",
                                                  y.view(), prm);
    const std::string path = fp32_path(pb, p);
    fp32_paths[key(l, p, threads, "")] = path;
    if (path == "im2col" || path == "col2im") {
      const double re = rearrangement_seconds(exec, pb, p, threads, x);
      im2col_seconds[key(l, p, threads, "")] = re;
      st.counters["im2col_share"] = re / seconds_per_call[k];
    }
  }
}

#if defined(TESSERA_HAVE_DNNL)
void bm_onednn(benchmark::State& st, layer l, pass p, int threads, dnnl::memory::data_type dt) {
  using namespace dnnl; // NOLINT: benchmark source, not a header
  omp_set_num_threads(threads);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const index_t G = l.groups;
  const memory::dims wei =
      G == 1 ? memory::dims{l.K, l.C, l.R, l.S} : memory::dims{G, l.K / G, l.C / G, l.R, l.S};
  const memory::dims src{l.N, l.C, l.H, l.W}, bia{l.K}, dst{l.N, l.K, l.P(), l.Q()},
      strides{l.stride, l.stride}, pad{l.pad, l.pad};
  const auto any = memory::format_tag::any;
  const memory::desc src_md(src, dt, any), wei_md(wei, dt, any), dst_md(dst, dt, any),
      bia_md(bia, memory::data_type::f32, memory::format_tag::x);
  std::vector<memory> owned;
  const auto alloc = [&](const memory::desc& md) {
    owned.emplace_back(md, eng);
    std::memset(owned.back().get_data_handle(), 0, md.get_size());
    return owned.back();
  };
  try {
    const convolution_forward::primitive_desc fwd_pd(
        convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                  src_md, wei_md, bia_md, dst_md, strides, pad, pad),
        eng);
    primitive prim;
    std::unordered_map<int, memory> args;
    if (p == pass::forward) {
      prim = convolution_forward(fwd_pd);
      args = {{DNNL_ARG_SRC, alloc(fwd_pd.src_desc())},
              {DNNL_ARG_WEIGHTS, alloc(fwd_pd.weights_desc())},
              {DNNL_ARG_BIAS, alloc(fwd_pd.bias_desc())},
              {DNNL_ARG_DST, alloc(fwd_pd.dst_desc())}};
    } else if (p == pass::backward_data) {
      const convolution_backward_data::primitive_desc pd(
          convolution_backward_data::desc(algorithm::convolution_direct, src_md, wei_md, dst_md,
                                          strides, pad, pad),
          eng, fwd_pd);
      prim = convolution_backward_data(pd);
      args = {{DNNL_ARG_DIFF_DST, alloc(pd.diff_dst_desc())},
              {DNNL_ARG_WEIGHTS, alloc(pd.weights_desc())},
              {DNNL_ARG_DIFF_SRC, alloc(pd.diff_src_desc())}};
    } else {
      const convolution_backward_weights::primitive_desc pd(
          convolution_backward_weights::desc(algorithm::convolution_direct, src_md, wei_md, bia_md,
                                             dst_md, strides, pad, pad),
          eng, fwd_pd);
      prim = convolution_backward_weights(pd);
      args = {{DNNL_ARG_SRC, alloc(pd.src_desc())},
              {DNNL_ARG_DIFF_DST, alloc(pd.diff_dst_desc())},
              {DNNL_ARG_DIFF_WEIGHTS, alloc(pd.diff_weights_desc())},
              {DNNL_ARG_DIFF_BIAS, alloc(pd.diff_bias_desc())}};
    }
    const std::string impl = dt == memory::data_type::f32 ? "onednn_fp32" : "onednn_bf16";
    timed_loop(st, l, threads, key(l, p, threads, impl), [&] {
      prim.execute(s, args);
      s.wait();
    });
  } catch (const dnnl::error& e) {
    st.SkipWithError(e.what());
    for (auto _ : st) {
    }
  }
}
#endif

#if defined(TESSERA_HAVE_OPENBLAS)
// The plain baseline: Caffe-style im2col / col2im loops, one cblas_sgemm per image.
void plain_im2col(const float* x, const layer& l, float* col) {
  const index_t P = l.P(), Q = l.Q();
  for (index_t c = 0; c < l.C; ++c)
    for (index_t r = 0; r < l.R; ++r)
      for (index_t s = 0; s < l.S; ++s)
        for (index_t p = 0; p < P; ++p) {
          const index_t h = p * l.stride - l.pad + r;
          for (index_t q = 0; q < Q; ++q) {
            const index_t w = q * l.stride - l.pad + s;
            *col++ = h >= 0 && h < l.H && w >= 0 && w < l.W ? x[(c * l.H + h) * l.W + w] : 0.f;
          }
        }
}
void plain_col2im(const float* col, const layer& l, float* x) {
  const index_t P = l.P(), Q = l.Q();
  std::fill(x, x + l.C * l.H * l.W, 0.f);
  for (index_t c = 0; c < l.C; ++c)
    for (index_t r = 0; r < l.R; ++r)
      for (index_t s = 0; s < l.S; ++s)
        for (index_t p = 0; p < P; ++p) {
          const index_t h = p * l.stride - l.pad + r;
          for (index_t q = 0; q < Q; ++q, ++col) {
            const index_t w = q * l.stride - l.pad + s;
            if (h >= 0 && h < l.H && w >= 0 && w < l.W) x[(c * l.H + h) * l.W + w] += *col;
          }
        }
}

void bm_openblas(benchmark::State& st, layer l, pass p, int threads) {
  openblas_set_num_threads(threads);
  const int G = static_cast<int>(l.groups), Kg = static_cast<int>(l.K) / G,
            PQ = static_cast<int>(l.P() * l.Q()),
            CRSg = static_cast<int>(l.C / l.groups * l.R * l.S);
  const index_t xs = l.C * l.H * l.W, ys = l.K * PQ;
  const bool pointwise = l.R == 1 && l.S == 1 && l.stride == 1 && l.pad == 0;
  std::vector<float> x(static_cast<std::size_t>(l.N * xs), 0.5f),
      w(static_cast<std::size_t>(l.K) * CRSg, 0.25f), y(static_cast<std::size_t>(l.N * ys), 0.75f),
      col(static_cast<std::size_t>(CRSg) * G * PQ);
  timed_loop(st, l, threads, key(l, p, threads, "openblas_fp32"), [&] {
    for (index_t n = 0; n < l.N; ++n) {
      float* xn = x.data() + n * xs;
      float* yn = y.data() + n * ys;
      float* c = pointwise ? xn : col.data();
      if (p != pass::backward_data && !pointwise) plain_im2col(xn, l, c);
      for (int g = 0; g < G; ++g) {
        float* wg = w.data() + static_cast<std::size_t>(g) * Kg * CRSg;
        float* cg = c + static_cast<std::size_t>(g) * CRSg * PQ;
        float* yg = yn + static_cast<std::size_t>(g) * Kg * PQ;
        if (p == pass::forward) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Kg, PQ, CRSg, 1.f, wg, CRSg, cg,
                      PQ, 0.f, yg, PQ);
        } else if (p == pass::backward_data) {
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CRSg, PQ, Kg, 1.f, wg, CRSg, yg, PQ,
                      0.f, cg, PQ);
        } else {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Kg, CRSg, PQ, 1.f, yg, PQ, cg, PQ,
                      n == 0 ? 0.f : 1.f, wg, CRSg);
        }
      }
      if (p == pass::backward_data && !pointwise) plain_col2im(c, l, xn);
    }
  });
}
#endif

void register_all() {
  for (const auto& l : layers)
    for (pass p : {pass::forward, pass::backward_data, pass::backward_weight})
      for (int threads : {1, 2}) {
        const std::string base =
            std::string(l.name) + "/" + pass_name(p) + "/threads:" + std::to_string(threads) + "/";
        const auto reg = [&](const std::string& impl, auto fn) {
          benchmark::RegisterBenchmark((base + impl).c_str(), fn)
              ->Unit(benchmark::kMillisecond)
              ->MinTime(threads == 1 ? 0.1 : 0.25) // 2 threads: more calls to take the best of
              ->UseRealTime();
        };
#if defined(TESSERA_HAVE_DNNL)
        reg("onednn_fp32", [=](benchmark::State& st) {
          bm_onednn(st, l, p, threads, dnnl::memory::data_type::f32);
        });
        reg("onednn_bf16", [=](benchmark::State& st) {
          bm_onednn(st, l, p, threads, dnnl::memory::data_type::bf16);
        });
#endif
#if defined(TESSERA_HAVE_OPENBLAS)
        reg("openblas_fp32", [=](benchmark::State& st) { bm_openblas(st, l, p, threads); });
#endif
        const auto tess = [&]<class Cfg>(Cfg) {
          if (threads == 1) {
#if defined(KOKKOS_ENABLE_SERIAL)
            reg(std::string("tessera_") + Cfg::name,
                [=](benchmark::State& st) { bm_tessera<Kokkos::Serial, Cfg>(st, l, p, threads); });
#endif
          } else {
            reg(std::string("tessera_") + Cfg::name, [=](benchmark::State& st) {
              bm_tessera<Kokkos::DefaultExecutionSpace, Cfg>(st, l, p, threads);
            });
          }
        };
        tess(cfg_fp32{});
        tess(cfg_bf16{});
        tess(cfg_fp8{});
      }
}

void print_table() {
  const auto gf = [](const layer& l, const std::string& k) -> std::string {
    const auto it = seconds_per_call.find(k);
    if (it == seconds_per_call.end()) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", l.flops() / it->second * 1e-9);
    return buf;
  };
  const auto ratio = [](const std::string& num, const std::string& den) -> std::string {
    const auto a = seconds_per_call.find(num), b = seconds_per_call.find(den);
    if (a == seconds_per_call.end() || b == seconds_per_call.end()) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", b->second / a->second);
    return buf;
  };
  // The ratios of issue 11's targets: fp32 and bf16 against oneDNN's, bf16 over tessera's fp32,
  // fp8 over tessera's bf16.
  std::printf("\n| layer | pass | thr | tessera fp32 | bf16 | fp8 | oneDNN fp32 | oneDNN bf16 | "
              "OpenBLAS | fp32/oneDNN | bf16/oneDNN bf16 | fp32/OpenBLAS | bf16/fp32 | fp8/bf16 | "
              "fp32 path (im2col ms, share) "
              "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& l : layers)
    for (pass p : {pass::forward, pass::backward_data, pass::backward_weight})
      for (int t : {1, 2}) {
        const auto k = [&](const char* impl) { return key(l, p, t, impl); };
        if (seconds_per_call.count(k("tessera_fp32")) == 0) continue;
        const auto path = fp32_paths.find(key(l, p, t, ""));
        std::string how = path == fp32_paths.end() ? "-" : path->second;
        const auto re = im2col_seconds.find(key(l, p, t, ""));
        if (re != im2col_seconds.end()) {
          char buf[64];
          std::snprintf(buf, sizeof buf, " %.1f (%.0f%%)", re->second * 1e3,
                        100 * re->second / seconds_per_call[k("tessera_fp32")]);
          how += buf;
        }
        std::printf(
            "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
            l.name, pass_name(p), t, gf(l, k("tessera_fp32")).c_str(),
            gf(l, k("tessera_bf16")).c_str(), gf(l, k("tessera_fp8")).c_str(),
            gf(l, k("onednn_fp32")).c_str(), gf(l, k("onednn_bf16")).c_str(),
            gf(l, k("openblas_fp32")).c_str(), ratio(k("tessera_fp32"), k("onednn_fp32")).c_str(),
            ratio(k("tessera_bf16"), k("onednn_bf16")).c_str(),
            ratio(k("tessera_fp32"), k("openblas_fp32")).c_str(),
            ratio(k("tessera_bf16"), k("tessera_fp32")).c_str(),
            ratio(k("tessera_fp8"), k("tessera_bf16")).c_str(), how.c_str());
      }
  std::printf(
      "(GFLOP/s = 2 N K P Q C/groups R S / time, time = median CPU time per call on 1 "
      "thread, shortest wall time per call on 2; ratios > 1 mean the first named is faster)\n");
  // A text plot: GFLOP/s on a log scale, 10 characters per decade from 1 GFLOP/s.
  std::printf("\n```\nGFLOP/s, 1 thread, log scale: 10 # per decade above 1 GFLOP/s "
              "(20 = 100, 30 = 1000)\n");
  for (const auto& l : layers)
    for (pass p : {pass::forward, pass::backward_data, pass::backward_weight})
      for (const char* impl : {"tessera_fp32", "tessera_bf16", "onednn_fp32", "openblas_fp32"}) {
        const auto it = seconds_per_call.find(key(l, p, 1, impl));
        if (it == seconds_per_call.end()) continue;
        const double g = l.flops() / it->second * 1e-9;
        const int bars = g <= 1 ? 0 : static_cast<int>(10 * std::log10(g) + 0.5);
        std::printf("%-12s %-10s %-14s %7.1f %s\n", l.name, pass_name(p), impl, g,
                    std::string(static_cast<std::size_t>(bars), '#').c_str());
      }
  std::printf("```\n");
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
