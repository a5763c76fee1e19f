// The main of every Catch2 test program: Kokkos is initialised once around the session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <Kokkos_Core.hpp>

#include <cstdlib>

int main(int argc, char* argv[]) {
  // Kokkos' OpenMP backend warns on every start without OMP_PROC_BIND, and recommends false
  // for unit tests. The warning would otherwise pollute CTest's test discovery.
  setenv("OMP_PROC_BIND", "false", 0);
  Kokkos::ScopeGuard kokkos(argc, argv);
  return Catch::Session().run(argc, argv);
}
