// expect: tessera::parallel::plan<...>: the data policy is given more than once
#include <tessera/parallel/plan.hpp>

int snippet() {
  return tessera::parallel::plan<tessera::parallel::data<2>, tessera::parallel::tensor<2>,
                                 tessera::parallel::data<2>>::world_size;
}
