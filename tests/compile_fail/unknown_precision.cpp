// expect: this type is not a precision tag
// A tag without a tessera::precision_traits specialisation: every consumer that asks for its
// traits (here storage_t, as Tensor, gemm and the conversions do) stops with this sentence.
#include <tessera/precision.hpp>

struct my_format {};

void snippet() {
  tessera::storage_t<my_format>* p = nullptr;
  (void)p;
}
