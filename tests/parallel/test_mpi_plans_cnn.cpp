// FashionCNN (examples/train_fashion_mnist.cpp) under the eight plans in fp32: 1F1B with 2
// micro-batches on a pipeline, 1 micro-batch (overlapped all-reduces) without. See
// plan_check.hpp.
#include "plan_check.hpp"

using namespace tessera_test;

TEST_CASE("plans: FashionCNN fp32", "[parallel]") {
  check_all_plans<FashionCNN<tessera::fp32>, tp::one_f_one_b, 1, 2>(
      "FashionCNN fp32", fp32_tolerance, {.global_batch = 8});
}
