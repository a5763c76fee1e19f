// The main of the MPI test programs (run under mpiexec): MPI, then Kokkos, then one Catch2
// session per rank. Every rank runs the same test cases, in the same order, so collectives
// inside them match. The exit code is the same on every rank: nonzero if any rank failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <tessera/parallel/mpi.hpp>

#include <Kokkos_Core.hpp>

#include <cstdlib>

int main(int argc, char* argv[]) {
  setenv("OMP_PROC_BIND", "false", 0); // see tests/support/main.cpp
  tessera::parallel::mpi_environment mpi(argc, argv);
  int failed = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    failed = Catch::Session().run(argc, argv) != 0 ? 1 : 0;
  }
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}
