#pragma once
// The plan-equivalence check shared by the test_mpi_plans_*.cpp files: for every plan of the
// eight (data, tensor, pipeline) in {1, 2}^3 whose size is the world's, 5 training steps on
// the same global batch as the single-process reference, then every parameter, gathered whole
// by name, compared with the reference's.
#include "nn_run.hpp"

#include <tessera/parallel/mpi.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace tessera_test {

namespace tp = tessera::parallel;

using all_plans =
    std::tuple<tp::plan<>, tp::plan<tp::data<2>>, tp::plan<tp::tensor<2>>,
               tp::plan<tp::pipeline<2>>, tp::plan<tp::data<2>, tp::tensor<2>>,
               tp::plan<tp::data<2>, tp::pipeline<2>>, tp::plan<tp::tensor<2>, tp::pipeline<2>>,
               tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>>;

/// Micro-batches for a plan: `with_pipeline` when it has a pipeline, else `without`.
template <class Plan, int without, int with_pipeline>
inline constexpr int micro_batches_for = Plan::pipeline_size > 1 ? with_pipeline : without;

/// Runs Plan if it fits the world's size (Plan::fits: its size, or for data<dyn> a multiple
/// of tensor x pipeline); returns whether it ran.
template <class Model, class Plan, class Kind, int M>
bool check_plan(const char* what, float tolerance, const run_options& o,
                const std::map<std::string, std::vector<float>>& reference) {
  auto world = tp::mpi_communicator::world();
  if (!Plan::fits(world.size())) return false;
  const tp::mesh_shape shape = Plan::shape_on(world.size());
  // The global batch splits into D equal shares of M equal micro-batches: else the test itself
  // is wrong (not the plan).
  REQUIRE(o.global_batch % (shape.data * M) == 0);
  bucket_counts buckets;
  const auto got = train_plan<Model, Plan, Kind, M>(world, o, &buckets);
  // Every plan (the pipeline path included) starts each bucket's all-reduce from mark_ready,
  // during backward, none from finish() after it.
  CHECK((!buckets.present || buckets.overlapped == buckets.total));
  float diff = 0;
  bool shapes_match = true;
  for (const auto& [name, values] : got) {
    const auto it = reference.find(name);
    if (it == reference.end() || it->second.size() != values.size()) {
      shapes_match = false;
      continue;
    }
    for (std::size_t i = 0; i < values.size(); ++i)
      diff = std::max(diff, std::fabs(it->second[i] - values[i]));
  }
  INFO(what << " " << shape.name());
  CHECK(shapes_match);
  // Every parameter lives on some stage, whole on each of its D * T ranks after the gather.
  int mine = int(got.size()), total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == int(reference.size()) * shape.data * shape.tensor);
  float worst = diff;
  MPI_Allreduce(&diff, &worst, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank() == 0)
    WARN(what << " " << Plan::name() << " as " << shape.name() << ": max |w - w_ref| = " << worst);
  CHECK(diff <= tolerance);
  return true;
}

/// check_plan for each plan of the tuple Plans (those that fit the world's size run); returns
/// how many ran. Kind and the micro-batch counts (without and with a pipeline) are the
/// configuration's.
template <class Model, class Kind, int M_flat, int M_pipe, class Plans = all_plans>
int check_plans(const char* what, float tolerance, const run_options& o) {
  const auto reference = train_reference<Model>(o);
  return [&]<class... P>(std::tuple<P...>*) {
    return (int(check_plan<Model, P, Kind, micro_batches_for<P, M_flat, M_pipe>>(what, tolerance, o,
                                                                                 reference)) +
            ... + 0);
  }(static_cast<Plans*>(nullptr));
}

/// check_plans over the eight plans.
template <class Model, class Kind, int M_flat, int M_pipe>
void check_all_plans(const char* what, float tolerance, const run_options& o) {
  check_plans<Model, Kind, M_flat, M_pipe>(what, tolerance, o);
}

// Tolerances (the runs differ only in the order of fp32 sums: over micro-batches, across data
// ranks times 1/D, and across tensor ranks for the row-parallel partial products and the
// column-parallel input gradients).
// fp32: each gradient moves by a few 2^-24 relative; 5 steps of lr 0.05 with momentum 0.9 (a
// gradient counted fewer than 5 times) keep weight differences ~1e-7. 1e-5 is far below what a
// real mistake does (a missed 1/D or 1/M, a shard sliced from the wrong place, a partial sum
// not reduced moves weights by lr |g| ~ 1e-3 or more).
// bf16: weights and activations are rounded to bf16 at each forward, so an fp32-ulp difference
// can flip a rounding to the neighbouring bf16 (2^-8 relative); a flip shifts the gradients it
// touches by ~2^-8 |g|, which the remaining steps carry into the masters as at most
// lr (1 + 0.9 + ...) 2^-8 |g| <= 5 * 0.05 * 2^-8 |g| ~ 1e-3 |g|; with |g| <~ 0.5 here, 5e-4.
inline constexpr float fp32_tolerance = 1e-5f;
inline constexpr float bf16_tolerance = 5e-4f;

/// Whether `v` is bit-identical on every rank of `comm` (sizes included): the fp8 scaling states
/// of the ranks that share a tensor must be.
template <class C>
bool same_on_all(C& comm, const std::vector<float>& v) {
  if (comm.size() == 1) return true;
  std::vector<float> n{float(v.size())}, ns(std::size_t(comm.size()));
  comm.all_gather(n.data(), ns.data(), 1);
  for (float x : ns)
    if (x != n[0]) return false;
  std::vector<float> all(v.size() * std::size_t(comm.size()));
  comm.all_gather(v.data(), all.data(), std::int64_t(v.size()));
  for (int r = 0; r < comm.size(); ++r)
    if (std::memcmp(all.data() + std::size_t(r) * v.size(), v.data(), v.size() * sizeof(float)))
      return false;
  return true;
}

} // namespace tessera_test
