#pragma once
/// \file nn/input.hpp
/// nn::Input<Dims...>: the identity, fixing the per-sample shape (B, Dims...) at the start of
/// a Sequential whose first real layer (a Conv2d) does not fix it by itself.
///
///   using Model = tessera::nn::Sequential<tessera::nn::Input<1, 28, 28>,
///                                         tessera::nn::Conv2d<1, 8, 3>, ...>;

#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/layer.hpp>

#include <boost/hana/tuple.hpp>

#include <array>
#include <cstdint>
#include <string>

namespace tessera::nn {

template <index_t... Dims>
class Input {
  static_assert(sizeof...(Dims) >= 1 && ((Dims >= 1) && ...),
                "tessera::nn::Input<Dims...>: give the static per-sample shape, e.g. "
                "Input<1, 28, 28>.");
  using M = detail::default_memory_space;

public:
  using input_extents = extents<dyn, Dims...>;
  static constexpr bool is_input = true;
  template <class InExt>
  static constexpr bool accepts = InExt::rank == sizeof...(Dims) + 1;
  template <class InExt>
  using output_extents = input_extents;
  /// nn/layer.hpp: no arithmetic (a view of x); runs on a feature shard as on the whole.
  static constexpr split_kind tensor_split = split_kind::per_feature;
  template <class InExt>
  static constexpr double forward_flops = 0;

  explicit Input(std::uint64_t /*seed*/ = 0) {}
  auto parameters() const { return boost::hana::make_tuple(); }

  /// x seen as (B, Dims...) (shares memory); throws shape_error if its extents differ.
  template <class Exec, class P, class E>
  Tensor<P, input_extents, layout_right, M> forward(const Exec&,
                                                    const Tensor<P, E, layout_right, M>& x) {
    static_assert(E::rank == sizeof...(Dims) + 1,
                  "tessera::nn::Input::forward: x must be (B, Dims...).");
    const std::array<index_t, sizeof...(Dims)> want{Dims...};
    for (std::size_t i = 0; i < want.size(); ++i)
      if (x.extent(i + 1) != want[i])
        throw shape_error("tessera::nn::Input::forward: x has shape " + shape_string(x.extents()) +
                          " but the model takes " + shape_string(input_extents(x.extent(0))));
    return Tensor<P, input_extents, layout_right, M>(x.kokkos_view(), input_extents(x.extent(0)));
  }

  template <class Exec, class P, class DE>
  Tensor<P, DE, layout_right, M> backward(const Exec&, const Tensor<P, DE, layout_right, M>& dy,
                                          bool = true) {
    return dy;
  }
};

} // namespace tessera::nn
