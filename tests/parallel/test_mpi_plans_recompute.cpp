// nn::Recompute segments (nn/recompute.hpp) under the plans: the MLP of nn_run.hpp with its
// first two Linear blocks each one Recompute segment, trained under every plan that fits the
// world (data, tensor, pipeline in {1, 2}), against the same model's single-process run (see
// plan_check.hpp). The segments are whole pipeline layers (balanced by their declared FLOPs),
// split by the tensor split as the Linear pair they hold (parallel::TensorParallelRecompute:
// the first segment's Linear column-, the second's row-parallel), re-run by the pipeline for
// micro-batches that are not the stage's latest, and each re-runs its own forward in backward.
#include "plan_check.hpp"

using namespace tessera_test;

namespace {
template <class P>
using RecomputeMLP = nn::Sequential<nn::Recompute<nn::Sequential<nn::Linear<23, 36, P>, nn::ReLU>>,
                                    nn::Recompute<nn::Sequential<nn::Linear<36, 20, P>, nn::GELU>>,
                                    nn::Linear<20, 10, P>>;
// The tensor split pairs the two segments as their Linear layers (a segment of one splittable
// layer among per-feature layers) and replicates the last Linear.
static_assert(
    std::is_same_v<
        tp::tensor_split_t<RecomputeMLP<tessera::fp32>, 2>,
        nn::Sequential<
            tp::TensorParallelRecompute<
                2, nn::Sequential<tp::ColumnParallelLinear<23, 36, 2, tessera::fp32>, nn::ReLU>>,
            tp::TensorParallelRecompute<
                2, nn::Sequential<tp::RowParallelLinear<36, 20, 2, tessera::fp32>, nn::GELU>>,
            nn::Linear<20, 10, tessera::fp32>>>);
// A segment with a replicated layer (LayerNorm) is left whole.
static_assert(std::is_same_v<
              tp::tensor_split_t<
                  nn::Sequential<nn::Recompute<nn::Sequential<nn::Linear<8, 8>, nn::LayerNorm<8>>>,
                                 nn::Linear<8, 8>>,
                  2>,
              nn::Sequential<nn::Recompute<nn::Sequential<nn::Linear<8, 8>, nn::LayerNorm<8>>>,
                             nn::Linear<8, 8>>>);
} // namespace

TEST_CASE("plans: MLP with Recompute segments fp32", "[parallel]") {
  check_all_plans<RecomputeMLP<tessera::fp32>, tp::one_f_one_b, 4, 4>(
      "Recompute MLP fp32", fp32_tolerance, {.global_batch = 16});
}
TEST_CASE("plans: MLP with Recompute segments bf16", "[parallel]") {
  check_all_plans<RecomputeMLP<tessera::bf16>, tp::gpipe, 1, 2>(
      "Recompute MLP bf16", bf16_tolerance, {.global_batch = 16});
}
