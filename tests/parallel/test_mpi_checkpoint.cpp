// Checkpoints of a parallel run: FashionCNN (fp32, SGD with momentum) trained 2 steps under a
// plan, saved (a shard per rank plus a manifest), then
//  - restored into a fresh run of the same plan: the same bits, and the next step the same bits
//    as the uninterrupted run's;
//  - merged into one single-process checkpoint and loaded into the whole model: the same values
//    as the gathered shards, the run state, and (momentum restored) the next step equal to the
//    plan's next step within the fp32 tolerance of plan_check.hpp;
//  - refused, on every rank and after the merge, by a run of another precision.
// With a sharded optimizer (ZeRO stages 1 and 2, data 2): each rank's shard of the momentum
// saved and restored (the next step bit for bit), another stage refused naming both, and the
// merge gathering the shards (the next single-process step within the tolerance).
// fp8 (the MLP in nn::fp8<delayed_scaling>): the scaling states (amax histories, scale amaxes)
// saved with each rank's shard and restored bit for bit (the next step's weights and states the
// uninterrupted run's), and merged into the single-process order: each stage's states at the
// place of its layers in the whole model.
// The interleaved schedule (interleaved_1f1b<2>, an fp8 MLP of seven layers cut into four
// chunks, rank p holding chunks p and p + 2): saved, restored bit for bit (also with ZeRO 2),
// refused by the same plan on one chunk per rank, and merged with each chunk's fp8 states at
// the place of its layers in the whole model (not the rank's states in one run).
// Run on 4 ranks (data 1, tensor 2, pipeline 2; data 2, tensor 2) and 8 ranks (2, 2, 2).
#include "plan_check.hpp"

#include <tessera/parallel/checkpoint.hpp>
#include <tessera/parallel/fp8_sync.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace tessera_test;

