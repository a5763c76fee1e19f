// expect: OverflowPolicy<Policy>
// expect (clang): because 'int' does not satisfy 'OverflowPolicy'
// The overflow policy must be tessera::saturate or tessera::overflow_to_inf_nan; the compiler
// names the unsatisfied concept.
#include <tessera/precision.hpp>

tessera::float8_e4m3 snippet(float x) {
  return tessera::from_float<tessera::fp8_e4m3, int>(x);
}
