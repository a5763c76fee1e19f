// expect: tessera::TensorView: the second template argument must be tessera::extents<...>
// A shape is a tessera::extents type, not an integer or a std::array.
#include <tessera/tensor.hpp>

void snippet() {
  tessera::TensorView<tessera::fp32, int> v;
  (void)v;
}
