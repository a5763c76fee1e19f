// nn::CausalSelfAttention's tiled online-softmax core against the naive form (scores
// materialised as B H t x t fp32 matrices), on the same layer: both use the same QKV and
// output nn::Linear projections (identical cost), so the difference is the core. B = 4,
// H = 4, D = 128 (head dim 32, the character GPT's), fp32, t = 64 .. 1024.
//
// Reported per benchmark: time, tokens/s (B t per iteration), and scratch_MiB, the memory the
// core allocates besides the activations both forms have (o, dqkv): for the tiled form the
// fp32 q, k, k^T, v, v^T, per-row statistics (and dO, D for backward) plus the work items'
// scratch times the concurrency (CausalSelfAttention::scratch_bytes()); for the naive form the
// probabilities P (B H t t, kept for backward) and, in backward, dS (B H t t).
//
// The "core" benchmarks time the attention core alone (nn::detail::tiled_attention_core, no
// projections) at the character GPT's batch (B = 16, t = 128 and longer) and report GFLOP/s of
// its products: forward 2 (QK^T, PV), backward 5 (the recomputed QK^T, dO V^T, P^T dO, dS^T Q,
// dS K), each 2 d flops per (query, key) pair the causal mask lets through, t (t + 1) / 2 per
// (batch, head). "core_bf16" is the same with bf16 q, k, v in and o out (the bf16 GPT's core:
// the scores on VDPBF16PS where the CPU has AVX512_BF16, the other products in fp32);
// "core_bf16_tile128" the same at t = 128 with one 128-row tile instead of the default 64 (no
// online-softmax correction: the cost of the tiling at the GPT's length).
//
//   bench_attention                                    # Kokkos' default threads
//   OMP_NUM_THREADS=1 bench_attention --benchmark_filter=/256
#include <tessera/nn/attention.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace nn = tessera::nn;
using tessera::dyn;
using tessera::extents;
using tessera::index_t;

constexpr index_t B = 4, H = 4, D = 128, d = D / H;
using X = tessera::Tensor<tessera::fp32, extents<dyn, dyn, D>>;

/// The same layer with a naive core: one work item per (b, h, query row) forms the row of
/// scores, its softmax (kept in P) and o; backward forms dS (kept) per row, then dK, dV per
/// key row from the kept P and dS.
class naive_attention_layer {
public:
  explicit naive_attention_layer(std::uint64_t seed)
      : qkv_(tessera::counter_rng{seed, 0}.bits(0)), proj_(tessera::counter_rng{seed, 1}.bits(0)),
        o_("naive.o"), dqkv_("naive.dqkv"), p_("naive.p"), ds_("naive.ds") {}

  std::size_t scratch_bytes() const noexcept { return scratch_; }

  auto forward(const Kokkos::DefaultExecutionSpace& exec, const X& x) {
    const index_t t = x.extent(1);
    const auto qkv = qkv_.forward(exec, x);
    auto o = o_.get(extents<dyn, dyn, D>(B, t));
    float* p = p_.get(B * H * t * t);
    const float* in = qkv.data();
    float* out = o.data();
    const float scale = 1.f / std::sqrt(float(d));
    Kokkos::parallel_for(
        "naive_attention::forward", Kokkos::RangePolicy<>(exec, 0, B * H * t),
        KOKKOS_LAMBDA(const index_t w) {
          const index_t bh = w / t, i = w % t, b = bh / H, h = bh % H;
          float* pr = p + (bh * t + i) * t;
          const float* q = in + (b * t + i) * 3 * D + h * d;
          float m = -3.0e38f;
          for (index_t j = 0; j <= i; ++j) {
            const float* k = in + (b * t + j) * 3 * D + D + h * d;
            float s = 0.f;
            for (index_t e = 0; e < d; ++e) s += q[e] * k[e];
            pr[j] = s * scale;
            m = pr[j] > m ? pr[j] : m;
          }
          float z = 0.f;
          for (index_t j = 0; j <= i; ++j) z += (pr[j] = nn::detail::kmath::exp(pr[j] - m));
          for (index_t j = 0; j <= i; ++j) pr[j] /= z;
          for (index_t j = i + 1; j < t; ++j) pr[j] = 0.f;
          float acc[d] = {};
          for (index_t j = 0; j <= i; ++j) {
            const float* v = in + (b * t + j) * 3 * D + 2 * D + h * d;
            for (index_t e = 0; e < d; ++e) acc[e] += pr[j] * v[e];
          }
          for (index_t e = 0; e < d; ++e) out[(b * t + i) * D + h * d + e] = acc[e];
        });
    exec.fence();
    t_ = t;
    qkv_out_ = qkv;
    scratch_ = std::size_t(B * H * t * t) * sizeof(float);
    return proj_.forward(exec, o);
  }

