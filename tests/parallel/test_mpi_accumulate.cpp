// Gradient accumulation under the plans (plan_stage::forward_backward_accumulated,
// parallel/runner.hpp): K = 3 accumulation steps per optimizer step, each on its own global
// batch, the data-parallel reduction once per optimizer step.
//  - against the single process on the union of the K batches (one forward and backward of
//    K x G samples): every plan that fits the world (data, tensor, pipeline in {1, 2}; ZeRO
//    stages 1 and 2 beside), parameters within the fp32 bound of the plan tests (the mean of
//    K means, reduced over D ranks, is the whole batch's mean up to the order of fp32 sums);
//  - on one rank, plan<> bit for bit against the single process accumulating the same K
//    micro-batches with train::grad_accumulator (the same operations in the same order);
//  - the data group's all-reduce volume of one accumulated step (counting_communicator): the
//    gradients once (4 bytes per element of this rank's parameters) plus the 4-byte loss, not K
//    times the gradients.
#include "plan_check.hpp"

#include <tessera/parallel/counting.hpp>
#include <tessera/train/grad_accumulation.hpp>

#include <cstring>

using namespace tessera_test;

namespace {

constexpr int K = 3;

/// The single process: each step one forward and backward of the K global batches' union.
template <class Model>
std::map<std::string, std::vector<float>> union_reference(const run_options& o) {
  Kokkos::DefaultExecutionSpace exec;
  Model model(o.seed);
  tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  nn::SoftmaxCrossEntropy loss;
  for (int step = 0; step < o.steps; ++step) {
    auto x = make_input<Model>(K * o.global_batch);
    Kokkos::View<int*> labels("labels", K * o.global_batch);
    for (int k = 0; k < K; ++k) {
      auto xk = make_input<Model>(o.global_batch);
      Kokkos::View<int*> lk("labels", o.global_batch);
      fill_batch(K * step + k, 0, xk, lk);
      std::memcpy(x.data() + k * xk.size(), xk.data(), sizeof(float) * std::size_t(xk.size()));
      for (int i = 0; i < o.global_batch; ++i) labels(k * o.global_batch + i) = lk(i);
    }
    auto y = model.forward(exec, x);
    auto [l, dlogits] = loss.forward_backward(exec, y, labels);
    (void)l;
    model.backward(exec, dlogits);
    opt.step(exec, model.parameters());
  }
  return values_by_name(model.parameters());
}

/// The single process accumulating the K batches with train::grad_accumulator.
template <class Model>
std::map<std::string, std::vector<float>> accumulated_reference(const run_options& o) {
  Kokkos::DefaultExecutionSpace exec;
  Model model(o.seed);
  tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  tessera::train::grad_accumulator acc;
  nn::SoftmaxCrossEntropy loss;
  for (int step = 0; step < o.steps; ++step) {
    for (int k = 0; k < K; ++k) {
      auto x = make_input<Model>(o.global_batch);
      Kokkos::View<int*> labels("labels", o.global_batch);
      fill_batch(K * step + k, 0, x, labels);
      auto y = model.forward(exec, x);
      auto [l, dlogits] = loss.forward_backward(exec, y, labels);
      (void)l;
      model.backward(exec, dlogits);
      acc.accumulate(exec, model.parameters());
    }
    acc.finish(exec, model.parameters());
    opt.step(exec, model.parameters());
  }
  return values_by_name(model.parameters());
}

struct accumulated_run {
  std::map<std::string, std::vector<float>> values; // whole, by name (this rank's stage)
  std::int64_t data_all_reduce_bytes = -1;          // of the last optimizer step
  std::int64_t data_reduce_scatter_bytes = -1;      // of the last optimizer step
  std::int64_t local_elements = 0;                  // this rank's parameter elements
  float loss = 0;
};

/// Training under Plan with K accumulation steps per optimizer step (ZeRO stage Z), on the
/// pipeline schedule Kind.
template <class Model, class Plan, int M, class Kind = tp::one_f_one_b, class C>
accumulated_run train_accumulated(C world, const run_options& o) {
  Kokkos::DefaultExecutionSpace exec;
  tp::mesh<Plan, C> mesh(world);
  accumulated_run out;
  tp::with_plan_stage<Plan, Model, Kind, M>(mesh, o.seed, o.bucket_bytes, [&](auto& stage) {
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    auto sharded = stage.make_optimizer(opt);
    tessera::train::grad_accumulator acc;
    nn::SoftmaxCrossEntropy loss;
    const int share = o.global_batch / mesh.shape.data, first = mesh.at.data * share;
    for (int step = 0; step < o.steps; ++step) {
      const auto before = mesh.data.counts().all_reduce;
      const auto before_rs = mesh.data.counts().reduce_scatter;
      out.loss = stage.forward_backward_accumulated(
          exec, K,
          [&](int k) {
            auto x = make_input<Model>(share);
            Kokkos::View<int*> labels("labels", share);
            fill_batch(K * step + k, first, x, labels);
            return std::make_pair(x, labels);
          },
          loss, acc);
      out.data_all_reduce_bytes = mesh.data.counts().all_reduce - before;
      out.data_reduce_scatter_bytes = mesh.data.counts().reduce_scatter - before_rs;
      sharded.step(exec);
    }
    out.values = stage.gather_parameters();
    boost::hana::for_each(stage.parameters(),
                          [&](const auto& p) { out.local_elements += p.size(); });
  });
  return out;
}

/// Trains Plan on the world against ref and checks it; false (nothing run) if Plan does not fit.
template <class Model, class Plan, int M, class Kind = tp::one_f_one_b>
bool check_accumulated(const char* what, const std::map<std::string, std::vector<float>>& ref) {
  auto world = tp::counting_communicator(tp::mpi_communicator::world());
  if (!Plan::fits(world.size())) return false;
  const run_options o{.global_batch = 8, .steps = 3};
  const tp::mesh_shape shape = Plan::shape_on(world.size());
  REQUIRE(o.global_batch % (shape.data * M) == 0);
  const accumulated_run got = train_accumulated<Model, Plan, M, Kind>(world, o);
  INFO(what << " " << shape.name() << " zero stage " << Plan::zero_stage);
  float diff = 0;
  bool names_match = true;
  for (const auto& [name, values] : got.values) {
    const auto it = ref.find(name);
    if (it == ref.end() || it->second.size() != values.size()) {
      names_match = false;
      continue;
    }
    for (std::size_t i = 0; i < values.size(); ++i)
      diff = std::max(diff, std::fabs(it->second[i] - values[i]));
  }
  CHECK(names_match);
  CHECK_FALSE(got.values.empty());
  float worst = diff;
  MPI_Allreduce(&diff, &worst, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(worst <= fp32_tolerance);
  CHECK(std::isfinite(got.loss));
  // One reduction per optimizer step: the gradients once (all-reduced without ZeRO,
  // reduce-scattered at stages 1 and 2) and the loss.
  if (shape.data > 1) {
    const std::int64_t grads = 4 * got.local_elements;
    CHECK(got.data_all_reduce_bytes == (Plan::zero_stage == 0 ? grads : 0) + 4);
    CHECK(got.data_reduce_scatter_bytes == (Plan::zero_stage == 0 ? 0 : grads));
  }
  return true;
}

/// The number of Plans that fit the world (each trained and checked).
template <class... Plans>
int check_plans(const char* what, const std::map<std::string, std::vector<float>>& ref) {
  return (
      int(check_accumulated<MLP<tessera::fp32>, Plans, micro_batches_for<Plans, 1, 2>>(what, ref)) +
      ... + 0);
}

} // namespace

TEST_CASE("plans: K accumulation steps equal the single process on the batches' union",
          "[parallel][accumulate]") {
  const auto ref = union_reference<MLP<tessera::fp32>>(run_options{.global_batch = 8, .steps = 3});
  // Every world size the test runs at (1, 2, 4, 8 ranks) has a plan of each list that fits it.
  const int plain =
      check_plans<tp::plan<>, tp::plan<tp::data<2>>, tp::plan<tp::tensor<2>>,
                  tp::plan<tp::pipeline<2>>, tp::plan<tp::data<2>, tp::tensor<2>>,
                  tp::plan<tp::data<2>, tp::pipeline<2>>, tp::plan<tp::tensor<2>, tp::pipeline<2>>,
                  tp::plan<tp::data<4>>, tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>>(
          "accumulate", ref);
  CHECK(plain >= 1);
  const int zero =
      check_plans<tp::plan<tp::data<2, tp::zero<1>>>, tp::plan<tp::data<2, tp::zero<2>>>,
                  tp::plan<tp::data<4, tp::zero<2>>>,
                  tp::plan<tp::data<2, tp::zero<2>>, tp::tensor<2>>,
                  tp::plan<tp::data<2, tp::zero<1>>, tp::tensor<2>, tp::pipeline<2>>>(
          "accumulate, ZeRO", ref);
  // One rank: no data split, so no ZeRO plan fits.
  CHECK(zero >= (tp::mpi_communicator::world().size() > 1 ? 1 : 0));
}

TEST_CASE("plans: accumulation on the interleaved schedule equals the single process",
          "[parallel][accumulate]") {
  // interleaved_1f1b<2>: the seven-layer MLP in P V = 4 chunks, M = 2 micro-batches.
  const auto ref =
      union_reference<DeepMLP<tessera::fp32>>(run_options{.global_batch = 8, .steps = 3});
  using V2 = tp::interleaved_1f1b<2>;
  using M = DeepMLP<tessera::fp32>;
  const int ran =
      int(check_accumulated<M, tp::plan<tp::pipeline<2>>, 2, V2>("interleaved", ref)) +
      int(check_accumulated<M, tp::plan<tp::data<2>, tp::pipeline<2>>, 2, V2>("interleaved", ref)) +
      int(check_accumulated<M, tp::plan<tp::tensor<2>, tp::pipeline<2>>, 2, V2>("interleaved",
                                                                                ref)) +
      int(check_accumulated<M, tp::plan<tp::data<2, tp::zero<2>>, tp::pipeline<2>>, 2, V2>(
          "interleaved, ZeRO 2", ref)) +
      int(check_accumulated<M, tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>, 2, V2>(
          "interleaved", ref));
  const int n = tp::mpi_communicator::world().size();
  CHECK(ran == (n == 2 ? 1 : n == 4 ? 3 : n == 8 ? 1 : 0));
}

TEST_CASE("plans: one rank's accumulation is the single process's, bit for bit",
          "[parallel][accumulate]") {
  auto world = tp::counting_communicator(tp::mpi_communicator::world());
  if (world.size() != 1) return;
  const run_options o{.global_batch = 8, .steps = 3};
  const auto ref = accumulated_reference<MLP<tessera::fp32>>(o);
  const auto got = train_accumulated<MLP<tessera::fp32>, tp::plan<>, 1>(world, o);
  REQUIRE(got.values.size() == ref.size());
  for (const auto& [name, values] : got.values) {
    INFO(name);
    REQUIRE(ref.count(name) == 1);
    CHECK(std::memcmp(values.data(), ref.at(name).data(), sizeof(float) * values.size()) == 0);
  }
}

TEST_CASE("plans: K below 1 is refused", "[parallel][accumulate]") {
  auto world = tp::mpi_communicator::world();
  tp::mesh<tp::plan<tp::data<tessera::dyn>>, tp::mpi_communicator> mesh(world);
  Kokkos::DefaultExecutionSpace exec;
  tp::with_plan_stage<tp::plan<tp::data<tessera::dyn>>, MLP<tessera::fp32>>(
      mesh, 1, std::size_t(1) << 16, [&](auto& stage) {
        tessera::train::grad_accumulator acc;
        nn::SoftmaxCrossEntropy loss;
        auto none = [&](int) {
          auto x = make_input<MLP<tessera::fp32>>(2);
          Kokkos::View<int*> labels("labels", 2);
          return std::make_pair(x, labels);
        };
        CHECK_THROWS_AS(stage.forward_backward_accumulated(exec, 0, none, loss, acc),
                        tessera::value_error);
      });
}
