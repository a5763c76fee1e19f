// The interleaved 1F1B schedule (interleaved_1f1b<2>: two model chunks per pipeline rank,
// parallel/schedule.hpp) run by plan_stage: an MLP of seven layers (four Linear) cut into
// P V = 4 balanced chunks, rank s holding chunks s and s + 2, trained with M = 2 and 4
// micro-batches under the pipeline plans that fit the world, and compared parameter by
// parameter with the single-process run (plan_check.hpp). Run at 2, 4 and 8 ranks.
#include "plan_check.hpp"

using namespace tessera_test;

namespace {

constexpr int any = int(tessera::dyn);

using plans = std::tuple<tp::plan<tp::pipeline<2>>, tp::plan<tp::data<any>, tp::pipeline<2>>,
                         tp::plan<tp::tensor<2>, tp::pipeline<2>>,
                         tp::plan<tp::data<any>, tp::tensor<2>, tp::pipeline<2>>>;

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// 2 ranks: pipeline=2 and data<dyn>=1 x pipeline=2; 4: data=2 x pipeline=2, tensor=2 x
// pipeline=2, data<dyn>=1 x tensor=2 x pipeline=2; 8: the two data<dyn> plans.
int expected_plans(int n) {
  return n == 2 ? 2 : n == 4 ? 3 : n == 8 ? 2 : 0;
}

using V2 = tp::interleaved_1f1b<2>;
using stage0 = tp::plan_stage<tp::plan<tp::pipeline<2>>, DeepMLP<tessera::fp32>, V2, 2,
                              tp::mpi_communicator, 0>;
// Rank 0 holds chunks 0 and 2 of the four, rank 1 chunks 1 and 3 (the loss's).
static_assert(stage0::virtual_stages == 2 && stage0::bounds::value.size() == 5);
static_assert(stage0::bounds::value[0] == 0 && stage0::bounds::value[4] == 7);

} // namespace

TEST_CASE("interleaved 1F1B plans: MLP fp32, 2 micro-batches", "[parallel]") {
  const int ran = check_plans<DeepMLP<tessera::fp32>, V2, 2, 2, plans>(
      "interleaved MLP M=2", fp32_tolerance, {.global_batch = 16});
  CHECK(ran == expected_plans(world_size()));
}

TEST_CASE("interleaved 1F1B plans: MLP fp32, 4 micro-batches", "[parallel]") {
  const int ran = check_plans<DeepMLP<tessera::fp32>, V2, 4, 4, plans>(
      "interleaved MLP M=4", fp32_tolerance, {.global_batch = 16});
  CHECK(ran == expected_plans(world_size()));
}

// The data-parallel all-reduce overlaps the pipeline's backward: with one bucket per
// parameter (bucket_bytes 4), every bucket's all-reduce starts from mark_ready while the
// chunk's last backward still runs (none left for finish()), and the result still equals the
// single-process run.
template <class Kind, int M>
void check_overlap(const char* what) {
  using Plan = tp::plan<tp::data<any>, tp::pipeline<2>>;
  const run_options o{.global_batch = 16, .bucket_bytes = 4};
  auto world = tp::mpi_communicator::world();
  if (!Plan::fits(world.size())) return;
  const auto reference = train_reference<DeepMLP<tessera::fp32>>(o);
  bucket_counts counts;
  const auto got = train_plan<DeepMLP<tessera::fp32>, Plan, Kind, M>(world, o, &counts);
  INFO(what);
  REQUIRE(counts.present);
  // One bucket per parameter: every rank holds a Linear layer's weight and bias at least, two
  // under the interleaved schedule (a Linear in each of its two chunks).
  CHECK(counts.total >= (tp::virtual_stages_v<Kind> == 2 ? 4u : 2u));
  CHECK(counts.overlapped == counts.total);
  for (const auto& [name, values] : got) {
    REQUIRE(reference.count(name) == 1);
    for (std::size_t i = 0; i < values.size(); ++i)
      CHECK(std::fabs(values[i] - reference.at(name)[i]) <= fp32_tolerance);
  }
}

TEST_CASE("pipeline plans start the gradient all-reduce during backward", "[parallel]") {
  check_overlap<V2, 4>("interleaved_1f1b<2>, M = 4");
  check_overlap<tp::one_f_one_b, 4>("1F1B, M = 4");
  check_overlap<tp::gpipe, 2>("GPipe, M = 2");
}

namespace {
/// plan_stage::evaluate under Plan on schedule Kind against the single-process model on the
/// same 16 samples (the initial weights): the loss sum within fp32 rounding of the tensor
/// split's sums, the same correct predictions and count. False if Plan does not fit.
template <class Plan, class Kind, int M>
bool check_evaluate(const char* what) {
  using Model = DeepMLP<tessera::fp32>;
  auto world = tp::mpi_communicator::world();
  if (!Plan::fits(world.size())) return false;
  const run_options o{.global_batch = 16};
  Kokkos::DefaultExecutionSpace exec;
  nn::SoftmaxCrossEntropy loss;
  Model model(o.seed);
  auto x = make_input<Model>(o.global_batch);
  Kokkos::View<int*> labels("labels", o.global_batch);
  fill_batch(0, 0, x, labels);
  const auto y = model.forward(exec, x);
  const double ref_loss = double(loss.forward(exec, y, labels)) * o.global_batch;
  tessera::index_t ref_correct = 0;
  for (int i = 0; i < o.global_batch; ++i) {
    int best = 0;
    for (int j = 1; j < 10; ++j)
      if (y(i, j) > y(i, best)) best = j;
    ref_correct += best == labels(i);
  }
  tp::mesh<Plan, tp::mpi_communicator> mesh(world);
  tp::with_plan_stage<Plan, Model, Kind, M>(mesh, o.seed, o.bucket_bytes, [&](auto& stage) {
    const int share = o.global_batch / mesh.shape.data, first = mesh.at.data * share;
    auto xs = make_input<Model>(share);
    Kokkos::View<int*> ls("labels", share);
    fill_batch(0, first, xs, ls);
    const tp::evaluation e = stage.evaluate(exec, xs, ls, loss);
    INFO(what << " " << Plan::name());
    CHECK(e.loss_sum == Approx(ref_loss).epsilon(1e-5));
    CHECK(e.correct == ref_correct);
    CHECK(e.count == o.global_batch);
  });
  return true;
}
} // namespace

TEST_CASE("interleaved 1F1B plans: evaluate equals the single process", "[parallel]") {
  // The batch goes around the ranks once per chunk; one_f_one_b's evaluate beside it.
  int interleaved = 0, plain = 0;
  [&]<class... P>(std::tuple<P...>*) {
    interleaved = (int(check_evaluate<P, V2, 2>("interleaved")) + ...);
    plain = (int(check_evaluate<P, tp::one_f_one_b, 2>("one_f_one_b")) + ...);
  }(static_cast<plans*>(nullptr));
  CHECK(interleaved == expected_plans(world_size()));
  CHECK(plain == interleaved);
}
