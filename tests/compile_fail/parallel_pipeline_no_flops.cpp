// expect: declares no forward FLOPs
// The balanced pipeline cut weighs layers by the FLOPs they declare (nn/layer.hpp); a layer
// without the declaration stops it at compile time instead of being weighed by a guess.
#include <tessera/nn.hpp>
#include <tessera/parallel/pipeline.hpp>

struct silent_layer { // a Layer, but it says nothing about its cost
  explicit silent_layer(std::uint64_t) {}
  auto parameters() const { return boost::hana::make_tuple(); }
  template <class InExt>
  static constexpr bool accepts = true;
  template <class InExt>
  using output_extents = InExt;
};

using Model =
    tessera::nn::Sequential<tessera::nn::Linear<4, 8>, silent_layer, tessera::nn::Linear<8, 2>>;
constexpr auto cut = tessera::parallel::stage_bounds<Model, 2>::value;
