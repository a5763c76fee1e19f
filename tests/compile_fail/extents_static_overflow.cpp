// expect: tessera::extents: the product of the static extents overflows 64-bit integers.
// 2^32 x 2^32 static extents: the element count is known (and too large) at compile time.
#include <tessera/tensor.hpp>

void snippet() {
  tessera::extents<(tessera::index_t{1} << 32), (tessera::index_t{1} << 32)> e;
  (void)e;
}
