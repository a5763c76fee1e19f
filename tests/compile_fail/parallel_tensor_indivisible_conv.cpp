// expect: T does not divide the width that layer I splits
// Conv2d 1 (3 output channels) is paired with Conv2d 3: 2 does not divide 3, and the compiler
// prints tensor_split_check<1, tessera::nn::Conv2d<1, 3, 3, ...>, 2, false>.
#include <tessera/parallel/tensor_parallel.hpp>

void snippet() {
  namespace nn = tessera::nn;
  using Model = nn::Sequential<nn::Input<1, 8, 8>, nn::Conv2d<1, 3, 3>, nn::ReLU,
                               nn::Conv2d<3, 4, 3>, nn::Flatten, nn::Linear<64, 10>>;
  tessera::parallel::tensor_split_t<Model, 2> model(1);
  (void)model;
}