  auto backward(const Kokkos::DefaultExecutionSpace& exec, const X& dy) {
    const index_t t = t_;
    const auto dout = proj_.backward(exec, dy, true);
    auto dqkv = dqkv_.get(extents<dyn, dyn, 3 * D>(B, t));
    float* ds = ds_.get(B * H * t * t);
    const float* p = p_.data();
    const float* in = qkv_out_.data();
    const float* g = dout.data();
    float* dst = dqkv.data();
    const float scale = 1.f / std::sqrt(float(d));
    Kokkos::parallel_for(
        "naive_attention::backward[dS dQ]", Kokkos::RangePolicy<>(exec, 0, B * H * t),
        KOKKOS_LAMBDA(const index_t w) {
          const index_t bh = w / t, i = w % t, b = bh / H, h = bh % H;
          const float* pr = p + (bh * t + i) * t;
          float* dsr = ds + (bh * t + i) * t;
          const float* go = g + (b * t + i) * D + h * d;
          float rowdot = 0.f;
          for (index_t j = 0; j <= i; ++j) {
            const float* v = in + (b * t + j) * 3 * D + 2 * D + h * d;
            float s = 0.f;
            for (index_t e = 0; e < d; ++e) s += go[e] * v[e];
            dsr[j] = s;
            rowdot += pr[j] * s;
          }
          float dq[d] = {};
          for (index_t j = 0; j <= i; ++j) {
            dsr[j] = pr[j] * (dsr[j] - rowdot);
            const float* k = in + (b * t + j) * 3 * D + D + h * d;
            for (index_t e = 0; e < d; ++e) dq[e] += dsr[j] * k[e];
          }
          for (index_t e = 0; e < d; ++e) dst[(b * t + i) * 3 * D + h * d + e] = scale * dq[e];
        });
    Kokkos::parallel_for(
        "naive_attention::backward[dK dV]", Kokkos::RangePolicy<>(exec, 0, B * H * t),
        KOKKOS_LAMBDA(const index_t w) {
          const index_t bh = w / t, j = w % t, b = bh / H, h = bh % H;
          float dk[d] = {}, dv[d] = {};
          for (index_t i = j; i < t; ++i) {
            const float pij = p[(bh * t + i) * t + j], dsij = ds[(bh * t + i) * t + j];
            const float* q = in + (b * t + i) * 3 * D + h * d;
            const float* go = g + (b * t + i) * D + h * d;
            for (index_t e = 0; e < d; ++e) {
              dk[e] += dsij * q[e];
              dv[e] += pij * go[e];
            }
          }
          for (index_t e = 0; e < d; ++e) {
            dst[(b * t + j) * 3 * D + D + h * d + e] = scale * dk[e];
            dst[(b * t + j) * 3 * D + 2 * D + h * d + e] = dv[e];
          }
        });
    exec.fence();
    scratch_ = 2 * std::size_t(B * H * t * t) * sizeof(float);
    return qkv_.backward(exec, dqkv, true);
  }

private:
  nn::Linear<D, 3 * D> qkv_;
  nn::Linear<D, D> proj_;
  tessera::Tensor<tessera::fp32, extents<dyn, dyn, 3 * D>> qkv_out_;
  nn::detail::buffer<tessera::fp32> o_, dqkv_;
  nn::detail::raw_buffer<float> p_, ds_;
  index_t t_ = 0;
  std::size_t scratch_ = 0;
};

X random_x(index_t t) {
  X x("bench.x", B, t);
  tessera::fill_uniform(x, 3, -1.f, 1.f);
  return x;
}

