// Per-layer time of one FashionCNN training step (the example's model, batch 64): forward and
// backward of every layer on its own, in fp32, bf16 and fp8 compute precision, so a step's time
// can be split into its parts and compared with the convolution / GEMM benchmarks; and GELU on
// the char GPT's MLP activations (`--benchmark_filter=gelu`, values per second). Layers with
// a GEMM also report GFLOP/s (2 B M N K per GEMM: forward one, backward two, the first
// convolution's backward one: nothing before it needs dx).
//
//   bench_layers                                   # Kokkos' default threads
//   OMP_NUM_THREADS=1 bench_layers --benchmark_filter=fp32
//
// There is no anchor here: PyTorch's time for the whole step is measured beside tessera's by
// benchmarks/train/compare_pytorch.py, and oneDNN's per convolution by bench_conv.
#include <tessera/nn.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace nn = tessera::nn;
using tessera::dyn;
using tessera::extents;
using tessera::index_t;

constexpr index_t batch = 64;

template <class P>
struct fashion_cnn {
  nn::Conv2d<1, 32, 3, nn::conv_options{.pad = 1}, P> conv1{1};
  nn::ReLU relu1;
  nn::MaxPool2d<2> pool1;
  nn::Conv2d<32, 64, 3, nn::conv_options{.pad = 1}, P> conv2{2};
  nn::ReLU relu2;
  nn::MaxPool2d<2> pool2;
  nn::Flatten flat;
  nn::Linear<3136, 128, P> fc1{3};
  nn::ReLU relu3;
  nn::Linear<128, 10, P> fc2{4};
};

/// A tensor like t, filled with values uniform in [-1, 1] from a fixed seed.
template <class T>
T random_like(const T& t, std::uint64_t seed) {
  T r("bench.random", t.extents());
  auto h = Kokkos::create_mirror_view(r.kokkos_view());
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i < h.extent(0); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    h(i) = tessera::from_float<typename T::precision>(
        static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) / float(1 << 23));
  }
  Kokkos::deep_copy(r.kokkos_view(), h);
  return r;
}

/// Registers forward and backward of one layer; x its input, y its output (from the chain).
/// Each reports the rate counter `unit` of `amount` per forward and `backward_times` amount per
/// backward (GFLOP/s of the GEMMs by default; nothing when amount is 0).
template <class L, class X, class Y>
void add_layer(const std::string& prefix, const std::shared_ptr<void>& keep, L& layer, X x, Y y,
               double amount, bool need_dx, int backward_times, const std::string& unit = "GFLOP/s",
               double scale = 1e-9) {
  const Kokkos::DefaultExecutionSpace exec;
  const auto dy = random_like(y, 7);
  benchmark::RegisterBenchmark(
      (prefix + "/forward").c_str(),
      [keep, &layer, x, exec, amount, unit, scale](benchmark::State& st) {
        for (auto _ : st) benchmark::DoNotOptimize(layer.forward(exec, x));
        if (amount > 0)
          st.counters[unit] =
              benchmark::Counter(amount * scale, benchmark::Counter::kIsIterationInvariantRate);
      })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark((prefix + "/backward").c_str(),
                               [keep, &layer, x, dy, exec, amount, need_dx, backward_times, unit,
                                scale](benchmark::State& st) {
                                 layer.forward(exec, x); // the state backward reads
                                 for (auto _ : st)
                                   benchmark::DoNotOptimize(layer.backward(exec, dy, need_dx));
                                 if (amount > 0)
                                   st.counters[unit] = benchmark::Counter(
                                       backward_times * amount * scale,
                                       benchmark::Counter::kIsIterationInvariantRate);
                               })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

template <class P>
void register_model(const std::string& name) {
  const Kokkos::DefaultExecutionSpace exec;
  auto m = std::make_shared<fashion_cnn<P>>();
  const auto x =
      random_like(tessera::Tensor<tessera::fp32, extents<dyn, 1, 28, 28>>("x", batch), 3);
  // The activations of one forward, each the next layer's input.
  const auto a1 = m->conv1.forward(exec, x);
  const auto a2 = m->relu1.forward(exec, a1);
  const auto a3 = m->pool1.forward(exec, a2);
  const auto a4 = m->conv2.forward(exec, a3);
  const auto a5 = m->relu2.forward(exec, a4);
  const auto a6 = m->pool2.forward(exec, a5);
  const auto a7 = m->flat.forward(exec, a6);
  const auto a8 = m->fc1.forward(exec, a7);
  const auto a9 = m->relu3.forward(exec, a8);
  const auto a10 = m->fc2.forward(exec, a9);
  const double b = batch;
  const std::string p = name + "/";
  add_layer(p + "1.conv(1,32,3)", m, m->conv1, x, a1, 2 * b * 32 * 784 * 9, false, 1);
  add_layer(p + "2.relu", m, m->relu1, a1, a2, 0, true, 0);
  add_layer(p + "3.maxpool", m, m->pool1, a2, a3, 0, true, 0);
  add_layer(p + "4.conv(32,64,3)", m, m->conv2, a3, a4, 2 * b * 64 * 196 * 288, true, 2);
  add_layer(p + "5.relu", m, m->relu2, a4, a5, 0, true, 0);
  add_layer(p + "6.maxpool", m, m->pool2, a5, a6, 0, true, 0);
  add_layer(p + "8.linear(3136,128)", m, m->fc1, a7, a8, 2 * b * 3136 * 128, true, 2);
  add_layer(p + "9.relu", m, m->relu3, a8, a9, 0, true, 0);
  add_layer(p + "10.linear(128,10)", m, m->fc2, a9, a10, 2 * b * 128 * 10, true, 2);
}

/// GELU forward and backward on the char GPT's MLP activations (batch 16, context 128, width
/// 512: 1 Mi values), reported as values per second (erf's cost is not a FLOP count).
template <class P>
void register_gelu(const std::string& name) {
  const Kokkos::DefaultExecutionSpace exec;
  auto g = std::make_shared<nn::GELU>();
  const auto x = random_like(tessera::Tensor<P, extents<dyn, 128, 512>>("x", 16), 5);
  const auto y = g->forward(exec, x);
  add_layer(name + "/gelu(16x128x512)", g, *g, x, y, double(x.size()), true, 1, "values/s", 1.0);
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  register_model<tessera::fp32>("fp32");
  register_model<tessera::bf16>("bf16");
  register_model<nn::fp8<>>("fp8");
  register_gelu<tessera::fp32>("fp32");
  register_gelu<tessera::bf16>("bf16");
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::ClearRegisteredBenchmarks(); // the models they hold go before Kokkos finalizes
  benchmark::Shutdown();
  return 0;
}
