// FashionCNN in bf16 under the eight plans, GPipe with 2 micro-batches. See plan_check.hpp.
#include "plan_check.hpp"

using namespace tessera_test;

TEST_CASE("plans: FashionCNN bf16", "[parallel]") {
  check_all_plans<FashionCNN<tessera::bf16>, tp::gpipe, 2, 2>("FashionCNN bf16", bf16_tolerance,
                                                              {.global_batch = 8});
}
