// A job in which one rank fails, run under mpiexec -n 2 by check_rank_failure.cmake, which
// checks that the whole job ends promptly, nonzero, with that rank's message:
//   throw   rank 1 throws inside abort_on_error while rank 0 waits in an all-reduce;
//   unwind  rank 1 throws out of the scope of mpi_environment (its destructor aborts the job);
//   stall   the communicator has a 1 s collective timeout; rank 1 sleeps 60 s instead of
//           joining an all-reduce (a stopped rank); rank 0 names it and aborts the job;
//   stall3  as stall on 3 ranks, rank 2 stalls: ranks 0 and 1 both wait, and the census names
//           rank 2 only;
//   ok      the timeout is on, nobody stalls: every collective completes with the right values.
#include <tessera/parallel/mpi.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

namespace tp = tessera::parallel;

namespace {

float sum_of_ranks(tp::mpi_communicator& world) {
  float v = float(world.rank() + 1);
  world.all_reduce_sum(&v, 1);
  return v;
}

int stall(int stalled) {
  auto world = tp::mpi_communicator::world();
  world.set_collective_timeout(1.0);
  world.barrier();
  if (world.rank() == stalled) std::this_thread::sleep_for(std::chrono::seconds(60));
  sum_of_ranks(world);
  std::fprintf(stderr, "rank %d: the all-reduce completed, which it must not\n", world.rank());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "unwind") {
    try {
      tp::mpi_environment mpi(argc, argv);
      auto world = tp::mpi_communicator::world();
      if (world.rank() == 1) throw std::runtime_error("rank 1 failed on purpose");
      sum_of_ranks(world);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "not reached with 2 ranks: %s\n", e.what());
      return 1;
    }
  }
  tp::mpi_environment mpi(argc, argv);
  if (mode == "throw")
    return tp::abort_on_error("rank_failure", [] {
      auto world = tp::mpi_communicator::world();
      if (world.rank() == 1) throw tessera::value_error("rank 1 failed on purpose");
      sum_of_ranks(world);
      return 0;
    });
  if (mode == "stall") return stall(1);
  if (mode == "stall3") return stall(2);
  if (mode == "ok") {
    auto world = tp::mpi_communicator::world();
    world.set_collective_timeout(5.0);
    const int n = world.size();
    bool good = world.collective_timeout() == 5.0;
    for (int k = 0; k < 50; ++k) {
      good = good && sum_of_ranks(world) == float(n * (n + 1) / 2);
      float b = float(world.rank() == 0 ? 42 + k : -1);
      world.broadcast(&b, 1, 0);
      good = good && b == float(42 + k);
      std::vector<float> mine{float(world.rank())}, all(std::size_t(n), -1.f);
      world.all_gather(mine.data(), all.data(), 1);
      for (int r = 0; r < n; ++r) good = good && all[std::size_t(r)] == float(r);
      float v = float(world.rank());
      auto req = world.iall_reduce_sum(&v, 1);
      req.wait();
      good = good && v == float(n * (n - 1) / 2);
      if (n > 1) { // a ring of point-to-point messages
        float out = float(world.rank()), in = -1;
        auto r = world.irecv(&in, 1, (world.rank() + n - 1) % n, 7);
        world.send(&out, 1, (world.rank() + 1) % n, 7);
        r.wait();
        good = good && in == float((world.rank() + n - 1) % n);
      }
      auto sub = world.split(world.rank() % 2, world.rank());
      good = good && sub.collective_timeout() == 5.0 && sub.all_of(true);
      world.barrier();
    }
    good = world.all_of(good);
    if (world.rank() == 0) std::printf("%s\n", good ? "all collectives correct" : "WRONG");
    return good ? 0 : 1;
  }
  std::fprintf(stderr, "usage: rank_failure throw|unwind|stall|stall3|ok\n");
  return 2;
}
