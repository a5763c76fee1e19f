// Plans composed of data and pipeline splits, run on 1, 2 or 4 ranks of the world (the other
// ranks idle in this test case): after 5 steps every rank's parameters equal, by name, the
// single-process run on the same global batch.
#include "nn_run.hpp"

#include <tessera/parallel/mpi.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

namespace tp = tessera::parallel;
using namespace tessera_test;

namespace {

template <class Model, class Plan, class Kind, int M>
void check_plan(const char* what, float tolerance, const run_options& o) {
  auto world = tp::mpi_communicator::world();
  if (world.size() != Plan::world_size) return; // CTest runs this program once per plan size
  const auto reference = train_reference<Model>(o);
  const auto got = train_plan<Model, Plan, Kind, M>(world, o);
  float diff = 0;
  for (const auto& [name, values] : got) {
    const auto& ref = reference.at(name);
    REQUIRE(ref.size() == values.size());
    for (std::size_t i = 0; i < ref.size(); ++i)
      diff = std::max(diff, std::fabs(ref[i] - values[i]));
  }
  // Every parameter lives on some rank: the names of all ranks together are the model's.
  int mine = int(got.size()), total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == int(reference.size()) * Plan::data_size * Plan::tensor_size);
  float worst = diff;
  MPI_Allreduce(&diff, &worst, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank() == 0) WARN(what << " " << Plan::name() << ": max |w - w_ref| = " << worst);
  CHECK(diff <= tolerance);
}

template <class Plan>
void check_all(const char* kind_name) {
  // Tolerances as in test_mpi_nn_data_parallel.cpp (the sums over micro-batches are one more
  // reordering of the same fp32 terms).
  (void)kind_name;
  check_plan<MLP<tessera::fp32>, Plan, tp::one_f_one_b, 4>("MLP fp32 1F1B", 1e-5f,
                                                           {.global_batch = 16});
  check_plan<MLP<tessera::fp32>, Plan, tp::gpipe, 2>("MLP fp32 GPipe", 1e-5f, {.global_batch = 16});
  check_plan<MLP<tessera::bf16>, Plan, tp::one_f_one_b, 4>("MLP bf16 1F1B", 5e-4f,
                                                           {.global_batch = 16});
  check_plan<FashionCNN<tessera::fp32>, Plan, tp::one_f_one_b, 2>("FashionCNN fp32 1F1B", 1e-5f,
                                                                  {.global_batch = 8});
  check_plan<FashionCNN<tessera::bf16>, Plan, tp::gpipe, 2>("FashionCNN bf16 GPipe", 5e-4f,
                                                            {.global_batch = 8});
}

} // namespace

TEST_CASE("plan (1,1,1)", "[parallel]") {
  check_all<tp::plan<>>("");
}
TEST_CASE("plan (2,1,1)", "[parallel]") {
  check_all<tp::plan<tp::data<2>>>("");
}
TEST_CASE("plan (1,1,2)", "[parallel]") {
  check_all<tp::plan<tp::pipeline<2>>>("");
}
TEST_CASE("plan (2,1,2)", "[parallel]") {
  check_all<tp::plan<tp::data<2>, tp::pipeline<2>>>("");
}
