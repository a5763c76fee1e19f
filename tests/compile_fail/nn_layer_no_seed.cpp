// expect: it has no constructor from a std::uint64_t seed
// Sequential builds layer i from a seed (nn::SeededLayer in nn/layer.hpp); a type without that
// constructor is named by layer_requirement<1, no_seed_layer, false>.
#include <tessera/nn.hpp>

struct no_seed_layer {
  no_seed_layer() = default;
  auto parameters() const { return boost::hana::make_tuple(); }
  template <class InExt>
  static constexpr bool accepts = true;
  template <class InExt>
  using output_extents = InExt;
};

void snippet() {
  tessera::nn::Sequential<tessera::nn::Linear<4, 4>, no_seed_layer> model(1);
  (void)model;
}
