// expect: it declares no shape rule
// A layer must say which inputs it accepts and what it returns (nn::LayerShapeRule in
// nn/layer.hpp); this one has a seed constructor and parameters but no accepts/output_extents.
#include <tessera/nn.hpp>

struct shapeless_layer {
  explicit shapeless_layer(std::uint64_t) {}
  auto parameters() const { return boost::hana::make_tuple(); }
};

void snippet() {
  tessera::nn::Sequential<tessera::nn::Linear<4, 4>, shapeless_layer> model(1);
  (void)model;
}
