// expect: run_pipeline_stage: the stage's activations and gradients are handed
// Pipeline stages hand activation buffers to the communicator as host pointers (device-aware MPI
// is not assumed), so a stage whose input lives in memory the host cannot reach (a GPU's; here a
// stand-in that Kokkos reports as not host-accessible) is refused at compile time, with a
// sentence saying what the caller must do.
#include "../support/fake_device_space.hpp"

#include <tessera/nn.hpp>
#include <tessera/parallel/pipeline.hpp>

using Model = tessera::nn::Sequential<tessera::nn::Linear<4, 8>, tessera::nn::Linear<8, 2>>;
using Stage = tessera::parallel::pipeline_stage<Model, 0, 2>;
using In = tessera::Tensor<tessera::fp32, tessera::extents<tessera::dyn, 4>, tessera::layout_right,
                           tessera::testing::fake_device_space>;

void snippet(Stage& stage, tessera::parallel::single_process_communicator& pipe, const In& x,
             const Kokkos::View<int*>& labels, tessera::nn::SoftmaxCrossEntropy& loss) {
  tessera::parallel::run_pipeline_stage<tessera::parallel::gpipe, 1, 0, 1, In>(
      Kokkos::DefaultHostExecutionSpace{}, stage, pipe, x, labels, loss);
}
