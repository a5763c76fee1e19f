// expect: tessera::parallel::plan<...>: every argument must be a policy
#include <tessera/parallel/plan.hpp>

int snippet() {
  return tessera::parallel::plan<tessera::parallel::data<2>, float>::world_size;
}
