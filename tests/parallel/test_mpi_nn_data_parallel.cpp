// Data parallelism with tessera::nn models (MLP and FashionCNN, fp32 and bf16): N ranks each on
// 1/N of the global batch end 5 SGD-momentum steps with the master weights of one process on
// the whole batch, within a tolerance derived below. The gradients of each bucket are reduced
// while the earlier layers still run backward (backward_overlapped).
#include "nn_run.hpp"

#include <tessera/parallel/mpi.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

namespace tp = tessera::parallel;
using namespace tessera_test;

namespace {
float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

template <class Model>
void check_equivalence(const char* what, float tolerance, const run_options& o) {
  auto world = tp::mpi_communicator::world();
  const auto reference = train_data_parallel<Model>(tp::single_process_communicator{}, o);
  const auto got = train_data_parallel<Model>(world, o);
  const float diff = max_difference(got, reference);
  if (world.rank() == 0) WARN(what << ", " << world.size() << " ranks: max |w - w_ref| = " << diff);
  CHECK(diff <= tolerance);
}
} // namespace

// Tolerances. fp32: the runs differ only in the order of the fp32 sums over the batch (per
// rank, across ranks, times 1/N, versus one sum; and gemm's K = batch blocking): each gradient
// moves by a few 2^-24 relative; 5 steps of lr 0.05 with momentum (a gradient counted up to
// 1 + 0.9 + ... < 5 times) keep weight differences ~1e-7. 1e-5 is far below what a real
// mistake does (a missed 1/N or a bucket not reduced moves weights by lr |g| ~ 1e-3).
// bf16: weights are cast to bf16 at each forward, so a master that differs by an fp32 ulp can
// round to the neighbouring bf16 (2^-8 relative); such a flip shifts the gradients it touches
// by ~2^-8 |g|, and the next steps carry lr (1 + 0.9 + ...) 2^-8 |g| <= 5 * 0.05 * 2^-8 ~ 1e-3
// |g| into the masters; with |g| <~ 0.5 here, 5e-4. Measured: <= 3e-8 (no flip happened in
// these runs) for 2 and 8 ranks.
TEST_CASE("nn data parallel: MLP fp32", "[parallel]") {
  check_equivalence<MLP<tessera::fp32>>("MLP fp32", 1e-5f, {.global_batch = 24});
}
TEST_CASE("nn data parallel: MLP bf16", "[parallel]") {
  check_equivalence<MLP<tessera::bf16>>("MLP bf16", 5e-4f, {.global_batch = 24});
}
TEST_CASE("nn data parallel: FashionCNN fp32", "[parallel]") {
  check_equivalence<FashionCNN<tessera::fp32>>("FashionCNN fp32", 1e-5f, {.global_batch = 8});
}
TEST_CASE("nn data parallel: FashionCNN bf16", "[parallel]") {
  check_equivalence<FashionCNN<tessera::bf16>>("FashionCNN bf16", 5e-4f, {.global_batch = 8});
}