namespace {

using Model = FashionCNN<tessera::fp32>;
using Kind = tp::one_f_one_b;
constexpr int M = 2;
constexpr run_options opts{.global_batch = 8, .steps = 3};

/// A directory every rank names alike, fresh for this run.
fs::path scratch_dir(const char* tag) {
  int pid = int(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return fs::temp_directory_path() /
         ("tessera_plan_ckpt_" + std::string(tag) + "_" + std::to_string(pid));
}

/// Steps first_step, ... of `stage` (a stage of Layers, FashionCNN by default) on its share,
/// through `opt`: a sharded optimizer's step(exec), or an optimizer on the stage's parameters.
template <class Layers = Model, class Stage, class Opt>
void train_steps(Stage& stage, Opt& opt, int first_step, int steps) {
  Kokkos::DefaultExecutionSpace exec;
  nn::SoftmaxCrossEntropy loss;
  const int share = opts.global_batch / stage.mesh().shape.data;
  const int first = stage.mesh().at.data * share;
  for (int step = first_step; step < first_step + steps; ++step) {
    auto x = make_input<Layers>(share);
    Kokkos::View<int*> labels("labels", share);
    fill_batch(step, first, x, labels);
    stage.forward_backward(exec, x, labels, loss);
    if constexpr (requires { opt.step(exec); })
      opt.step(exec);
    else
      opt.step(exec, stage.parameters());
  }
}

template <class Plan>
void check_checkpoint(const char* tag) {
  auto world = tp::mpi_communicator::world();
  if (world.size() != Plan::world_size) return;
  const fs::path dir = scratch_dir(tag);
  tp::mesh<Plan, tp::mpi_communicator> mesh(world);
  std::map<std::string, std::vector<float>> saved, after_three;
  tp::with_plan_stage<Plan, Model, Kind, M>(mesh, opts.seed, opts.bucket_bytes, [&](auto& stage) {
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    tessera::train::static_scaler scaler;
    train_steps(stage, opt, 0, 2);
    saved = stage.gather_parameters();
    tp::save_plan_checkpoint(dir, stage, opt, scaler,
                             {.step = 2, .epoch = 0, .data_seed = 9, .precision = "fp32"});
    train_steps(stage, opt, 2, 1);
    after_three = stage.gather_parameters();
  });
  // The same plan, restored from the checkpoint into a differently seeded run.
  tp::with_plan_stage<Plan, Model, Kind, M>(mesh, 12345, opts.bucket_bytes, [&](auto& stage) {
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    tessera::train::static_scaler scaler;
    tessera::train::run_state run;
    train_steps(stage, opt, 0, 1); // creates momentum buffers to be overwritten
    // Another precision is refused on every rank, changing nothing.
    run.precision = "bf16";
    const auto before = stage.gather_parameters();
    CHECK_THROWS_WITH(tp::load_plan_checkpoint(dir, stage, opt, scaler, run),
                      Catch::Contains("run/precision") &&
                          Catch::Contains("saved 'fp32', expected 'bf16'"));
    CHECK(stage.gather_parameters() == before);
    CHECK(run.step == 0);
    run.precision = "fp32";
    tp::load_plan_checkpoint(dir, stage, opt, scaler, run);
    CHECK(run.step == 2);
    CHECK(run.data_seed == 9);
    CHECK(stage.gather_parameters() == saved);
    train_steps(stage, opt, 2, 1);
    CHECK(stage.gather_parameters() == after_three); // bit for bit
  });
  // Merged into the single-process model.
  if (world.rank() == 0) tp::merge_plan_checkpoint(dir, dir / "whole.tsr");
  world.barrier();
  {
    Kokkos::DefaultExecutionSpace exec;
    Model model(99);
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.step = 0, .epoch = 0, .data_seed = 0, .precision = "bf16"};
    CHECK_THROWS_WITH(
        tessera::train::load_checkpoint(dir / "whole.tsr", model.parameters(), opt, scaler, run),
        Catch::Contains("saved 'fp32', expected 'bf16'")); // the merge keeps the precision
    run.precision = "fp32";
    tessera::train::load_checkpoint(dir / "whole.tsr", model.parameters(), opt, scaler, run);
    CHECK(run.step == 2);
    CHECK(opt.steps() == 2);
    // This rank's stage's parameters (whole, gathered) are the merged model's, bit for bit.
    const auto merged = values_by_name(model.parameters());
    for (const auto& [name, v] : saved) CHECK(merged.at(name) == v);
    nn::SoftmaxCrossEntropy loss;
    auto x = make_input<Model>(opts.global_batch);
    Kokkos::View<int*> labels("labels", opts.global_batch);
    fill_batch(2, 0, x, labels);
    auto y = model.forward(exec, x);
    auto [l, dlogits] = loss.forward_backward(exec, y, labels);
    (void)l;
    model.backward(exec, dlogits);
    opt.step(exec, model.parameters());
    const auto next = values_by_name(model.parameters());
    float diff = 0;
    for (const auto& [name, v] : after_three)
      for (std::size_t i = 0; i < v.size(); ++i)
        diff = std::max(diff, std::fabs(v[i] - next.at(name)[i]));
    INFO(Plan::name() << ": one step after the merged checkpoint, max |w - w_plan| = " << diff);
    CHECK(diff <= fp32_tolerance);
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

/// Plan has data<2, zero<Z>>; Other the same plan at another ZeRO stage.
template <class Plan, class Other>
void check_zero_checkpoint(const char* tag) {
  auto world = tp::mpi_communicator::world();
  if (world.size() != Plan::world_size) return;
  const fs::path dir = scratch_dir(tag);
  tp::mesh<Plan, tp::mpi_communicator> mesh(world);
  std::map<std::string, std::vector<float>> saved, after_three;
  tp::with_plan_stage<Plan, Model, Kind, M>(mesh, opts.seed, opts.bucket_bytes, [&](auto& stage) {
    auto opt = stage.make_optimizer(tessera::train::sgd{.lr = 0.05f, .momentum = 0.9f});
    tessera::train::static_scaler scaler;
    train_steps(stage, opt, 0, 2);
    saved = stage.gather_parameters();
    tp::save_plan_checkpoint(dir, stage, opt, scaler,
                             {.step = 2, .epoch = 0, .data_seed = 9, .precision = "fp32"});
    train_steps(stage, opt, 2, 1);
    after_three = stage.gather_parameters();
  });
  CHECK(fs::exists(dir / ("rank-" + std::to_string(world.rank()) + ".zero.tsr")));
  tp::with_plan_stage<Plan, Model, Kind, M>(mesh, 12345, opts.bucket_bytes, [&](auto& stage) {
    auto opt = stage.make_optimizer(tessera::train::sgd{.lr = 0.05f, .momentum = 0.9f});
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.precision = "fp32"};
    train_steps(stage, opt, 0, 1); // momentum to be overwritten
    tp::load_plan_checkpoint(dir, stage, opt, scaler, run);
    CHECK(run.step == 2);
    CHECK(opt.steps() == 2);
    CHECK(stage.gather_parameters() == saved);
    train_steps(stage, opt, 2, 1);
    CHECK(stage.gather_parameters() == after_three); // bit for bit: the momentum shard restored
  });
  // The same plan at another ZeRO stage, and the unsharded optimizer, are refused.
  tp::mesh<Other, tp::mpi_communicator> other(world);
  tp::with_plan_stage<Other, Model, Kind, M>(other, 1, opts.bucket_bytes, [&](auto& stage) {
    auto opt = stage.make_optimizer(tessera::train::sgd{.lr = 0.05f, .momentum = 0.9f});
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.precision = "fp32"};
    CHECK_THROWS_WITH(tp::load_plan_checkpoint(dir, stage, opt, scaler, run),
                      Catch::Contains("at ZeRO stage " + std::to_string(Plan::zero_stage) +
                                      ", not at ZeRO stage " + std::to_string(Other::zero_stage)));
  });
  // Merged: the shards of the momentum gathered, so one single-process step lands on the plan's.
  if (world.rank() == 0) tp::merge_plan_checkpoint(dir, dir / "whole.tsr");
  world.barrier();
  {
    Kokkos::DefaultExecutionSpace exec;
    Model model(99);
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.precision = "fp32"};
    tessera::train::load_checkpoint(dir / "whole.tsr", model.parameters(), opt, scaler, run);
    CHECK(run.step == 2);
    CHECK(opt.steps() == 2);
    const auto merged = values_by_name(model.parameters());
    for (const auto& [name, v] : saved) CHECK(merged.at(name) == v);
    nn::SoftmaxCrossEntropy loss;
    auto x = make_input<Model>(opts.global_batch);
    Kokkos::View<int*> labels("labels", opts.global_batch);
    fill_batch(2, 0, x, labels);
    auto y = model.forward(exec, x);
    auto [l, dlogits] = loss.forward_backward(exec, y, labels);
    (void)l;
    model.backward(exec, dlogits);
    opt.step(exec, model.parameters());
    const auto next = values_by_name(model.parameters());
    float diff = 0;
    for (const auto& [name, v] : after_three)
      for (std::size_t i = 0; i < v.size(); ++i)
        diff = std::max(diff, std::fabs(v[i] - next.at(name)[i]));
    INFO(Plan::name() << ": one step after the merged ZeRO checkpoint, max |w - w_plan| = "
                      << diff);
    CHECK(diff <= fp32_tolerance);
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

using fp8_delayed = nn::fp8<tessera::train::delayed_scaling>;
using Fp8Model = MLP<fp8_delayed>;

/// Every fp8 state of `model` (a model or a stage), in for_each_fp8_state's order: its history
/// followed by its scale amax.
template <class Layers>
std::vector<std::vector<float>> fp8_values(Layers& model) {
  std::vector<std::vector<float>> out;
  tp::for_each_fp8_state(model, [&](const auto& meta) {
    std::vector<float> v = meta.history();
    v.push_back(meta.scale_amax());
    out.push_back(std::move(v));
  });
  return out;
}

/// The number of fp8 states of the whole model's layers before layer Begin.
template <std::size_t Begin, class Model>
std::size_t fp8_states_before(Model& model) {
  std::size_t n = 0;
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    ((n += K < Begin ? tp::count_fp8_states(model.template layer<K>()) : 0), ...);
  }
  (std::make_index_sequence<Model::size()>{});
  return n;
}

template <class Plan>
void check_fp8_checkpoint(const char* tag) {
  auto world = tp::mpi_communicator::world();
  if (world.size() != Plan::world_size) return;
  const fs::path dir = scratch_dir(tag);
  tp::mesh<Plan, tp::mpi_communicator> mesh(world);
  std::map<std::string, std::vector<float>> saved, after_three;
  std::vector<std::vector<float>> saved_fp8, after_three_fp8;
  std::size_t before = 0; // fp8 states of the whole model before this rank's stage
  const tessera::train::run_state at_two{.step = 2, .epoch = 0, .data_seed = 9, .precision = "fp8"};
  tp::with_plan_stage<Plan, Fp8Model, Kind, M>(
      mesh, opts.seed, opts.bucket_bytes, [&](auto& stage) {
        tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
        tessera::train::static_scaler scaler;
        train_steps<Fp8Model>(stage, opt, 0, 2);
        saved = stage.gather_parameters();
        saved_fp8 = fp8_values(stage.stage());
        tp::save_plan_checkpoint(dir, stage, opt, scaler, at_two);
        // A directory whose tensor ranks disagree (one state changed on tensor rank 1 only; a
        // mixed-up or corrupt checkpoint): the merge refuses it, naming the stage.
        if (stage.mesh().at.tensor == 1)
          tp::for_each_fp8_state(stage.stage(), [first = true](auto& meta) mutable {
            if (first) meta.restore({1.f, 2.f}, 2.f);
            first = false;
          });
        tp::save_plan_checkpoint(dir / "mixed", stage, opt, scaler, at_two);
        if (world.rank() == 0)
          CHECK_THROWS_WITH(tp::merge_plan_checkpoint(dir / "mixed", dir / "mixed.tsr"),
                            Catch::Contains("fp8 scaling states of pipeline stage") &&
                                Catch::Contains("differ between tensor ranks 0 and 1"));
        tp::for_each_fp8_state(stage.stage(), [&, k = std::size_t(0)](auto& meta) mutable {
          const std::vector<float>& v = saved_fp8[k++];
          meta.restore(std::vector<float>(v.begin(), v.end() - 1), v.back());
        });
        train_steps<Fp8Model>(stage, opt, 2, 1);
        after_three = stage.gather_parameters();
        after_three_fp8 = fp8_values(stage.stage());
        Fp8Model whole(1);
        before = fp8_states_before<std::remove_cvref_t<decltype(stage.stage())>::begin>(whole);
      });
  REQUIRE(!saved_fp8.empty());
  REQUIRE(saved_fp8.front().size() == 3); // two history entries and the scale amax
  // Restored into a differently seeded run that has trained a step (other histories).
  tp::with_plan_stage<Plan, Fp8Model, Kind, M>(mesh, 12345, opts.bucket_bytes, [&](auto& stage) {
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.precision = "fp8"};
    train_steps<Fp8Model>(stage, opt, 0, 1);
    CHECK(fp8_values(stage.stage()) != saved_fp8);
    tp::load_plan_checkpoint(dir, stage, opt, scaler, run);
    CHECK(run.step == 2);
    CHECK(stage.gather_parameters() == saved);
    CHECK(fp8_values(stage.stage()) == saved_fp8);
    train_steps<Fp8Model>(stage, opt, 2, 1);
    CHECK(stage.gather_parameters() == after_three); // bit for bit
    CHECK(fp8_values(stage.stage()) == after_three_fp8);
  });
  // Merged: the single-process model gets each stage's states where its layers are.
  if (world.rank() == 0) tp::merge_plan_checkpoint(dir, dir / "whole.tsr");
  world.barrier();
  {
    Fp8Model model(99);
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.precision = "fp8"};
    tessera::train::load_checkpoint(dir / "whole.tsr", model.parameters(), opt, scaler, run,
                                    model.fp8_states());
    CHECK(run.step == 2);
    const auto merged = values_by_name(model.parameters());
    for (const auto& [name, v] : saved) CHECK(merged.at(name) == v);
    const auto whole = fp8_values(model);
    REQUIRE(whole.size() >= before + saved_fp8.size());
    for (std::size_t k = 0; k < saved_fp8.size(); ++k) CHECK(whole[before + k] == saved_fp8[k]);
    // Without the fp8 states the merged file is refused (its fp8 records are left over).
    Fp8Model plain(99);
    CHECK_THROWS_WITH(
        tessera::train::load_checkpoint(dir / "whole.tsr", plain.parameters(), opt, scaler, run),
        Catch::Contains("fp8/0/"));
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

using V2 = tp::interleaved_1f1b<2>;
/// Four Linear layers of similar cost, so each of the four balanced chunks holds one (and fp8
/// states): rank 0's chunks 0 and 2 are then not one run of the model's states.
using Fp8Deep =
    nn::Sequential<nn::Linear<23, 32, fp8_delayed>, nn::ReLU, nn::Linear<32, 32, fp8_delayed>,
                   nn::GELU, nn::Linear<32, 32, fp8_delayed>, nn::ReLU,
                   nn::Linear<32, 10, fp8_delayed>>;

template <class Plan, class Stage>
auto make_sgd(Stage& stage) {
  const tessera::train::sgd sgd{.lr = 0.05f, .momentum = 0.9f};
  if constexpr (Plan::zero_stage > 0)
    return stage.make_optimizer(sgd);
  else
    return sgd;
}

template <class Plan>
void check_interleaved_checkpoint(const char* tag) {
  auto world = tp::mpi_communicator::world();
  if (world.size() != Plan::world_size) return;
  const fs::path dir = scratch_dir(tag);
  tp::mesh<Plan, tp::mpi_communicator> mesh(world);
  std::map<std::string, std::vector<float>> saved, after_three;
  std::vector<std::vector<float>> saved_fp8, after_three_fp8;
  // This rank's chunks: the fp8 states of the whole model before the chunk's first layer, and
  // the chunk's states when saved.
  std::vector<std::pair<std::size_t, std::vector<std::vector<float>>>> chunks;
  const tessera::train::run_state at_two{.step = 2, .epoch = 0, .data_seed = 9, .precision = "fp8"};
  tp::with_plan_stage<Plan, Fp8Deep, V2, M>(mesh, opts.seed, opts.bucket_bytes, [&](auto& stage) {
    static_assert(std::remove_cvref_t<decltype(stage)>::virtual_stages == 2);
    auto opt = make_sgd<Plan>(stage);
    tessera::train::static_scaler scaler;
    train_steps<Fp8Deep>(stage, opt, 0, 2);
    saved = stage.gather_parameters();
    saved_fp8 = fp8_values(stage.stage());
    Fp8Deep whole(1);
    [&]<int... c>(std::integer_sequence<int, c...>) {
      auto add = [&](auto& chunk) {
        using Chunk = std::remove_cvref_t<decltype(chunk)>;
        chunks.push_back({fp8_states_before<Chunk::begin>(whole), fp8_values(chunk)});
      };
      (add(stage.stage().template chunk<c>()), ...);
    }
    (std::make_integer_sequence<int, 2>{});
    tp::save_plan_checkpoint(dir, stage, opt, scaler, at_two);
    train_steps<Fp8Deep>(stage, opt, 2, 1);
    after_three = stage.gather_parameters();
    after_three_fp8 = fp8_values(stage.stage());
  });
  REQUIRE(chunks.size() == 2);
  CHECK(!chunks[0].second.empty());
  CHECK(!chunks[1].second.empty());
  // Model chunk 1 (rank 1's) has fp8 states, so rank 0's two chunks are not one run of the
  // model's states: what a merge by pipeline stage would get wrong.
  if (mesh.at.pipeline == 0) CHECK(chunks[1].first > chunks[0].first + chunks[0].second.size());
  // Restored into a differently seeded run that has trained a step: the same bits, and the
  // next step the uninterrupted run's.
  tp::with_plan_stage<Plan, Fp8Deep, V2, M>(mesh, 12345, opts.bucket_bytes, [&](auto& stage) {
    auto opt = make_sgd<Plan>(stage);
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.precision = "fp8"};
    train_steps<Fp8Deep>(stage, opt, 0, 1);
    CHECK(fp8_values(stage.stage()) != saved_fp8);
    tp::load_plan_checkpoint(dir, stage, opt, scaler, run);
    CHECK(run.step == 2);
    CHECK(stage.gather_parameters() == saved);
    CHECK(fp8_values(stage.stage()) == saved_fp8);
    train_steps<Fp8Deep>(stage, opt, 2, 1);
    CHECK(stage.gather_parameters() == after_three); // bit for bit
    CHECK(fp8_values(stage.stage()) == after_three_fp8);
  });
  // The same plan with one chunk per rank holds other layers: refused, naming both.
  tp::with_plan_stage<Plan, Fp8Deep, Kind, M>(mesh, 1, opts.bucket_bytes, [&](auto& stage) {
    auto opt = make_sgd<Plan>(stage);
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.precision = "fp8"};
    CHECK_THROWS_WITH(tp::load_plan_checkpoint(dir, stage, opt, scaler, run),
                      Catch::Contains("with 2 model chunk(s) per rank, not 1"));
  });
  // Merged: each chunk's parameters and fp8 states where its layers are in the whole model.
  if (world.rank() == 0) tp::merge_plan_checkpoint(dir, dir / "whole.tsr");
  world.barrier();
  {
    Fp8Deep model(99);
    tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    tessera::train::static_scaler scaler;
    tessera::train::run_state run{.precision = "fp8"};
    tessera::train::load_checkpoint(dir / "whole.tsr", model.parameters(), opt, scaler, run,
                                    model.fp8_states());
    CHECK(run.step == 2);
    CHECK(opt.steps() == 2);
    const auto merged = values_by_name(model.parameters());
    for (const auto& [name, v] : saved) CHECK(merged.at(name) == v);
    const auto whole = fp8_values(model);
    for (const auto& [before, states] : chunks) {
      INFO("the chunk whose layers follow " << before << " fp8 states of the model");
      REQUIRE(whole.size() >= before + states.size());
      for (std::size_t k = 0; k < states.size(); ++k) CHECK(whole[before + k] == states[k]);
    }
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

} // namespace

