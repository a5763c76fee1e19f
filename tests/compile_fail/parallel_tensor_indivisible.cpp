// expect: T does not divide the width that layer I splits
// Linear 0 becomes column-parallel over its 35 outputs, which 2 does not divide: the compiler
// prints the assertion with tensor_split_check<0, tessera::nn::Linear<23, 35, fp32>, 2, false>.
#include <tessera/parallel/tensor_parallel.hpp>

void snippet() {
  using Model = tessera::nn::Sequential<tessera::nn::Linear<23, 35>, tessera::nn::ReLU,
                                        tessera::nn::Linear<35, 10>>;
  tessera::parallel::tensor_split_t<Model, 2> model(1);
  (void)model;
}
