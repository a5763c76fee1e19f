// The MLP (Linear 23-36, ReLU, Linear 36-20, GELU, Linear 20-10) under the eight plans, fp32
// on the 1F1B schedule with 4 micro-batches, bf16 on GPipe with 2 (1 micro-batch without a
// pipeline: the path where gradient all-reduces overlap backward). See plan_check.hpp.
#include "plan_check.hpp"

using namespace tessera_test;

TEST_CASE("plans: MLP fp32", "[parallel]") {
  check_all_plans<MLP<tessera::fp32>, tp::one_f_one_b, 4, 4>("MLP fp32", fp32_tolerance,
                                                             {.global_batch = 16});
}
TEST_CASE("plans: MLP bf16", "[parallel]") {
  check_all_plans<MLP<tessera::bf16>, tp::gpipe, 1, 2>("MLP bf16", bf16_tolerance,
                                                       {.global_batch = 16});
}