TEST_CASE("plan checkpoints: the interleaved schedule's chunks saved, restored and merged",
          "[parallel]") {
  check_interleaved_checkpoint<tp::plan<tp::tensor<2>, tp::pipeline<2>>>("v2t2p2");
  check_interleaved_checkpoint<tp::plan<tp::data<2, tp::zero<2>>, tp::pipeline<2>>>("v2z2d2p2");
  check_interleaved_checkpoint<tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>>("v2d2t2p2");
}

TEST_CASE("plan checkpoints: fp8 scaling states saved, restored and merged", "[parallel]") {
  check_fp8_checkpoint<tp::plan<tp::tensor<2>, tp::pipeline<2>>>("fp8t2p2");
  check_fp8_checkpoint<tp::plan<tp::data<2>, tp::tensor<2>>>("fp8d2t2");
  check_fp8_checkpoint<tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>>("fp8d2t2p2");
}

TEST_CASE("plan checkpoints with a sharded optimizer: ZeRO stages 1 and 2", "[parallel]") {
  check_zero_checkpoint<tp::plan<tp::data<2, tp::zero<1>>, tp::tensor<2>>,
                        tp::plan<tp::data<2, tp::zero<2>>, tp::tensor<2>>>("z1d2t2");
  check_zero_checkpoint<tp::plan<tp::data<2, tp::zero<2>>, tp::tensor<2>>,
                        tp::plan<tp::data<2, tp::zero<1>>, tp::tensor<2>>>("z2d2t2");
  check_zero_checkpoint<tp::plan<tp::data<2, tp::zero<2>>, tp::tensor<2>, tp::pipeline<2>>,
                        tp::plan<tp::data<2, tp::zero<1>>, tp::tensor<2>, tp::pipeline<2>>>(
      "z2d2t2p2");
}

