// expect: every element of the parameter sequence must be a tessera::nn::parameter
// Optimizers walk nn::parameter handles (value + grad + name); a bare tensor has no gradient.
#include <tessera/train.hpp>

#include <boost/hana/tuple.hpp>

void snippet() {
  tessera::Tensor<tessera::fp32, tessera::extents<4>> w("w"); // (4) fp32
  tessera::train::sgd opt{.lr = 0.1f};
  opt.step(Kokkos::DefaultHostExecutionSpace{}, boost::hana::make_tuple(w));
}
