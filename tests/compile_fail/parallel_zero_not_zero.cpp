// expect: Z must be tessera::parallel::zero<S>
#include <tessera/parallel/plan.hpp>

int snippet() {
  return tessera::parallel::plan<tessera::parallel::data<2, int>>::zero_stage;
}
