// Data parallelism over MPI: N ranks, each on 1/N of the global batch, end 5 SGD steps with the
// master weights of one process on the whole batch, within a tolerance derived below.
#include "dp_run.hpp"

#include <tessera/parallel/mesh.hpp>
#include <tessera/parallel/mpi.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

namespace tp = tessera::parallel;

namespace {
// Largest |a - b| over all parameters.
float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}
} // namespace

TEST_CASE("data parallel fp32: N ranks equal one process on the global batch", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  const std::vector<float> reference =
      tessera_test::run_data_parallel(tp::single_process_communicator{}, 1 << 20);
  // Bucket sizes: one per parameter, two buckets, everything in one.
  for (std::size_t bucket_bytes : {std::size_t(1), std::size_t(200), std::size_t(1) << 20}) {
    INFO(world.size() << " ranks, bucket_bytes " << bucket_bytes);
    const std::vector<float> got = tessera_test::run_data_parallel(world, bucket_bytes);
    // Tolerance: the runs differ only in the order of the fp32 sums over the 24 samples
    // (per rank, then across ranks, then * 1/N, vs one sum / 24); each gradient then differs
    // by a few units of 2^-24 times the sum of |terms| (O(1) here), and 5 steps of lr 0.5
    // carry that to the weights. Measured: <= 1.2e-7 (2, 3 and 8 ranks); 1e-5 leaves a margin
    // of ~80x, while a wrong average (a missed 1/N, a bucket not reduced) moves weights by
    // ~lr |g| >= 1e-2.
    const float diff = max_difference(got, reference);
    WARN("max |w - w_reference| = " << diff);
    CHECK(diff <= 1e-5f);
    // All replicas agree: the spread across ranks of every weight.
    std::vector<float> lo = got, hi = got;
    MPI_Allreduce(MPI_IN_PLACE, lo.data(), int(lo.size()), MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, hi.data(), int(hi.size()), MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(max_difference(lo, hi) <= 1e-6f);
  }
}

TEST_CASE("data parallel bf16 wire: within bf16 rounding of the fp32 run", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  const std::vector<float> reference =
      tessera_test::run_data_parallel(tp::single_process_communicator{}, 1 << 20);
  const std::vector<float> got = tessera_test::run_data_parallel<tessera::bfloat16>(world, 256);
  // Each step rounds every rank's gradient to bf16 (relative 2^-9) and the fp32 sum to bf16
  // again (2^-9): gradients off by <= 2^-8 |g|. With |g| <= 1 (softmax CE on inputs in
  // [-1, 1), weights ~0.5), 5 steps of lr 0.5 move weights by <= 5 * 0.5 * 2^-8 ~ 1e-2 (before
  // any step-to-step growth). Measured: <= 8e-4 (2, 3 and 8 ranks). The bound is the same for
  // one rank: the rounding to bf16 happens anyway.
  const float diff = max_difference(got, reference);
  WARN("bf16 wire: max |w - w_reference| = " << diff);
  CHECK(diff <= 1e-2f);
  CHECK(diff > 0.0f); // the gradients really did travel as bf16
}

TEST_CASE("data parallel on a mesh: the data group of plan<data<N>>", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  auto check = [&](auto plan_type) {
    using P = typename decltype(plan_type)::type;
    if (world.size() != P::world_size) return;
    tp::mesh<P, tp::mpi_communicator> m(world);
    const auto reference =
        tessera_test::run_data_parallel(tp::single_process_communicator{}, 1 << 20);
    CHECK(max_difference(tessera_test::run_data_parallel(m.data, 64), reference) <= 1e-5f);
  };
  check(boost::hana::type_c<tp::plan<tp::data<2>>>);
  check(boost::hana::type_c<tp::plan<tp::data<3>>>);
  check(boost::hana::type_c<tp::plan<tp::data<8>>>);
}

namespace {
struct recording_optimizer {
  int steps = 0;
  template <class E, class P>
  void step(const E&, const P&) {
    ++steps;
  }
};
struct scripted_scaler {
  bool local_finite = true;
  std::vector<bool> updates;
  template <class E, class P>
  bool unscale_and_check(const E&, const P&) {
    return local_finite;
  }
  void update(bool finite) { updates.push_back(finite); }
};
} // namespace

TEST_CASE("consistent_step: one rank's inf skips the step on every rank", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  Kokkos::DefaultExecutionSpace exec;
  tessera_test::dp_model m(1);
  recording_optimizer opt;
  scripted_scaler scaler;
  CHECK(tp::consistent_step(exec, opt, scaler, m.parameters(), world));
  for (int culprit = 0; culprit < world.size(); ++culprit) {
    scaler.local_finite = world.rank() != culprit;
    CHECK_FALSE(tp::consistent_step(exec, opt, scaler, m.parameters(), world));
  }
  CHECK(opt.steps == 1);
  CHECK(scaler.updates.size() == std::size_t(world.size()) + 1);
  CHECK(std::count(scaler.updates.begin(), scaler.updates.end(), false) == world.size());
}
