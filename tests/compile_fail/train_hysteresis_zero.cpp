// expect: tessera::train::hysteresis_policy<N>: N (overflows tolerated before backing off
// A hysteresis of 0 would never back off.
#include <tessera/train/loss_scaler.hpp>

void snippet() {
  tessera::train::dynamic_scaler<tessera::train::hysteresis_policy<0>> scaler;
  (void)scaler;
}