template <class Layer>
void add(const std::string& name, index_t t) {
  auto layer = std::make_shared<Layer>(1);
  const X x = random_x(t);
  X dy("bench.dy", B, t);
  tessera::fill_uniform(dy, 4, -1.f, 1.f);
  const Kokkos::DefaultExecutionSpace exec;
  const double tokens = double(B * t);
  benchmark::RegisterBenchmark((name + "/forward/" + std::to_string(t)).c_str(),
                               [layer, x, exec, tokens](benchmark::State& st) {
                                 for (auto _ : st)
                                   benchmark::DoNotOptimize(layer->forward(exec, x));
                                 st.counters["tokens/s"] = benchmark::Counter(
                                     tokens, benchmark::Counter::kIsIterationInvariantRate);
                                 st.counters["scratch_MiB"] =
                                     double(layer->scratch_bytes()) / (1024.0 * 1024.0);
                               })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark((name + "/forward+backward/" + std::to_string(t)).c_str(),
                               [layer, x, dy, exec, tokens](benchmark::State& st) {
                                 for (auto _ : st) {
                                   benchmark::DoNotOptimize(layer->forward(exec, x));
                                   benchmark::DoNotOptimize(layer->backward(exec, dy));
                                 }
                                 st.counters["tokens/s"] = benchmark::Counter(
                                     tokens, benchmark::Counter::kIsIterationInvariantRate);
                                 st.counters["scratch_MiB"] =
                                     double(layer->scratch_bytes()) / (1024.0 * 1024.0);
                               })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

/// The core alone (see the file comment): qkv (Bc, t, 3D) random, in precision P's storage
/// and dO (fp32, or bf16 as the bf16 GPT's projections hand them over), o in P.
template <class P>
void add_core(index_t t, const std::string& name, index_t tile = 0) {
  constexpr index_t Bc = 16;
  using S = tessera::storage_t<P>;
  using core_t = nn::detail::tiled_attention_core<D, H, P>;
  auto core = std::make_shared<core_t>();
  if (tile > 0) core->set_tile(tile, "bench_attention");
  auto qkv = std::make_shared<std::vector<S>>(std::size_t(Bc * t * 3 * D));
  auto o = std::make_shared<std::vector<S>>(std::size_t(Bc * t * D));
  auto g = std::make_shared<std::vector<S>>(std::size_t(Bc * t * D));
  auto dqkv = std::make_shared<std::vector<float>>(std::size_t(Bc * t * 3 * D));
  tessera::counter_rng rng{7, 0};
  for (std::size_t i = 0; i < qkv->size(); ++i)
    (*qkv)[i] = tessera::from_float<P>(2 * rng.uniform01(i) - 1);
  for (std::size_t i = 0; i < g->size(); ++i)
    (*g)[i] = tessera::from_float<P>(2 * rng.uniform01(qkv->size() + i) - 1);
  const Kokkos::DefaultHostExecutionSpace exec;
  const double pairs = double(Bc * H) * double(t) * double(t + 1) / 2;
  const double flops_fwd = 2 * 2 * d * pairs, flops_bwd = 5 * 2 * d * pairs;
  const std::string ts = std::to_string(t);
  benchmark::RegisterBenchmark(
      (name + "/forward/" + ts).c_str(),
      [=](benchmark::State& st) {
        for (auto _ : st) core->forward(exec, qkv->data(), Bc, t, o->data());
        st.counters["GFLOP"] =
            benchmark::Counter(flops_fwd * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
      })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark(
      (name + "/backward/" + ts).c_str(),
      [=](benchmark::State& st) {
        core->forward(exec, qkv->data(), Bc, t, o->data());
        for (auto _ : st) core->backward(exec, g->data(), o->data(), Bc, t, dqkv->data());
        st.counters["GFLOP"] =
            benchmark::Counter(flops_bwd * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
      })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  for (const index_t t : {128, 256, 1024}) add_core<tessera::fp32>(t, "core");
  for (const index_t t : {128, 1024}) add_core<tessera::bf16>(t, "core_bf16");
  add_core<tessera::bf16>(128, "core_bf16_tile128", 128);
  for (const index_t t : {64, 128, 256, 512, 1024}) {
    add<nn::CausalSelfAttention<D, H>>("tiled", t);
    add<naive_attention_layer>("naive", t);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::ClearRegisteredBenchmarks(); // the layers they hold go before Kokkos finalizes
  benchmark::Shutdown();
  return 0;
}
