// expect: the recipe must be tessera::train::current_scaling or tessera::train::delayed_scaling
// fp8_meta's recipe is a policy type; anything else is refused with one sentence.
#include <tessera/train/fp8_recipe.hpp>

void snippet() {
  tessera::train::fp8_meta<float> meta;
  (void)meta;
}
