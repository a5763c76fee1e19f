// expect: which the tensor split does not support
// An fp8 Linear pair under tensor<2>: tensor_split_precision_check<0, Linear<16, 8, fp8<>>,
// false> names the layer.
#include <tessera/parallel/tensor_parallel.hpp>

void snippet() {
  namespace nn = tessera::nn;
  using Model = nn::Sequential<nn::Linear<16, 8, nn::fp8<>>, nn::ReLU, nn::Linear<8, 4, nn::fp8<>>>;
  tessera::parallel::tensor_split_t<Model, 2> model(1);
  (void)model;
}
