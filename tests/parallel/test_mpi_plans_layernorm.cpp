// nn::LayerNorm (one file, nn/layernorm.hpp) under every plan: the MLP of
// test_mpi_plans_mlp.cpp with a LayerNorm after its first Linear,
//   Linear 23-36, LayerNorm 36, ReLU, Linear 36-20, GELU, Linear 20-10,
// trained under each of the eight plans of the world's size and compared, parameter by
// parameter, with the single-process run (plan_check.hpp). LayerNorm declares no tensor split,
// so the split replicates it (and Linear 0, whose partner it separates) and pairs Linear 3 with
// Linear 5; the balanced pipeline cut reads its declared FLOPs.
#include "plan_check.hpp"

#include <tessera/nn/activation.hpp>
#include <tessera/nn/layernorm.hpp>

#include <mpi.h>

#include <algorithm>
#include <vector>

using namespace tessera_test;

namespace {

template <class P>
using LNMLP = nn::Sequential<nn::Linear<23, 36, P>, nn::LayerNorm<36>, nn::ReLU,
                             nn::Linear<36, 20, P>, nn::GELU, nn::Linear<20, 10, P>>;

// The split reads LayerNorm's (absent) declaration: replicate, which breaks the pair 0-3.
constexpr auto roles = tp::tensor_split_roles<LNMLP<tessera::fp32>>;
static_assert(roles[0] == tp::split_role::replicate && roles[1] == tp::split_role::replicate &&
              roles[3] == tp::split_role::column && roles[5] == tp::split_role::row);
// The pipeline reads its declared FLOPs: 8 per element of (B, 36). The balanced 2-stage cut
// {0, 2, 6}: stage 0 = Linear 0 + LayerNorm (1656 + 288 = 1944), stage 1 the rest (1896).
static_assert(tp::layer_costs<LNMLP<tessera::fp32>>()[1] == 8.0 * 36);
static_assert(tp::stage_bounds<LNMLP<tessera::fp32>, 2>::value[1] == 2);

} // namespace

TEST_CASE("plans: MLP with LayerNorm fp32", "[parallel][layernorm]") {
  check_all_plans<LNMLP<tessera::fp32>, tp::one_f_one_b, 4, 4>("LayerNorm MLP fp32", fp32_tolerance,
                                                               {.global_batch = 16});
}

TEST_CASE("plans: MLP with LayerNorm bf16", "[parallel][layernorm]") {
  check_all_plans<LNMLP<tessera::bf16>, tp::gpipe, 1, 2>("LayerNorm MLP bf16", bf16_tolerance,
                                                         {.global_batch = 16});
}

TEST_CASE("plans: a replicated LayerNorm stays identical on the ranks of its tensor group",
          "[parallel][layernorm]") {
  auto world = tp::mpi_communicator::world();
  if (world.size() != 2) return;
  const auto got = train_plan<LNMLP<tessera::fp32>, tp::plan<tp::tensor<2>>, tp::gpipe, 1>(
      world, {.global_batch = 16});
  for (const char* name : {"1.weight", "1.bias"}) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    const std::vector<float>& mine = got.at(name);
    std::vector<float> lo(mine.size()), hi(mine.size());
    MPI_Allreduce(mine.data(), lo.data(), int(mine.size()), MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(mine.data(), hi.data(), int(mine.size()), MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi);
    // ... and trained: gamma moved away from its initial 1 (a test that cannot fail otherwise).
    if (name[2] == 'w')
      CHECK(std::any_of(mine.begin(), mine.end(), [](float v) { return v != 1.f; }));
  }
}
