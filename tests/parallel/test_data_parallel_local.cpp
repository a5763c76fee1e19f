// gradient_buckets without MPI: bucket layout, errors, and data=1 on the single-process backend.
#include "dp_run.hpp"

#include <tessera/parallel/communicator.hpp>

#include <catch2/catch.hpp>

namespace tp = tessera::parallel;
using tessera_test::dp_model;

TEST_CASE("gradient_buckets: buckets fill in reverse parameter order up to bucket_bytes",
          "[parallel]") {
  dp_model m(1);
  // Sizes in bytes: w1 11*13*4 = 572, b1 44, w2 5*11*4 = 220, b2 20; reverse order b2 w2 b1 w1.
  using B = tp::gradient_buckets<tp::single_process_communicator>;
  const B one_each(tp::single_process_communicator{}, m.parameters(), 1);
  REQUIRE(one_each.bucket_count() == 4);
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(one_each.bucket_parameters(i) == std::vector<std::size_t>{3 - i});
  const B mixed(tp::single_process_communicator{}, m.parameters(), 200);
  REQUIRE(mixed.bucket_count() == 2); // 20 + 220 >= 200 closes the first; 44 + 572 the second
  CHECK(mixed.bucket_parameters(0) == std::vector<std::size_t>{3, 2});
  CHECK(mixed.bucket_parameters(1) == std::vector<std::size_t>{1, 0});
  const B single(tp::single_process_communicator{}, m.parameters(), 1 << 20);
  CHECK(single.bucket_count() == 1);
  CHECK(single.bytes_per_step() == (572 + 44 + 220 + 20));
  const tp::gradient_buckets<tp::single_process_communicator,
                             Kokkos::DefaultExecutionSpace::memory_space, tessera::bfloat16>
      half(tp::single_process_communicator{}, m.parameters(), 1 << 20);
  CHECK(half.bytes_per_step() == (572 + 44 + 220 + 20) / 2);
}

TEST_CASE("gradient_buckets: bad use throws with the parameter's name", "[parallel]") {
  dp_model m(1), other(2);
  Kokkos::DefaultExecutionSpace exec;
  CHECK_THROWS_WITH(tp::gradient_buckets(tp::single_process_communicator{}, m.parameters(), 0),
                    Catch::Contains("bucket_bytes must be positive"));
  tp::gradient_buckets dp(tp::single_process_communicator{}, m.parameters(), 64);
  dp.mark_ready(exec, m.b2);
  CHECK_THROWS_WITH(dp.mark_ready(exec, m.b2), Catch::Contains("'2.bias' was marked twice"));
  CHECK_THROWS_WITH(dp.mark_ready(exec, other.w1),
                    Catch::Contains("'0.weight' is not one of the parameters"));
  auto twice = boost::hana::make_tuple(m.w1, m.w1);
  CHECK_THROWS_WITH(tp::gradient_buckets(tp::single_process_communicator{}, twice, 64),
                    Catch::Contains("share a gradient buffer"));
}

TEST_CASE("gradient_buckets: a group of one leaves gradients unchanged", "[parallel]") {
  // data=1 runs without MPI and equals the plain loop (one term: the average is exact).
  dp_model plain(2024);
  for (int step = 0; step < tessera_test::dp_steps; ++step) {
    std::vector<float> x(std::size_t(tessera_test::dp_global_batch * tessera_test::dp_in));
    std::vector<int> labels(static_cast<std::size_t>(tessera_test::dp_global_batch));
    for (int s = 0; s < tessera_test::dp_global_batch; ++s)
      tessera_test::sample<tessera_test::dp_in, tessera_test::dp_out>(
          step, s, &x[std::size_t(s * tessera_test::dp_in)], labels[std::size_t(s)]);
    plain.forward(x, labels);
    plain.backward_layer2();
    plain.backward_layer1();
    plain.sgd(tessera_test::dp_lr);
  }
  std::vector<float> expected;
  boost::hana::for_each(plain.parameters(), [&](const auto& p) {
    expected.insert(expected.end(), p.value.data(), p.value.data() + p.size());
  });
  for (std::size_t bucket : {std::size_t(1), std::size_t(100), std::size_t(1) << 20})
    CHECK(tessera_test::run_data_parallel(tp::single_process_communicator{}, bucket) == expected);
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

TEST_CASE("consistent_step on one process follows the local check", "[parallel]") {
  Kokkos::DefaultExecutionSpace exec;
  dp_model m(1);
  tp::single_process_communicator c;
  recording_optimizer opt;
  scripted_scaler scaler;
  CHECK(tp::consistent_step(exec, opt, scaler, m.parameters(), c));
  scaler.local_finite = false;
  CHECK_FALSE(tp::consistent_step(exec, opt, scaler, m.parameters(), c));
  CHECK(opt.steps == 1);
  CHECK(scaler.updates == std::vector<bool>{true, false});
}
