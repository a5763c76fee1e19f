// expect: stage 3
#include <tessera/parallel/plan.hpp>

int snippet() {
  return tessera::parallel::plan<
      tessera::parallel::data<2, tessera::parallel::zero<3>>>::zero_stage;
}
