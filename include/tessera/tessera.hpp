#pragma once
/// \file tessera.hpp
/// Umbrella header: everything tessera offers. Prefer the entry header of the module you use
/// (tessera/precision.hpp, tessera/tensor.hpp, ...) to keep builds fast.

#include <tessera/config.hpp>
#include <tessera/precision.hpp>
#include <tessera/tensor.hpp>
#include <tessera/gemm.hpp>
#include <tessera/train.hpp>
#include <tessera/parallel.hpp> // no MPI: the MPI backend is tessera/parallel/mpi.hpp
