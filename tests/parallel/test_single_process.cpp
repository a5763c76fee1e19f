// single_process_communicator: the size-1 backend every plan of world size 1 runs on.
#include <tessera/parallel/mesh.hpp>

#include <catch2/catch.hpp>

#include <vector>

namespace tp = tessera::parallel;
using tessera::bfloat16;

TEST_CASE("single process: collectives are identities", "[parallel]") {
  tp::single_process_communicator c;
  CHECK(c.size() == 1);
  CHECK(c.rank() == 0);
  std::vector<float> x = {1.5f, -2.25f, 3.0f}, y(3);
  const std::vector<float> x0 = x;
  c.all_reduce_sum(x.data(), 3);
  CHECK(x == x0);
  c.iall_reduce_sum(x.data(), 3).wait();
  CHECK(x == x0);
  c.all_gather(x.data(), y.data(), 3);
  CHECK(y == x0);
  std::fill(y.begin(), y.end(), 0.0f);
  c.reduce_scatter_sum(x.data(), y.data(), 3);
  CHECK(y == x0);
  c.broadcast(x.data(), 3, 0);
  CHECK(x == x0);
  std::vector<bfloat16> b = {bfloat16::from_float(0.1f), bfloat16::from_float(-3.0f)};
  const std::vector<bfloat16> b0 = b;
  c.all_reduce_sum(b.data(), 2);
  CHECK(b == b0);
  CHECK(c.all_of(true));
  CHECK_FALSE(c.all_of(false));
  CHECK_THROWS_WITH(c.broadcast(x.data(), 3, 1),
                    Catch::Contains("broadcast") && Catch::Contains("rank 1 is outside"));
  CHECK_THROWS_WITH(c.all_reduce_sum(x.data(), -2), Catch::Contains("-2 is negative"));
}

TEST_CASE("single process: messages to itself, in order per tag", "[parallel]") {
  tp::single_process_communicator c;
  std::vector<float> got(2);
  tp::request pending = c.irecv(got.data(), 2, 0, 5); // posted before the send
  std::vector<float> first = {1, 2}, second = {3, 4};
  c.send(first.data(), 2, 0, 5);
  c.isend(second.data(), 2, 0, 5).wait();
  first = {9, 9}; // the message was copied at send
  pending.wait();
  CHECK(got == std::vector<float>{1, 2});
  c.recv(got.data(), 2, 0, 5);
  CHECK(got == std::vector<float>{3, 4});
  CHECK_THROWS_WITH(c.recv(got.data(), 2, 0, 5), Catch::Contains("no message with tag 5"));
  c.send(first.data(), 2, 0, 6);
  CHECK_THROWS_WITH(c.recv(got.data(), 1, 0, 6), Catch::Contains("has 8 bytes"));
  // A copy shares the mailbox (copies are handles); a split is a fresh process group.
  tp::single_process_communicator copy = c;
  copy.send(second.data(), 2, 0, 7);
  c.recv(got.data(), 2, 0, 7);
  CHECK(got == second);
  CHECK(c.split(3, 0).size() == 1);
}

TEST_CASE("single process: meshes of world size 1 run, others are refused", "[parallel]") {
  tp::mesh<tp::plan<>, tp::single_process_communicator> m{tp::single_process_communicator{}};
  CHECK(m.at == tp::coordinates_t{});
  CHECK(m.data.size() == 1);
  tp::mesh<tp::plan<tp::data<1>, tp::tensor<1>>, tp::single_process_communicator> ones{
      tp::single_process_communicator{}};
  CHECK(ones.tensor.size() == 1);
  using two = tp::plan<tp::tensor<2>>;
  CHECK_THROWS_WITH(
      (tp::mesh<two, tp::single_process_communicator>{tp::single_process_communicator{}}),
      Catch::Contains("plan(data=1, tensor=2, pipeline=1) needs 2 processes but "
                      "the world has 1 (launch it with mpiexec -n 2)"));
}
