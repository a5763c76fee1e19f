// The tiny character GPT of test_mpi_plans_gpt.cpp under every plan in bf16 and in fp8 (hybrid,
// delayed scaling): the Linear layers and the attention's QKV and output projections in the
// compute precision, fp32 masters; the embeddings, LayerNorms, softmax and loss in fp32.
//
// Bounds. On one rank without splits the plan runs the single process's arithmetic: bit for
// bit. Elsewhere the plans sum in another order (see test_mpi_plans_gpt.cpp), and an fp32-ulp
// difference can flip a rounding to bf16 of an activation or gradient (2^-8 relative) or, in
// fp8, of an operand (E4M3 2^-4, E5M2 2^-3); the scales come from amax histories that
// parallel/fp8_sync.hpp keeps equal on the ranks sharing a tensor (checked bit for bit here)
// and equal to the single process's (the output gradients' times D, a power of two: the same
// payloads), so only such flips remain. A flip changes the updates it feeds by at most its
// relative size, so the weights lie within that fraction of how far the reference's weights
// moved (measured on Zen 5: up to 0.19 in 3 steps of lr 0.05, momentum 0.9): bf16 within 2^-7
// of it (measured: 3.9e-4, under 1.5e-3), fp8 within 2^-3 (measured: 6.0e-3, under 0.025). A
// missed 1/D or 1/M, a wrong shard or an unreduced partial sum changes every update by 50% or
// more (>~ 0.1 here) and breaks the one-rank identity; a missed amax reduction is what the
// state check catches.
#include "gpt_run.hpp"

using namespace tessera_test;
using namespace tessera_test::gpt;

TEST_CASE("plans: tiny character GPT bf16 against the single process", "[parallel][gpt]") {
  const int ran = check_gpt_plans<tessera::bf16>({.global_batch = 8, .steps = 3}, 0, 1.f / 128);
  CHECK(ran == plans_for(tp::mpi_communicator::world().size()));
}

TEST_CASE("plans: tiny character GPT fp8 against the single process", "[parallel][gpt]") {
  using fp8_delayed = nn::fp8<tessera::train::delayed_scaling>;
  const int ran = check_gpt_plans<fp8_delayed>({.global_batch = 8, .steps = 3}, 0, 1.f / 8);
  CHECK(ran == plans_for(tp::mpi_communicator::world().size()));
}
