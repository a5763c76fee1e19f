#pragma once
// Five SGD steps of tiny_mlp on a global batch split over a data-parallel group: the run the
// equivalence tests compare, on any Communicator (single-process: the reference).
#include "tiny_mlp.hpp"

#include <tessera/parallel/data_parallel.hpp>

#include <boost/hana/for_each.hpp>

#include <vector>

namespace tessera_test {

inline constexpr int dp_in = 13, dp_hidden = 11, dp_out = 5; // odd and prime: no lucky tiling
inline constexpr int dp_global_batch = 24; // divisible by 1, 2, 3, 4, 6 and 8 ranks
inline constexpr int dp_steps = 5;
inline constexpr float dp_lr = 0.5f;
using dp_model = tiny_mlp<dp_in, dp_hidden, dp_out>;

// Every parameter value, in order, after the steps. `comm` is the data group; this rank
// trains on its contiguous slice of each global batch.
template <class Wire = float, class C>
std::vector<float> run_data_parallel(C comm, std::size_t bucket_bytes) {
  Kokkos::DefaultExecutionSpace exec;
  dp_model model(2024);
  tessera::parallel::gradient_buckets<C, Kokkos::DefaultExecutionSpace::memory_space, Wire> dp(
      comm, model.parameters(), bucket_bytes);
  const int share = dp_global_batch / comm.size(), first = comm.rank() * share;
  for (int step = 0; step < dp_steps; ++step) {
    std::vector<float> x(std::size_t(share * dp_in));
    std::vector<int> labels(static_cast<std::size_t>(share));
    for (int s = 0; s < share; ++s)
      sample<dp_in, dp_out>(step, first + s, &x[std::size_t(s * dp_in)], labels[std::size_t(s)]);
    model.forward(x, labels);
    model.backward_layer2();
    dp.mark_ready(exec, model.b2);
    dp.mark_ready(exec, model.w2); // the first bucket may be in flight during layer 1
    model.backward_layer1();
    dp.mark_ready(exec, model.w1);
    dp.mark_ready(exec, model.b1);
    dp.finish(exec);
    model.sgd(dp_lr);
  }
  std::vector<float> out;
  boost::hana::for_each(model.parameters(), [&](const auto& p) {
    out.insert(out.end(), p.value.data(), p.value.data() + p.size());
  });
  return out;
}

} // namespace tessera_test
