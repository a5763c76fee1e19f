#pragma once
/// \file parallel/mesh.hpp
/// tessera::parallel::mesh<Plan, Comm>: a plan laid over a world communicator, with one
/// sub-communicator per mesh axis (MPI_Comm_split by the plan's constexpr colours).
///
///   auto world = tessera::parallel::mpi_communicator::world();
///   auto m = tessera::parallel::make_mesh_or_abort<plan<data<2>, tensor<2>>>(world);
///   m.data.all_reduce_sum(grads, n);    // the ranks with my tensor and pipeline coordinates
///
/// The world must have exactly Plan::world_size processes, or for data<dyn> a positive multiple
/// of tensor x pipeline (the data degree is then world size / (tensor x pipeline), in
/// mesh::shape). The constructor throws tessera::value_error on every rank otherwise, naming
/// the plan, the world size and the rule (each rank sees the same sizes, so no rank is left
/// waiting in a collective); make_mesh_or_abort prints the message on every rank and aborts the
/// job with a nonzero exit instead of hanging.

#include <tessera/parallel/communicator.hpp>
#include <tessera/parallel/plan.hpp>

#include <cstdio>
#include <string>

namespace tessera::parallel {

/// A plan's mesh over a world communicator: this rank's coordinates and its groups.
template <Plan P, Communicator C>
struct mesh {
  using plan_type = P;
  C world;          ///< every rank of the plan
  mesh_shape shape; ///< the axes' sizes (data<dyn>'s degree filled in from the world size)
  coordinates_t at; ///< this rank's position
  C data;           ///< ranks differing only in the data coordinate (gradient averaging)
  C tensor;         ///< ranks differing only in the tensor coordinate (Megatron all-reduces)
  C pipeline;       ///< ranks differing only in the pipeline coordinate (stage to stage)

  /// Splits `w`; throws value_error when P does not fit w.size() processes (P::fits).
  explicit mesh(C w)
      : world(checked(std::move(w))), shape(P::shape_on(world.size())),
        at(shape.coordinates(world.rank())), data(split_along(axis::data)),
        tensor(split_along(axis::tensor)), pipeline(split_along(axis::pipeline)) {}

private:
  static C checked(C w) {
    if (!P::fits(w.size())) throw value_error("tessera::parallel::mesh: " + P::misfit(w.size()));
    return w;
  }
  C split_along(axis a) {
    return world.split(shape.group_color(a, world.rank()), shape.group_rank(a, world.rank()));
  }
};

/// mesh<P, C>(world), or, when the plan does not fit the world's size, prints
/// "tessera: rank r of n: <message>" on every rank and aborts the whole job with exit code 1.
template <Plan P, Communicator C>
mesh<P, C> make_mesh_or_abort(C world) {
  if (!P::fits(world.size())) {
    try {
      mesh<P, C> m(world); // throws: the same message as the constructor
    } catch (const value_error& e) {
      std::fprintf(stderr, "tessera: rank %d of %d: %s\n", world.rank(), world.size(), e.what());
      std::fflush(stderr);
    }
    world.barrier(); // every rank has printed before any rank aborts the job
    world.abort(1);
  }
  return mesh<P, C>(std::move(world));
}

} // namespace tessera::parallel
