#pragma once
/// \file parallel.hpp
/// Entry header of tessera's parallelism plans: policies data<D>, tensor<T>, pipeline<P>;
/// plan<Policies...>; pipeline schedules; the Communicator concept and its single-process
/// backend; meshes. It needs no MPI: the MPI communicator lives in tessera/parallel/mpi.hpp,
/// which only programs linked with MPI include.
///
/// The parts that depend on tessera::nn are separate headers, so that this one stays light:
///   tessera/parallel/data_parallel.hpp    gradient buckets, overlapped backward
///   tessera/parallel/tensor_parallel.hpp  tensor_split_t and the column/row-parallel layers
///   tessera/parallel/pipeline.hpp         stage cuts, pipeline stages, run_pipeline_stage
///   tessera/parallel/runner.hpp           plan_stage: one rank's training step of any plan
///   tessera/parallel/checkpoint.hpp       plan checkpoints (per-rank shards, manifest, merge)
///   tessera/parallel/counting.hpp         a communicator that counts the bytes it carries

#include <tessera/parallel/communicator.hpp>
#include <tessera/parallel/mesh.hpp>
#include <tessera/parallel/plan.hpp>
#include <tessera/parallel/policies.hpp>
#include <tessera/parallel/schedule.hpp>