TEST_CASE("plan checkpoints: save, restore, merge into one process", "[parallel]") {
  check_checkpoint<tp::plan<tp::tensor<2>, tp::pipeline<2>>>("t2p2");
  check_checkpoint<tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>>("d2t2p2");
}

TEST_CASE("plan checkpoints: a checkpoint of another plan is refused on every rank", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  if (world.size() != 4) return;
  const fs::path dir = scratch_dir("mismatch");
  tp::mesh<tp::plan<tp::tensor<2>, tp::pipeline<2>>, tp::mpi_communicator> a(world);
  tp::with_plan_stage<tp::plan<tp::tensor<2>, tp::pipeline<2>>, Model, Kind, M>(
      a, 1, opts.bucket_bytes, [&](auto& stage) {
        tessera::train::sgd opt{.lr = 0.05f};
        tp::save_plan_checkpoint(dir, stage, opt, tessera::train::static_scaler{}, {});
      });
  tp::mesh<tp::plan<tp::data<2>, tp::tensor<2>>, tp::mpi_communicator> b(world);
  tp::with_plan_stage<tp::plan<tp::data<2>, tp::tensor<2>>, Model, Kind, 1>(
      b, 1, opts.bucket_bytes, [&](auto& stage) {
        tessera::train::sgd opt{.lr = 0.05f};
        tessera::train::static_scaler scaler;
        tessera::train::run_state run;
        CHECK_THROWS_WITH(tp::load_plan_checkpoint(dir, stage, opt, scaler, run),
                          Catch::Contains("holds a run of plan(data=1, tensor=2, pipeline=2)"));
      });
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

TEST_CASE("plan checkpoints: check_plan_checkpoint_writable before training", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  const fs::path base = scratch_dir("writable");
  if (world.rank() == 0) fs::create_directories(base);
  world.barrier();
  // A new directory in an existing one, with or without a trailing separator, and an existing
  // directory: writable (every rank probes at once), and the check creates nothing.
  CHECK_NOTHROW(tp::check_plan_checkpoint_writable(base / "new"));
  CHECK_NOTHROW(tp::check_plan_checkpoint_writable((base / "new").string() + "/"));
  CHECK_NOTHROW(tp::check_plan_checkpoint_writable(base));
  CHECK_FALSE(fs::exists(base / "new"));
  world.barrier();
  CHECK(fs::is_empty(base)); // the probes are gone
  world.barrier();           // before rank 0 writes `file` below
  // A missing parent, and a file where the directory would go: refused, naming the path.
  CHECK_THROWS_WITH(tp::check_plan_checkpoint_writable(base / "missing" / "ck"),
                    Catch::Contains((base / "missing").string()) &&
                        Catch::Contains("does not exist"));
  if (world.rank() == 0) std::ofstream(base / "file") << "x";
  world.barrier();
  CHECK_THROWS_WITH(tp::check_plan_checkpoint_writable(base / "file"),
                    Catch::Contains((base / "file").string()) &&
                        Catch::Contains("exists and is not a directory"));
  world.barrier();
  if (world.rank() == 0) fs::remove_all(base);
}
