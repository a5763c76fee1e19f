// expect: tessera::Tensor::operator(): element access from host code needs memory the host can reach
// Tensor::operator() is host element access: on a tensor whose memory the host cannot reach (a
// GPU's; here a stand-in that Kokkos reports as not host-accessible) it is refused at compile
// time, with a sentence naming host_mirror_copy / host_mirror + copy_from_host, instead of a
// host dereference of a device pointer at run time.
#include "../support/fake_device_space.hpp"

#include <tessera/tensor.hpp>

using T = tessera::Tensor<tessera::fp32, tessera::extents<4>, tessera::layout_right,
                          tessera::testing::fake_device_space>;

float snippet(const T& t) {
  return t(1);
}
