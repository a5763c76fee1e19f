#pragma once
/// \file parallel.hpp
/// Entry header of tessera's parallelism plans: policies data<D>, tensor<T>, pipeline<P>;
/// plan<Policies...>; pipeline schedules; the Communicator concept and its single-process
/// backend; meshes. It needs no MPI: the MPI communicator lives in tessera/parallel/mpi.hpp,
/// which only programs linked with MPI include.

#include <tessera/parallel/communicator.hpp>
#include <tessera/parallel/mesh.hpp>
#include <tessera/parallel/plan.hpp>
#include <tessera/parallel/policies.hpp>
#include <tessera/parallel/schedule.hpp>
