// expect: has column- and row-parallel shard types only for nn::Linear and nn::Conv2d
// A layer may declare split_kind::splittable only if parallel/ can shard it; otherwise the
// tensor split names it (layer_has_shard_types<1, claims_splittable, false>).
#include <tessera/nn.hpp>
#include <tessera/parallel/tensor_parallel.hpp>

struct claims_splittable {
  static constexpr tessera::nn::split_kind tensor_split = tessera::nn::split_kind::splittable;
  explicit claims_splittable(std::uint64_t) {}
  auto parameters() const { return boost::hana::make_tuple(); }
  template <class InExt>
  static constexpr bool accepts = true;
  template <class InExt>
  using output_extents = InExt;
};

using Model = tessera::nn::Sequential<tessera::nn::Linear<4, 8>, claims_splittable,
                                      tessera::nn::Linear<8, 2>>;
using Split = tessera::parallel::tensor_split_t<Model, 2>;
Split* split = nullptr;
