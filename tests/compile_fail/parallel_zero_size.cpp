// expect: tessera::parallel::tensor<T>: the tensor-parallel size T must be at least 1
#include <tessera/parallel/plan.hpp>

int snippet() {
  return tessera::parallel::plan<tessera::parallel::tensor<0>>::world_size;
}
