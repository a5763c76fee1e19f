#pragma once
/// \file tessera.hpp
/// Umbrella header: everything tessera offers. Prefer the entry header of the module you use
/// (tessera/precision.hpp, tessera/tensor.hpp, ...) to keep builds fast. The modules in the
/// order of their dependencies (each includes only those above it; docs/architecture.md).

#include <tessera/config.hpp>
#include <tessera/precision.hpp>
#include <tessera/tensor.hpp>
#include <tessera/gemm.hpp>
#include <tessera/conv.hpp>
#include <tessera/train.hpp>
#include <tessera/nn.hpp>
#include <tessera/parallel.hpp> // no MPI: the MPI backend is tessera/parallel/mpi.hpp
