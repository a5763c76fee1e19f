// Started with a world of the wrong size: make_mesh_or_abort must print on every rank and end
// the job with a nonzero exit code (check_mismatch.cmake checks both), not hang.
#include <tessera/parallel/mesh.hpp>
#include <tessera/parallel/mpi.hpp>

int main(int argc, char* argv[]) {
  tessera::parallel::mpi_environment mpi(argc, argv);
  namespace tp = tessera::parallel;
  auto m =
      tp::make_mesh_or_abort<tp::plan<tp::data<2>, tp::pipeline<2>>>(tp::mpi_communicator::world());
  return m.world.size() == 4 ? 0 : 2;
}
