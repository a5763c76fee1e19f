// expect: only the data degree may be dyn
// tensor<dyn>: the tensor degree shapes the layer types (Out / T features per rank), so it is a
// compile-time number; only data<dyn> takes its degree from the world size.
#include <tessera/parallel/plan.hpp>

int snippet() {
  return tessera::parallel::plan<tessera::parallel::tensor<tessera::dyn>>::tensor_size;
}
