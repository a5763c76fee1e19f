#pragma once
// Training runs of tessera::nn models that the plan-equivalence tests compare: a few SGD steps
// (momentum 0.9) of softmax cross-entropy on a synthetic global batch, each data-parallel rank
// on its contiguous share of every batch. The single-process run on the whole batch is the
// reference.
#include <tessera/nn.hpp>
#include <tessera/parallel/data_parallel.hpp>
#include <tessera/parallel/mesh.hpp>
#include <tessera/parallel/pipeline.hpp>
#include <tessera/parallel/runner.hpp>
#include <tessera/train/sgd.hpp>

#include <boost/hana/for_each.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tessera_test {

namespace nn = tessera::nn;

/// The model of examples/train_fashion_mnist.cpp.
template <class P>
using FashionCNN =
    nn::Sequential<nn::Input<1, 28, 28>, nn::Conv2d<1, 32, 3, nn::conv_options{.pad = 1}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Conv2d<32, 64, 3, nn::conv_options{.pad = 1}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Flatten, nn::Linear<3136, 128, P>, nn::ReLU,
                   nn::Linear<128, 10, P>>;

/// An MLP with odd input and output widths; the tensor split pairs Linear 0 (36 outputs) with
/// Linear 2 (36 inputs) and replicates Linear 4.
template <class P>
using MLP = nn::Sequential<nn::Linear<23, 36, P>, nn::ReLU, nn::Linear<36, 20, P>, nn::GELU,
                           nn::Linear<20, 10, P>>;

/// Seven layers (four Linear): enough for the interleaved schedule's P V = 4 balanced chunks.
template <class P>
using DeepMLP = nn::Sequential<nn::Linear<23, 32, P>, nn::ReLU, nn::Linear<32, 24, P>, nn::GELU,
                               nn::Linear<24, 16, P>, nn::ReLU, nn::Linear<16, 10, P>>;

struct run_options {
  int global_batch = 8;
  int steps = 5;
  std::size_t bucket_bytes = std::size_t(1) << 16;
  std::uint64_t seed = 7;
};

/// Inputs in [-1, 1) and labels in [0, 10) of sample s at step t, the same on every rank.
template <class X, class L>
void fill_batch(int step, int first, X& x, L& labels) {
  const tessera::index_t per_sample = x.size() / x.extent(0);
  for (tessera::index_t s = 0; s < x.extent(0); ++s) {
    std::mt19937 g(std::uint32_t(7919 * step + 104729 * (first + s) + 1));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (tessera::index_t i = 0; i < per_sample; ++i) x.data()[s * per_sample + i] = u(g);
    labels(s) = int(g() % 10);
  }
}

/// A zero input batch of B samples for Model (its first layer fixes the per-sample shape).
template <class Model>
auto make_input(tessera::index_t batch) {
  using first = std::remove_cvref_t<decltype(std::declval<Model&>().template layer<0>())>;
  return tessera::Tensor<tessera::fp32, typename first::input_extents>("x", batch);
}

/// All parameter values of a model, in order, as one vector.
template <class Params>
std::vector<float> flatten_values(const Params& params) {
  std::vector<float> out;
  boost::hana::for_each(params, [&](const auto& p) {
    out.insert(out.end(), p.value.data(), p.value.data() + p.size());
  });
  return out;
}

/// Data-parallel training of Model over `comm` (the single-process communicator: the
/// reference). Wire is the precision gradients travel in.
template <class Model, class Wire = float, class C>
std::vector<float> train_data_parallel(C comm, const run_options& o) {
  Kokkos::DefaultExecutionSpace exec;
  Model model(o.seed);
  tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  nn::SoftmaxCrossEntropy loss;
  tessera::parallel::gradient_buckets<C, Kokkos::DefaultExecutionSpace::memory_space, Wire> dp(
      comm, model.parameters(), o.bucket_bytes);
  const int share = o.global_batch / comm.size(), first = comm.rank() * share;
  for (int step = 0; step < o.steps; ++step) {
    auto x = make_input<Model>(share);
    Kokkos::View<int*> labels("labels", share);
    fill_batch(step, first, x, labels);
    auto y = model.forward(exec, x);
    auto [l, dlogits] = loss.forward_backward(exec, y, labels);
    (void)l;
    tessera::parallel::backward_overlapped(exec, model, dlogits, dp);
    dp.finish(exec);
    opt.step(exec, model.parameters());
  }
  return flatten_values(model.parameters());
}

/// Parameter values by name ("3.weight"), the names a pipeline stage shares with the model.
template <class Params>
std::map<std::string, std::vector<float>> values_by_name(const Params& params) {
  std::map<std::string, std::vector<float>> out;
  boost::hana::for_each(params, [&](const auto& p) {
    out[p.name].assign(p.value.data(), p.value.data() + p.size());
  });
  return out;
}

/// The single-process reference: Model on the whole batch, values by name.
template <class Model>
std::map<std::string, std::vector<float>> train_reference(const run_options& o) {
  Kokkos::DefaultExecutionSpace exec;
  Model model(o.seed);
  tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  nn::SoftmaxCrossEntropy loss;
  for (int step = 0; step < o.steps; ++step) {
    auto x = make_input<Model>(o.global_batch);
    Kokkos::View<int*> labels("labels", o.global_batch);
    fill_batch(step, 0, x, labels);
    auto y = model.forward(exec, x);
    auto [l, dlogits] = loss.forward_backward(exec, y, labels);
    (void)l;
    model.backward(exec, dlogits);
    opt.step(exec, model.parameters());
  }
  return values_by_name(model.parameters());
}

/// Training under Plan (data, tensor and pipeline splits): this rank's stage of the tensor-split
/// model, its data share of each global batch in M micro-batches on the schedule Kind, the same
/// SGD; returns the WHOLE values (gathered over the tensor group) of this rank's stage's
/// parameters, by name.
/// What the data-parallel gradient buckets did in the last step of train_plan.
struct bucket_counts {
  std::size_t overlapped = 0; ///< buckets whose all-reduce started during backward
  std::size_t total = 0;      ///< buckets
  bool present = false;       ///< false at ZeRO stage 2 (no buckets)
};

template <class Model, class Plan, class Kind, int M, class C>
std::map<std::string, std::vector<float>> train_plan(C world, const run_options& o,
                                                     bucket_counts* counts = nullptr) {
  namespace tp = tessera::parallel;
  Kokkos::DefaultExecutionSpace exec;
  tp::mesh<Plan, C> mesh(world);
  std::map<std::string, std::vector<float>> result;
  tp::with_plan_stage<Plan, Model, Kind, M>(mesh, o.seed, o.bucket_bytes, [&](auto& stage) {
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    nn::SoftmaxCrossEntropy loss;
    const int share = o.global_batch / mesh.shape.data, first = mesh.at.data * share;
    for (int step = 0; step < o.steps; ++step) {
      auto x = make_input<Model>(share);
      Kokkos::View<int*> labels("labels", share);
      fill_batch(step, first, x, labels);
      stage.forward_backward(exec, x, labels, loss);
      opt.step(exec, stage.parameters());
    }
    if (counts)
      *counts = {stage.buckets().overlapped_buckets(), stage.buckets().bucket_count(), true};
    result = stage.gather_parameters();
  });
  return result;
}

} // namespace tessera_test
